"""memq fit's program against the real one at a larger shape: hand recordings (stacks="all", 3 steps) of
three of the new families at 4x and 8x their recorded batch (tests/fixtures/fit_one_step/big, README there),
beside their base recordings (tests/fixtures/fit_one_step/hand). What the rules read from the base trace
is what the real large run allocates: reductions' staging buffers grow to REDUCE_STAGING_MAX, activation
gradients of a gradient's size scale, weight gradients' temporaries do not."""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

from memq.analysis import fit
from memq.load import load_snapshot_file
from memq.model import frame_name

ONE = Path(__file__).resolve().parents[1] / "fixtures" / "fit_one_step"
BIG = ONE / "big"


@cache
def snap(path: Path):
    return load_snapshot_file(str(path), max_bytes=1 << 32).snapshot


@cache
def measured(path: Path) -> fit.Measured:
    return fit.classify(snap(path))


def sizes(m: fit.Measured, kind: int) -> Counter:
    prog = m.replay.program
    return Counter(s for op, h, s in zip(prog.ops, prog.hid, prog.size, strict=True)
                   if op == fit.OP_ALLOC and m.kinds[h] == kind)


def frames_of(m: fit.Measured, s, kind: int) -> list[list[str]]:
    prog, trace = m.replay.program, s.trace
    return [[frame_name(f) for f in trace[m.replay.op_event[i]].frames]
            for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
            if op == fit.OP_ALLOC and m.kinds[h] == kind and m.replay.op_event[i] >= 0]


def test_the_fixture_is_what_the_readme_says():
    for name in ("mlp_mixer-hand-b128", "convnext_ln-hand-b128", "vae_conv-hand-b128"):
        res = json.loads((BIG / f"{name}.json").read_text())
        assert res["mode"] == "hand" and res["steps"] == 3 and res["device"] == "NVIDIA H200"
        assert res["torch"] == "2.11.0+cu130"
    assert sum(p.stat().st_size for p in BIG.iterdir()) < 300_000


@pytest.mark.parametrize("fam", ["mlp_mixer", "convnext_ln"])
def test_the_pattern_finds_the_reduction_kernels_buffers(fam):
    """Every block the four-request pattern marks is the reduction kernel's (its C++ frames say so)."""
    s = snap(ONE / "hand" / f"{fam}.pickle.gz")
    m = measured(ONE / "hand" / f"{fam}.pickle.gz")
    found = frames_of(m, s, fit.REDUCE_BUFFER)
    assert len(found) >= 90
    assert all(any("gpu_reduce_kernel" in n for n in names) for names in found)


@pytest.mark.parametrize("fam,k", [("mlp_mixer", 8), ("convnext_ln", 8)])
def test_reduction_buffers_grow_to_the_cap_as_in_the_real_run(fam, k):
    """The base's staging buffers at k x, by REDUCE_STAGING_MAX, are the sizes the real run at k x allocates
    (the real run has more: reductions too small to split at the base split at 8x)."""
    base = sizes(measured(ONE / "hand" / f"{fam}.pickle.gz"), fit.REDUCE_BUFFER)
    real = sizes(measured(BIG / f"{fam}-hand-b{16 * k}.pickle.gz"), fit.REDUCE_BUFFER)
    predicted = {fit.reduce_buffer_size(s, k) for s in base if s >= fit.MIN_BYTES}
    assert predicted <= set(real)
    assert fit.REDUCE_STAGING_MAX in predicted and max(real) <= fit.REDUCE_STAGING_MAX + (1 << 20)
    linear = {s * k for s in base if s >= fit.MIN_BYTES}
    assert not linear <= set(real)  # scaled without the cap, the largest would not be there


