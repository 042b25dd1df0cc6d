"""A weight's gradient made in autocast's precision, told from an activation's gradient in a trace of Python
frames alone (the agent records stacks="python"; autograd's thread has no Python frames at all).

Under bf16 autocast a linear layer's (or a convolution's) weight gradient is made in bfloat16, half the
float32 weight's gradient, and the same size at every batch. Autograd then casts it to float32
(ToCopyBackward0): an allocation of exactly twice its size, and the bfloat16 block is freed on the next op.
With zero_grad(set_to_none=True) that float32 copy is the .grad, kept until zero_grad frees it. An
activation's gradient cast the same way is consumed by the next op, not kept. So: a frameless block freed
right after an allocation of twice its size that is a gradient is a weight's gradient, held at its size.

Checked against the C++ frames of the hand recordings (stacks="all"): every block the rule holds is followed
by a ToCopyBackward0 allocation kept as .grad, and every such cast has its block held. The checkpointed bf16
GPT's recording with its C++ frames dropped (what the agent would record) predicts what the whole one does.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from memq.analysis import fit
from memq.analysis.allocator_model import OP_ALLOC, OP_FREE
from memq.load import load_snapshot_file
from memq.model import frame_file, frame_name

ROOT = Path(__file__).resolve().parents[2]
FAM = ROOT / "tests" / "fixtures" / "fit_families"
ONE = ROOT / "tests" / "fixtures" / "fit_one_step"


def _load(path: Path):
    return load_snapshot_file(str(path), max_bytes=1 << 32).snapshot


def python_only(snap):
    """The snapshot as the agent records it (stacks="python"): every stack's C++ frames dropped."""
    done: dict[int, list] = {}

    def keep(frames):
        if frames is None:
            return None
        if id(frames) not in done:
            done[id(frames)] = [f for f in frames if frame_file(f).endswith(".py")]
        return done[id(frames)]

    snap.traces = [[ev._replace(frames=keep(ev.frames)) for ev in t] for t in snap.traces]
    for seg in snap.segments:
        seg.frames = keep(seg.frames)
        for b in seg.blocks:
            b.frames = keep(b.frames)
    snap.memo.clear()
    return snap


@cache
def gpt(frames: str) -> fit.Measured:
    snap = _load(ONE / "hand" / "gpt_ckpt_bf16.pickle.gz")
    return fit.classify(python_only(snap) if frames == "python" else snap)


def gpt_errors(m: fit.Measured) -> dict[str, float]:
    runs = json.loads((ONE / "summary.json").read_text())["runs"]
    shapes = {"2x batch": (2, "b16-s256"), "4x batch": (4, "b32-s256"), "8x batch": (8, "b64-s256"),
              "2x length": (2, "b8-s512"), "4x length": (4, "b8-s1024")}
    return {lab: fit.predict(m, k).peak_reserved / runs[f"gpt_ckpt_bf16-{tag}"]["max_reserved"] - 1
            for lab, (k, tag) in shapes.items()}


def test_the_agents_recording_of_the_checkpointed_bf16_gpt_predicts_as_the_hand_recording(monkeypatch):
    """gpt_ckpt_bf16 with its C++ frames dropped: the same blocks held as where mm_mat2_backward names them
    (the tied head's 31.25 MiB bfloat16 gradient, the blocks' linears'), and the same peaks at 2x/4x the batch
    and length; -19.9% at 4x without the rule. 8x: -0.2% for 0.0%, from another rule (a Python-frame trace's
    autocast copies: the fused attention's 2 MiB output, half a 4 MiB weight, read as one)."""
    py, whole = gpt("python"), gpt("all")
    held = {h for h, k in enumerate(py.kinds) if k == fit.GRAD_TEMP}
    # every block the C++ frames hold is held without them; without them, the count rule
    # (GRAD_TEMP_PER_GRADIENT) also holds a few activation gradients of a gradient's size, which the frames
    # scale (they do not move these peaks)
    assert {h for h, k in enumerate(whole.kinds) if k == fit.GRAD_TEMP} <= held
    e, w = gpt_errors(py), gpt_errors(whole)
    for shape in ("2x batch", "4x batch", "2x length", "4x length"):
        assert e[shape] == pytest.approx(w[shape], abs=5e-4) and abs(e[shape]) < 5e-4, shape
    assert e["8x batch"] == pytest.approx(-0.002, abs=5e-4) and w["8x batch"] == pytest.approx(0.0, abs=5e-4)
    monkeypatch.setattr(fit, "_hold_cast_gradients", lambda *a: None)
    snap = python_only(_load(ONE / "hand" / "gpt_ckpt_bf16.pickle.gz"))
    assert not any(f for ev in snap.trace for f in ev.frames or () if not frame_file(f).endswith(".py"))
    off = gpt_errors(fit.classify(snap))
    assert off["4x batch"] == pytest.approx(-0.199, abs=1e-3) and off["4x length"] == pytest.approx(-0.199, abs=1e-3)


def classify_watching_the_cast_rule(snap, monkeypatch):
    """fit.classify(snap), and the handles _hold_cast_gradients held (its own, not the other rules')."""
    ran = fit._hold_cast_gradients
    held: list[int] = []

    def spy(prog, kinds, frameless):
        before = list(kinds)
        ran(prog, kinds, frameless)
        held.extend(h for h in range(len(kinds)) if kinds[h] != before[h])

    monkeypatch.setattr(fit, "_hold_cast_gradients", spy)
    return fit.classify(snap), held


