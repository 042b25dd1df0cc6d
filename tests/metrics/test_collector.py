"""The collector's SQL aggregates on both databases (SQLite, PostgreSQL), over rows written with the
repository the workers use: exact latency bucket edges (Prometheus' `le` is inclusive), reused
analyses left out of the latency, OOM snapshots by cause, active runs bounded to the top K, and a
scrape that reports a database outage as memq_up 0 instead of failing."""

from __future__ import annotations

import datetime as dt
import math
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from sqlalchemy import select, update

from memq.config import load_settings
from memq.metrics.collector import OTHER
from memq.metrics.exporter import registry_for
from memq.store import metric_queries as q
from memq.store import repository as repo
from memq.store.orm import Snapshot
from tests.conftest import memq_environ
from tests.metrics.history import GIB, add_run, set_run
from tests.metrics.scrape import Samples

T0 = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)


def _snapshot(s, run_id: int, tag: str, latency_s: float | None, *, trigger: str = "epoch_end",
              cause: str = "healthy", oom: bool = False, state: str = "done") -> None:
    sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=run_id, sha256=tag.ljust(64, "0"), size_bytes=1,
                                                      trigger=trigger))
    created = T0 + dt.timedelta(minutes=len(tag))
    s.execute(update(Snapshot).where(Snapshot.id == sid).values(state=state, created_at=repo.db_time(s, created)))
    if latency_s is None and state != "done":
        return
    doc = {"schema": 1, "metrics": {}, "oom": {"requested_bytes": 2 * GIB} if oom else None,
           "diagnosis": {"primary_cause": cause, "confidence": 0.9}}
    aid = repo.store_analysis(s, tag.ljust(64, "0"), "v1", doc)
    done = None if latency_s is None else repo.db_time(s, created + dt.timedelta(seconds=latency_s))
    s.execute(update(Snapshot).where(Snapshot.id == sid).values(analysis_id=aid, analysed_at=done))


def test_analysed_at_is_set_once(store):
    with store.session() as s:
        rid = add_run(s, "once")
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256="e" * 64, size_bytes=1))
        aid = repo.store_analysis(s, "e" * 64, "v1", {"schema": 1})
        repo.complete_snapshot(s, sid, aid, "v1")
        first = s.execute(select(Snapshot.analysed_at).where(Snapshot.id == sid)).scalar_one()
        s.execute(update(Snapshot).where(Snapshot.id == sid).values(analysed_at=first - dt.timedelta(hours=1)))
        repo.complete_snapshot(s, sid, aid, "v2")  # a reanalysis keeps the first time: buckets only grow
        again = s.execute(select(Snapshot.analysed_at).where(Snapshot.id == sid)).scalar_one()
    assert first is not None and again == first - dt.timedelta(hours=1)


def test_aggregates(store):
    with store.session() as s:
        a = add_run(s, "a", cluster="c1", job="train")
        b = add_run(s, "b", cluster="c1", job="train", status="oom", cause="capacity", oom_count=1)
        c = add_run(s, "c", cluster="c2", job="eval", peak=None)
        _snapshot(s, a, "a1", 0.25)      # exactly on a bound: counted in le=0.25
        _snapshot(s, a, "a2", 0.251)
        _snapshot(s, a, "a3", 7.0)
        _snapshot(s, a, "a4", 5000.0)    # beyond the last bound: +Inf only
        _snapshot(s, b, "b1", 1.0)
        _snapshot(s, b, "b2", 2.0, trigger="oom", cause="capacity")
        _snapshot(s, b, "b3", 3.0, cause="fragmentation", oom=True)  # found by the analysis, not the trigger
        _snapshot(s, c, "c1", None)      # done before analysed_at existed (migration 0007): left out
        _snapshot(s, c, "c2", None, state="pending")
    with store.session() as s:
        buckets, count, total = q.analysis_latency(s)
        states = {(r[0], r[1], r[2]): int(r[3]) for r in q.snapshot_states(s)}
        ooms = {(r[0], r[1], r[2]): int(r[3]) for r in q.oom_snapshots(s)}
    le = dict(zip(q.LATENCY_BUCKETS + (math.inf,), buckets, strict=True))
    assert count == 7 and math.isclose(total, 0.25 + 0.251 + 7 + 5000 + 1 + 2 + 3, rel_tol=1e-6)
    got = (le[0.25], le[0.5], le[1.0], le[2.5], le[5.0], le[10.0], le[3600.0], le[math.inf])
    assert got == (1, 2, 3, 4, 5, 6, 6, 7)
    assert states == {("c1", "train", "done"): 7, ("c2", "eval", "done"): 1, ("c2", "eval", "pending"): 1}
    assert ooms == {("c1", "train", "capacity"): 1, ("c1", "train", "fragmentation"): 1}


