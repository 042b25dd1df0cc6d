"""The decoder and the analysis read a trace the same whatever the frames' sharing: torch's one dict
per distinct frame and one list per allocation read again by its frees, a list per entry, or every
list and frame dict its own object (benchmarks/trace_shapes.py builds each from the same real
recording). Only the cost may differ, never a figure of the result."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from memq.analysis import analyze
from memq.load import decode_snapshot_bytes

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("trace_shapes", ROOT / "benchmarks" / "trace_shapes.py")
trace_shapes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(trace_shapes)


def _result(shape: str, n: int) -> str:
    snap = decode_snapshot_bytes(trace_shapes.build(shape, n), digest=False).snapshot
    return json.dumps(analyze([snap]), sort_keys=True, default=str)


@pytest.mark.parametrize(("shared", "other"), [("python", "unshared"), ("cpp", "cpp_lists")])
def test_the_analysis_of_a_trace_does_not_depend_on_how_its_frames_are_shared(shared, other):
    n = 30_000  # the C++ recording repeated: each copy's addresses and times its own
    got = _result(shared, n)
    assert '"optimizer_steps"' in got and '"live_at_peak"' in got
    assert got == _result(other, n)


@pytest.mark.parametrize("path", [ROOT / "benchmarks" / "data" / "big.pickle.gz",
                                  ROOT / "tests" / "fixtures" / "captured" / "cudnn_workspace"
                                  / "after_benchmark_step.pickle.gz"])
def test_the_blocks_made_in_the_trace_are_the_same_from_the_replay_as_from_a_pass_of_their_own(path):
    """The timeline's replay leaves provenance the blocks still live at the trace's end and the
    entry that made each (one pass over a million events instead of two): the same map as a pass
    of its own, carried from the peak to the end."""
    from memq.analysis.per_snapshot import per_snapshot
    from memq.analysis.timeline import _made_live, made_live_in
    from memq.load import load_snapshot_file

    snap = load_snapshot_file(path).snapshot
    tl = per_snapshot(snap, "test")["timeline"]
    assert 0 <= tl["peak_index"] < len(snap.trace) - 1  # events after the peak: carried on
    made = made_live_in(snap)
    assert made and made == _made_live(snap.trace, {}, -1)
