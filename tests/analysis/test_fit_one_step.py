"""`memq fit` from one step or part of one: the real whole-run hand recordings of tests/fixtures/fit_families
(stacks="all", from the model's build) cut where a snapshot dumped in the first step would be (the trace up
to the cut, the blocks live at the cut: tests/analysis/one_step.py), against the real runs' peaks at 2x and
4x the batch. Figures are benchmarks/RESULTS.md's "memq fit from one step" (`python benchmarks/fit_one_step.py`)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from memq.analysis import fit
from memq.analysis.fit import Question
from memq.load import load_snapshot_file
from memq.pipeline.fit import answer_for
from memq.render.fit_text import render_fit
from tests.analysis.one_step import cut, cut_points

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fit_families"
SUMMARY = json.loads((FIX / "summary.json").read_text())
GiB = 1 << 30


@cache
def whole(fam: str):
    return load_snapshot_file(str(FIX / "hand" / f"{fam}.pickle.gz"), max_bytes=1 << 32).snapshot


@cache
def part(fam: str, where: str):
    snap = whole(fam)
    return cut(snap, cut_points(snap)[where])


def real(fam: str, k: int) -> int:
    spec = SUMMARY["families"][fam]["spec"]
    return SUMMARY["families"][fam]["runs"][f"{fam}-b{spec['batch'] * k}-s{spec['size']}"]["max_reserved"]


def test_a_cut_snapshot_holds_no_optimizer_step_and_the_live_blocks_of_its_moment():
    snap = whole("vit_bf16")
    c = part("vit_bf16", "backward")
    assert fit.optimizer_steps(c.trace) == 0 and fit.optimizer_steps(snap.trace) == 6
    live = sum(b.size for s in c.segments for b in s.blocks if b.state != "inactive")
    assert 0 < live < sum(b.size for s in snap.segments for b in s.blocks if b.state != "inactive") + 400 * (1 << 20)


@pytest.mark.parametrize("fam", ["vit_bf16", "unet_diff", "lora_gpt"])
def test_forward_and_backward_of_step_one_predicts_two_and_four_times_the_batch_within_three_percent(fam):
    """Before: 'the trace holds 0 optimizer step(s)', refused. The gradients are what the backward kept; the
    optimizer state (AdamW: 2x them) and a second step are inferred. lora_gpt's state is the adapters' alone
    (its frozen base has no gradients), which only the backward shows."""
    opt = SUMMARY["families"][fam]["spec"]["opt"]
    m = fit.classify(part(fam, "backward"), optimizer=opt)
    assert m.partial == fit.PARTIAL_BACKWARD and m.steps == 0 and not m.optimizer_assumed
    for k in (2, 4):
        err = fit.predict(m, k, opt).peak_reserved / real(fam, k) - 1
        assert abs(err) <= 0.03, (fam, k, err)


def test_the_whole_step_from_its_backward_agrees_with_the_whole_run_trace():
    """seq2seq (exact from the six-step trace since reductions' staging buffers stop at REDUCE_STAGING_MAX;
    +9-11% before): the step-one cut predicts the same peak allocated within 1% and its peak reserved within
    0.1% at 4x."""
    opt = "adamw"
    m_full, m_cut = fit.classify(whole("seq2seq")), fit.classify(part("seq2seq", "backward"), optimizer=opt)
    a, b = fit.predict(m_full, 4.0), fit.predict(m_cut, 4.0, opt)
    assert abs(b.peak_allocated / a.peak_allocated - 1) < 0.01
    assert abs(b.peak_reserved / a.peak_reserved - 1) < 0.001


def test_forward_alone_infers_the_backward_and_says_so():
    """seq2seq's forward alone: the backward played back from the forward's memory with the chain of
    activation gradients (without the chain: -10%); within 3% at 2x and 4x."""
    m = fit.classify(part("seq2seq", "forward"), optimizer="adamw")
    assert m.partial == fit.PARTIAL_FORWARD and m.margin == fit.FORWARD_ONLY_MARGIN
    for k in (2, 4):
        assert abs(fit.predict(m, k, "adamw").peak_reserved / real("seq2seq", k) - 1) <= 0.03


def test_the_answer_names_what_was_inferred_and_an_assumed_optimizer():
    doc = answer_for(part("seq2seq", "backward"), "cut", Question(batch=32, from_batch=16, limit=8 * GiB,
                                                                  limit_source="--limit"), (None, None))
    assert doc["measured"]["partial_step"] == "forward and backward" and doc["measured"]["optimizer_assumed"]
    assert any("optimizer state inferred from parameters for adamw (assumed" in x for x in doc["inferred"])
    assert doc["low"] == int(doc["peak_bytes"] * (1 - fit.FIT_MARGIN))
    text = render_fit(doc)
    assert f"  interval +/-{fit.FIT_MARGIN:.0%}: the trace shows no size a library chooses by shape" in text
    assert "inferred: optimizer state inferred from parameters for adamw" in text
    assert "the trace holds the first step's forward and backward only" in text
    doc = answer_for(part("resnet_bn", "forward"), "cut", Question(optimizer="sgd_momentum"), (None, None))
    assert not doc["measured"]["optimizer_assumed"] and doc["optimizer"]["predicted"] == "sgd_momentum"
    assert any(x.startswith("backward (the forward's memory played backwards") for x in doc["inferred"])
    assert any("for sgd_momentum (named): 1x" in x for x in doc["inferred"])


def test_the_optimizer_asked_for_sizes_the_inferred_state():
    c = part("vit_bf16", "backward")
    sgd, adam = (fit.classify(c, optimizer=o) for o in ("sgd", "adamw"))
    assert sgd.state_bytes == 0 and adam.state_bytes == 2 * adam.gradient_bytes > 0
    assert fit.predict(sgd, 2.0, "sgd").peak_allocated < fit.predict(adam, 2.0, "adamw").peak_allocated


def test_a_cut_before_the_first_forward_is_refused_with_the_reason():
    """The model's build alone (its parameters made, no forward yet): nothing of a step to replay."""
    early = cut(whole("vit_bf16"), 50)
    with pytest.raises(fit.NotAssessable, match="no forward pass"):
        fit.classify(early)


