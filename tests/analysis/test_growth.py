"""The growth model (profiler/analysis/growth.py): every rule just under and just over its value, the
trend on real per-step figures of an H200 run (tests/fixtures/forecast/healthy) with growth laid over
them, and one constant moved to see the leak verdict and the forecast move together."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest

from memq.analysis import analyze, leak
from memq.analysis import forecast as fm
from memq.analysis import growth as gm
from memq.model import OomContext
from tests.analysis.agent_data import spool_run

rule = pytest.mark.rule
MiB, GiB = 1 << 20, 1 << 30
FIX = Path(__file__).resolve().parents[1] / "fixtures" / "forecast"


def pts(lives: list[float], unit: str = "step", x0: int = 1) -> list[gm.Point]:
    return [gm.Point(x=float(x0 + i), live=int(v), label=f"{unit} {x0 + i}", step=x0 + i if unit == "step" else None)
            for i, v in enumerate(lives)]


def healthy_figures() -> list[dict]:
    snaps, _ctx, _t = spool_run(next((FIX / "healthy" / "defaults").iterdir()))
    return [{"step": f.step, "epoch": f.epoch, "allocated": f.allocated, "peak_allocated": f.peak_allocated,
             "peak_reserved": f.peak_reserved, "reserved": f.reserved} for f in snaps[-1].agent.step_figures]


def with_growth(figs: list[dict], per_step: int = 0, per_epoch: int = 0, until_step: int | None = None) -> list[dict]:
    """The real healthy run's figures with growth laid over them: per step, or at each epoch end."""
    out = copy.deepcopy(figs)
    for f in out:
        s = min(f["step"], until_step) if until_step is not None else f["step"]
        add = per_step * s + per_epoch * (f["epoch"] or 0)
        for k in ("allocated", "peak_allocated", "peak_reserved", "reserved"):
            f[k] += add
    return out


# ------------------------------------------------------------------ the trend

def test_theil_sen_is_the_median_pairwise_slope_with_an_interval_around_it():
    t = gm.theil_sen([1, 2, 3, 4, 5, 6, 7, 8], [10, 12, 14, 16, 18, 20, 22, 100])  # one spike at the end
    assert t.slope == pytest.approx(2.0) and t.low <= 2.0 <= t.high and t.low > 0


def test_a_spike_or_a_one_off_copy_is_no_trend():
    flat = [5 * GiB] * 20
    flat[7] += 2 * GiB  # a checkpoint copy, freed at the next point
    assert gm.assess(pts(flat), "step", limit=20 * GiB).state == "flat"
    jump = [5 * GiB] * 10 + [6 * GiB] * 10  # one jump, flat on both sides
    g = gm.assess(pts(jump), "step", limit=20 * GiB)
    assert not g.leak


def test_the_real_healthy_run_is_flat_and_a_leak_over_it_is_growing():
    figs = healthy_figures()
    flat = gm.assess(leak.figure_series(figs)[0], "step", limit=8 * GiB)
    assert flat.state == "flat", flat.why
    g = gm.assess(leak.figure_series(with_growth(figs, per_step=8 * MiB))[0], "step", limit=8 * GiB)
    assert g.state == "growing" and g.trend.slope == pytest.approx(8 * MiB, rel=0.05), g.why
    assert "live bytes grow +8.0 MiB a step (" in g.why


def test_a_slow_leak_under_a_small_cap_is_a_leak_although_no_interval_passes_64_mib():
    """31 MiB an epoch under a 2.6 GiB cap (the issue's README-way job): every interval is far under the
    old 64 MiB threshold; the trend over the epochs is what says leak."""
    lives = [1 * GiB + i * 31 * MiB + (i % 3) * MiB for i in range(16)]
    g = gm.assess(pts(lives, "epoch", x0=1), "epoch", limit=int(2.6 * GiB))
    assert g.leak, g.why


