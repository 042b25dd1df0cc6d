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
