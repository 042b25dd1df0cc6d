"""Every screen names the same rank's verdict for a run (analysis/run_verdict.run_verdict, read through
store/run_verdicts), on real PostgreSQL and SQLite: the run row (runs list, exporter, alerts' verdict),
the history page, compare, the nightly report's parts and metrics, and the alert's body.

The run: rank 0 runs out of memory first (capacity, the lower peak), rank 1 a minute later
(fragmentation, the higher peak). Before one rule, the history said rank 0's capacity and the runs list,
report and alerts rank 1's fragmentation."""

from __future__ import annotations

import datetime as dt

from memq.pipeline import history as queries
from memq.store import report_queries
from memq.store import repository as repo
from memq.store.run_verdicts import verdict_rank, verdict_result

GiB = 1 << 30
T0 = dt.datetime(2026, 12, 1, 10, tzinfo=dt.UTC)


def _result(cause: str, reserved: int, frag: float) -> dict:
    return {"schema": 1, "snapshots": [],
            "metrics": {"reserved_bytes": reserved, "allocated_bytes": reserved - GiB, "active_bytes": reserved - GiB,
                        "requested_bytes": reserved - GiB, "reserved_unallocated_bytes": GiB,
                        "largest_free_block_bytes": GiB // 4, "fragmentation_ratio": frag, "stranded_bytes": 0},
            "oom": {"requested_bytes": 2 * GiB, "limit_bytes": 16 * GiB, "fits_largest_free_block": False,
                    "fits_if_compacted": cause == "fragmentation"},
            "composition": {"parameters": GiB, "gradients": 0, "optimizer_state": 0, "activations": 0,
                            "workspace": 0, "other": 0, "unknown": 0},
            "diagnosis": {"primary_cause": cause, "confidence": 0.8,
                          "causes": [{"cause": cause, "confidence": 0.8, "evidence": [f"rank says {cause}"]}],
                          "recommendations": [{"action": f"fix {cause}", "why": "w", "expected_effect": "e"}]}}


def _two_ranks(store, name: str = "ddp") -> int:
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name=name, job="train", cluster="c", started_at=T0,
                                              memory_limit_bytes=16 * GiB))
        for rank, cause, peak, late, frag in ((0, "capacity", 10 * GiB, 0, 0.1),
                                              (1, "fragmentation", 12 * GiB, 60, 0.7)):
            sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(
                run_id=rid, sha256=f"{rank}" * 64, size_bytes=10, rank=rank, step=7, trigger="oom",
                taken_at=T0 + dt.timedelta(seconds=late)))
            res = _result(cause, peak, frag)
            aid = repo.store_analysis(s, f"{rank}" * 64, "t", res)
            repo.complete_snapshot(s, sid, aid, "t")
            repo.store_run_diagnosis(s, rid, rank, "t", res, 1, peak, peak - GiB, res["composition"])
        repo.refresh_run_summary(s, rid)
        repo.upsert_run(s, repo.RunMeta(name=name, ended_at=T0 + dt.timedelta(minutes=5)))
    return rid


def test_every_screen_names_the_first_failing_ranks_verdict(store):
    rid = _two_ranks(store)
    with store.session() as s:
        assert verdict_rank(s, rid) == 0
        assert queries.get_run(s, "ddp")["primary_cause"] == "capacity"            # runs list, exporter, alerts
        hist = queries.run_history(s, "ddp")
        assert hist["ranks"]["failed_rank"] == 0 and hist["run_analysis"]["rank"] == 0
        assert hist["diagnosis"]["primary_cause"] == "capacity"                      # history page
        assert queries.compare_runs(s, "ddp", "ddp")["a"]["diagnosis"]["primary_cause"] == "capacity"
        parts = report_queries.diagnosis_parts(s, [rid])                             # the report's runs
        assert parts[rid]["rank"] == 0 and parts[rid]["diagnosis"]["primary_cause"] == "capacity"
        window, scope = report_queries.Window.for_date(T0.date()), report_queries.Scope()
        assert report_queries.run_metrics(s, window, scope)[rid]["fragmentation_ratio"] == 0.1
        assert verdict_result(s, rid)["diagnosis"]["primary_cause"] == "capacity"   # the alert's body


def test_a_rank_asked_for_by_name_is_that_ranks(store):
    _two_ranks(store)
    with store.session() as s:
        hist = queries.run_history(s, "ddp", rank=1)
    assert hist["diagnosis"]["primary_cause"] == "fragmentation"


def test_a_rank_diagnosed_between_the_summarys_two_reads_leaves_the_cause_to_its_own_refresh(store, monkeypatch):
    """Two ranks' recomputes race (a DDP run's workers on PostgreSQL): rank 1's refresh reads the ranks'
    diagnoses (rank 1's alone), then rank 0's commits, then the verdict's own read names rank 0. The refresh
    must neither fail (it raised StopIteration, and the run never got its figures) nor take rank 1's
    cause; rank 0's own refresh sets the run's cause."""
    from memq.store.repository import analyses

    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="race", job="train", cluster="c", started_at=T0,
                                              memory_limit_bytes=16 * GiB))
        late = _result("fragmentation", 12 * GiB, 0.7)
        repo.store_run_diagnosis(s, rid, 1, "t", late, 1, 12 * GiB, 11 * GiB, late["composition"])
        monkeypatch.setattr(analyses, "verdict_rank", lambda session, run_id: 0)  # rank 0 committed meanwhile
        repo.refresh_run_summary(s, rid)
        assert queries.get_run(s, "race")["primary_cause"] is None
        assert queries.get_run(s, "race")["peak_reserved_bytes"] == 12 * GiB  # the rest is refreshed
        first = _result("capacity", 10 * GiB, 0.1)
        repo.store_run_diagnosis(s, rid, 0, "t", first, 1, 10 * GiB, 9 * GiB, first["composition"])
        repo.refresh_run_summary(s, rid)
        assert queries.get_run(s, "race")["primary_cause"] == "capacity"