@cache
def inhouse(model: str):
    from benchmarks.fit_calibration import full_raw
    from memq.snapshot import parse_snapshot

    return parse_snapshot(full_raw(model))


@pytest.mark.rule("ONE_STEP_REPEATS")
def test_two_more_steps_reach_the_peak_the_whole_trace_reaches(monkeypatch):
    """gpt_m (tests/fixtures/fit) at 4x the batch peaks in its third step: from its first forward and
    backward, one more step misses by 6% of the whole trace's prediction, two match it."""
    snap = inhouse("gpt_m")
    whole_peak = fit.predict(fit.classify(snap), 4.0).peak_reserved
    c = cut(snap, cut_points(snap)["backward"])
    got = {}
    for n in (fit.ONE_STEP_REPEATS - 1, fit.ONE_STEP_REPEATS):
        monkeypatch.setattr(fit, "ONE_STEP_REPEATS", n)
        got[n] = fit.predict(fit.classify(c, optimizer="adamw"), 4.0, "adamw").peak_reserved / whole_peak - 1
    assert got[1] < -0.05 and abs(got[2]) < 0.005, got


@pytest.mark.rule("CUBLAS_WORKSPACE_BYTES")
def test_the_forward_block_of_cublas_workspace_size_is_held_not_scaled(monkeypatch):
    """gpt_s (Python frames only): the first 32 MiB block the step keeps is cuBLAS's workspace (and the
    1 MiB one after it at the same call site cuBLASLt's); a size 512 bytes off is an activation."""
    c = cut(inhouse("gpt_s"), cut_points(inhouse("gpt_s"))["backward"])

    def held(size: int) -> int:
        monkeypatch.setattr(fit, "CUBLAS_WORKSPACE_BYTES", size)
        m = fit.classify(c, optimizer="adamw")
        sizes = {}
        for op, h, s in zip(m.replay.program.ops, m.replay.program.hid, m.replay.program.size, strict=True):
            if op == 0 and m.kinds[h] == fit.WORKSPACE:
                sizes[s] = sizes.get(s, 0) + 1
        return sum(s * n for s, n in sizes.items() if s in (32 << 20, 1 << 20))

    assert held(32 << 20) == (32 << 20) + (32 << 20) + (1 << 20)  # the forward's two, the engine thread's one
    for off in (32 << 20) - 512, (32 << 20) + 512:
        assert held(off) == 32 << 20  # only the engine thread's (not of a parameter's size)


ONE = Path(__file__).resolve().parents[1] / "fixtures" / "fit_one_step"


@cache
def dump(fam: str, where: str):
    return load_snapshot_file(str(ONE / "dumps" / f"{fam}-dump.{where}.pickle.gz"), max_bytes=1 << 32).snapshot


@pytest.mark.parametrize("fam", ["vit_bf16", "unet_diff"])
def test_a_real_dump_at_the_end_of_the_first_backward_predicts_within_three_percent(fam):
    """`_snapshot()` taken on the H200 right after the first `loss.backward()` (benchmarks/gpu/
    fit_one_step_capture.py), not a cut: the same prediction as the cut of the whole recording, and within
    3% of the real peak at 2x and 4x the batch."""
    opt = SUMMARY["families"][fam]["spec"]["opt"]
    real_dump = fit.classify(dump(fam, "backward"), optimizer=opt)
    derived = fit.classify(part(fam, "backward"), optimizer=opt)
    assert fit.optimizer_steps(dump(fam, "backward").trace) == 0
    for k in (2, 4):
        p = fit.predict(real_dump, k, opt).peak_reserved
        assert p == fit.predict(derived, k, opt).peak_reserved
        assert abs(p / real(fam, k) - 1) <= 0.03


