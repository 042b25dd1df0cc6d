"""rank_figures: a rank's exit figures as the dispatcher stores them (stats flush, then run_end), on
SQLite and PostgreSQL; payloads come from the network, so only known keys and sane integers stay."""

from __future__ import annotations

import datetime as dt

from memq.pipeline.history import run_history
from memq.store import rank_figures
from memq.store import repository as repo

T = dt.datetime(2026, 12, 1, 12, tzinfo=dt.UTC)


def test_stats_then_run_end_merge_and_peaks_only_grow(store):
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="rf-1", cluster="c"))
        rank_figures.upsert(s, rid, 1, {"peak_allocated_bytes": 9 << 30, "peak_reserved_bytes": 10 << 30,
                                        "last_step": 41, "limit_bytes": 16 << 30,
                                        "step_peaks": {"count": 42, "max_peak_allocated": 9 << 30}}, None, T)
        # run_end: a later, smaller reading (the step in progress) never lowers the run's peak
        rank_figures.upsert(s, rid, 1, {"peak_allocated_bytes": 3 << 30, "peak_reserved_bytes": None,
                                        "last_step": 42, "end_reason": "sigterm"}, "crashed", T)
        rank_figures.upsert(s, rid, 0, {"peak_allocated_bytes": -5, "limit_bytes": 1 << 70, "last_step": True,
                                        "evil": "x" * 10_000, "end_reason": "y" * 500}, "completed", T)
    with store.session() as s:
        got = rank_figures.for_run(s, rid)
    one = got[1]
    assert one["status"] == "crashed" and one["end_reason"] == "sigterm" and one["last_step"] == 42
    assert (one["peak_allocated_bytes"], one["peak_reserved_bytes"]) == (9 << 30, 10 << 30)
    assert one["step_peaks"]["count"] == 42 and one["limit_bytes"] == 16 << 30
    zero = got[0]
    assert zero["peak_allocated_bytes"] is None and zero["limit_bytes"] is None and zero["last_step"] is None
    assert "evil" not in zero and len(zero["end_reason"]) == 64
    with store.session() as s:
        doc = run_history(s, "rf-1")
    rows = {r["rank"]: r for r in doc["ranks"]["ranks"]}
    assert rows[1]["peak_allocated_bytes"] == 9 << 30 and rows[1]["end_reason"] == "sigterm"
    with store.session() as s:
        repo.delete_run(s, "rf-1")
    with store.session() as s:
        assert rank_figures.for_run(s, rid) == {}