def test_active_runs_are_bounded_to_top_k(store):
    with store.session() as s:
        for i in range(6):
            add_run(s, f"live-{i}", job=f"j{i % 2}", peak=(70 + i) * GIB, limit=80 * GIB, frag=i / 10)
        old = add_run(s, "stale", job="j0", peak=79 * GIB, limit=80 * GIB)
        set_run(s, old, updated_at=repo.db_time(s, repo.utcnow() - dt.timedelta(hours=3)))
        add_run(s, "finished", job="j0", status="completed", peak=79 * GIB, limit=80 * GIB)
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env |= {"MEMQ_EXPORTER_TOP_K": "3", "MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    m = Samples(generate_latest(registry_for(load_settings(env), store)).decode())
    assert m.get("memq_active_runs", job_name="j0") == 3 and m.get("memq_active_runs", job_name="j1") == 3
    assert [lab["run"] for lab, _ in m.all("memq_run_headroom_ratio")] == ["live-5", "live-4", "live-3"]
    assert math.isclose(m.get("memq_run_headroom_ratio", run="live-5"), 1 - 75 / 80)
    assert math.isclose(m.get("memq_job_headroom_min_ratio", job_name="j1"), 1 - 75 / 80)
    assert math.isclose(m.get("memq_job_fragmentation_max_ratio", job_name="j0"), 0.4)
    assert m.get("memq_up", component="database") == 1
    assert m.get("memq_up", component="redis") == 0  # nothing listens there: reported, not raised
    assert m.get("memq_stream_lag") is None


def test_a_database_outage_is_a_metric_not_an_error(tmp_path):
    env = memq_environ("postgresql://postgres@127.0.0.1:1/none", tmp_path) | {"MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    m = Samples(generate_latest(registry_for(load_settings(env))).decode())
    assert m.get("memq_up", component="database") == 0 and m.get("memq_up", component="redis") == 0
    assert m.get("memq_snapshots_analysed_total") is None


def test_the_tally_adds_new_done_snapshots_once_and_agrees_with_a_recount(store):
    from memq.store.snapshot_tally import SnapshotTally

    incremental, recount = SnapshotTally(resync_s=3600), SnapshotTally(resync_s=0)
    with store.session() as s:
        a = add_run(s, "t-a", job="ja")
        _snapshot(s, a, "t1", 0.5)
        _snapshot(s, a, "t2", 40.0, trigger="oom", cause="capacity")

    def both():
        with store.session() as s:
            x = incremental.refresh(s)
            x = (dict(x.done), dict(x.ooms), x.latency())
        with store.session() as s:
            y = recount.refresh(s)
            y = (dict(y.done), dict(y.ooms), y.latency())
        return x, y

    def same(x, y) -> bool:
        """Counts exactly; the latency sum to float rounding (a running total of seconds and a recount
        add the same terms in another order: 40.502084 against 40.502083999999996)."""
        (bx, nx, sx), (by, ny, sy) = x[2], y[2]
        return x[:2] == y[:2] and (bx, nx) == (by, ny) and math.isclose(sx, sy, rel_tol=1e-9, abs_tol=1e-9)

    x, y = both()
    assert same(x, y) and x[0] == {("c1", "ja"): 2}
    now = repo.utcnow()
    with store.session() as s:
        b = add_run(s, "t-b", job="jb")
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=b, sha256="f" * 64, size_bytes=1, trigger="oom"))
        aid = repo.store_analysis(s, "f" * 64, "v1", {"schema": 1, "oom": {"requested_bytes": 1},
                                                     "diagnosis": {"primary_cause": "fragmentation"}})
        s.execute(update(Snapshot).where(Snapshot.id == sid).values(created_at=repo.db_time(s, now)))
        repo.complete_snapshot(s, sid, aid, "v1")  # analysed_at = the database's now
    for _ in range(3):  # scraped again and again: counted once
        x, y = both()
        assert same(x, y)
    assert x[0] == {("c1", "ja"): 2, ("c1", "jb"): 1}
    assert x[1] == {("c1", "ja", "capacity"): 1, ("c1", "jb", "fragmentation"): 1}
    assert x[2][1] == 3 and incremental.full_recounts == 1 and recount.full_recounts == 4


