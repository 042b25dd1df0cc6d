"""Prediction: the model, fed only the default run's full trace, must predict which allocator settings
ran out of memory on the GPU (tests/fixtures/captured/dynamic_settings: one dynamic-shape GPT job,
one per-process cap, one process per PYTORCH_CUDA_ALLOC_CONF; see that folder's README)."""

from __future__ import annotations

import bisect
import json

import pytest

from memq.analysis.whatif import compile_trace, run_whatif
from memq.load import load_snapshot_file
from tests.helpers import FIXTURES

D = FIXTURES / "captured" / "dynamic_settings"
STEP_LINE = ("/workspace/train.py", 726)  # `x = torch.randint(...)`: the first allocation of every step

def _runs() -> dict:
    out = {}
    for d in sorted(D.iterdir()) if D.exists() else []:
        if d.is_dir() and not d.name.startswith("_") and d.name != "probe" and (d / "meta.json").exists():
            out[d.name] = json.loads((d / "meta.json").read_text())
    return out


RUNS = _runs()


@pytest.fixture(scope="module")
def replay():
    snap = load_snapshot_file(D / "default" / "end.pickle.gz").snapshot
    cap = RUNS["default"]["cap_bytes"]
    confs = [""] + [m["alloc_conf"] for n, m in RUNS.items() if n != "default"]
    results = {r.conf: r for r in run_whatif(snap, cap, confs)}
    trace = snap.trace
    steps = [i for i, e in enumerate(trace) if e.action == "alloc" and e.frames
             and (e.frames[0].get("filename"), e.frames[0].get("line")) == STEP_LINE]
    return snap, results, steps


def test_the_default_trace_is_the_whole_job(replay):
    snap, results, steps = replay
    assert snap.trace[0].action == "segment_alloc"
    assert len(steps) == RUNS["default"]["epochs"] * RUNS["default"]["steps_per_epoch"]
    rec = results[""]
    assert rec.start_state == "recorded" and rec.start_reserved_bytes == 0
    assert rec.fidelity["segment_event_share"] == 1.0 and rec.fidelity["segment_events_recorded"] == 69
    assert rec.fidelity["reserved_within_5pct"] and rec.fidelity["alloc_address_share"] == 1.0


@pytest.mark.parametrize("name", sorted(RUNS))
def test_outcome_step_and_peak_are_predicted(replay, name):
    _snap, results, steps = replay
    meta = RUNS[name]
    r = results["" if name == "default" else meta["alloc_conf"]]
    assert r.predicted_oom == (meta["outcome"] == "oom"), (name, r.first_failure)
    assert r.confidence == "high"  # the trace starts at an empty allocator: no start-state guess
    if r.predicted_oom:
        step = bisect.bisect_right(steps, r.first_failure["trace_index"]) - 1
        assert step == meta["oom_step"]
    # peak reserved: within 1% of what the GPU run reached (up to its OOM)
    assert abs(r.peak_reserved_bytes - meta["max_reserved"]) <= 0.01 * meta["max_reserved"], name
    assert r.alloc_retries == meta["final_stats"]["num_alloc_retries"], name


def test_settings_that_fit_leave_headroom_and_those_that_fail_say_by_how_much(replay):
    _snap, results, _steps = replay
    for r in results.values():
        if r.predicted_oom:
            assert r.shortfall_bytes > 0
        else:
            assert r.headroom_bytes >= 0


@pytest.mark.parametrize("name", ["max_split_128", "max_split_512", "gc_0.6", "expandable_segments"])
def test_reserved_over_time_matches_each_settings_own_windows(replay, name):
    """Each setting's run kept 8000-entry windows at epoch ends: the model replaying the default trace
    under that setting must have the reserved bytes those windows recorded, entry by entry."""
    snap, _results, steps = replay
    from memq.analysis.alloc_conf import parse_alloc_conf
    from memq.analysis.whatif import _simulate

    rep = compile_trace(snap)
    ev2op = {e: i for i, e in enumerate(rep.op_event)}
    step_ops = [ev2op[i] for i in steps]
    sim = _simulate(rep, parse_alloc_conf(RUNS[name]["alloc_conf"]), RUNS["default"]["cap_bytes"], "recorded",
                    record=True)
    checked = 0
    for f in sorted((D / name).glob("epoch*.pickle.gz")):
        k = int(f.name[len("epoch")])
        w = compile_trace(load_snapshot_file(f).snapshot)
        nxt = 15 * (k + 1)
        end = step_ops[nxt] - 1 if nxt < len(step_ops) else len(rep.program.ops) - 1
        off = end - len(w.program.ops) + 1
        assert rep.program.size[off:end + 1] == w.program.size  # the same requests
        recorded = w.recorded_reserved_after()
        modelled = sim.reserved_after[off:end + 1]
        worst = max(abs(a - b) / a for a, b in zip(recorded, modelled, strict=True))
        assert worst <= 0.01, (name, f.name, worst)
        checked += 1
    assert checked >= 2
