"""`memq fit` on torch.compile'd models against runs whose inductor cache state is known
(tests/fixtures/fit_compile_cache: each shape of gpt_compile and gqa_lm recorded by hand on one H100, first
with the cache cold, then warm; benchmarks/fit_compile_cache.py; benchmarks/RESULTS.md, "A compiled model's
two peaks"). A first run autotunes its kernels in its first step; a restart finds them cached. The prediction
leaves the autotuning out: it is of a restart, within FIT_MARGIN_COMPILE."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import fit_compile_cache as fcc  # noqa: E402

from memq.analysis import fit  # noqa: E402

CACHE = ROOT / "tests" / "fixtures" / "fit_compile_cache"


def _real(fam: str, tag: str, state: str) -> int:
    return json.loads((CACHE / "results" / f"{fam}-{tag}-{state}.json").read_text())["max_reserved"]


def test_the_fixture_holds_both_states_of_every_shape_and_stays_small():
    assert sum(p.stat().st_size for p in CACHE.rglob("*") if p.is_file()) < 2 << 20
    for fam in fcc.FAMILIES:
        for tag, _k, _s in fcc.rungs(fam):
            for state in fcc.STATES:
                assert (CACHE / "hand" / f"{fam}-{tag}-{state}.pickle.gz").is_file()
                result = json.loads((CACHE / "results" / f"{fam}-{tag}-{state}.json").read_text())
                assert result["outcome"] == "completed"


@pytest.mark.parametrize("fam", list(fcc.FAMILIES))
def test_a_restart_s_peak_is_predicted_within_five_percent_from_either_recording(fam):
    """gpt_compile (tuning) within 3.8%, gqa_lm (held back) within 4.1%, from the cold and the warm recording
    alike, at 2x-8x the batch and 2x-4x the length (inside 5%, the interval's first value; 8% since the second
    judging set); at the base shape the restart's own peak."""
    for r in fcc.family_rows(CACHE, fam):
        for src in fcc.STATES:
            p = r[f"from_{src}"]
            want = fit.FIT_MARGIN_COMPILE if r["seq_k"] == 1.0 else fit.FIT_MARGIN_COMPILE_LENGTH
            assert p["margin"] == want and fit.FIT_MARGIN_COMPILE == 0.08
            assert abs(p["err_warm"]) <= 0.042, (r["shape"], src, p)
            if r["k"] == 1.0:
                assert p["peak"] == r["real"]["warm"]
        assert r["from_cold"]["peak"] == r["from_warm"]["peak"], r["shape"]


def test_the_first_run_and_the_restart_reserve_different_peaks_at_one_shape():
    """The same shape twice: 17% apart at 4x the batch (the first run lower), at most 1.9% the other way."""
    for fam in fcc.FAMILIES:
        ratios = {tag: _real(fam, tag, "warm") / _real(fam, tag, "cold") for tag, _k, _s in fcc.rungs(fam)}
        assert ratios["b32-s256"] > 1.19 and min(ratios.values()) > 0.98, (fam, ratios)


def test_the_autotuning_is_what_the_cold_recording_holds_more():
    """The cold recording's program, its autotuning left out, holds the warm one's requests and 98 more of 2
    or 4 bytes (the compilation's scalars); kept in (as before), it misses the restart at 4x and 8x by more
    than 10%."""
    from collections import Counter

    cold, warm = fcc.measured(CACHE, "gqa_lm", "cold"), fcc.measured(CACHE, "gqa_lm", "warm")
    assert cold.autotuning > 400 and warm.autotuning == 0

    def sizes(m):
        prog = m.replay.program
        return Counter(s for op, s in zip(prog.ops, prog.size, strict=True) if op == fit.OP_ALLOC)

    more = sizes(cold) - sizes(warm)
    assert not sizes(warm) - sizes(cold) and set(more) <= {2, 4} and sum(more.values()) == 98
    assert any("autotuning" in n and "restart" in n for n in cold.notes)
    assert "restart" in cold.margin_reason


def test_kept_in_the_autotuning_misses_the_restart(monkeypatch):
    monkeypatch.setattr(fit, "without_autotuning", lambda rep, trace: (rep, 0))
    cold = fcc.measured(CACHE, "gqa_lm", "cold")
    assert cold.autotuning == 0
    for tag, k in (("b32-s256", 4.0), ("b64-s256", 8.0)):
        err = (fit.predict(cold, k).peak_reserved - _real("gqa_lm", tag, "warm")) / _real("gqa_lm", tag, "warm")
        assert err < -0.10, (tag, err)


