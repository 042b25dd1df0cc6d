"""The model against real torch 2.11 traces, under the recorded configuration: it must reproduce the
recorded segment_alloc/segment_free sequence and the reserved bytes after every trace entry."""

from __future__ import annotations

import pytest

from memq.analysis.whatif import compile_trace, run_whatif
from memq.load import load_snapshot_file
from tests.helpers import REAL, REAL_RUNS

BENCH = REAL.parent.parent.parent / "benchmarks" / "data" / "big.pickle.gz"
CAPTURED = REAL.parent / "captured"

CASES = []
for folder, (stems, opts) in REAL_RUNS.items():
    for stem in stems:
        if folder == "kept_loss_no_leak" and stem not in ("step0020", "step0400"):
            continue  # 20 snapshots of the same loop: two are enough
        CASES.append((folder, stem, opts.get("limit")))


# the second batch (tests/fixtures/captured): leak, CUDA graphs with private pools, cuDNN's empty_cache
CAPTURED_CASES = [
    ("leak_epochs", "epoch2", 7516192768),
    ("leak_epochs", "oom", 7516192768),
    ("cuda_graphs", "after_replays", None),
    ("cuda_graphs_oom", "graphs_captured", 4445962240),
    ("cuda_graphs_oom", "oom", 4445962240),
    ("cudnn_workspace", "after_benchmark_step", 6523191296),
    ("cudnn_workspace", "oom", 6523191296),
    ("dynamic_settings/max_split_128", "epoch1", 18484297728),
    ("dynamic_settings/max_split_512", "epoch2", 18484297728),
    ("dynamic_settings/roundup_4", "oom", 18484297728),
    ("dynamic_settings/gc_0.6", "oom", 18484297728),
    ("dynamic_settings/expandable_segments", "epoch2", 18484297728),
]


def _check(path, limit):
    snap = load_snapshot_file(path).snapshot
    rec = run_whatif(snap, limit, [""])[0]
    return snap, rec, rec.fidelity


@pytest.mark.parametrize(("folder", "stem", "limit"), CASES, ids=[f"{f}/{s}" for f, s, _ in CASES])
def test_recorded_configuration_reproduces_the_trace(folder, stem, limit):
    path = REAL / folder / f"{stem}.pickle.gz"
    snap, rec, fid = _check(path, limit)
    assert fid["segment_event_share"] >= 0.99, fid
    assert fid["reserved_within_5pct"], fid
    assert fid["max_reserved_deviation"] <= 0.05
    assert fid["alloc_address_share"] >= 0.99, fid
    # an OOM the recorded run hit is the request the model fails; a run that completed does not fail;
    # without any limit (no --limit, no OOM entry to take a device-bound one from) nothing is assessable
    if rec.limit_bytes is None:
        assert rec.predicted_oom is None and rec.verdict == "not_assessable" and "no limit" in rec.reason
        return
    assert rec.predicted_oom == bool(compile_trace(snap).recorded_oom_ops)
    if rec.predicted_oom:
        assert rec.fails_recorded_request is True
        assert rec.first_failure["at"] == "the recorded OOM request"


@pytest.mark.parametrize(("folder", "stem", "limit"), CAPTURED_CASES, ids=[f"{f}/{s}" for f, s, _ in CAPTURED_CASES])
def test_captured_traces_are_reproduced(folder, stem, limit):
    path = CAPTURED / folder / f"{stem}.pickle.gz"
    if not path.exists():
        pytest.fail(f"captured data missing: {path} (it ships in the repository)")
    snap, rec, fid = _check(path, limit)
    assert fid["segment_event_share"] == 1.0, fid
    assert fid["reserved_within_5pct"] and fid["max_reserved_deviation"] == 0.0, fid
    assert fid["alloc_address_share"] == 1.0, fid
    assert rec.predicted_oom == (bool(compile_trace(snap).recorded_oom_ops) if limit is not None else None)


def test_cudnn_empty_cache_calls_are_replayed_as_such():
    """cuDNN's plan search calls emptyCache() between workspace tries; the frames say so, and the replay
    frees the cache there instead of inside the next request."""
    path = CAPTURED / "cudnn_workspace" / "after_benchmark_step.pickle.gz"
    if not path.exists():
        pytest.fail(f"captured data missing: {path} (it ships in the repository)")
    from memq.analysis.allocator_model import OP_EMPTY_CACHE

    rep = compile_trace(load_snapshot_file(path).snapshot)
    assert rep.program.ops.count(OP_EMPTY_CACHE) >= 5


def test_private_pool_segments_count_against_the_limit():
    path = CAPTURED / "cuda_graphs_oom" / "oom.pickle.gz"
    if not path.exists():
        pytest.fail(f"captured data missing: {path} (it ships in the repository)")
    _snap, rec, fid = _check(path, 4445962240)
    assert rec.predicted_oom and rec.fails_recorded_request
    assert fid["segment_events_recorded"] == 123


def test_oom_replay_reproduces_the_release_before_the_oom():
    """frag_dynamic_1.15: the failing request frees two cached segments (18 MiB, 2 MiB) then fails."""
    _, rec, fid = _check(REAL / "frag_dynamic_1.15" / "oom.pickle.gz", 20244645632)
    assert fid["recorded_by_kind"] == {"segment_free": 2}
    assert fid["segment_events_matched"] == 2
    assert rec.fails_recorded_request is True
    assert rec.first_failure["requested_bytes"] == 4423680000


def test_capacity_replay_reproduces_release_and_retry():
    _, rec, fid = _check(REAL / "capacity" / "oom.pickle.gz", 17179869184)
    assert fid["segment_events_recorded"] == 117
    assert fid["segment_events_matched"] == 117
    assert rec.alloc_retries == 2  # the retry that succeeded and the one before the OOM


def test_without_limit_the_device_bound_limit_reproduces_the_external_oom():
    _, rec, fid = _check(REAL / "external" / "oom.pickle.gz", None)
    assert rec.predicted_oom and rec.fails_recorded_request
    assert fid["segment_event_share"] == 1.0
    assert any("device-bound limit" in n for n in rec.notes)


def test_expandable_start_state_is_rebuilt():
    snap = load_snapshot_file(REAL / "frag_dynamic_probe" / "epoch2.pickle.gz").snapshot
    rep = compile_trace(snap)
    assert rep.start_segments and all(s.expandable for s in rep.start_segments)
    assert rep.recorded_config.expandable_segments


def test_bench_trace_100k():
    _, rec, fid = _check(BENCH, None)
    assert fid["reserved_points_total"] > 60000
    assert fid["reserved_within_5pct"] and fid["alloc_address_share"] >= 0.99
