"""Write-side repository on real PostgreSQL and SQLite: idempotency, leases, upserts, errors."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from sqlalchemy import func, select, text

from memq.errors import BadInput, NotFound, SchemaOutOfDate, StorageError, StorageUnavailable
from memq.pipeline import history
from memq.store import queries
from memq.store import repository as repo
from memq.store.db import make_engine, session_scope
from memq.store.orm import AnalysisResult, Report, Run, Snapshot, StatSample

SHA_A = "a" * 64
SHA_B = "b" * 64


def _result(cause="healthy", reserved=100, allocated=60):
    """A contract-shaped analysis result (the real analyze() output is exercised in test_service)."""
    return {"schema": 1, "snapshots": [{"file": "x", "torch_format": "2.3+", "segments": 1, "trace_entries": 0,
                                        "expandable_segments": False}],
            "metrics": {"reserved_bytes": reserved, "allocated_bytes": allocated, "active_bytes": allocated,
                        "requested_bytes": allocated, "reserved_unallocated_bytes": reserved - allocated,
                        "largest_free_block_bytes": 20, "fragmentation_ratio": 0.5, "stranded_bytes": 0},
            "oom": None, "composition": {"parameters": allocated, "gradients": 0, "optimizer_state": 0,
                                         "activations": 0, "workspace": 0, "other": 0, "unknown": 0},
            "diagnosis": {"primary_cause": cause, "confidence": 0.9, "causes": [], "recommendations": []},
            "details": {"nan": float("nan")}}


def test_upsert_run_creates_then_merges(store):
    t0 = dt.datetime(2026, 11, 1, 12, tzinfo=dt.UTC)
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="r1", job="j", cluster="c", labels={"a": "1"}, started_at=t0,
                                              torch_version="2.11.0"))
    with store.session() as s:
        rid2 = repo.upsert_run(s, repo.RunMeta(name="r1", host="h", labels={"b": "2"},
                                               started_at=t0 + dt.timedelta(hours=1), ended_at=t0, status="completed"))
        assert rid2 == rid
        d = queries.get_run(s, "r1")
    assert d["job"] == "j" and d["cluster"] == "c" and d["host"] == "h"  # None kept the stored value
    assert d["labels"] == {"a": "1", "b": "2"}
    assert d["started_at"] == "2026-11-01T12:00:00Z"  # the earliest start wins
    assert d["status"] == "completed" and d["torch_version"] == "2.11.0"


def test_insert_snapshot_is_idempotent_and_same_bytes_two_runs_are_two_rows(store):
    with store.session() as s:
        r1 = repo.upsert_run(s, repo.RunMeta(name="r1"))
        r2 = repo.upsert_run(s, repo.RunMeta(name="r2"))
        a, created = repo.insert_snapshot(s, repo.NewSnapshot(run_id=r1, sha256=SHA_A, size_bytes=10))
        b, created2 = repo.insert_snapshot(s, repo.NewSnapshot(run_id=r1, sha256=SHA_A, size_bytes=10))
        c, created3 = repo.insert_snapshot(s, repo.NewSnapshot(run_id=r2, sha256=SHA_A, size_bytes=10))
        d, created4 = repo.insert_snapshot(s, repo.NewSnapshot(run_id=r1, rank=1, sha256=SHA_A, size_bytes=10))
    assert created and not created2 and created3 and created4
    assert a == b and len({a, c, d}) == 3
    with store.session() as s:
        assert s.execute(select(func.count()).select_from(Snapshot)).scalar_one() == 3


def test_claim_lease_complete_fail_and_requeue(store):
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="r"))
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=SHA_A, size_bytes=1))
        sid2, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=SHA_B, size_bytes=1))
    with store.session() as s:
        c = repo.claim_snapshot(s, sid, lease_s=60)
        assert c is not None and c.attempts == 1 and c.sha256 == SHA_A
        assert repo.claim_snapshot(s, sid, lease_s=60) is None  # leased by someone else
    with store.session() as s:  # the lease expires: the reaper puts it back, a worker claims again
        s.execute(Snapshot.__table__.update().where(Snapshot.id == sid).values(
            lease_until=dt.datetime(2000, 1, 1)))
        assert repo.requeue_expired(s) == [sid]
        again = repo.claim_snapshot(s, sid, lease_s=60)
        assert again is not None and again.attempts == 2
        assert repo.fail_snapshot(s, sid, "boom", retry=True, max_attempts=5) == "pending"
        assert repo.claim_snapshot(s, sid, lease_s=60, max_attempts=2) is None  # out of attempts
        assert repo.fail_snapshot(s, sid, "boom", retry=False) == "failed"
    with store.session() as s:
        nxt = repo.claim_next(s, lease_s=60, limit=5)
        assert [c.id for c in nxt] == [sid2]
        aid = repo.store_analysis(s, SHA_B, "v1", _result())
        repo.complete_snapshot(s, sid2, aid, "v1")
        assert repo.claim_snapshot(s, sid2) is None  # done is never claimed again
        row = s.execute(select(Snapshot.state, Snapshot.analysis_id, Snapshot.lease_until)
                        .where(Snapshot.id == sid2)).one()
    assert row.state == "done" and row.analysis_id == aid and row.lease_until is None
    with store.session() as s, pytest.raises(NotFound):
        repo.fail_snapshot(s, 999_999, "x")


@pytest.mark.postgres
def test_only_one_of_many_concurrent_claims_wins(pg_session_db, tmp_path):
    from tests.conftest import _truncate

    _truncate(pg_session_db)
    engine = make_engine(pg_session_db)
    try:
        with session_scope(engine) as s:
            rid = repo.upsert_run(s, repo.RunMeta(name="race"))
            sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=SHA_A, size_bytes=1))
        wins, barrier = [], threading.Barrier(8)

        def worker():
            barrier.wait()
            with session_scope(engine) as s:
                if repo.claim_snapshot(s, sid, lease_s=60) is not None:
                    wins.append(1)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(wins) == 1
    finally:
        engine.dispose()


def test_analysis_upsert_keyed_by_sha_version_context(store):
    with store.session() as s:
        a = repo.store_analysis(s, SHA_A, "v1", _result("healthy"))
        b = repo.store_analysis(s, SHA_A, "v1", _result("fragmentation", reserved=200))
        c = repo.store_analysis(s, SHA_A, "v2", _result())
        d = repo.store_analysis(s, SHA_A, "v1", _result(), context_key=repo.context_key({"limit_bytes": 8}))
        assert a == b and len({a, c, d}) == 3
        assert repo.find_analysis(s, SHA_A, "v1") == a
        assert repo.find_analysis(s, SHA_A, "v3") is None
        row = s.execute(select(AnalysisResult).where(AnalysisResult.id == a)).scalar_one()
        assert row.primary_cause == "fragmentation" and row.reserved_bytes == 200  # replaced
        assert row.result["details"]["nan"] is None  # NaN is not JSON: stored as null
    assert repo.context_key({}) == "" and repo.context_key({"limit_bytes": None}) == ""
    assert repo.context_key({"limit_bytes": 8}) == repo.context_key({"limit_bytes": 8, "message": ""})


def test_stat_samples_batch_insert_skips_redelivered_rows(store):
    t0 = 1_795_984_680.0
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="r"))
    rows = [repo.stat_row(rid, 0, {"allocated_bytes.all.current": i * 10, "reserved_bytes.all.current": i * 20,
                                   "active_bytes.all.current": i, "inactive_split_bytes.all.current": 1,
                                   "num_alloc_retries": 0, "num_ooms": 0, "step": i, "epoch": 0}, t0 + i)
            for i in range(7000)]
    with store.session() as s:
        assert repo.insert_stat_samples(s, rows) == 7000
    with store.session() as s:
        repo.insert_stat_samples(s, rows[:100] + [repo.stat_row(rid, 1, {}, t0)])  # redelivered + one new
        assert s.execute(select(func.count()).select_from(StatSample)).scalar_one() == 7001
        series = queries.stat_series(s, rid, 0, points=50)
    assert series["count"] == 7000 and len(series["series"]) <= 50
    assert series["peak_reserved_bytes"] == 6999 * 20
    assert series["series"][0]["t"].startswith("2026-11-29T")


def test_report_upsert_replaces_per_date_and_scope(store):
    day = dt.date(2026, 11, 29)
    with store.session() as s:
        a = repo.upsert_report(s, day, "all", {"runs": 1})
        b = repo.upsert_report(s, day, "all", {"runs": 2}, path="/tmp/r.html")
        c = repo.upsert_report(s, day, "cluster:x", {"runs": 3})
        assert a == b != c
        assert s.execute(select(func.count()).select_from(Report)).scalar_one() == 2
        assert s.execute(select(Report.summary).where(Report.id == a)).scalar_one() == {"runs": 2}


def test_status_moves_up_only_unless_a_person_gives_it(store):
    """analysis/run_status.py through repo.move_run_status: running < completed < crashed < oom."""
    t = dt.datetime(2026, 11, 2, 9, tzinfo=dt.UTC)
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="r"))
        assert repo.move_run_status(s, rid, "oom", ended_at=t)
        assert not repo.move_run_status(s, rid, "completed")  # a late run_end never downgrades an OOM
        assert not repo.move_run_status(s, rid, "crashed") and not repo.move_run_status(s, rid, "oom")
        status, ended = s.execute(select(Run.status, Run.ended_at).where(Run.id == rid)).one()
        assert status == "oom" and repo.to_utc(ended) == t
        assert repo.move_run_status(s, rid, "completed", given=True)  # `memq ingest --status`: as given
        assert repo.move_run_status(s, rid, "crashed") and repo.move_run_status(s, rid, "oom")
        with pytest.raises(BadInput, match="not one of running, completed, crashed, oom"):
            repo.move_run_status(s, rid, "error")
        assert not repo.move_run_status(s, rid + 1000, "oom")  # no such run: nothing moves
    with store.session() as s, pytest.raises(NotFound):
        history.run_history(s, "ghost")


def test_filters_are_bound_not_formatted(store):
    with store.session() as s:
        repo.upsert_run(s, repo.RunMeta(name="r", cluster="c", labels={"team": "x"}, torch_version="2.11.0+cu130"))
        repo.upsert_run(s, repo.RunMeta(name="r2", cluster="c", labels={"team": "y"}, torch_version="2.1.0"))
    evil = "x' OR '1'='1"
    with store.session() as s:
        assert queries.list_runs(s, queries.RunFilter(cluster=evil)) == []
        assert queries.list_runs(s, queries.RunFilter(labels={"team": evil})) == []
        assert [r["run"] for r in queries.list_runs(s, queries.RunFilter(labels={"team": "x"}))] == ["r"]
        assert [r["run"] for r in queries.list_runs(s, queries.RunFilter(torch_version="2.11"))] == ["r"]
        assert [r["run"] for r in queries.list_runs(s, queries.RunFilter(torch_version="2.1"))] == ["r2"]
        assert queries.list_runs(s, queries.RunFilter(torch_version="2_%")) == []


def test_missing_tables_read_as_schema_out_of_date(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'empty.db'}")
    try:
        with pytest.raises(SchemaOutOfDate, match="memq db upgrade"), session_scope(engine) as s:
            s.execute(select(Run.id)).all()
    finally:
        engine.dispose()


def test_unreachable_server_is_storage_unavailable_without_password():
    engine = make_engine("postgresql://memq:s3cret-pw@127.0.0.1:1/memq")
    try:
        with pytest.raises(StorageUnavailable) as exc, session_scope(engine) as s:
            s.execute(text("SELECT 1"))
        assert "s3cret-pw" not in str(exc.value)
        assert isinstance(exc.value, StorageError) and exc.value.exit_code == 1
    finally:
        engine.dispose()


def test_delete_run_removes_its_rows_but_not_shared_analyses(store):
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="gone"))
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=SHA_A, size_bytes=1))
        aid = repo.store_analysis(s, SHA_A, "v1", _result())
        repo.complete_snapshot(s, sid, aid, "v1")
        repo.insert_stat_samples(s, [repo.stat_row(rid, 0, {"allocated_bytes": 1}, 1_795_984_680.0)])
    with store.session() as s:
        repo.delete_run(s, "gone")
    with store.session() as s:
        assert s.execute(select(func.count()).select_from(StatSample)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(Snapshot)).scalar_one() == 0
        assert s.execute(select(func.count()).select_from(AnalysisResult)).scalar_one() == 1
