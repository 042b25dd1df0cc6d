"""The run-level rules of analysis/run_verdict.py (which rank speaks for a run, which rank's forecast is
the run's) and analysis/headroom.py (the one near miss)."""

from __future__ import annotations

import pytest

from memq.analysis.headroom import in_last_free_bytes, near_miss
from memq.analysis.ranks import RankFacts
from memq.analysis.run_verdict import RankDiagnosis, forecast_rank, rank_diagnosis, run_verdict

GiB = 1 << 30
rule = pytest.mark.rule


def D(rank, cause, oom=False, peak=None):  # noqa: N802
    return RankDiagnosis(rank=rank, cause=cause, oom=oom, peak_reserved_bytes=peak)


def test_no_diagnosis_no_verdict():
    assert run_verdict([]) is None
    assert run_verdict([], [RankFacts(rank=0, status="oom")]) is None


def test_the_first_rank_to_fail_speaks_not_the_highest_peak():
    diags = [D(0, "capacity", oom=True, peak=10 * GiB), D(1, "fragmentation", oom=True, peak=12 * GiB)]
    facts = [RankFacts(rank=0, oom_at=100.0, oom_step=7), RankFacts(rank=1, oom_at=101.0, oom_step=7)]
    assert run_verdict(diags, facts) == 0
    # the time decides before the step, the step before the rank
    facts = [RankFacts(rank=0, oom_at=None, oom_step=9), RankFacts(rank=1, oom_at=None, oom_step=8)]
    assert run_verdict(diags, facts) == 1
    facts = [RankFacts(rank=0, status="oom"), RankFacts(rank=1, status="oom")]
    assert run_verdict(diags, facts) == 0


def test_a_failed_rank_without_a_diagnosis_gives_way_to_the_next_failed_one():
    diags = [D(1, "capacity", oom=True, peak=GiB), D(2, "healthy", peak=9 * GiB)]
    facts = [RankFacts(rank=0, status="oom", oom_at=50.0), RankFacts(rank=1, oom_at=60.0)]
    assert run_verdict(diags, facts) == 1


def test_an_oom_only_the_diagnosis_knows_speaks_after_the_recorded_ones_highest_peak_first():
    diags = [D(0, "capacity", oom=True, peak=5 * GiB), D(1, "capacity", oom=True, peak=7 * GiB),
             D(2, "leak", peak=9 * GiB)]
    assert run_verdict(diags) == 1  # no snapshot trigger or exit status: the OOM diagnoses, peak first
    assert run_verdict(diags, [RankFacts(rank=0, oom_at=1.0)]) == 0


def test_without_an_oom_the_cause_earliest_in_the_precedence_speaks_then_the_peak():
    diags = [D(0, "healthy", peak=20 * GiB), D(1, "leak", peak=10 * GiB), D(2, None, peak=30 * GiB)]
    assert run_verdict(diags) == 1  # a leaking rank before a healthy one with a higher peak
    diags = [D(0, "healthy", peak=10 * GiB), D(1, "healthy", peak=12 * GiB), D(2, "healthy", peak=12 * GiB)]
    assert run_verdict(diags) == 1  # equal causes: the highest peak, then the lowest rank
    assert run_verdict([D(3, None), D(4, None)]) == 3


def test_rank_diagnosis_reads_a_result():
    d = rank_diagnosis(2, {"oom": {"requested_bytes": 1}, "diagnosis": {"primary_cause": "capacity"}}, 5)
    assert d == RankDiagnosis(rank=2, cause="capacity", oom=True, peak_reserved_bytes=5)
    assert rank_diagnosis(0, None) == RankDiagnosis(rank=0, cause=None)


def test_the_forecast_of_the_rank_that_runs_out_first():
    fcs = {0: {"oom_expected": True, "as_of_time": 1000.0, "eta_s": 500.0, "step": 900},
           1: {"oom_expected": True, "as_of_time": 1200.0, "eta_s": 200.0, "step": 950},
           2: {"oom_expected": False}, 3: None}
    assert forecast_rank(fcs) == 1  # the earliest moment (1400 s), not the shortest time left of another moment
    fcs[1]["as_of_time"] = None
    assert forecast_rank(fcs) == 0  # a moment known before one unknown
    assert forecast_rank({0: {"oom_expected": True, "step": 90}, 1: {"oom_expected": True, "step": 80}}) == 1
    assert forecast_rank({0: {"oom_expected": True}, 1: {"oom_expected": True, "step": 80}}) == 1
    assert forecast_rank({0: {"oom_expected": None}}) is None and forecast_rank({}) is None


@rule("NEAR_MISS_SHARE")
def test_a_near_miss_is_under_five_percent_of_the_limit_left_without_an_oom():
    limit = 20 * GiB
    assert near_miss(limit - int(0.05 * limit) + 1, limit)          # 5% less a byte left
    assert not near_miss(limit - int(0.05 * limit) - 1, limit)      # 5% and a byte left
    assert not near_miss(limit, limit, oom=True)                    # an OOM is not a near miss
    assert not near_miss(limit, None) and not near_miss(None, limit) and not near_miss(0, limit)
    assert near_miss(limit - int(0.08 * limit), limit, share=0.10)  # the alerts' own threshold
    # the last free bytes: past the limit too, and regardless of an OOM
    assert in_last_free_bytes(limit + GiB, limit) and not in_last_free_bytes(None, limit)


@rule("LEAK_LISTED_CONFIDENCE")
def test_a_ranks_own_leak_is_a_leak_listed_at_even_odds():
    from memq.analysis.ranks import leak_listed

    def d(conf):
        return {"causes": [{"cause": "capacity", "confidence": 0.9}, {"cause": "leak", "confidence": conf}]}

    assert leak_listed(d(0.5)) and leak_listed(d(0.51)) and not leak_listed(d(0.49))
    assert not leak_listed(None) and not leak_listed({"causes": [{"cause": "capacity", "confidence": 0.9}]})
