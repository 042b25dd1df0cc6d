"""The figures kept with a run's diagnosis (profiler/analysis/series.py): bounded, the recent steps as
they came, the older ones merged with their lowest and highest live bytes; the growth model reads a
compacted long leak and a compacted plateau as it reads them whole."""

from __future__ import annotations

import pytest

from memq.analysis import growth as gm
from memq.analysis import leak
from memq.analysis.series import compact

MiB, GiB = 1 << 20, 1 << 30


def figs(lives: list[int]) -> list[dict]:
    return [{"step": i + 1, "epoch": None, "allocated": v, "peak_allocated": v + GiB, "peak_reserved": v + 2 * GiB,
             "reserved": v + GiB} for i, v in enumerate(lives)]


def test_under_the_bound_nothing_changes():
    f = figs([GiB] * 100)
    assert compact(f, 512) == f


def test_a_long_run_keeps_its_start_its_end_and_its_extremes():
    lives = [4 * GiB + (i % 7) * MiB for i in range(5000)]
    lives[10] = 9 * GiB  # one boundary far above the rest, early in the run
    out = compact(figs(lives), 512)
    assert len(out) <= 512
    assert out[0]["step_first"] == 1 and out[-1]["step"] == 5000
    assert sum(int(f.get("span") or 1) for f in out) == 5000
    assert max(f.get("allocated_max", f["allocated"]) for f in out) == 9 * GiB
    assert all("step_first" not in f for f in out[-100:])  # the recent steps at full resolution
    steps = [f["step"] for f in out]
    assert steps == sorted(steps)


@pytest.mark.parametrize("shape", ["leak", "plateau"])
def test_the_growth_model_reads_a_compacted_series_as_the_whole_one(shape):
    if shape == "leak":
        lives = [4 * GiB + i * 128 * 1024 for i in range(3000)]
    else:
        lives = [4 * GiB + min(i, 400) * MiB for i in range(3000)]
    whole = gm.assess(leak.figure_series(figs(lives))[0], "step", limit=16 * GiB)
    kept = gm.assess(leak.figure_series(compact(figs(lives), 512))[0], "step", limit=16 * GiB)
    assert whole.state == kept.state == ("growing" if shape == "leak" else "plateau")
    if shape == "leak":
        assert kept.trend.slope == pytest.approx(whole.trend.slope, rel=0.01)


def test_room_for_two_at_least():
    with pytest.raises(ValueError):
        compact(figs([GiB] * 3), 1)
