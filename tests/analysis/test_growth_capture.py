"""The growth model on the H200 growth capture set (tests/fixtures/growth; benchmarks/growth_calibration.py
judges each run): every control ends with no leak verdict and never gets an OOM forecast, and the leaks
are diagnosed leak at their OOM with the line that keeps the tensor, as benchmarks/RESULTS.md reports.
The runs RESULTS names as missed are the known misses below, each with its reason; a test pins each
one, so a change that mends one (or breaks another) is seen."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.growth_calibration import judge, runs, truth  # noqa: E402

#: forecasts at half a run's life that miss, each for its reason (benchmarks/RESULTS.md)
#: late_leak: its leak starts at epoch 40 of 71, after the half: nothing at half its life grows
#: step_64k/defaults: the step is 3.8% early, the epoch 2 early: the allocator, freeing its cache and
#: retrying, reached the whole cap, where the forecast counts whole free segments
KNOWN_MISSES = {("late_leak", "defaults"), ("late_leak", "run"), ("late_leak", "hand"), ("step_64k", "defaults")}
JUDGED = runs()
CONTROLS = [(sc, v) for sc, v in JUDGED if not truth()[sc][v].get("leak")]
LEAKS = [(sc, v) for sc, v in JUDGED if truth()[sc][v].get("leak")]


@pytest.mark.parametrize("sc,variant", CONTROLS)
def test_no_control_is_a_leak_or_forecast(sc, variant):
    row = judge(sc, variant)
    assert row["verdict_ok"] and row["forecast_ok"], (row["verdict"], row.get("false_alarms"))


@pytest.mark.parametrize("sc,variant", LEAKS)
def test_every_leak_is_diagnosed_at_its_oom_with_its_line(sc, variant):
    row = judge(sc, variant)
    assert row["verdict"] == "leak", row
    if variant == "defaults":  # at defaults the agent records stacks on growth: the line is named
        assert row["site"] and "growth_capture.py" in row["site"], row["site"]


@pytest.mark.parametrize("sc,variant", [r for r in LEAKS if r not in KNOWN_MISSES])
def test_every_leak_is_forecast_at_half_its_life(sc, variant):
    row = judge(sc, variant)
    assert row["forecast_ok"], row["forecast"] and row["forecast"]["basis"]


@pytest.mark.parametrize("sc,variant", sorted(KNOWN_MISSES))
def test_the_known_misses_stay_as_reported(sc, variant):
    row = judge(sc, variant)
    assert row["verdict"] == "leak" and not row["forecast_ok"], \
        f"{sc}/{variant} now passes: update benchmarks/RESULTS.md and this list"
