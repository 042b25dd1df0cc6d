"""The worker's decoded-snapshot cache: decoded snapshots are frozen out of the cyclic GC, and
still freed when evicted; cyclic garbage made before a decode is collected, not frozen."""

from __future__ import annotations

import gc
import weakref

from memq.load import load_snapshot_file
from memq.workers import jobs
from tests.helpers import REAL


class _Cycle:
    def __init__(self):
        self.me = self


def test_decoded_snapshot_is_frozen_and_freed_on_eviction(store):
    ld0 = load_snapshot_file(REAL / "seed_sgd" / "epoch1.pickle.gz", keep_raw=True)
    store.blobs.put(ld0.sha256, ld0.raw)
    jobs.forget_cache()
    gc.collect()
    gc.freeze()  # what exists now is the baseline
    base = gc.get_freeze_count()
    garbage = weakref.ref(_Cycle())  # unreachable at once, kept alive only by its cycle
    try:
        ld = jobs._cached_load(store, ld0.sha256, "epoch1")
        assert garbage() is None  # collected before the freeze, not frozen with the snapshot
        assert gc.isenabled()
        frozen = gc.get_freeze_count() - base
        trace_events = len(ld.snapshot.trace)
        assert frozen > trace_events  # the snapshot's containers are out of the collector's sight
        assert jobs._cached_load(store, ld0.sha256, "epoch1") is ld  # cached
        # kept for long, it lets go of the frames lists the parser dropped (a fresh decode holds 3,940)
        assert ld0.snapshot.held and ld.snapshot.held == []
        del ld
        jobs.forget_cache()
        # reference counting alone gave the snapshot's memory back (no cycles inside a snapshot)
        assert gc.get_freeze_count() - base < frozen / 20
    finally:
        jobs.forget_cache()
        gc.unfreeze()