def test_activation_gradients_scale_and_weight_gradients_temporaries_do_not():
    """The VAE's 2 MiB activation gradients (SiluBackward0, ExpBackward0, ... and cuDNN's backward_input) were
    read as temporaries of its 2 MiB weights' gradients and held; at 4x they are 8 MiB. ConvNeXt's bf16
    weight gradients (mm_mat2_backward, backward_weight) stay gradient-sized temporaries, held, as in its
    real 8x run."""
    vae = measured(ONE / "hand" / "vae_conv.pickle.gz")
    assert fit.GRAD_TEMP not in vae.kinds
    for path, steps, size in ((ONE / "hand" / "vae_conv.pickle.gz", 6, 2 << 20),
                              (BIG / "vae_conv-hand-b128.pickle.gz", 3, 8 << 20)):
        m, s = measured(path), snap(path)
        prog = m.replay.program
        grads = [i for i, (op, sz) in enumerate(zip(prog.ops, prog.size, strict=True))
                 if op == fit.OP_ALLOC and sz == size and m.replay.op_event[i] >= 0
                 and fit.activation_gradient([frame_name(f) for f in s.trace[m.replay.op_event[i]].frames])]
        assert m.steps == steps and len(grads) == 15 * steps  # 15 a step at 2 MiB; the same 15 at 8 MiB at 4x
    cnx = measured(ONE / "hand" / "convnext_ln.pickle.gz")
    held = frames_of(cnx, snap(ONE / "hand" / "convnext_ln.pickle.gz"), fit.GRAD_TEMP)
    # 102 by the count and the frames of autograd's thread, the rest by `mm_mat2_backward` and the float32 cast
    # that follows each (_hold_weight_gradients, _hold_cast_gradients)
    assert len(held) == 492 and all(fit.activation_gradient(names) is not True for names in held)
    real = sizes(measured(BIG / "convnext_ln-hand-b128.pickle.gz"), fit.GRAD_TEMP)
    assert set(sizes(cnx, fit.GRAD_TEMP)) <= set(real)


def test_without_cxx_frames_their_number_tells_them():
    """The agent's recordings (Python frames: the engine's blocks have none) read the same by count: the
    ResNet's BN/ReLU gradients (15-31 a step for 1-7 gradients of their size) scale, as the hand recording's
    C++ frames say; the tied-embedding GPT's 2 a step for its one gradient stay held (tests/fixtures/fit)."""
    from tests.analysis.test_fit import measured as inhouse
    from tests.analysis.test_fit_families import recordings

    agent = recordings("resnet_bn")["agent"]
    assert fit.GRAD_TEMP not in agent.kinds and fit.GRAD_TEMP not in recordings("resnet_bn")["hand"].kinds
    gpt_m = inhouse("gpt_m")
    held = [h for h, kind in enumerate(gpt_m.kinds) if kind == fit.GRAD_TEMP]
    assert len(held) == 2 * gpt_m.steps


def test_activation_gradient_reads_the_frames():
    node = "torch::autograd::generated::{}::apply(std::vector<at::Tensor> &&)"
    assert fit.activation_gradient([node.format("SiluBackward0")])
    assert fit.activation_gradient(["at::native::cudnn_convolution_backward_input(...)",
                                    node.format("ConvolutionBackward0")])
    assert fit.activation_gradient([node.format("ConvolutionBackward0")]) is None  # which operand: unknown
    assert fit.activation_gradient(["torch::autograd::generated::details::mm_mat2_backward(...)",
                                    node.format("AddmmBackward0")]) is False
    assert fit.activation_gradient(["torch::autograd::generated::details::mm_mat1_backward(...)",
                                    node.format("AddmmBackward0")])
    assert fit.activation_gradient(["at::native::empty_cuda(...)"]) is None  # no node: by their number


def test_the_new_families_predictions():
    """Whole hand recordings against the real plain runs (tests/fixtures/fit_one_step/summary.json)."""
    runs = json.loads((ONE / "summary.json").read_text())["runs"]
    want = {"convnext_ln": (16, 128, {2: 0.0, 4: -0.024, 8: 0.083}),
            "mlp_mixer": (16, 224, {2: 0.0, 4: 0.015, 8: -0.003}),
            "vae_conv": (32, 64, {2: -0.079, 4: -0.115, 8: -0.097})}
    for fam, (b0, size, errs) in want.items():
        m = measured(ONE / "hand" / f"{fam}.pickle.gz")
        for k, e in errs.items():
            real = runs[f"{fam}-b{b0 * k}-s{size}"]["max_reserved"]
            assert (fit.predict(m, k).peak_reserved - real) / real == pytest.approx(e, abs=0.001), (fam, k)