def test_a_flood_of_job_names_keeps_metrics_under_the_bound(store):
    """Issue 24 item 5: every run_start with a new cluster and job name added series that never went
    away (20,000 names: 44 -> 40,044). At most MEMQ_EXPORTER_MAX_JOBS pairs and clusters keep series of
    their own; the rest are summed as "other", so the totals stay true."""
    with store.session() as s:
        for i in range(3):  # the real jobs, with analysed snapshots: they keep their names
            rid = add_run(s, f"real-{i}", cluster="prod", job=f"train-{i}", peak=70 * GIB, limit=80 * GIB)
            for j in range(5):
                _snapshot(s, rid, f"r{i}-{j}", 1.0)
        for i in range(3000):  # forged run_starts: one new cluster and job each
            add_run(s, f"flood-{i}", cluster=f"c-{i}", job=f"j-{i}", peak=GIB, limit=80 * GIB)
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env |= {"MEMQ_EXPORTER_MAX_JOBS": "5", "MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    text = generate_latest(registry_for(load_settings(env), store)).decode()
    m = Samples(text)
    series = [ln for ln in text.splitlines() if ln and not ln.startswith("#")]
    assert len(series) < 120, len(series)  # 3,003 pairs and clusters would be over 9,000
    assert {lab["job_name"] for lab, _ in m.all("memq_active_runs")} <= {"train-0", "train-1", "train-2",
                                                                        "j-0", "j-1", OTHER}
    assert {"train-0", "train-1", "train-2"} <= {lab["job_name"] for lab, _ in m.all("memq_snapshots_analysed_total")}
    assert sum(v for _, v in m.all("memq_active_runs")) == 3003  # nothing dropped: "other" holds the rest
    assert m.get("memq_active_runs", cluster=OTHER, job_name=OTHER) >= 2998
    assert sum(v for lab, v in m.all("memq_runs")) == 3003
    assert len({lab["cluster"] for lab, _ in m.all("memq_runs")}) <= 6


def test_dashboards_get_the_runs_cause_for_ingested_runs_too(memq_env, store):
    """Issue 23 item 9: a leak run's OOM snapshot read `cause="capacity"` (the snapshot's own verdict)
    and `memq ingest`ed runs had no run-level series at all. memq_run_causes is the run's diagnosis over
    all its snapshots, for every run whatever brought it. Real run: tests/fixtures/captured/leak_epochs
    (logits kept every step; OOM in epoch 5), ingested with its 7 GiB cap."""
    from click.testing import CliRunner

    from memq.cli import cli
    from tests.helpers import FIXTURES

    d = FIXTURES / "captured" / "leak_epochs"
    files = [str(d / f"{n}.pickle.gz") for n in ("epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom")]
    res = CliRunner().invoke(cli, ["ingest", *files, "--run", "leaky", "--cluster", "c9", "--job", "lm",
                                   "--limit", "7516192768"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env |= {"MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    m = Samples(generate_latest(registry_for(load_settings(env), store)).decode())
    assert m.get("memq_run_causes", cluster="c9", job_name="lm", cause="leak") == 1
    assert sum(v for lab, v in m.all("memq_run_causes") if lab["job_name"] == "lm") == 1


def test_oom_eta_of_the_soonest_running_runs(store):
    """memq_run_oom_eta_seconds: the top-K running runs whose forecast OOM comes first, seconds from the
    scrape (0 once due); finished runs and runs with no forecast OOM have none."""
    now = repo.utcnow()
    with store.session() as s:
        for i, hours in enumerate((5, 1, 3, 9)):
            rid = add_run(s, f"fc-{i}", job=f"j{i % 2}")
            set_run(s, rid, oom_forecast_step=100 * i, oom_forecast_at=now + dt.timedelta(hours=hours))
        due = add_run(s, "fc-due", job="j0")
        set_run(s, due, oom_forecast_step=7, oom_forecast_at=now - dt.timedelta(minutes=5))
        done = add_run(s, "fc-done", job="j0", status="oom")
        set_run(s, done, oom_forecast_step=7, oom_forecast_at=now + dt.timedelta(minutes=5))
        add_run(s, "no-fc", job="j0")
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env |= {"MEMQ_EXPORTER_TOP_K": "3", "MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    m = Samples(generate_latest(registry_for(load_settings(env), store)).decode())
    runs = [lab["run"] for lab, _ in m.all("memq_run_oom_eta_seconds")]
    assert sorted(runs) == ["fc-1", "fc-2", "fc-due"]
    assert m.get("memq_run_oom_eta_seconds", run="fc-due") == 0
    assert 3600 - 120 < m.get("memq_run_oom_eta_seconds", run="fc-1") <= 3600
    assert m.get("memq_run_oom_eta_seconds", run="fc-2", job_name="j0") > 3 * 3600 - 120


@pytest.mark.redis
def test_inbox_backlog_is_a_metric(store, shared_redis):
    """memq_inbox_length: what agents appended through the inbox and no relay has moved (nothing reads
    this test's stream)."""
    import secrets

    import redis

    stream = f"memqtest:inbox:{secrets.token_hex(6)}"
    r = redis.Redis.from_url(shared_redis)
    r.rpush(f"{stream}:inbox", "a", "b", "c")
    try:
        env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
        env |= {"MEMQ_REDIS_URL": shared_redis, "MEMQ_STREAM": stream, "MEMQ_KEY_PREFIX": stream + ":"}
        m = Samples(generate_latest(registry_for(load_settings(env), store)).decode())
        assert m.get("memq_inbox_length") == 3 and m.get("memq_up", component="redis") == 1
    finally:
        r.delete(f"{stream}:inbox")


def test_active_runs_show_pieces_as_the_runs_list_does(store):
    # a healthy run's fragmentation ratio (0.78: its free cache between steps) is no problem, and the runs
    # list shows `pieces` "-" for it; a run that caught an OOM and went on has its pieces at that OOM
    with store.session() as s:
        add_run(s, "healthy", job="jp", peak=70 * GIB, limit=80 * GIB, frag=0.78)
        caught = add_run(s, "caught", job="jp", peak=60 * GIB, limit=80 * GIB, frag=0.55)
        set_run(s, caught, pieces_share=0.15)
        add_run(s, "alone", job="jq", peak=75 * GIB, limit=80 * GIB, frag=0.79)
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env |= {"MEMQ_EXPORTER_TOP_K": "3", "MEMQ_REDIS_URL": "redis://127.0.0.1:1/0"}
    m = Samples(generate_latest(registry_for(load_settings(env), store)).decode())
    assert math.isclose(m.get("memq_job_pieces_max_ratio", job_name="jp"), 0.15)
    assert m.get("memq_job_pieces_max_ratio", job_name="jq") is None  # no OOM: no series, as the list's "-"
    assert [lab["run"] for lab, _ in m.all("memq_run_pieces_ratio")] == ["caught"]
    assert math.isclose(m.get("memq_run_pieces_ratio", run="caught"), 0.15)
    assert math.isclose(m.get("memq_job_fragmentation_max_ratio", job_name="jq"), 0.79)  # deprecated, kept
