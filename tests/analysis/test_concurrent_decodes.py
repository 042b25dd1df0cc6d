"""Decode limits hold per decode, not per process: several threads of one process (the threads of
`memq serve`) decode snapshots at the same time and every valid one is read, the process's address-space
limit is what it was before, and the memory bombs are still refused while others decode."""

from __future__ import annotations

import functools
import resource
import threading
from pathlib import Path

from memq import codec
from memq.errors import TooLarge
from memq.load import decode_snapshot_bytes

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
SNAPSHOTS = [REAL / "seed_adamw" / "epoch0.pickle.gz", REAL / "frag_dynamic_1.15" / "oom.pickle.gz",
             REAL / "seed_sgd" / "epoch1.pickle.gz", REAL / "capacity" / "oom.pickle.gz"]
THREADS = 8
MIB = 1024 * 1024


def _in_threads(jobs: list) -> list:
    """Run each job in its own thread, all released at once; (ok, value or exception) per job."""
    start = threading.Barrier(len(jobs))
    out: list = [None] * len(jobs)

    def run(i, job):
        start.wait()
        try:
            out[i] = (True, job())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out[i] = (False, exc)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_eight_concurrent_decodes_all_succeed_and_leave_the_limit_as_it_was():
    before = resource.getrlimit(resource.RLIMIT_AS)
    blobs = [p.read_bytes() for p in SNAPSHOTS]
    for _ in range(3):  # the race took 1-6 of 8 decodes: a few rounds make it certain
        jobs = [functools.partial(decode_snapshot_bytes, blobs[i % len(blobs)], 256 * MIB) for i in range(THREADS)]
        results = _in_threads(jobs)
        failed = [repr(v) for ok, v in results if not ok]
        assert not failed, failed
        assert all(v.snapshot.traces for _, v in results)
        assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_bombs_are_refused_while_valid_snapshots_decode_beside_them():
    before = resource.getrlimit(resource.RLIMIT_AS)
    sets = b"\x80\x04](" + b"\x8f" * (4 * MIB) + b"e."  # ~200 bytes of objects per byte: past the cap
    memo = b"\x80\x04]r\xff\xff\xff\x7f."  # LONG_BINPUT 2**31-1: the memo table zero-filled to 16 GiB
    good = SNAPSHOTS[0].read_bytes()
    jobs = [lambda: codec.loads_restricted(sets), lambda: codec.loads_restricted(memo)]
    jobs += [lambda: decode_snapshot_bytes(good, 256 * MIB) for _ in range(THREADS - 2)]
    results = _in_threads(jobs)
    assert all(not ok and isinstance(v, TooLarge) for ok, v in results[:2]), results[:2]
    failed = [repr(v) for ok, v in results[2:] if not ok]
    assert not failed, failed
    assert resource.getrlimit(resource.RLIMIT_AS) == before