def test_a_real_forward_dump_is_read_as_a_forward_alone():
    m = fit.classify(dump("resnet_bn", "forward"), optimizer="sgd_momentum")
    assert m.partial == fit.PARTIAL_FORWARD and m.margin == fit.FORWARD_ONLY_MARGIN
    assert m.state_bytes == m.gradient_bytes > 0  # SGD momentum: one copy, from the parameters


def test_four_new_families_judged_once():
    """The fresh held-back set (not among the ten, captured after the tuning: tests/fixtures/fit_one_step),
    judged once as it is. The real dumps at the end of the first backward predict what the whole hand
    recording predicts; against the real runs, first judged: 9 of 14 whole-trace predictions inside FIT_MARGIN
    (12%; convnext_ln 8x +21.6%, gpt_ckpt_bf16 4x -19.9%, vae_conv 4x -19.4% and 8x -14.8% outside). Since a
    weight's gradient made under autocast is held, reductions' staging buffers stop at REDUCE_STAGING_MAX and
    activation gradients are told from weights' gradients (causes found on the larger shapes' real programs,
    tests/analysis/test_fit_sequence.py, test_fit_big_shapes.py): 14 of 14, gpt_ckpt_bf16 exact at every
    shape, convnext_ln 8x +8.3%, mlp_mixer within 1.5%, vae_conv 4x -11.5% the worst. Each inside its own
    interval since it is per trace: gpt_ckpt_bf16's +/-3% (its own ops), the three convolutional ones' +/-13%."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import fit_one_step as bench

    rows = [r for r in bench.rows(list(bench.dump_cases("new"))) if "err" in r]
    back = [r for r in rows if r["cut"] == "backward"]
    assert len(back) == 14 and all(abs(r["vs_whole"]) < 1e-3 for r in back)
    inside = sum(abs(r["whole_err"]) <= r["whole_margin"] for r in back)
    assert inside == 14
    assert {r["name"]: r["whole_margin"] for r in back} == {
        "convnext_ln": fit.FIT_MARGIN_LIBRARY, "mlp_mixer": fit.FIT_MARGIN_LIBRARY, "vae_conv": fit.FIT_MARGIN_LIBRARY,
        "gpt_ckpt_bf16": fit.FIT_MARGIN}
    assert all(r["margin"] == r["whole_margin"] for r in back)  # the dump after the backward: the whole trace's
    worst = max(back, key=lambda r: abs(r["whole_err"]))
    err = {(r["name"], r["shape"]): r["whole_err"] for r in back}
    assert (worst["name"], worst["shape"]) == ("vae_conv", "4x batch")
    assert worst["whole_err"] == pytest.approx(-0.115, abs=0.001)
    assert all(abs(r["whole_err"]) < 1e-3 for r in back if r["name"] == "gpt_ckpt_bf16")
    assert err[("convnext_ln", "8x batch")] == pytest.approx(0.083, abs=0.001)
    assert max(abs(err[("mlp_mixer", s)]) for s in ("2x batch", "4x batch", "8x batch")) < 0.016


def test_a_runs_own_curve_reads_whole_steps_and_says_why_not_part_of_one():
    c = dump("vit_bf16", "backward")
    assert fit.own_curve(c) is None
    assert "first step's forward and backward only" in fit.own_curve_reason(c)
    assert fit.own_curve(whole("vit_bf16")) is not None


def test_the_new_families_largest_batch_judged_once(capsys):
    """Under a cap halfway between the 4x and 8x peaks, bisected by real capped runs on the H200: first judged,
    exact for convnext_ln (95) only, gpt_ckpt_bf16 predicted at 52 (45-58) where 42 runs out of memory (its
    -19.9% at 4x). Now exact for convnext_ln, mlp_mixer (96) and gpt_ckpt_bf16 (41), vae_conv's range holding
    the truth (216 for 221). The dump after the first backward answers as the whole recording does."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import fit_one_step as bench

    bench.largest_rows()
    out = capsys.readouterr().out
    # the ranges: the cap -/+ each recording's margin (13% for the convolutional ones, 3% for the GPT)
    assert "| convnext_ln | 1.564 GiB | 95 | 95 (84-117) | 95 (85-120) |" in out
    assert "| gpt_ckpt_bf16 | 6.248 GiB | 41 | 41 (40-42) | 41 (40-42) |" in out
    assert "| mlp_mixer | 4.885 GiB | 96 | 96 (83-111) | 96 (83-111) |" in out
    assert "largest batch exact 6/8, inside its range 8/8" in out
