"""memq fit's prediction (profiler/analysis/fit.py) on the H200 calibration set (tests/fixtures/fit):
one run measured at a small batch, the real runs at 2x-8x the batch and 2x-4x the length, and the real
largest batch under a cap (the next larger ran out of memory for real). Fails when a prediction drifts
past the interval, and on each rule's boundary."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from memq.analysis import fit
from tests.analysis.agent_data import spool_run

# The five models' bar (their largest error is 1.0%: benchmarks/RESULTS.md "memq fit"); the interval memq fit
# states is per trace (rules.FIT_MARGIN for the GPTs, rules.FIT_MARGIN_LIBRARY for the CNN's convolutions).
FIVE_BAR = 0.03
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "fit"
TRUTH = json.loads((FIX / "truth.json").read_text())
MODELS = sorted(TRUTH)


def base(model: str) -> dict:
    return next(v for k, v in TRUTH[model]["runs"].items() if k.endswith("-defaults"))


@cache
def traced(model: str):
    snaps, _ctx, _trig = spool_run(next((FIX / model / "defaults").iterdir()))
    return next(s for s in snaps if s.trace)


def measured(model: str) -> fit.Measured:
    return fit.classify(traced(model))


def shapes():
    for model in MODELS:
        b0, t0 = base(model)["batch"], base(model)["seq"]
        for k in (2, 4, 8):
            yield model, k, f"{model}-b{b0 * k}-t{t0}"
        if model != "cnn":
            for k in (2, 4):
                yield model, k, f"{model}-b{b0}-t{t0 * k}"


@pytest.mark.parametrize(("model", "k", "key"), list(shapes()))
def test_peak_reserved_within_the_interval_of_the_real_run(model, k, key):
    real = TRUTH[model]["runs"][key]["max_reserved"]
    got = fit.predict(measured(model), k).peak_reserved
    assert abs(got - real) <= FIVE_BAR * real, f"{key}: predicted {got}, real {real}"


@pytest.mark.parametrize("model", MODELS)
def test_largest_batch_under_the_cap_is_the_real_one(model):
    cap = TRUTH[model]["cap"]
    m, b0 = measured(model), base(model)["batch"]
    got = fit.largest_unit(m, b0, cap["cap_bytes"])
    assert cap["next_outcome"] == "oom"
    # a known miss: the CNN one short (64 for 65) since its 16,777,631-byte workspace, 415 bytes from an
    # activation's size and seen at batches 8 and 32 only (cnn_batches), scales (WORKSPACE_NEAR);
    # the range under the limit -/+ the margin holds the truth
    assert got == cap["max_batch"] - (model == "cnn")
    lo = fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 - m.margin)))
    hi = fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 + m.margin)))
    assert lo <= cap["max_batch"] <= hi


def test_workspace_boundary():
    """An odd byte count of at least MIN_BYTES with no frames is a workspace; just under the size, an
    even count, or an allocation with Python frames is not."""
    assert fit.is_workspace(fit.MIN_BYTES + 1)
    assert not fit.is_workspace(fit.MIN_BYTES - 1)
    assert not fit.is_workspace(fit.MIN_BYTES + 2)
    m = measured("cnn")
    prog, trace = m.replay.program, traced("cnn").trace
    held = {m.replay.program.size[i] for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
            if op == fit.OP_ALLOC and m.kinds[h] == fit.WORKSPACE}
    # odd sizes by fit's own rule; the one even one is the cuBLAS workspace still live at the snapshot,
    # which the composition (provenance.block_classes) names so and the peak's composition with it
    assert 8651487 in held and all(s % 2 for s in held - {32 << 20})
    assert all(not trace[m.replay.op_event[i]].frames for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
               if op == fit.OP_ALLOC and m.kinds[h] == fit.WORKSPACE)
    # the one within WORKSPACE_NEAR of an activation's size scales (it is not among the sizes that recur
    # at every batch: test_the_workspace_sizes_recur_at_every_batch)
    scaled = {prog.size[i] for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
              if op == fit.OP_ALLOC and m.kinds[h] == fit.INPUT and fit.is_workspace(prog.size[i])
              and not trace[m.replay.op_event[i]].frames}
    assert scaled == {16777631}


def test_the_workspace_sizes_recur_at_every_batch():
    """The source of WORKSPACE_ODD: the CNN at batches 8-64, each with the agent (cnn_batches)."""
    sizes = []
    for b in (8, 16, 32, 64):
        snaps, _c, _t = spool_run(next((FIX / "cnn_batches" / "spool" / f"b{b}").iterdir()))
        trace = next(s for s in snaps if s.trace).trace
        sizes.append({ev.size for ev in trace if ev.action == "alloc" and not ev.frames and fit.is_workspace(ev.size)})
    common = set.intersection(*sizes)
    assert {8651487, 8258199, 7078479, 4260559, 2065047} <= common
    assert 16777631 in sizes[0] and 16777631 not in common  # the one near an activation (scaled) changes


def test_the_measured_shape_reports_what_the_run_reserved():
    for model in MODELS:
        assert fit.predict(measured(model), 1.0).peak_reserved == base(model)["max_reserved"], model


def test_autocast_copies_are_found_on_the_bf16_run_only():
    shares = {m: measured(m).cast_share for m in MODELS}
    assert shares["gpt_bf16"] >= fit.CAST_COVERAGE
    assert all(v < fit.CAST_COVERAGE for m, v in shares.items() if m != "gpt_bf16"), shares


def _run_at_one_line(py_files: list[str]) -> list:
    """An op's allocations at one line: a 2 MiB block, its 64 KiB statistics, then the op's last output."""
    from memq.model import TraceEvent

    frames = [{"filename": f, "line": 10 + i, "name": "call" if "torchinductor" in f else "forward"}
              for i, f in enumerate(py_files)]
    return [TraceEvent("alloc", 0x1000 * (i + 1), size, 0, None, frames)
            for i, size in enumerate((2 << 20, 64 << 10, 256))]


def test_a_compiled_graph_makes_no_autocast_copies():
    """The call-site reading of autocast's copies skips what a torch.compile'd graph allocates (its casts
    are the graph's own conversions): the same run of allocations at one line is a copy in eager code."""
    site = "/srv/torch/lib/python3.12/site-packages/torch/"
    eager = ["/job/model.py", site + "nn/modules/module.py"]
    compiled = ["/tmp/torchinductor_u/kv/ckvk46ak.py", "/job/model.py", site + "_inductor/output_code.py",
                site + "_functorch/_aot_autograd/runtime_wrappers.py"]
    old_layout = ["/tmp/g.py", site + "_functorch/aot_autograd.py"]  # torch 2.0: the wrappers in one module
    for files, copies in ((eager, [0]), (compiled, []), (old_layout, []),
                          ([*eager, site + "_dynamo/eval_frame.py"], [0])):  # eager code at a graph break
        trace = _run_at_one_line(files)
        found = fit._cast_copies(trace, [fit.INPUT] * 3, [e.size for e in trace], [0, 1, 2], {2 << 20})
        assert found == copies, files
        assert fit.compiled_graph(trace[0].frames) == (copies == [])
    assert not fit.compiled_graph([]) and not fit.compiled_graph(None)


def test_cast_coverage_boundary(monkeypatch):
    share = measured("gpt_bf16").cast_share
    real = TRUTH["gpt_bf16"]["runs"]["gpt_bf16-b32-t256"]["max_reserved"]
    monkeypatch.setattr(fit, "CAST_COVERAGE", share)  # just at the measured share: copies held
    on = fit.predict(measured("gpt_bf16"), 8).peak_reserved
    monkeypatch.setattr(fit, "CAST_COVERAGE", share + 0.001)  # just over: copies read as activations
    off = fit.predict(measured("gpt_bf16"), 8).peak_reserved
    assert abs(on - real) <= FIVE_BAR * real
    assert off - real > FIVE_BAR * real  # weight copies scaled with the batch: far too high


def test_gradient_sized_temporaries_boundary(monkeypatch):
    """gpt_m's tied embedding sums its two gradients into a 125 MiB temporary on autograd's thread:
    held at its size the 2x prediction is exact; read as input-sized, it is 18% high."""
    real = TRUTH["gpt_m"]["runs"]["gpt_m-b4-t256"]["max_reserved"]
    tied = 32_000 * 1024 * 4
    monkeypatch.setattr(fit, "MIN_BYTES", tied)
    at = fit.predict(measured("gpt_m"), 2).peak_reserved
    monkeypatch.setattr(fit, "MIN_BYTES", tied + 1)
    over = fit.predict(measured("gpt_m"), 2).peak_reserved
    assert abs(at - real) <= FIVE_BAR * real
    assert over - real > FIVE_BAR * real


def test_fits_is_null_inside_the_margin_and_decided_outside():
    m = measured("gpt_s")
    cap = TRUTH["gpt_s"]["cap"]["cap_bytes"]
    k = 24 / 4  # the largest batch under the cap
    assert fit.fits_under(m, k, cap) and not fit.fits_under(m, 25 / 4, cap)
    # the least limit the model serves batch 24 under, to 1 MiB
    lo, hi = cap // 2, cap
    while hi - lo > (1 << 20):
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fit.fits_under(m, k, mid) else (mid, hi)
    need = hi
    assert m.margin == fit.FIT_MARGIN  # a GPT: its own ops decide every size
    assert fit.tri_fits(m, k, int(need / (1 - m.margin)) + (4 << 20)) is True
    assert fit.tri_fits(m, k, int(need / (1 - m.margin)) - (4 << 20)) is None
    assert fit.tri_fits(m, k, int(need / (1 + m.margin)) + (4 << 20)) is None
    assert fit.tri_fits(m, k, int(need / (1 + m.margin)) - (4 << 20)) is False


@pytest.mark.parametrize("model", MODELS)
def test_each_models_interval_says_what_decides_its_sizes(model):
    """The four GPTs (Python frames only, the agent's defaults): no size a library chooses by shape, the narrow
    interval; the CNN's torch/nn/modules/conv.py frames: cuDNN's convolutions, the wide one, with the reason.
    Every prediction of the calibration inside its own interval."""
    m = measured(model)
    if model == "cnn":
        assert m.library == fit.LIBRARY_CONV and m.margin == fit.FIT_MARGIN_LIBRARY
        assert m.margin_reason.startswith("wider: cuDNN convolutions choose their algorithm and workspace by shape")
    else:
        assert m.library is None and m.margin == fit.FIT_MARGIN
    b0, t0 = base(model)["batch"], base(model)["seq"]
    for k in (2, 4, 8):
        real = TRUTH[model]["runs"][f"{model}-b{b0 * k}-t{t0}"]["max_reserved"]
        assert abs(fit.predict(m, k).peak_reserved / real - 1) <= m.margin, k


def test_question_bounds():
    fit.check(fit.Question(batch=256, from_batch=4))  # 64x: the most a measured step stands for
    with pytest.raises(ValueError, match="64x"):
        fit.check(fit.Question(batch=257, from_batch=4))
    with pytest.raises(ValueError, match="--from-batch"):
        fit.check(fit.Question(batch=8))
    with pytest.raises(ValueError, match="--from-seq"):
        fit.check(fit.Question(seq=8))
    with pytest.raises(ValueError, match="at least 1"):
        fit.check(fit.Question(batch=0, from_batch=4))
    with pytest.raises(ValueError, match="unknown optimizer"):
        fit.check(fit.Question(optimizer="lion"))


def test_optimizer_change_uses_the_playbook_state_multiples():
    m = measured("gpt_s")
    assert m.optimizer == "adamw"
    params = base("gpt_s")["param_bytes"]
    adamw = fit.predict(m, 1.0)
    sgd_m = fit.predict(m, 1.0, "sgd_momentum")
    sgd = fit.predict(m, 1.0, "sgd")
    # AdamW keeps 2x the parameter bytes, SGD with momentum 1x, plain SGD none
    assert adamw.composition["optimizer state"] == pytest.approx(2 * params, rel=0.01)
    assert sgd_m.composition["optimizer state"] == pytest.approx(params, rel=0.01)
    assert "optimizer state" not in {k for k, v in sgd.composition.items() if v > params * 0.01}
    assert sgd.peak_allocated < sgd_m.peak_allocated < adamw.peak_allocated
    back = fit.predict(fit.classify(traced("cnn")), 1.0, "adamw")  # SGD momentum (1x) -> AdamW (2x)
    cnn_params = base("cnn")["param_bytes"]
    assert back.composition["optimizer state"] == pytest.approx(2 * cnn_params, rel=0.01)


def test_answer_document():
    m = measured("gpt_m")
    cap = TRUTH["gpt_m"]["cap"]["cap_bytes"]
    doc = fit.answer(m, fit.Question(batch=14, from_batch=2, limit=cap, limit_source="--limit"))
    assert doc["low"] <= doc["peak_bytes"] <= doc["high"]
    # a GPT's program is its own ops': the narrow interval, said with its reason
    assert doc["margin"] == fit.FIT_MARGIN and "no size a library chooses" in doc["margin_reason"]
    assert f"interval +/-{fit.FIT_MARGIN:.0%}: the trace shows no size" in doc["basis"]
    # batch 14 needs 4.9 GiB against a 4.81 GiB cap: over it, but not by the interval's 3%, so not decided
    assert doc["fits"] is None and doc["low"] < cap < doc["high"] and doc["fits_reason"]
    # batch 15 (5.3 GiB) is over by more than the interval and fails under the cap too (real largest: 13;
    # under the former +/-12% it was undecided)
    assert fit.answer(m, fit.Question(batch=15, from_batch=2, limit=cap))["fits"] is False
    over = fit.answer(m, fit.Question(batch=24, from_batch=2, limit=cap, limit_source="--limit"))
    assert over["fits"] is False and over["low"] > cap  # 24 is over by more than the interval
    assert doc["max_batch"] == 13 and (doc["max_batch_low"], doc["max_batch_high"]) == (13, 14)
    assert doc["dominant"][0]["kind"] == "input-sized (activations)"
    seq = fit.answer(m, fit.Question(seq=1024, from_seq=256, limit=cap))
    assert seq["max_seq"] is not None and seq["max_batch"] is None
    assert seq["peak_bytes"] == pytest.approx(TRUTH["gpt_m"]["runs"]["gpt_m-b2-t1024"]["max_reserved"],
                                              rel=FIVE_BAR)


def test_headroom_reads_the_curve_against_the_limit():
    curve = fit.own_curve(traced("gpt_s"))
    assert curve["curve"][0] == [1.0, base("gpt_s")["max_reserved"]]
    cap = TRUTH["gpt_s"]["cap"]["cap_bytes"]
    h = fit.headroom(curve, cap)
    assert h["fits"] is True
    assert int(h["max_scale"] * 4) == 24  # batch 24 of 4 fits the cap for real, 25 runs out
    assert fit.headroom(curve, None)["max_scale"] is None
    small = fit.headroom(curve, base("gpt_s")["max_reserved"] // 2)
    assert small["fits"] is False and small["max_scale"] == 0.5


def test_no_trace_and_one_step_are_refused_and_part_of_the_first_step_is_not():
    snaps, _c, _t = spool_run(next((FIX / "gpt_s" / "defaults").iterdir()))
    untraced = next(s for s in snaps if not s.trace)
    with pytest.raises(fit.NotAssessable, match="no trace"):
        fit.classify(untraced)
    assert fit.own_curve(untraced) is None
    from dataclasses import replace

    one = traced("gpt_s")
    opt = [i for i, e in enumerate(one.trace) if e.frames and "optim" in str(e.frames[:4])]
    # no optimizer step yet: part of the first step, the rest inferred (test_fit_one_step.py)
    assert fit.classify(replace(one, traces=[one.trace[:opt[0]]])).partial == fit.PARTIAL_BACKWARD
    # one whole optimizer step and part of the next: still refused
    second = next(i for i in opt if i > opt[0] and not any(j == i - 1 for j in opt))
    with pytest.raises(fit.NotAssessable, match="optimizer step"):
        fit.classify(replace(one, traces=[one.trace[:second]]))


def test_an_expandable_run_far_past_its_mapping_ends_the_curve_not_the_analysis():
    """frag_dynamic_probe (expandable segments, H200): the model cannot grow its segments to 64x;
    the run's curve stops where it can no longer follow, and `answer` names it."""
    from memq.load import load_snapshot_file
    from tests.helpers import REAL

    snap = load_snapshot_file(REAL / "frag_dynamic_probe" / "epoch0.pickle.gz").snapshot
    curve = fit.own_curve(snap)
    assert curve is not None and 1 <= len(curve["curve"]) < len(fit.CURVE_SCALES)
    ks = [k for k, _ in curve["curve"]]
    assert ks == list(fit.CURVE_SCALES[: len(ks)])
    with pytest.raises(fit.NotAssessable, match="cannot replay this trace at 64x"):
        fit.predict(fit.classify(snap), fit.K_MAX)


def test_library_choice_reads_frames_and_workspaces():
    """Synthetic traces: which frames make a trace's interval the library one, and which do not."""
    from types import SimpleNamespace as E

    def tr(*frames, size=1 << 20):
        return [E(action="alloc", size=size, frames=list(frames))]

    py = lambda path, name="forward": (path, 1, name)  # noqa: E731 (a frame: file, line, name)
    assert fit.library_choice(tr(py("/x/site-packages/torch/nn/modules/conv.py"))) == fit.LIBRARY_CONV
    assert fit.library_choice(tr(py("/x/site-packages/torch/nn/modules/rnn.py"))) == fit.LIBRARY_RNN
    assert fit.library_choice(tr(py("/x/torch/_inductor/output_code.py", "__call__"))) == fit.LIBRARY_COMPILE
    # checkpointing runs through dynamo's "disable" wrapper in eager models: not compile
    assert fit.library_choice(tr(py("/x/torch/_dynamo/eval_frame.py", "_fn"), py("/m/model.py"))) is None
    # C++ frames alone (stacks="all" with the Python ones dropped)
    assert fit.library_choice(tr(("??", 0, "at::native::cudnn_convolution(at::Tensor const&)"))) == fit.LIBRARY_CONV
    assert fit.library_choice(tr(("??", 0, "at::native::_cudnn_rnn(at::Tensor const&)"))) == fit.LIBRARY_RNN
    # cuDNN's attention sizes its buffers by the shape it is given: not a library's choice
    assert fit.library_choice(tr(("??", 0, "at::native::_cudnn_attention_forward(at::Tensor const&)"))) is None
    # a frameless block of an odd byte count is a library's workspace (WORKSPACE_ODD); an even one is not
    assert fit.library_choice(tr(size=(1 << 20) + 1)) == fit.LIBRARY_WORKSPACE
    assert fit.library_choice(tr(size=(1 << 20) + 2)) is None
    assert fit.library_choice(tr(py("/m/model.py"), size=(1 << 20) + 1)) is None  # Python frames: not frameless


def test_another_optimizer_widens_the_interval_and_says_so():
    """Another optimizer's state re-sized from the parameters errs by up to 11% (FIT_MARGIN_OPTIMIZER); the
    recorded one, asked by name, keeps the trace's own interval."""
    m = measured("gpt_m")
    assert m.optimizer == "adamw"
    doc = fit.answer(m, fit.Question(optimizer="sgd"))
    assert doc["margin"] == fit.FIT_MARGIN_OPTIMIZER and doc["margin_reason"].startswith("another optimizer (sgd)")
    assert doc["high"] == int(doc["peak_bytes"] * (1 + fit.FIT_MARGIN_OPTIMIZER))
    assert f"interval +/-{fit.FIT_MARGIN_OPTIMIZER:.0%}: another optimizer (sgd)" in doc["basis"]
    assert fit.answer(m, fit.Question(optimizer="adamw"))["margin"] == fit.FIT_MARGIN
    assert m.margin == fit.FIT_MARGIN  # the measurement itself is untouched