def test_a_leak_on_a_big_card_is_seen_below_one_percent_of_the_card_per_interval():
    """256 MiB an epoch on a 139.8 GiB card (1% is 1.4 GiB): growing, and the crossing is where the card
    runs out."""
    card = int(139.8 * GiB)
    lives = [10 * GiB + i * 256 * MiB for i in range(40)]
    g = gm.assess(pts(lives, "epoch"), "epoch", limit=card)
    assert g.leak, g.why
    cr = gm.crossing(g, 0, (card, card))
    assert cr.x == pytest.approx(40 + (card - lives[-1]) / (256 * MiB), abs=1.5)


def test_a_late_leak_is_said_from_where_it_starts():
    lives = [4 * GiB] * 30 + [4 * GiB + i * 64 * MiB for i in range(1, 31)]
    g = gm.assess(pts(lives), "step", limit=16 * GiB)
    assert g.leak and g.since is not None and 28 <= g.since.x <= 33 and "since step" in g.why


def test_a_cache_that_stopped_is_a_plateau_said_as_one():
    lives = [4 * GiB + min(i, 5) * 32 * MiB for i in range(40)]
    g = gm.assess(pts(lives, "epoch"), "epoch", limit=int(2.6 * GiB) * 4)
    assert g.state == "plateau" and not g.leak
    assert g.why.startswith("grew 0.16 GiB from epoch 1 to epoch 6, then flat for 34 epochs"), g.why


# ------------------------------------------------------------------ each rule at its boundary

@rule("GROWTH_MIN_POINTS")
def test_four_points_decide_without_the_few_points_rule():
    # 4 points rising in order: Sen's interval is above zero; with the third interval flat, it is not
    four = gm.assess(pts([1 * GiB, 1.1 * GiB, 1.2 * GiB, 1.3 * GiB]), "step", limit=2 * GiB)
    assert four.leak and not four.few
    stalled = gm.assess(pts([1 * GiB, 1.1 * GiB, 1.2 * GiB, 1.2 * GiB]), "step", limit=2 * GiB)
    assert not stalled.leak


@rule("GROWTH_FEW_POINTS")
def test_three_points_can_decide_two_cannot():
    two = gm.assess(pts([1 * GiB, 1.5 * GiB]), "epoch", limit=2 * GiB)
    three = gm.assess(pts([1 * GiB, 1.3 * GiB, 1.6 * GiB]), "epoch", limit=2 * GiB)
    assert two.state == "too_few" and "at least 3" in two.why
    assert three.leak and three.few and "only 3 points" in three.why


@rule("GROWTH_STEADY_SHARE")
def test_three_points_must_rise_steadily():
    # intervals 100 and 49 MiB (under half) / 100 and 51 MiB (over half)
    under = gm.assess(pts([1 * GiB, 1 * GiB + 100 * MiB, 1 * GiB + 149 * MiB]), "epoch", limit=2 * GiB)
    over = gm.assess(pts([1 * GiB, 1 * GiB + 100 * MiB, 1 * GiB + 151 * MiB]), "epoch", limit=2 * GiB)
    assert under.state == "too_few" and over.leak


@rule("GROWTH_MIN_SEGMENT")
def test_a_regime_needs_four_points_of_its_own():
    """Growth then flat: 4 + 4 points split into two regimes; 3 + 4 (under four on one side) cannot."""
    def series(grow: int) -> tuple[list[float], list[float]]:
        ys = [4.0 * GiB + i * 100 * MiB for i in range(grow)]
        ys += [ys[-1]] * 4
        return [float(i) for i in range(len(ys))], ys
    assert gm.change_point(*series(4)) == 4
    assert gm.change_point(*series(3)) is None


@rule("GROWTH_CHANGE_GAIN")
def test_a_change_point_must_halve_the_squared_residuals(monkeypatch):
    xs = [float(i) for i in range(12)]
    ys = [float(min(i, 7)) for i in range(12)]  # a bend at 7
    one = gm.theil_sen(xs, ys)
    assert gm.change_point(xs, ys) is not None
    # the gain here: two lines leave almost nothing; a gain rule of 0 (never enough) finds none
    monkeypatch.setattr(gm, "GROWTH_CHANGE_GAIN", 0.0)
    assert gm.change_point(xs, ys) is None
    del one


