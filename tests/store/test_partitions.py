"""stat_samples partitioned by UTC day on real PostgreSQL (a database of its own per test): the
migration keeps every row, samples without a day partition land in the default one and are carved
out when their day gets one, retention drops whole days only when every policy allows it."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, inspect, select, text

from memq.config import load_settings
from memq.store import partitions, schema
from memq.store import repository as repo
from memq.store.connection import open_store
from memq.store.db import make_engine
from memq.store.orm import StatSample
from memq.store.retention import Policy, collect
from tests.conftest import memq_environ, temp_pg_database

pytestmark = pytest.mark.postgres

NOW = dt.datetime(2026, 11, 30, 9, 30, tzinfo=dt.UTC)
TODAY = NOW.date()


@pytest.fixture
def pg_store(pg_server, tmp_path):
    with temp_pg_database("part") as url:
        st = open_store(load_settings(memq_environ(url, tmp_path)), auto_migrate=True)
        yield st
        st.close()


def _day(n: int, hour: int = 12) -> dt.datetime:
    return dt.datetime.combine(TODAY - dt.timedelta(days=n), dt.time(hour), dt.UTC)


def _samples(store, run: str, cluster: str | None, ages: list[int]) -> int:
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name=run, cluster=cluster))
        repo.insert_stat_samples(s, [{"run_id": rid, "rank": 0, "sampled_at": _day(a), "allocated_bytes": a}
                                     for a in ages])
    return rid


def _count(store, table: str) -> int:
    with store.session() as s:
        return s.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()  # noqa: S608 - test tables


def _ages(store, rid: int) -> list[int]:
    with store.session() as s:
        rows = s.execute(select(StatSample.allocated_bytes).where(StatSample.run_id == rid)).scalars()
        return sorted(rows)


def test_fresh_schema_is_partitioned_with_a_default(pg_store):
    with pg_store.session() as s:
        assert partitions.is_partitioned(s) and partitions.days(s) == []
    assert partitions.DEFAULT in inspect(pg_store.engine).get_table_names()


def test_days_are_made_ahead_and_samples_already_waiting_move_in(pg_store):
    future = TODAY + dt.timedelta(days=3)
    rid = _samples(pg_store, "r", "c", [-3])  # a sample from three days ahead: no partition yet
    assert _count(pg_store, partitions.DEFAULT) == 1
    with pg_store.session() as s:
        made = partitions.ensure_ahead(s, NOW, 7)
    assert made == [partitions.day_name(TODAY + dt.timedelta(days=i)) for i in range(8)]
    assert _count(pg_store, partitions.DEFAULT) == 0
    assert _count(pg_store, partitions.day_name(future)) == 1 and _ages(pg_store, rid) == [-3]
    with pg_store.session() as s:
        assert partitions.ensure_ahead(s, NOW, 7) == []  # idempotent
        assert partitions.days(s) == [TODAY + dt.timedelta(days=i) for i in range(8)]
    # the partition has the table's primary key: a duplicate is still skipped
    with pg_store.session() as s:
        repo.insert_stat_samples(s, [{"run_id": rid, "rank": 0, "sampled_at": _day(-3), "allocated_bytes": 5}])
    assert _ages(pg_store, rid) == [-3]


def test_retention_drops_whole_days_past_every_policy(pg_store):
    with pg_store.session() as s:
        partitions.ensure_days(s, TODAY - dt.timedelta(days=40), TODAY)
    old = _samples(pg_store, "old", "prod", [40, 35, 31, 30, 29, 1])
    dev = _samples(pg_store, "dev", "dev", [40, 10, 6, 1])
    stray = _samples(pg_store, "stray", "prod", [45])  # no partition for that day: default partition
    before = _count(pg_store, "stat_samples")
    policy = Policy(30, {"dev": 7})
    dry = collect(pg_store, policy, now=NOW, dry_run=True)
    assert _count(pg_store, "stat_samples") == before
    summary = collect(pg_store, policy, now=NOW)
    assert summary["stat_samples_removed"] == dry["stat_samples_removed"] == before - _count(pg_store, "stat_samples")
    # every day before midnight of (now - 30 days) went as a partition; the rest row by row
    cut = TODAY - dt.timedelta(days=30)
    assert summary["stat_partitions_dropped"] == [partitions.day_name(TODAY - dt.timedelta(days=n))
                                                  for n in range(40, 30, -1)]
    with pg_store.session() as s:
        assert partitions.days(s)[0] == cut
    assert _ages(pg_store, old) == [1, 29, 30]  # the 30-day-old sample's day is not wholly past
    assert _ages(pg_store, dev) == [1, 6]
    assert _ages(pg_store, stray) == []


def test_a_cluster_kept_forever_keeps_every_day(pg_store):
    with pg_store.session() as s:
        partitions.ensure_days(s, TODAY - dt.timedelta(days=40), TODAY)
    prod = _samples(pg_store, "p", "prod", [40, 1])
    keep = _samples(pg_store, "k", "keep", [40, 1])
    summary = collect(pg_store, Policy(30, {"keep": 0}), now=NOW)
    assert summary["stat_partitions_dropped"] == [] and summary["stat_samples_removed"] == 1
    assert _ages(pg_store, prod) == [1] and _ages(pg_store, keep) == [1, 40]
    with pg_store.session() as s:
        assert len(partitions.days(s)) == 41


def test_gc_makes_the_coming_days(pg_store):
    summary = collect(pg_store, Policy(30), now=NOW, partition_days_ahead=2)
    assert summary["stat_partitions_created"] == [partitions.day_name(TODAY + dt.timedelta(days=i))
                                                  for i in range(3)]


def test_migration_0004_keeps_every_sample_both_ways(pg_server):
    with temp_pg_database("mig4") as url:
        engine = make_engine(url)
        try:
            schema.upgrade(engine, "0003")
            with engine.begin() as c:
                for t in ("2026-11-28 23:59:59+00", "2026-11-29 00:00:00+00", "2026-11-29 12:00:00+00"):
                    c.execute(text("INSERT INTO stat_samples (run_id, rank, sampled_at, allocated_bytes) "
                                   "VALUES (1, 0, :t, 7)"), {"t": t})
            schema.upgrade(engine)
            with engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM stat_samples")).scalar_one() == 3
                assert c.execute(text("SELECT count(*) FROM stat_samples_p20261129")).scalar_one() == 2
                assert c.execute(text("SELECT count(*) FROM stat_samples_p20261128")).scalar_one() == 1
                assert c.execute(text("SELECT count(*) FROM pg_partitioned_table")).scalar_one() == 1
            schema.downgrade(engine, "0003")
            with engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM stat_samples")).scalar_one() == 3
                assert c.execute(text("SELECT count(*) FROM pg_partitioned_table")).scalar_one() == 0
            assert set(inspect(engine).get_table_names()) & {partitions.DEFAULT, "stat_samples_p20261129"} == set()
            schema.upgrade(engine)
            with engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM stat_samples")).scalar_one() == 3
        finally:
            engine.dispose()


def test_sqlite_has_no_partitions(tmp_path):
    st = open_store(load_settings(memq_environ(f"sqlite:///{tmp_path}/m.db", tmp_path)), auto_migrate=True)
    try:
        with st.session() as s:
            assert not partitions.is_partitioned(s)
            assert partitions.ensure_ahead(s, NOW, 7) == []
            assert partitions.drop_days_before(s, TODAY) == ([], 0)
            repo.insert_stat_samples(s, [{"run_id": 1, "rank": 0, "sampled_at": _day(1)}])
            assert s.execute(select(func.count()).select_from(StatSample)).scalar_one() == 1
    finally:
        st.close()


def test_the_dispatcher_makes_the_coming_days_and_survives_a_failure(pg_store, tmp_path, caplog):
    import time

    from memq.workers.dispatcher import Dispatcher

    st = pg_store.settings
    d = Dispatcher(st, consumer="t")  # Redis is not touched by this step
    before = dt.datetime.now(dt.UTC).date()
    d._make_partitions()
    with pg_store.session() as s:
        made = partitions.days(s)
    assert made == [before + dt.timedelta(days=i) for i in range(st.stat_partition_days_ahead + 1)] or \
        made == [before + dt.timedelta(days=i + 1) for i in range(st.stat_partition_days_ahead + 1)]  # at midnight
    assert d._next_partitions > time.monotonic() + 3000  # next check in an hour

    down = load_settings(memq_environ("postgresql://postgres@127.0.0.1:1/none", tmp_path))
    d = Dispatcher(down, consumer="t")
    d._make_partitions()  # logs and carries on: samples land in the default partition meanwhile
    assert d._next_partitions < time.monotonic() + 120
    assert "partitions not made" in caplog.text