def test_which_requests_are_the_autotuning_s():
    def frames(*paths):
        return [{"filename": p, "name": "f", "line": 1} for p in paths]

    site = "/usr/lib/python3/torch"
    assert fit.autotuning_request(frames(f"{site}/_ops.py", f"{site}/_inductor/runtime/benchmarking.py"))
    heuristics = f"{site}/_inductor/runtime/triton_heuristics.py"
    bench = f"{site}/_inductor/runtime/benchmarking.py"
    assert fit.autotuning_request(frames(f"{site}/_inductor/utils.py", heuristics, heuristics, bench))
    assert not fit.autotuning_request(frames(heuristics, "/tmp/inductor/cab.py"))  # a launch: the run's own
    assert fit.autotuning_request(frames("C:\\py\\Lib\\site-packages\\torch\\_inductor\\runtime\\benchmarking.py"))
    assert not fit.autotuning_request(frames("/tmp/torchinductor_root/ab/cabcdefghijklmnopqrstuvwxyz0123456789abcd.py",
                                             f"{site}/_inductor/output_code.py"))
    assert not fit.autotuning_request(frames("/app/benchmarking.py"))  # a user's own file of that name
    assert not fit.autotuning_request([])


def test_memq_fit_says_what_was_recorded_and_what_a_restart_reserves():
    """From the cold recording: the measured line gives the recorded first run's peak and a restart's at that
    shape; the JSON carries both and the autotuning's count; the interval's words name the restart."""
    from click.testing import CliRunner

    from memq.cli import cli

    path = CACHE / "hand" / "gqa_lm-b8-s256-cold.pickle.gz"
    res = CliRunner().invoke(cli, ["fit", str(path), "--from-batch", "8", "--batch", "32", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    meas = doc["measured"]
    assert meas["recorded_peak_bytes"] == _real("gqa_lm", "b8-s256", "cold")
    assert meas["peak_bytes"] == _real("gqa_lm", "b8-s256", "warm") and meas["autotuning_left_out"] > 400
    assert doc["margin"] == fit.FIT_MARGIN_COMPILE and "restart" in doc["margin_reason"]
    assert abs(doc["peak_bytes"] - _real("gqa_lm", "b32-s256", "warm")) <= 0.05 * _real("gqa_lm", "b32-s256", "warm")
    text = CliRunner().invoke(cli, ["fit", str(path), "--from-batch", "8", "--batch", "32"]).output
    assert "a first run that autotuned; a restart's at that shape (the autotuning left out)" in text
    assert "torch.compile's autotuning (464 requests" in text


JUDGE = ROOT / "tests" / "fixtures" / "fit_compile_judge"


def test_the_judging_set_as_judged():
    """Three families memq fit had seen only eager, compiled whole (bert_mlm, t5_relpos, alibi_lm; one H200),
    written before their capture and judged once: every batch prediction of a restart within 0.6%; every
    length one within 0.6% but t5_relpos's, whose learned bias sends attention down its math path: its (t x t)
    scores inside generated code are scaled with the length once, -2.6% at 2x and -8.6% at 4x. The length
    interval (FIT_MARGIN_COMPILE_LENGTH) was widened to hold that."""
    assert sum(p.stat().st_size for p in JUDGE.rglob("*") if p.is_file()) < 3 << 20
    rows = [r for fam in fcc.JUDGE for r in fcc.family_rows(JUDGE, fam)]
    assert len(rows) == 18
    for r in rows:
        for src in fcc.STATES:
            p = r[f"from_{src}"]
            assert abs(p["err_warm"]) <= p["margin"], (r["family"], r["shape"], src)
            if r["seq_k"] == 1.0:
                assert abs(p["err_warm"]) <= 0.006 and p["margin"] == fit.FIT_MARGIN_COMPILE, (r["family"], r["shape"])
            elif r["family"] != "t5_relpos":
                assert abs(p["err_warm"]) <= 0.006, (r["family"], r["shape"])
    t5 = {r["shape"]: r["from_warm"]["err_warm"] for r in rows if r["family"] == "t5_relpos"}
    assert t5["b8-s512"] == pytest.approx(-0.086, abs=0.001) and t5["b8-s256"] == pytest.approx(-0.026, abs=0.001)


def test_a_length_question_on_a_compiled_model_has_the_wider_interval():
    m = fcc.measured(JUDGE, "t5_relpos", "warm")
    doc = fit.answer(m, fit.Question(seq=512, from_seq=128))
    assert doc["margin"] == fit.FIT_MARGIN_COMPILE_LENGTH and "(t x t) scores" in doc["margin_reason"]
    assert fit.answer(m, fit.Question(batch=32, from_batch=8))["margin"] == fit.FIT_MARGIN_COMPILE
    eager = fit.asked(replace(m, library=None), length=True)
    assert eager.margin == fit.FIT_MARGIN  # an eager model's length question keeps its own interval


def test_the_agent_s_recording_finds_the_autotuning_by_its_python_frames():
    """The agent records Python frames only (its defaults): the same 464 autotuning requests as the hand
    recording (stacks="all") of one gqa_lm run in tests/fixtures/fit_fresh, and the same interval."""
    import fit_families_calibration as cal

    meas = cal.recordings(cal.FRESH_DIR, "gqa_lm", "adamw")
    assert {src: m.autotuning for src, m in meas.items()} == {"agent": 464, "hand": 464, "dump": 464}
    assert {m.margin for m in meas.values()} == {fit.FIT_MARGIN_COMPILE}


JUDGE2 = ROOT / "tests" / "fixtures" / "fit_compile_judge2"


def _judged(folder: Path, families: dict, max_bytes: int) -> tuple[list, list]:
    """A compiled judging set's rows (the fixture under `max_bytes`, six shapes per family), and the
    (family, shape, recording) whose restart prediction lay outside the intervals both sets were judged
    with: +/-5% at another batch, +/-9% at another length."""
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) < max_bytes
    rows = [r for fam in families for r in fcc.family_rows(folder, fam)]
    assert len(rows) == 6 * len(families)
    outside = sorted((r["family"], r["shape"], src) for r in rows for src in fcc.STATES
                     if abs(r[f"from_{src}"]["err_warm"]) > (0.05 if r["seq_k"] == 1.0 else 0.09))
    return rows, outside


def test_the_second_judging_set_as_judged():
    """moe_lm, seq2seq and lora_gpt compiled whole (one H100), written after the first set was judged and
    before their capture, judged once with the intervals of then (+/-5%, +/-9% at another length): 27 of 36
    inside. seq2seq within 0.3%; moe_lm within 0.3% from its warm recording, but +7.6% at the measured shape
    from its cold one (a first run that allocated 10% more than its restart); lora_gpt +6.8% to +29.5% from
    either recording: a frozen base's autocast copies inside generated code, scaled with the activations. Since:
    FIT_MARGIN_COMPILE 8%, and FIT_MARGIN_COMPILE_FROZEN 30% for a frozen base; all 36 inside."""
    rows, outside = _judged(JUDGE2, fcc.JUDGE2, 6 << 20)
    # 9 as judged, moe_lm's cold recording at its own shape (+7.6%) among them: since read as a restart's
    # (-0.1%), the first step's blocks its compile kept freed (test_a_first_compiles_kept_blocks_are_freed_...)
    assert len(outside) == 8 and {f for f, _s, _src in outside} == {"lora_gpt"}
    for r in rows:
        for src in fcc.STATES:
            p = r[f"from_{src}"]
            assert abs(p["err_warm"]) <= p["margin"], (r["family"], r["shape"], src)
            if r["family"] == "seq2seq":
                assert abs(p["err_warm"]) <= 0.003
            if r["family"] == "lora_gpt":
                assert p["margin"] == fit.FIT_MARGIN_COMPILE_FROZEN and p["err_warm"] >= 0.0
    lora = fcc.measured(JUDGE2, "lora_gpt", "warm")
    assert lora.frozen_base and "frozen base" in lora.margin_reason
    assert not fcc.measured(JUDGE2, "seq2seq", "warm").frozen_base


JUDGE3 = ROOT / "tests" / "fixtures" / "fit_compile_judge3"


def test_the_third_judging_set_as_judged():
    """relbias_enc_bf16, whisper_enc and gpt_ckpt_bf16 compiled whole (one H100), written after the second set
    was judged and read, and after FIT_MARGIN_COMPILE went back to 5%, before their capture; judged once: 28 of
    36 inside. gpt_ckpt_bf16 within 0.2%, whisper_enc within 3.0%; relbias_enc_bf16 -7.6%, +6.4%, -7.6% at 2x,
    4x and 8x the batch (its runs at one shape reserved up to 17% apart, the cache cold against warm, with the
    same bytes allocated) and -15.1% at 4x the length (a learned bias: attention's math path, its scores
    scaled once). Since: FIT_MARGIN_COMPILE 8% again and FIT_MARGIN_COMPILE_LENGTH 16%; all 36 inside."""
    rows, outside = _judged(JUDGE3, fcc.JUDGE3, 4 << 20)
    assert len(outside) == 8 and {f for f, _s, _src in outside} == {"relbias_enc_bf16"}
    for r in rows:
        for src in fcc.STATES:
            p = r[f"from_{src}"]
            assert abs(p["err_warm"]) <= p["margin"], (r["family"], r["shape"], src)
            if r["family"] == "gpt_ckpt_bf16":
                assert abs(p["err_warm"]) <= 0.003
            if r["family"] == "whisper_enc":
                assert abs(p["err_warm"]) <= 0.031
    rel = {r["shape"]: r["from_warm"]["err_warm"] for r in rows if r["family"] == "relbias_enc_bf16"}
    assert rel["b8-s1024"] == pytest.approx(-0.151, abs=0.002)


def test_a_first_compiles_kept_blocks_are_freed_as_a_restart_frees_them():
    """moe_lm's first run (its cache cold, the second judging set) kept two blocks of its first step to the
    end, the head's 125 MiB logits among them (made after a graph break), where every later step frees its
    own and its restart never keeps them: the cold recording predicted +7.6% over the restart at its own shape.
    Freed as a later step frees them, the prediction is the restart's within 0.2%, and says so. A recording
    that did not autotune (a restart's) is left as it is."""
    cold, warm = fcc.measured(JUDGE2, "moe_lm", "cold"), fcc.measured(JUDGE2, "moe_lm", "warm")
    assert any("compile kept to the end" in n for n in cold.notes)
    assert not any("compile kept to the end" in n for n in warm.notes)
    real_warm = json.loads((JUDGE2 / "results" / "moe_lm-b8-s256-warm.json").read_text())["max_reserved"]
    got = fit.predict(cold, 1.0).peak_reserved
    assert abs(got / real_warm - 1) <= 0.002, (got, real_warm)
    snap = fcc.load_snapshot_file(str(JUDGE2 / "hand" / "moe_lm-b8-s256-cold.pickle.gz"), max_bytes=1 << 32).snapshot
    rep, _tuned = fit.without_autotuning(fit.wi.compile_trace(snap), snap.trace)
    _rep, held = fit.released_first_step_holds(rep, snap.trace)
    assert held == 2
    snap = fcc.load_snapshot_file(str(JUDGE2 / "hand" / "seq2seq-b16-s128-cold.pickle.gz"), max_bytes=1 << 32).snapshot
    rep, _tuned = fit.without_autotuning(fit.wi.compile_trace(snap), snap.trace)
    assert fit.released_first_step_holds(rep, snap.trace)[1] == 0


def test_a_run_s_own_fit_says_what_it_reserved_and_a_restart_s_peak():
    """The history's `fit` of a compiled run recorded cold: its curve is a restart's (scaled from), and the
    line says what the run itself reserved beside it; a warm recording says one figure."""
    from memq.analysis.fit import headroom, own_curve
    from memq.load import load_snapshot_file
    from memq.render.fit_text import own_fit_line

    def fit_of(state):
        snap = load_snapshot_file(str(CACHE / "hand" / f"gqa_lm-b8-s256-{state}.pickle.gz"), max_bytes=1 << 32)
        return headroom(own_curve(snap.snapshot), 80 << 30)

    cold, warm = fit_of("cold"), fit_of("warm")
    assert cold["recorded_peak_bytes"] == _real("gqa_lm", "b8-s256", "cold")
    assert cold["peak_bytes"] == warm["peak_bytes"] == _real("gqa_lm", "b8-s256", "warm")
    assert warm["recorded_peak_bytes"] is None
    assert "a first run that autotuned; a restart's" in own_fit_line(cold)
    assert "autotuned" not in own_fit_line(warm)