@rule("GROWTH_CHANGE_GAIN")
def test_a_straight_noisy_leak_gains_too_little_from_a_split():
    noise = [0, 3, -2, 4, -3, 1, -4, 2, 0, -1, 3, -2, 1, -3, 2, 0]
    ys = [float(i * 10 + n) for i, n in enumerate(noise)]
    assert gm.change_point([float(i) for i in range(16)], ys) is None


@rule("GROWTH_PLATEAU_SHARE")
def test_growth_stopped_when_the_recent_bound_is_under_a_quarter_of_the_earlier_slope():
    def run(late_rate: float) -> gm.Growth:
        lives = [4 * GiB + i * 100 * MiB for i in range(10)]
        lives += [lives[-1] + int(j * late_rate * 100 * MiB) for j in range(1, 21)]
        return gm.assess(pts(lives), "step", limit=8 * GiB)
    assert run(0.0).state == "plateau" and run(0.24).state == "plateau"
    assert run(0.26).leak  # a leak that slows to a quarter is still going


@rule("GROWTH_NOISE_MULTIPLE")
def test_a_rise_must_pass_three_times_the_runs_own_scatter():
    """Dynamic shapes move the floor by +-100 MiB about the line (a scatter of 1.4826 x 100 MiB); over 29
    intervals the rise must pass 3 x 148.26 MiB = 444.8 MiB: 15.0 MiB a point is under, 15.5 over."""
    def run(drift: float) -> gm.Growth:
        return gm.assess(pts([5 * GiB + i * drift * MiB + (100 * MiB if i % 2 else -100 * MiB) for i in range(30)],
                             x0=0), "step", limit=8 * GiB)
    under, over = run(15.0), run(15.5)
    assert under.state == "flat" and "within the run's own scatter" in under.why
    assert over.leak, over.why


