"""End to end on the shared services: the agent (replaying real snapshots) -> shared Redis (unique
prefix) -> `memq dispatcher` -> a real Celery worker process -> this module's own database on the
shared PostgreSQL -> `memq history --run R --json`."""

from __future__ import annotations

import json

import pytest

from memq.agent.source import ReplaySource
from tests.workers.stack import REAL, Stack, fixture_bytes, make_agent, sha, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(240)]

SGD = ["before_training.pickle.gz", "epoch0.pickle.gz", "epoch1.pickle.gz", "epoch2.pickle.gz"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_redis, pg_server):
    from tests.conftest import temp_pg_database

    with temp_pg_database("wk") as url:
        s = Stack(tmp_path_factory.mktemp("e2e"), shared_redis, url)
        try:
            s.upgrade()
            s.start_worker(concurrency=2)
            s.start_dispatcher()
            yield s
        finally:
            s.close()


def _history(stack: Stack, run: str) -> dict:
    return stack.memq_json("history", "--run", run)


def _settled(stack: Stack, run: str, n: int, status: str) -> dict:
    """`memq history` once every snapshot of the run is done and its run-level diagnosis covers
    them all (polled cheaply in SQL first)."""
    def ready():
        rows = stack.rows(
            "SELECT r.status, count(s.id) AS n, sum(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END) AS done, "
            "(SELECT max(d.snapshot_count) FROM run_diagnoses d WHERE d.run_id = r.id) AS diag "
            "FROM runs r LEFT JOIN snapshots s ON s.run_id = r.id WHERE r.name = :name GROUP BY r.id, r.status",
            name=run)
        return bool(rows) and tuple(rows[0]) == (status, n, n, n)

    wait_for(ready, 90, 0.25, f"run {run}: {n} snapshots analysed, status {status}")
    return _history(stack, run)


def test_agent_run_is_analysed_and_matches_memq_ingest(stack):
    src = ReplaySource(REAL / "seed_sgd")
    # warm-up outlasts these 45 steps: the agent's own baseline snapshot at its end (a comparable periodic
    # one) would take one of the four recorded files that are compared with memq ingest below
    a = make_agent(stack, "e2e-sgd", src, stats_interval_s=0, job="job-e2e", host="node-1", warmup_steps=100)
    assert a.snapshot("manual")  # before_training
    for epoch in range(3):
        for step in range(epoch * 15, epoch * 15 + 15):
            a.mark_step(step, epoch)
        a.mark_epoch(epoch)
    counters = a.stop(15)
    assert counters["sent"] > 0 and counters["dropped"] == 0

    doc = _settled(stack, "e2e-sgd", 4, "completed")
    snaps = doc["snapshots"]
    assert [s["sha256"] for s in snaps] == [sha(fixture_bytes("seed_sgd", f)) for f in SGD]
    assert [s["trigger"] for s in snaps] == ["manual", "epoch_end", "epoch_end", "epoch_end"]
    assert [(s["step"], s["epoch"]) for s in snaps[1:]] == [(14, 0), (29, 1), (44, 2)]
    for s in snaps:
        assert s["diagnosis"]["primary_cause"] == "healthy"
        assert s["reserved_bytes"] > 0 and s["composition"]["parameters"] > 0
    assert doc["diagnosis"]["primary_cause"] == "healthy"
    run = doc["run"]
    assert (run["job"], run["cluster"], run["host"]) == ("job-e2e", "test-cluster", "node-1")
    assert run["torch_version"] == "2.11.0+cu130" and run["gpu_model"] == "NVIDIA H200"
    assert run["snapshot_count"] == 4 and run["primary_cause"] == "healthy"
    assert doc["stats"]["count"] == 45  # one memory_stats sample per marked step

    # The worker produces what `memq ingest` produces for the same files and facts.
    files = [str(REAL / "seed_sgd" / f) for f in SGD]
    ing = stack.memq_json("ingest", *files, "--run", "e2e-sgd-ingest", "--device-total", "150109880320")
    ref = _history(stack, "e2e-sgd-ingest")
    assert [s["sha256"] for s in ref["snapshots"]] == [s["sha256"] for s in snaps]
    assert not any(s["analysed"] for s in ing["snapshots"])  # the workers' results were reused
    for a_s, b_s in zip(snaps, ref["snapshots"], strict=True):
        assert a_s["diagnosis"] == b_s["diagnosis"] and a_s["composition"] == b_s["composition"]
    assert doc["diagnosis"] == ref["diagnosis"]
    assert doc["run_analysis"]["metrics"] == ref["run_analysis"]["metrics"]


def test_agent_oom_marks_the_run_and_gives_the_cause(stack):
    src = ReplaySource(REAL / "frag_synthetic")
    meta = json.loads((REAL / "frag_synthetic" / "meta.json").read_text())
    a = make_agent(stack, "e2e-frag", src, oom_message_wait_s=5)
    a.mark_step(0, 0)
    assert a.snapshot("manual")  # fragmented
    err = RuntimeError(meta["oom_message"])
    with pytest.raises(RuntimeError):
        assert src.fire_oom()  # the allocator's observer runs, then the error reaches the caller
        raise err
    a.note_exception(err)
    a.stop(15)

    doc = _settled(stack, "e2e-frag", 2, "oom")
    oom_snap = doc["snapshots"][-1]
    assert oom_snap["trigger"] == "oom"
    assert oom_snap["oom"]["requested_bytes"] == 1610612736
    assert doc["diagnosis"]["primary_cause"] == "fragmentation"
    assert doc["run"]["memory_limit_bytes"] == meta["cap_bytes"] and doc["run"]["oom_count"] >= 1


def test_push_cli_and_status(stack):
    f = str(REAL / "capacity" / "oom.pickle.gz")
    out = stack.memq_json("push", f, "--run", "e2e-push", "--cluster", "c-push", "--limit", "16GiB")
    assert out["snapshots"][0]["sha256"] == sha(fixture_bytes("capacity", "oom.pickle.gz"))
    assert out["snapshots"][0]["trigger"] == "oom"
    doc = _settled(stack, "e2e-push", 1, "oom")
    assert doc["diagnosis"]["primary_cause"] == "capacity"

    st = stack.memq_json("status")
    assert st["stream"]["key"] == stack.stream and st["stream"]["length"] > 0
    assert st["stream"]["pending"] == 0 and st["stream"]["group"] == "memq-dispatch"
    assert set(st["queues"]) == {"memq.ingest", "memq.analyze", "memq.report"}
    assert st["dead_letters"]["count"] == 0
    assert len(st["workers"]) == 1 and st["workers"][0]["age_s"] < 5
    assert "memq.analyze" in st["workers"][0]["queues"]
    assert len(st["dispatchers"]) == 1
    # what `memq status` counts is what the stack's database holds (this test's push and whatever the
    # module's other tests left: the count must not depend on which of them ran before it)
    total = stack.rows("SELECT count(*) FROM snapshots")[0][0]
    assert sum(st["snapshots"].values()) == total >= 1
    assert st["snapshots"]["failed"] == 0 and st["snapshots"]["done"] >= 1
    text = stack.memq("status").stdout
    assert "dead letters" in text and "workers 1 alive" in text
