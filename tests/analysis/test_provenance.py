"""Composition and phase by provenance on snapshots other projects published, and one class per block
on every screen (ARCHITECTURE.md "Composition and phase")."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from memq.analysis import analyze
from memq.analysis import frames as fr
from memq.analysis.provenance import block_classes
from memq.load import load_snapshot_file
from memq.web.snapshot_view import snapshot_view

HERE = Path(__file__).resolve().parent.parent / "fixtures"
PUB = HERE / "public_snapshots"
TRUTH = json.loads((PUB / "truth.json").read_text())["snapshots"]
GiB = 2**30


def _snap(path):
    s = load_snapshot_file(path)
    return getattr(s, "snapshot", s)


def _right_share(comp: dict, truth: dict, live: int) -> float:
    want = {k: truth.get(k, 0) for k in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE)}
    rest_pred = live - sum(comp.get(k, 0) for k in want)
    right = sum(min(comp.get(k, 0), v) for k, v in want.items()) + min(rest_pred, live - sum(want.values()))
    return right / live


@pytest.mark.parametrize("name", ["cs336_2.7b_ctx128_fullstep", "cs336_2.7b_ctx512_forward"])
def test_public_snapshot_composition_by_provenance(name):
    """A 3.4B-parameter model's AdamW full step (stacks="all", recorded after the model was made) and a
    forward-only snapshot: parameters predate the trace, gradients come from the autograd engine."""
    t = TRUTH[name]
    snap = _snap(Path(__file__).resolve().parent.parent.parent / t["path"])
    out = analyze([snap])
    comp = out["composition"]
    live = out["metrics"]["active_bytes"]
    assert comp["unknown"] == 0 and comp["other"] == 0
    assert _right_share(comp, t, live) >= 0.95
    if "gradients" in t:
        assert comp["gradients"] == pytest.approx(t["gradients"], rel=0.02)
    else:
        assert comp["gradients"] == 0
        assert out["details"]["timeline"]["peak_phase"] == "forward"


def test_variable_type_dispatch_is_forward_not_backward():
    """`torch::autograd::VariableType::*` frames are forward dispatch; the engine's are backward."""
    fwd = [{"name": "torch::autograd::VariableType::(anonymous namespace)::bmm(c10::DispatchKeySet)",
            "filename": "VariableType_3.cpp", "line": 1}]
    bwd = fwd + [{"name": "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
                  "filename": "??", "line": 0},
                 {"name": "torch::autograd::Engine::evaluate_function(...)", "filename": "??", "line": 0}]
    assert not fr.is_backward(fwd)
    assert fr.phase_of(fwd) is None
    assert fr.is_backward(bwd)


def test_segment_map_and_composition_agree_block_by_block():
    """The 4.12 GiB frameless block of the frag_dynamic OOM was `other` on the segment map and `unknown`
    in the composition: one function now decides, and both screens read it."""
    snap = _snap(HERE / "real/frag_dynamic_1.15/oom.pickle.gz")
    out = analyze([snap])
    view = snapshot_view(snap, out, title="t")
    classes = block_classes(snap)
    by = Counter()
    big = []
    for seg in view["segments"]:
        for b in seg["blocks"]:
            if b["c"] is None:
                continue
            by[b["c"]] += b["s"]
            assert b["c"] == classes[seg["address"] + b["o"]].cls
            if b["s"] > 4 * GiB:
                big.append(b["c"])
    assert big and set(big) == {fr.ACTIVATIONS}
    assert {k: v for k, v in by.items() if v} == {k: v for k, v in out["composition"].items() if v}