@rule("GROWTH_MATTERS_SHARE")
def test_it_matters_once_it_added_more_than_one_percent_of_the_limit():
    limit = 100 * GiB  # 1% is 1 GiB; the run has lived 10 steps, the room would last far longer
    def run(total: int) -> gm.Growth:
        return gm.assess(pts([10 * GiB + total * i // 10 for i in range(11)]), "step", limit=limit,
                         headroom=80 * GiB)
    assert not run(GiB - 50 * MiB).matters
    assert run(GiB + 50 * MiB).matters


@rule("GROWTH_HORIZON_MULTIPLE")
def test_it_matters_when_the_room_goes_within_ten_times_what_the_run_has_lived():
    # 1 MiB a step over 100 steps (100 MiB, under 1% of 100 GiB); the room lasts 990 or 1010 steps
    def run(room_steps: int) -> gm.Growth:
        return gm.assess(pts([10 * GiB + i * MiB for i in range(101)], x0=0), "step", limit=100 * GiB,
                         headroom=room_steps * MiB)
    assert run(990).matters and run(990).leak
    assert not run(1010).matters and run(1010).state == "small"


def test_a_512_byte_drift_is_small_not_a_leak():
    """A scalar loss kept each step (kept_loss_no_leak): a real trend, far too small to matter."""
    g = gm.assess(pts([6 * GiB + 512 * i for i in range(400)]), "step", limit=20 * GiB)
    assert g.state == "small" and not g.leak


# ------------------------------------------------------------------ the forecast reads the same model

def test_the_forecast_and_the_leak_verdict_read_one_model(monkeypatch):
    """A real leak run (val_logits, under `memq run`): the leak verdict at its OOM and the forecast of its
    half-life agree; moving the model's horizon moves both screens' inputs at once."""
    snaps, _ctx, triggers = spool_run(next((FIX / "val_logits" / "run").iterdir()))
    figs = [{"step": f.step, "epoch": f.epoch, "allocated": f.allocated, "peak_allocated": f.peak_allocated,
             "peak_reserved": f.peak_reserved, "reserved": f.reserved} for f in snaps[-1].agent.step_figures]
    limit = 5_744_000_000
    half = figs[: len(figs) // 2]
    fc = fm.forecast(half, limit)
    lk = leak.detect_leak([], limit, half)
    assert fc["oom_expected"] is True and lk["holds"] and fc["growth"]["state"] == lk["growth"]["state"]
    assert fc["growth"]["rate_bytes"] == lk["growth"]["rate_bytes"]
    monkeypatch.setattr(gm, "GROWTH_MATTERS_SHARE", 1.0)
    monkeypatch.setattr(gm, "GROWTH_HORIZON_MULTIPLE", 0.01)
    fc2, lk2 = fm.forecast(half, limit), leak.detect_leak([], limit, half)
    assert fc2["oom_expected"] is False and not lk2["holds"] and lk2["growth"]["state"] == "small"
    res = analyze(snaps, ctx=OomContext(limit_bytes=limit), triggers=triggers)
    assert res["diagnosis"]["primary_cause"] != "leak"


def test_hand_ingested_epoch_end_files_are_counted_in_epochs():
    comp = [{"step": None, "epoch": None, "epoch_end": True, "active": 2 * GiB + i * 300 * MiB,
             "reserved": 3 * GiB + i * 300 * MiB} for i in range(5)]
    fc = fm.forecast([], 6 * GiB, comparable=comp)
    assert fc["unit"] == "epoch" and fc["oom_expected"] is True and fc["step"] is None
    # no trace: a step's excursion is the cache above the live bytes (reserved - active: 1 GiB here)
    assert fc["epoch"] == math.floor((6 * GiB - GiB - (2 * GiB + 4 * 300 * MiB)) / (300 * MiB)) + 4 + 1
    three = fm.forecast([], 6 * GiB, comparable=comp[:3])
    assert three["oom_expected"] is None and "epochs on" in three["basis"] and "one more point" in three["basis"]


# -- growth in steps between unmoved points (a cache filling in bursts) ------------------------------

def _staircase(rises: int, flat: int = 3, jump: int = 40 * MiB) -> list[float]:
    """`rises` jumps of `jump`, each followed by `flat` points that do not move at all."""
    lives, v = [GiB], float(GiB)
    for _ in range(rises):
        v += jump
        lives += [v] * (flat + 1)
    return lives


def test_three_steps_between_unmoved_points_are_said_but_not_claimed():
    g = gm.assess(pts(_staircase(gm.GROWTH_MIN_POINTS - 1), "epoch", 0), "epoch", limit=2 * GiB)
    assert g.leak and g.few and g.rises == gm.GROWTH_MIN_POINTS - 1
    fc = fm.forecast([], 2 * GiB, comparable=[{"epoch_end": True, "active": int(v), "reserved": int(v)}
                                             for v in _staircase(gm.GROWTH_MIN_POINTS - 1)])
    assert fc["oom_expected"] is None and "bursts" in fc["basis"], fc["basis"]


def test_four_steps_between_unmoved_points_are_a_trend():
    g = gm.assess(pts(_staircase(gm.GROWTH_MIN_POINTS), "epoch", 0), "epoch", limit=2 * GiB)
    assert g.leak and not g.few and g.rises == gm.GROWTH_MIN_POINTS


def test_stepwise_only_when_at_least_half_of_the_intervals_did_not_move():
    # one unmoved interval in two: stepwise; one in three: a leak that moves at nearly every point
    half = [GiB + (i + 1) // 2 * 40 * MiB for i in range(9)]  # 8 intervals, 4 unmoved
    assert gm._stepwise_rises(pts(half)) == 4
    under = [GiB + (i - i // 3) * 40 * MiB for i in range(10)]  # 9 intervals, 3 unmoved
    assert gm._stepwise_rises(pts(under)) is None


def test_epoch_end_growth_of_one_block_an_epoch_fails_in_the_next_epoch():
    # the same live bytes: one new block an epoch (kept at the epoch's end) fails an epoch later than
    # eight new blocks an epoch (kept at every step, so inside the epoch)
    def comp(per_epoch: int) -> list[dict]:
        return [{"epoch_end": True, "active": 2 * GiB + i * 300 * MiB, "reserved": 3 * GiB + i * 300 * MiB,
                 "n_blocks": 100 + per_epoch * i} for i in range(5)]
    once, steps = fm.forecast([], 6 * GiB, comparable=comp(1)), fm.forecast([], 6 * GiB, comparable=comp(8))
    assert once["epoch"] == steps["epoch"] + 1
    assert fm.forecast([], 6 * GiB, comparable=comp(2))["epoch"] == steps["epoch"]
