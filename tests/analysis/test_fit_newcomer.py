"""What a first user of `memq fit` ran into (issue 40), each on the real trace that showed it:
- `--optimizer` on a trace that starts mid-run (its optimizer state made before the trace) changed
  nothing: the state is now re-sized from one step's gradients, whether the trace made it or not,
  with 8-bit state below 32-bit and SGD below AdamW;
- the same file read "3 optimizer steps", and with `--optimizer` "no optimizer step": an optimizer the
  trace does not name is read from its state's size;
- `fits` was true while the interval straddled the limit: now null there, with the reason;
- every figure of the answer has its interval (the headroom, the largest scale, the largest batch);
- a run's snapshots: the trace measured is one that holds a whole clean step, not the longest."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from memq.analysis import fit
from memq.load import load_snapshot_file
from tests.analysis.agent_data import spool_run

# The five models' bar (their largest error is 1.0%: benchmarks/RESULTS.md "memq fit"); the interval memq fit
# states is per trace (rules.FIT_MARGIN, FIT_MARGIN_LIBRARY, from the ten families of tests/fixtures/fit_families).
FIVE_BAR = 0.03
FIX = Path(__file__).resolve().parents[1] / "fixtures"
# GPT bf16, AdamW, a history="on" job with max_entries 8000: each epoch-end trace starts mid-run, the
# Adam state made at step 1, long before it (tests/fixtures/captured/README.md, leak_epochs)
ADAM_MID_RUN = FIX / "captured" / "leak_epochs" / "epoch2.pickle.gz"
# GPT bf16, SGD with momentum, max_entries 8000: mid-run, and SGD allocates nothing in its step, so no
# frame in the trace names the optimizer (tests/fixtures/real/README.md, seed_sgd)
SGD_MID_RUN = FIX / "real" / "seed_sgd" / "epoch0.pickle.gz"


@cache
def snap(path: Path):
    return load_snapshot_file(str(path), max_bytes=1 << 31).snapshot


@cache
def measured(path: Path) -> fit.Measured:
    return fit.classify(snap(path))


@cache
def warmup(model: str) -> fit.Measured:
    snaps, _ctx, _trig = spool_run(next((FIX / "fit" / model / "defaults").iterdir()))
    return fit.classify(next(s for s in snaps if s.trace))


def peak(m: fit.Measured, optimizer: str | None, k: float = 1.0) -> int:
    return fit.predict(m, k, optimizer).peak_reserved


def test_optimizer_change_on_a_mid_run_trace_resizes_the_state_made_before_it():
    m = measured(ADAM_MID_RUN)
    assert not m.covers_start and m.optimizer == "adam" and not m.optimizer_inferred
    # the state is the blocks live before the trace that optimizer code made: two per gradient
    assert m.pre_state and m.state_bytes == pytest.approx(2 * m.gradient_bytes, rel=0.01)
    adamw, sgd, momentum, eight = (peak(m, o) for o in ("adamw", "sgd", "sgd_momentum", "adamw_8bit"))
    assert adamw == peak(m, None)  # Adam and AdamW keep the same state
    assert sgd < momentum < adamw and eight < adamw
    # what SGD saves is at most the state it drops (the model packs the rest as the allocator does)
    assert adamw - sgd <= m.state_bytes * (1 + FIVE_BAR)


def test_optimizer_change_on_the_warm_up_trace_orders_the_optimizers():
    m = warmup("gpt_m")
    assert m.covers_start and m.optimizer == "adamw"
    got = {o: peak(m, o, 4.0) for o in ("sgd", "adafactor", "adamw_8bit", "sgd_momentum", "adamw")}
    assert got["sgd"] == got["adafactor"] < got["adamw_8bit"] < got["sgd_momentum"] < got["adamw"]
    # from a stateless optimizer to one with state: its blocks per gradient (Adam's two) at the first step
    sgd = fit.Measured(**{**m.__dict__, "optimizer": "sgd"})
    assert fit.state_plan(sgd, "adamw").first_new == tuple(g for g in m.gradient_sizes for _ in range(2))
    assert fit.state_plan(sgd, "sgd_momentum").first_new == m.gradient_sizes


def test_one_answer_on_optimizer_steps_per_file():
    """The file that read "3 optimizer steps" without --optimizer and "no optimizer step" with it."""
    m = measured(SGD_MID_RUN)
    assert m.steps == 3 and fit.recorded_optimizer(snap(SGD_MID_RUN)) is None
    assert m.optimizer == "sgd_momentum" and m.optimizer_inferred
    assert any("not named in the trace" in n for n in m.notes)
    base = fit.answer(m, fit.Question())
    other = fit.answer(m, fit.Question(optimizer="adamw"))
    assert base["measured"]["optimizer_steps"] == other["measured"]["optimizer_steps"] == 3
    assert other["optimizer"] == {"recorded": "sgd_momentum", "predicted": "adamw", "state_multiple": 2.0}
    assert peak(m, "sgd") < base["peak_bytes"] < other["peak_bytes"]


def test_state_inference_boundary():
    """0, 1 or 2 copies of the gradients within STATE_INFER_TOLERANCE; between them, unnamed."""
    g = 1000
    tol = fit.STATE_INFER_TOLERANCE
    assert fit.infer_optimizer(int(g * (1 + tol)) - 1, g) == ("sgd_momentum", True)
    assert fit.infer_optimizer(int(g * (1 + tol)) + 2, g) == (None, False)
    assert fit.infer_optimizer(int(g * (2 - tol)) + 1, g) == ("adam", True)
    assert fit.infer_optimizer(int(g * tol) - 1, g) == ("sgd", True)
    assert fit.infer_optimizer(int(g * tol) + 2, g) == (None, False)
    assert fit.infer_optimizer(500, 0) == (None, False)
    # measured: the SGD-momentum run's state is one copy, the Adam run's two
    for path, mult in ((SGD_MID_RUN, 1.0), (ADAM_MID_RUN, 2.0)):
        m = measured(path)
        assert abs(m.state_bytes / m.gradient_bytes - mult) < 0.02


def test_fits_is_null_whenever_the_interval_straddles_the_limit():
    m = warmup("gpt_m")
    doc = fit.answer(m, fit.Question(batch=16, from_batch=2))
    low, high = doc["low"], doc["high"]
    inside = (low + high) // 2
    # the model serves batch 16 under this limit (it frees its cache and retries) ...
    assert fit.fits_under(m, 8.0, inside)
    # ... yet the interval straddles it: null, and why
    got = fit.answer(m, fit.Question(batch=16, from_batch=2, limit=inside))
    assert got["fits"] is None and "straddles" in got["fits_reason"]
    assert fit.answer(m, fit.Question(batch=16, from_batch=2, limit=low))["fits"] is None  # low <= limit
    assert fit.answer(m, fit.Question(batch=16, from_batch=2, limit=high))["fits"] is True  # high <= limit
    under = fit.answer(m, fit.Question(batch=16, from_batch=2, limit=int(low * 0.9)))
    assert under["fits"] is False and "over" in under["fits_reason"]


def test_every_answer_has_its_interval():
    from memq.gpus import gpu_limit

    m = warmup("gpt_m")
    limit, source = gpu_limit("RTX 4090")
    doc = fit.answer(m, fit.Question(limit=limit, limit_source=source))
    assert doc["low"] < doc["peak_bytes"] < doc["high"]
    assert doc["fits"] is True and "under" in doc["fits_reason"]
    assert doc["headroom_low"] < doc["headroom_bytes"] < doc["headroom_high"]
    assert doc["max_scale_low"] <= doc["max_scale"] <= doc["max_scale_high"]
    assert doc["max_scale_low"] < doc["max_scale_high"]
    from memq.render.fit_text import render_fit

    text = render_fit(dict(doc, source="x"))
    assert "headroom in input units: " in text and "x within the interval)" in text
    batch = fit.answer(m, fit.Question(batch=8, from_batch=2, limit=limit, limit_source=source))
    assert batch["max_batch_low"] <= batch["max_batch"] <= batch["max_batch_high"]
    assert "within the interval)" in render_fit(dict(batch, source="x")).splitlines()[0]


def test_choose_takes_the_warm_up_not_the_longer_window_of_a_leaking_job():
    """val_logits keeps every validation step's logits (a leak): the agent's growth windows recorded
    later hold 21,000 trace entries mid-run, its warm-up 5,258 from the start."""
    snaps, _ctx, _trig = spool_run(next((FIX / "forecast" / "val_logits" / "defaults").iterdir()))
    longest = max(range(len(snaps)), key=lambda i: len(snaps[i].trace))
    i, why = fit.choose(snaps)
    assert i == 0 != longest and len(snaps[longest].trace) > 4 * len(snaps[0].trace)
    assert "starts at an empty allocator" in why and fit.classify(snaps[i]).covers_start
    # without the warm-up, the earliest mid-run trace of a whole step (the least grown)
    rest = snaps[1:]
    j, why = fit.choose(rest)
    assert "mid-run" in why and fit.optimizer_steps(rest[j].trace) >= 2
    assert all(fit.optimizer_steps(s.trace) < 2 for s in rest[:j])


def test_a_run_without_fit_says_why():
    from memq.analysis import analyze

    no_trace = [s for s in spool_run(next((FIX / "fit" / "gpt_s" / "defaults").iterdir()))[0] if not s.trace]
    res = analyze(no_trace[:1])
    assert res["fit"] is None and "has a trace" in res["fit_reason"]
    res = analyze([snap(ADAM_MID_RUN)], names=["epoch2"])
    assert res["fit"] is None and "starts mid-run" in res["fit_reason"] and "epoch2" in res["fit_reason"]
    warm = [s for s in spool_run(next((FIX / "fit" / "gpt_s" / "defaults").iterdir()))[0]]
    res = analyze(warm)
    assert res["fit"] is not None and res["fit_reason"] is None


def _warmup_raw(model: str) -> dict:
    """The warm-up snapshot of a calibration spool as the agent sent it (the raw dict)."""
    from memq import codec
    from memq.agent.spool import decode

    for f in sorted(next((FIX / "fit" / model / "defaults").iterdir()).rglob("*.mqs")):
        msg = decode(f.read_bytes())
        if msg.fields["kind"] == "snapshot":
            raw = codec.decode(msg.blob)
            if any(raw.get("device_traces") or []):
                return raw
    raise AssertionError(model)


def _with_autocast(raw: dict, state: str) -> fit.Measured:
    from memq.snapshot import parse_snapshot

    d = dict(raw)
    d["memq_agent"] = dict(raw["memq_agent"], first_input={"module": "GPT", "autocast": state,
                                                          "shapes": [[4, 256]], "dtypes": ["int64"]})
    return fit.classify(parse_snapshot(d))


def test_the_agents_autocast_state_decides_the_weight_copies(monkeypatch):
    """bf16 GPT (autocast on): the agent's word holds the copies even where the coverage test alone
    would not; float32 GPT (autocast off): no copies, though 24% of its weights' bytes have a
    same-sized activation (48% before the outputs of ops autocast runs in float32 were left out)."""
    import json

    truth = json.loads((FIX / "fit" / "truth.json").read_text())
    real = truth["gpt_bf16"]["runs"]["gpt_bf16-b32-t256"]["max_reserved"]
    monkeypatch.setattr(fit, "CAST_COVERAGE", 1.01)  # the coverage test can no longer pass
    told = _with_autocast(_warmup_raw("gpt_bf16"), "bfloat16")
    assert fit.CAST_COPY in told.kinds and "the agent read it" in " ".join(told.notes)
    assert abs(fit.predict(told, 8).peak_reserved - real) <= FIVE_BAR * real
    untold = fit.classify(next(s for s in spool_run(next((FIX / "fit" / "gpt_bf16" / "defaults").iterdir()))[0]
                               if s.trace))  # the same trace from an agent that did not say
    assert fit.CAST_COPY not in untold.kinds and untold.cast_share >= 0.9
    monkeypatch.undo()
    off = _with_autocast(_warmup_raw("gpt_m"), "off")
    assert off.cast_share == 0.0 and fit.CAST_COPY not in off.kinds
    assert warmup("gpt_m").cast_share > 0.2  # the coincidences the test of coverage had to reject
    real_m = truth["gpt_m"]["runs"]["gpt_m-b16-t256"]["max_reserved"]
    assert abs(fit.predict(off, 8).peak_reserved - real_m) <= FIVE_BAR * real_m


def test_the_measured_batch_comes_from_the_agents_first_input():
    """gpt_s ran at 4 x 256 (tests/fixtures/fit/truth.json): the agent's first-forward reading gives
    --from-batch and --from-seq; asked without them, the same answer as with them."""
    from memq.pipeline.fit import answer_for
    from memq.snapshot import parse_snapshot

    raw = _warmup_raw("gpt_s")
    d = dict(raw, memq_agent=dict(raw["memq_agent"], first_input={"module": "GPT", "autocast": "off",
                                                                  "shapes": [[4, 256]], "dtypes": ["int64"]}))
    snap = parse_snapshot(d)
    got = answer_for(snap, "x", fit.Question(batch=16, seq=512), (None, None))
    want = answer_for(snap, "x", fit.Question(batch=16, from_batch=4, seq=512, from_seq=256), (None, None))
    assert got["from_batch"] == 4 and got["from_seq"] == 256 and got["peak_bytes"] == want["peak_bytes"]
    assert any("the agent read GPT's first input, shape [4, 256]" in n for n in got["notes"])
    # an image batch [16, 3, 224, 224]: the batch only, never a length
    d["memq_agent"]["first_input"]["shapes"] = [[16, 3, 224, 224]]
    q, note = fit.measured_shape(fit.Question(batch=32, seq=512), parse_snapshot(d))
    assert q.from_batch == 16 and q.from_seq is None and "batch 16" in note
    # no reading: unchanged, and --from-batch is still asked for
    q, note = fit.measured_shape(fit.Question(batch=32), snap_no_agent := parse_snapshot(
        {k: v for k, v in raw.items() if k != "memq_agent"}))
    assert q.from_batch is None and note is None and snap_no_agent.agent is None


def test_optimizer_change_against_the_same_gpt_run_with_each_optimizer():
    """tests/fixtures/playbook/optim_*: one GPT, three steps, once per optimizer. From AdamW's trace or
    plain SGD's, every other optimizer's recorded peak is predicted within the margin; into AdamW from
    SGD with momentum, Adafactor or 8-bit AdamW the allocator packs the new state tighter than the real
    run did (peak allocated exact, reserved 9-11% low): what is still weak, held here so it cannot drift."""
    names = ("sgd", "sgd_momentum", "adamw", "adafactor", "adamw_8bit")
    ms = {}
    for k in names:
        snaps, _ctx, _trig = spool_run(FIX / "playbook" / f"optim_{k}" / "spool")
        ms[k] = fit.classify(next(s for s in snaps if s.trace))
    assert {k: m.optimizer for k, m in ms.items()} == {k: k for k in names}
    for src in ("adamw", "sgd"):
        for dst in names:
            real = ms[dst].recorded_peak
            got = fit.predict(ms[src], 1.0, dst)
            assert abs(got.peak_reserved - real) <= FIVE_BAR * real, (src, dst, got.peak_reserved, real)
    for src in ("sgd_momentum", "adafactor", "adamw_8bit"):
        real = ms["adamw"].recorded_peak
        got = fit.predict(ms[src], 1.0, "adamw").peak_reserved
        assert -0.12 * real < got - real < 0, (src, got, real)
        assert got > ms[src].recorded_peak  # still above the recorded optimizer's own peak


def test_a_trace_that_starts_mid_run_has_the_wider_interval():
    """The five models' whole traces cut where a ring buffer that wrapped would have cut them: the
    real peak at 2x-8x lies within MIDRUN_MARGIN of the prediction, not within MIDRUN_MARGIN - 0.5%
    (the extreme cuts of benchmarks/fit_calibration.py --mid-run: gpt_bf16 cut at 60%, gpt_s at 10%)."""
    import json
    import sys

    sys.path.insert(0, str(FIX.parents[1]))
    from benchmarks.fit_calibration import mid_run

    truth = json.loads((FIX / "fit" / "truth.json").read_text())
    rows = mid_run({m: truth[m] for m in ("gpt_bf16", "gpt_s")}, cuts=(0.1, 0.6))
    dev = [abs(real / pred - 1) for *_x, pred, real in rows]
    assert max(dev) <= fit.MIDRUN_MARGIN
    assert max(dev) > fit.MIDRUN_MARGIN - 0.005
    m = measured(ADAM_MID_RUN)
    doc = fit.answer(m, fit.Question(batch=8, from_batch=4))
    assert doc["low"] == int(doc["peak_bytes"] * (1 - fit.MIDRUN_MARGIN)) and "starts mid-run" in doc["basis"]
    assert warmup("gpt_m").margin == fit.FIT_MARGIN
