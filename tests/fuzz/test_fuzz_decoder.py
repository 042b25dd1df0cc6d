"""Fuzzing the decoder and the analysis with 10,000+ generated and mutated snapshots.

The only acceptable failure is the documented bad-input error (SnapshotError, exit code 2); no hang
(each input is timed) and bounded memory (peak traced allocation per input is checked)."""

from __future__ import annotations

import gzip
import pickle
import random
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq import codec
from memq.analysis import analyze
from memq.errors import SnapshotError
from memq.load import decode_snapshot_bytes
from memq.model import OomContext
from tests.bombs import own_peak_rss, reset_peak_rss
from tests.helpers import REAL

MAX_SECONDS = 20.0
# growth of this process's peak RSS during one input: a 4 MiB input may build 12x its size before
# the address-space cap refuses it, so 1 GiB is a hang-sized margin, not noise
MAX_RSS_GROWTH_BYTES = 1024**3
LIMIT_BYTES = 4 * 1024**2  # decompressed input cap for the fuzzed decoder

SEED_FILES = [REAL / "frag_synthetic" / "oom.pickle.gz", REAL / "frag_synthetic" / "fragmented.pickle.gz"]
SEEDS = [gzip.decompress(p.read_bytes()) for p in SEED_FILES]

# Generated snapshots come from a seeded builder rather than nested hypothesis strategies: drawing
# deep structures through hypothesis costs ~30 ms an example, the builder well under 1 ms.
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
           "segment_unmap", "oom", "snapshot", "annotate", "future_action"]
STATES = ["active_allocated", "inactive", "active_pending_free", "active_awaiting_free"]
KEYS = ["max_split_size", "expandable_segments", "roundup_power2_divisions", "garbage_collection_threshold",
        "PYTORCH_CUDA_ALLOC_CONF", "trace_alloc_overflowed"]


def _int(r: random.Random):
    return r.choice([0, 1, 512, 2**20, 2**21, 2**31, -1, -(2**40), 2**64 + 3, r.randrange(-(2**20), 2**34)])


def _scalar(r: random.Random):
    return r.choice([None, True, 1.5, float("nan"), "x", b"\x00", (1, 2), [], {}, _int(r)])


WRONG = {"rate": 0.05}


def _maybe(r: random.Random, value, wrong=None):
    """Usually `value`, sometimes (at the current snapshot's rate) a value of the wrong type."""
    return _scalar(r) if r.random() < (WRONG["rate"] if wrong is None else wrong) else value


def _frames(r):
    return [{"filename": r.choice(["/x/torch/optim/adam.py", "train.py", "", "a::b.cpp"]),
             "line": _maybe(r, r.randrange(2000)), "name": r.choice(["forward", "_init_group", "cudnn_conv", "f"])}
            for _ in range(r.randrange(4))]


def _segment(r):
    blocks = [{k: v for k, v in {"size": _maybe(r, _int(r)), "requested_size": _maybe(r, _int(r)),
                                 "state": _maybe(r, r.choice(STATES)), "address": _maybe(r, _int(r)),
                                 "frames": _maybe(r, _frames(r))}.items() if r.random() >= WRONG["rate"]}
              for _ in range(r.randrange(7))]
    seg = {"total_size": _maybe(r, sum(b.get("size", 0) for b in blocks if isinstance(b.get("size"), int))),
           "blocks": _maybe(r, blocks), "address": _maybe(r, _int(r)), "stream": _maybe(r, r.choice([0, 7])),
           "segment_type": r.choice(["small", "large", "x"]), "segment_pool_id": r.choice([(0, 0), [1, 2], None, 5]),
           "is_expandable": _scalar(r)}
    return {k: v for k, v in seg.items() if r.random() >= WRONG["rate"]}


def _entry(r):
    e = {"action": _maybe(r, r.choice(ACTIONS)), "size": _maybe(r, _int(r)), "addr": _maybe(r, _int(r)),
         "stream": _maybe(r, 0), "time_us": _maybe(r, r.randrange(10**9)), "device_free": _int(r),
         "frames": _maybe(r, _frames(r)), "pool_id": r.choice([(0, 0), None, "p"]), "user_metadata": _scalar(r)}
    return {k: v for k, v in e.items() if r.random() > 0.1}


def build_snapshot(seed: int):
    r = random.Random(seed)
    WRONG["rate"] = r.choice([0.0, 0.0, 0.002, 0.05])  # half the snapshots are well-typed throughout
    shape = r.random()
    if shape < 0.05:
        return _scalar(r)
    segments = [_segment(r) for _ in range(r.randrange(6))]
    if shape < 0.15:
        return segments
    snap = {"segments": _maybe(r, segments, 0.02),
            "device_traces": _maybe(r, [[_entry(r) for _ in range(r.randrange(40))] for _ in range(r.randrange(3))]),
            "allocator_settings": _maybe(r, {k: r.choice([_scalar(r), {"1": 4, "x": "y"}]) for k in r.sample(KEYS, 3)}),
            "external_annotations": _maybe(r, [{"name": "s"}]), "host_segments": _maybe(r, [])}
    return {k: v for k, v in snap.items() if k == "segments" or r.random() > 0.1}


def _check(data: bytes) -> None:
    base = reset_peak_rss()
    t = time.perf_counter()
    try:
        loaded = decode_snapshot_bytes(data, max_bytes=LIMIT_BYTES)
        analyze([loaded], OomContext(limit_bytes=8 * 1024**3))
    except SnapshotError:
        pass  # the documented bad-input error
    elapsed = time.perf_counter() - t
    assert elapsed < MAX_SECONDS, f"took {elapsed:.1f} s (a hang, not noise: inputs are at most 4 MiB)"
    grew = own_peak_rss() - base
    assert grew < MAX_RSS_GROWTH_BYTES, f"process peak RSS grew {grew} bytes on one input"


FUZZ = settings(max_examples=5000, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(st.integers(0, 2**32), st.sampled_from([0, 2, 4, 5]), st.booleans())
def test_generated_snapshots(seed, protocol, compress):
    try:
        data = pickle.dumps(build_snapshot(seed), protocol=protocol)
    except (ValueError, OverflowError):
        return
    _check(codec.compress(data, "gzip") if compress else data)


@FUZZ
@given(st.sampled_from(range(len(SEEDS))), st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)),
                                                    min_size=1, max_size=8),
       st.integers(0, 2**31), st.sampled_from(["none", "gzip", "zstd"]))
def test_mutated_real_snapshots(seed, flips, cut, comp):
    buf = bytearray(SEEDS[seed])
    for pos, val in flips:
        buf[pos % len(buf)] = val
    data = bytes(buf[: max(1, cut % (len(buf) + 1))]) if cut % 3 == 0 else bytes(buf)
    if comp != "none":
        data = codec.compress(data, comp)
        if cut % 5 == 0:
            data = data[: len(data) // 2]
    _check(data)
