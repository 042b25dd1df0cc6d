"""Retention (`memq gc`, memq.workers.retention): on SQLite and the real PostgreSQL (own database).

Referenced blobs survive, unreferenced old ones go, OOM and diagnosed snapshots' blobs stay, stat
samples follow the per-cluster policy, and a dry run changes nothing."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import time

import pytest

from memq.config import load_settings
from memq.errors import ConfigError
from memq.store import repository as repo
from memq.store.retention import Policy, collect, parse_overrides
from tests.conftest import memq_environ

NOW = dt.datetime.now(dt.UTC)
POLICY = Policy(30, {"dev": 7, "keep": 0})
GRACE = 0.05  # seconds removed blobs are held before the final reference check


def _days(n: float) -> dt.datetime:
    return NOW - dt.timedelta(days=n)


def _result(cause: str = "healthy", oom: bool = False) -> dict:
    return {"schema": 1, "snapshots": [], "metrics": {"reserved_bytes": 1},
            "oom": {"requested_bytes": 4096, "limit_bytes": None, "fits_largest_free_block": False,
                    "fits_if_compacted": None} if oom else None,
            "composition": {}, "diagnosis": {"primary_cause": cause, "confidence": 0.9, "causes": [],
                                             "recommendations": []}}


class World:
    def __init__(self, store):
        self.store = store
        self.runs: dict[str, int] = {}
        self.snaps: dict[str, int] = {}
        self.shas: dict[str, str] = {}

    def run(self, name: str, cluster: str | None) -> int:
        if name not in self.runs:
            with self.store.session() as s:
                self.runs[name] = repo.upsert_run(s, repo.RunMeta(name=name, cluster=cluster))
        return self.runs[name]

    def blob(self, tag: str) -> str:
        data = f"snapshot bytes {tag}".encode() * 50
        sha = hashlib.sha256(data).hexdigest()
        self.store.blobs.put(sha, data)
        self.shas[tag] = sha
        return sha

    def snap(self, tag: str, run: str, cluster: str | None, age_days: float, *, blob: str | None = None,
             trigger: str = "epoch_end", cause: str | None = "healthy", oom: bool = False,
             state: str = "done") -> None:
        sha = self.shas.get(blob or tag) or self.blob(blob or tag)
        self.shas[tag] = sha
        ref = self.store.blobs.ref(sha)
        with self.store.session() as s:
            sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(
                run_id=self.run(run, cluster), sha256=sha, size_bytes=100, trigger=trigger,
                taken_at=_days(age_days), blob_ref=ref, source=tag))
            if state == "done":
                aid = repo.store_analysis(s, sha, "test-v1", _result(cause or "healthy", oom))
                repo.complete_snapshot(s, sid, aid, "test-v1")
            elif state == "failed":
                repo.fail_snapshot(s, sid, "bad snapshot: test", retry=False)
        self.snaps[tag] = sid

    def orphan(self, tag: str, age_days: float) -> str:
        sha = self.blob(tag)
        path = self.store.blobs.directory / self.store.blobs.ref(sha)
        t = time.time() - age_days * 86400
        os.utime(path, (t, t))
        return sha

    def samples(self, run: str, cluster: str | None, ages: list[float]) -> None:
        rid = self.run(run, cluster)
        with self.store.session() as s:
            repo.insert_stat_samples(s, [{"run_id": rid, "rank": 0, "sampled_at": _days(a), "allocated_bytes": 1}
                                         for a in ages])

    def has_blob(self, tag: str) -> bool:
        return self.store.blobs.exists(self.shas[tag])

    def blob_ref(self, tag: str) -> str | None:
        from sqlalchemy import select

        from memq.store.orm import Snapshot

        with self.store.session() as s:
            return s.execute(select(Snapshot.blob_ref).where(Snapshot.id == self.snaps[tag])).scalar_one()

    def sample_ages(self, run: str) -> list[int]:
        from sqlalchemy import select

        from memq.store.orm import StatSample

        with self.store.session() as s:
            rows = s.execute(select(StatSample.sampled_at).where(StatSample.run_id == self.runs[run])).scalars()
            return sorted(round((NOW - repo.to_utc(t)).total_seconds() / 86400) for t in rows)


@pytest.fixture
def world(store) -> World:
    w = World(store)
    w.snap("old_healthy", "r-old", "prod", 40)
    w.snap("old_oom_trigger", "r-old", "prod", 40, trigger="oom")
    w.snap("old_oom_result", "r-old", "prod", 41, oom=True, cause="capacity")
    w.snap("old_diagnosed", "r-old", "prod", 42, cause="fragmentation")
    w.snap("old_pending", "r-old", "prod", 43, state="pending")
    w.snap("old_failed", "r-old", "prod", 44, state="failed")
    w.snap("old_shared", "r-old", "prod", 45)
    w.snap("new_shared", "r-new", "prod", 1, blob="old_shared")   # same bytes, recent run: referenced
    w.snap("new_healthy", "r-new", "prod", 2)
    w.snap("active_old", "r-new", "prod", 40)                     # old, but its run is still going
    w.snap("dev_10d", "r-dev", "dev", 10)                          # dev keeps 7 days
    w.snap("prod_10d", "r-new", "prod", 10)                        # default keeps 30
    w.snap("keep_100d", "r-keep", "keep", 100)                     # keep=0: forever
    w.snap("nocluster_40d", "r-none", None, 40)
    w.orphan("orphan_old", 60)
    w.orphan("orphan_new", 3)
    w.samples("r-old", "prod", [45, 31, 29, 1])
    w.samples("r-dev", "dev", [10, 8, 6, 1])
    w.samples("r-keep", "keep", [400, 1])
    with store.session() as s:  # samples of a run deleted since (no foreign key)
        repo.insert_stat_samples(s, [{"run_id": 987654, "rank": 0, "sampled_at": _days(a)} for a in (50, 2)])
    return w


GONE = {"old_healthy", "old_failed", "dev_10d", "nocluster_40d"}
KEPT = {"active_old", "old_oom_trigger", "old_oom_result", "old_diagnosed", "old_pending", "old_shared", "new_shared",
        "new_healthy", "prod_10d", "keep_100d"}


def test_gc_removes_only_what_is_past_retention_and_unreferenced(world, store):
    summary = collect(store, POLICY, now=NOW, grace_s=GRACE)
    for tag in GONE:
        assert not world.has_blob(tag), tag
        assert world.blob_ref(tag) is None, tag
    for tag in KEPT:
        assert world.has_blob(tag), tag
        assert world.blob_ref(tag) is not None or tag == "old_pending", tag
    assert not world.has_blob("orphan_old") and world.has_blob("orphan_new")
    assert summary["blobs_removed"] == len(GONE) and summary["snapshots_unlinked"] == len(GONE)
    assert summary["orphans_removed"] == 1
    assert summary["kept"] == {"oom": 2, "diagnosis": 1, "active_run": 1, "referenced": 1}
    assert summary["bytes_freed"] > 0 and not summary["errors"]
    # rows and analyses stay: only the raw bytes went
    from sqlalchemy import func, select

    from memq.store.orm import Snapshot

    with store.session() as s:
        assert s.execute(select(func.count()).select_from(Snapshot)).scalar_one() == len(GONE) + len(KEPT)
        done = s.execute(select(Snapshot.analysis_id).where(Snapshot.id == world.snaps["old_healthy"])).scalar_one()
        assert done is not None
    assert world.sample_ages("r-old") == [1, 29]
    assert world.sample_ages("r-dev") == [1, 6]
    assert world.sample_ages("r-keep") == [1, 400]
    # once the run has ended, its old blobs go too
    with store.session() as s:
        repo.move_run_status(s, repo.run_id_for(s, "r-new"), "completed")
    later = collect(store, POLICY, now=NOW, grace_s=GRACE)
    assert later["blobs_removed"] == 1 and not world.has_blob("active_old") and world.has_blob("new_shared")
    assert summary["stat_samples_removed"] == 2 + 2 + 1
    # another run finds nothing more (what the daily task relies on)
    again = collect(store, POLICY, now=NOW, grace_s=GRACE)
    assert (again["blobs_removed"], again["stat_samples_removed"], again["orphans_removed"]) == (0, 0, 0)


def test_dry_run_changes_nothing(world, store):
    before = {tag: world.has_blob(tag) for tag in GONE | KEPT}
    summary = collect(store, POLICY, now=NOW, dry_run=True)
    assert summary["dry_run"] and summary["blobs_removed"] == len(GONE) and summary["stat_samples_removed"] == 5
    assert {tag: world.has_blob(tag) for tag in GONE | KEPT} == before
    assert world.has_blob("orphan_old")
    assert world.sample_ages("r-old") == [1, 29, 31, 45]


def test_cli_and_task_use_the_settings_policy(world, store, db_url, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from memq.cli import cli
    from memq.workers.retention import beat_entries, run_gc

    env = memq_environ(db_url, tmp_path) | {"MEMQ_RETENTION_DAYS": "30", "MEMQ_RETENTION_CLUSTERS": "dev=7,keep=0"}
    env["MEMQ_BLOB_DIR"] = str(store.blobs.directory)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    res = CliRunner().invoke(cli, ["gc", "--dry-run", "--json"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["dry_run"] and doc["blobs_removed"] == len(GONE) and doc["policy"]["clusters"] == {"dev": 7, "keep": 0}
    assert world.has_blob("old_healthy")
    summary = run_gc(load_settings(env), store, grace_s=GRACE)
    assert summary["blobs_removed"] == len(GONE) and not world.has_blob("old_healthy")
    res = CliRunner().invoke(cli, ["gc"], catch_exceptions=False)
    assert res.exit_code == 0 and "removed: 0 stat samples, 0 blobs" in res.output, res.output
    entry = beat_entries(load_settings(env))["memq-retention"]
    assert entry["task"] == "workers.retention.gc" and entry["options"]["queue"] == "memq.report"


def test_beat_schedule_has_the_retention_entry():
    from memq.workers.app import beat_schedule

    st = load_settings({"MEMQ_CONFIG": "/nonexistent.toml", "MEMQ_GC_HOUR_UTC": "4"})
    sched = beat_schedule(st)
    assert "memq-retention" in sched and "memq-reaper" in sched
    assert 4 in sched["memq-retention"]["schedule"].hour
    assert "memq-retention" not in beat_schedule(st.replace(retention_days=0))


def test_policy_parsing():
    assert parse_overrides(" dev=7, prod = 90 ,") == {"dev": 7, "prod": 90}
    for bad in ("dev", "dev=x", "=3", "dev=-1"):
        with pytest.raises(ConfigError):
            parse_overrides(bad)
    p = Policy(30, {"dev": 7})
    assert p.days_for("dev") == 7 and p.days_for("other") == 30 and p.days_for(None) == 30


def test_a_reference_that_appears_during_removal_puts_the_blob_back(world, store):
    """The race: a dispatcher (or `memq ingest`) finds the old blob file and commits a row naming it
    just after gc counted the references. Here a second connection commits that row while gc holds
    the removed bytes; the blob must be back, byte for byte, and still readable."""
    import threading

    sha = world.shas["old_healthy"]
    original = store.blobs.get(sha)
    done = threading.Event()

    def late_ingest():
        # wait until gc has removed the file, then commit a row that names it, as the dispatcher would
        deadline = time.monotonic() + 20
        while store.blobs.exists(sha) and time.monotonic() < deadline:
            time.sleep(0.01)
        with store.session() as s:
            repo.insert_snapshot(s, repo.NewSnapshot(run_id=world.run("r-late", "prod"), sha256=sha, size_bytes=100,
                                                     blob_ref=f"{sha[:2]}/{sha}.zst", source="late"))
        done.set()

    t = threading.Thread(target=late_ingest)
    t.start()
    summary = collect(store, POLICY, now=NOW, grace_s=1.5)
    t.join(30)
    assert done.is_set()
    assert store.blobs.get(sha) == original
    assert summary["restored"] == 1 and summary["blobs_removed"] == len(GONE) - 1
    for tag in GONE - {"old_healthy"}:
        assert not world.has_blob(tag), tag