@pytest.mark.parametrize("fam", ["vit_bf16", "unet_diff", "lora_gpt"])
def test_what_the_rule_holds_is_what_autograd_casts_to_a_grad(fam, monkeypatch):
    """In the hand recordings' C++ frames: the allocation just before each held block's free is autograd's
    ToCopyBackward0 (the float32 cast), and every ToCopyBackward0 allocation kept as a gradient has the block
    it was cast from held (by this rule or, of a gradient's size, already). None of an activation's gradient
    cast (ToCopyBackward0 too, not kept) is held by it."""
    snap = _load(FAM / "hand" / f"{fam}.pickle.gz")
    m, held = classify_watching_the_cast_rule(snap, monkeypatch)
    prog, trace = m.replay.program, snap.trace
    free_at = {h: i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)) if op == OP_FREE}
    size = {h: prog.size[i] for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)) if op == OP_ALLOC}

    def cast(i: int) -> bool:
        e = m.replay.op_event[i]
        return e >= 0 and any("ToCopyBackward0" in frame_name(f) for f in trace[e].frames or ())

    assert held and all(cast(free_at[h] - 1) for h in held)
    assert all(m.kinds[prog.hid[free_at[h] - 1]] == fit.GRADIENTS for h in held)  # kept: no activation's cast
    to_grad = [i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
               if op == OP_ALLOC and cast(i) and m.kinds[h] == fit.GRADIENTS]
    sources = [prog.hid[i + 1] for i in to_grad]
    assert all(prog.ops[i + 1] == OP_FREE and 2 * size[h] == prog.size[i]
               for i, h in zip(to_grad, sources, strict=True))
    assert all(m.kinds[h] == fit.GRAD_TEMP for h in sources)
    assert len(to_grad) == {"vit_bf16": 402, "unet_diff": 660, "lora_gpt": 384}[fam]  # 6 steps each


def test_the_agents_own_recording_finds_the_same_per_step():
    """vit_bf16's real agent recording (3 steps) holds 67 gradient temporaries a step, as its hand recording
    (6 steps) does: 59 a step by this rule (the weights' and biases' bfloat16 gradients), 8 (the qkv weights',
    of another gradient's size) as before."""
    from tests.analysis.agent_data import spool_run

    snaps, _c, _t = spool_run(next((FAM / "spools" / "vit_bf16" / "defaults").iterdir()))
    agent = fit.classify(snaps[fit.choose(snaps)[0]])
    hand = fit.classify(_load(FAM / "hand" / "vit_bf16.pickle.gz"))
    assert agent.kinds.count(fit.GRAD_TEMP) * 2 == hand.kinds.count(fit.GRAD_TEMP)


def test_a_python_frame_dump_after_the_first_backward_holds_them_too(monkeypatch):
    """The same rule on a dump taken at the end of the first backward (fit._one_step, the rest of the step
    inferred), its C++ frames dropped: 4x the batch +0.7% (the whole dump with its frames: 0.0%); -19.2%
    without the rule."""
    path = ONE / "dumps" / "gpt_ckpt_bf16-dump.backward.pickle.gz"
    assert gpt_errors(fit.classify(_load(path), optimizer="adamw"))["4x batch"] == pytest.approx(0.0, abs=5e-4)
    e = gpt_errors(fit.classify(python_only(_load(path)), optimizer="adamw"))
    assert e["4x batch"] == pytest.approx(0.0072, abs=5e-4) and e["4x length"] == pytest.approx(0.0072, abs=5e-4)
    monkeypatch.setattr(fit, "_hold_cast_gradients", lambda *a: None)
    off = gpt_errors(fit.classify(python_only(_load(path)), optimizer="adamw"))
    assert off["4x batch"] == pytest.approx(-0.192, abs=1e-3)


def test_an_einsum_weights_gradient_is_held_where_grad_is_a_copy_of_the_cast(monkeypatch):
    """A published recording (tests/fixtures/public_snapshots/cs336_d512_3steps_ctx200_bf16: the CS336
    TransformerLM, d 512 x 4 layers, its linears einsums, three steps under bf16 autocast, stacks="all"): the
    weight's bfloat16 gradient is cast to float32 with the bmm's strides, so AccumulateGrad allocates .grad as
    a copy on the op after the bfloat16 block's free and then frees the cast. Held: 29 a step, the 4 layers'
    7 linears and the head, every one's cast ToCopyBackward0 and its .grad AccumulateGrad's in the C++ frames
    (the last step's .grad is never freed in the trace: kept)."""
    snap = _load(ROOT / "tests" / "fixtures" / "public_snapshots" / "cs336_d512_3steps_ctx200_bf16.pickle.gz")
    m, held = classify_watching_the_cast_rule(snap, monkeypatch)
    prog, trace = m.replay.program, snap.trace
    free_at = {h: i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)) if op == OP_FREE}
    size = {h: prog.size[i] for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)) if op == OP_ALLOC}

    def named(i: int, what: str) -> bool:
        e = m.replay.op_event[i]
        return e >= 0 and any(what in frame_name(f) for f in trace[e].frames or ())

    assert m.steps == 3 and len(held) == 3 * 29
    assert sorted({size[h] for h in held}) == [512 * 512 * 2, 1344 * 512 * 2, 10_000 * 512 * 2]
    assert all(named(free_at[h] - 1, "ToCopyBackward0") and named(free_at[h] + 1, "AccumulateGrad") for h in held)
