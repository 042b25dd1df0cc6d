"""Live metrics and alerts end to end: `memq push` and the agent -> Redis (shared, own prefix) ->
`memq dispatcher` -> a Celery worker (`memq worker`) and its beat -> this module's own database;
then `memq exporter` scraped over HTTP, and the alerts received by a local HTTP server, including
when the worker is SIGKILLed in the middle of a send and started again."""

from __future__ import annotations

import json
import math
import time

import pytest

from tests.metrics.receiver import Receiver
from tests.metrics.scrape import Samples, scrape
from tests.workers.stack import REAL, Stack, free_port, kill_group, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(400)]

SGD = [str(REAL / "seed_sgd" / f) for f in ("before_training.pickle.gz", "epoch0.pickle.gz", "epoch1.pickle.gz",
                                            "epoch2.pickle.gz")]
NEAR_LIMIT = 8_100_000_000  # seed_sgd peaks at 7,981,760,512 reserved bytes: 1.5% headroom


@pytest.fixture(scope="module")
def rx():
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_redis, pg_server, rx):
    from tests.conftest import temp_pg_database

    with temp_pg_database("live") as url:
        s = Stack(tmp_path_factory.mktemp("live"), shared_redis, url, MEMQ_ALERT_WEBHOOK_URL=rx.url,
                  MEMQ_ALERT_SWEEP_S="1", MEMQ_ALERT_TIMEOUT_S="4", MEMQ_ALERT_LEASE_S="8",
                  MEMQ_ALERT_RUN_INTERVAL_S="1", MEMQ_PUBLIC_URL="http://memq.test", MEMQ_ALERT_FORMAT="slack")
        try:
            s.upgrade()
            s.start_worker(concurrency=1)
            s.start_dispatcher(wait=True)
            yield s
        finally:
            s.close()


def _settled(stack: Stack, run: str, n: int) -> None:
    def ready():
        rows = stack.rows(
            "SELECT count(s.id), sum(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END), "
            "(SELECT max(d.snapshot_count) FROM run_diagnoses d WHERE d.run_id = r.id) "
            "FROM runs r LEFT JOIN snapshots s ON s.run_id = r.id WHERE r.name = :name GROUP BY r.id", name=run)
        return bool(rows) and tuple(rows[0]) == (n, n, n)

    wait_for(ready, 120, 0.3, f"run {run}: {n} snapshots analysed and diagnosed")


def _exporter(stack: Stack) -> int:
    port = free_port()
    p = stack._spawn("exporter", ["exporter", "--port", str(port)])
    wait_for(lambda: p.poll() is not None or _healthy(port), 60, 0.2, "exporter /healthz")
    assert p.poll() is None, stack.log_tail("exporter")
    return port


def _healthy(port: int) -> bool:
    try:
        return scrape(port, "/healthz") == "ok\n"
    except OSError:
        return False


def _alert_states(stack: Stack) -> dict[str, tuple]:
    return {f"{r.name}/{r.verdict}": (r.state, r.idem_key, r.attempts) for r in stack.rows(
        "SELECT r.name, a.verdict, a.state, a.idem_key, a.attempts FROM alerts a JOIN runs r ON r.id = a.run_id")}


def test_exporter_reports_the_ingested_history(stack, rx):
    stack.memq("push", *SGD, "--run", "m-near", "--cluster", "c-m", "--job", "job-near", "--limit",
               str(NEAR_LIMIT), "--status", "running")
    stack.memq("push", str(REAL / "capacity" / "oom.pickle.gz"), "--run", "m-cap", "--cluster", "c-m",
               "--job", "job-cap", "--limit", "16GiB", "--status", "oom")
    # an entry the dispatcher cannot take: dead-lettered
    stack.redis.xadd(stack.stream, {"v": "1", "kind": "bogus", "run": "m-bad"})
    _settled(stack, "m-near", 4)
    _settled(stack, "m-cap", 1)
    wait_for(lambda: len(_alert_states(stack)) == 2 and all(v[0] == "sent" for v in _alert_states(stack).values()),
             60, 0.3, "two alerts sent")
    wait_for(lambda: len(stack.dead()) == 1, 30, 0.2, "one dead letter")

    a, b = _exporter(stack), _exporter(stack)
    m = Samples(scrape(a))
    truth = {r.name: r for r in stack.rows(
        "SELECT name, peak_reserved_bytes, memory_limit_bytes, fragmentation_ratio, status FROM runs")}
    near = truth["m-near"]
    assert near.status == "running" and near.memory_limit_bytes == NEAR_LIMIT

    # history counters
    assert m.get("memq_snapshots_analysed_total", cluster="c-m", job_name="job-near") == 4
    assert m.get("memq_snapshots_analysed_total", cluster="c-m", job_name="job-cap") == 1
    assert m.get("memq_snapshots", state="done") == 5 and m.get("memq_snapshots", state="failed") == 0
    assert m.get("memq_oom_snapshots_total", job_name="job-cap", cause="capacity") == 1
    assert m.get("memq_oom_snapshots_total", job_name="job-near") is None
    assert m.get("memq_verdicts_total", cluster="c-m", job_name="job-cap", kind="oom", cause="capacity") == 1
    assert m.get("memq_verdicts_total", job_name="job-near", kind="near_miss") == 1
    assert m.get("memq_verdicts_total") == 2
    assert m.get("memq_alerts", state="sent") == 2
    assert m.get("memq_runs", cluster="c-m", status="running") == 1 and m.get("memq_runs", status="oom") == 1
    # gauges of running runs: only m-near is running
    headroom = 1 - near.peak_reserved_bytes / NEAR_LIMIT
    assert 0 < headroom < 0.05
    assert m.get("memq_active_runs", cluster="c-m", job_name="job-near") == 1
    assert m.get("memq_active_runs", job_name="job-cap") is None
    assert math.isclose(m.get("memq_job_headroom_min_ratio", job_name="job-near"), headroom, rel_tol=1e-9)
    assert math.isclose(m.get("memq_run_headroom_ratio", run="m-near", job_name="job-near"), headroom, rel_tol=1e-9)
    assert math.isclose(m.get("memq_run_fragmentation_ratio", run="m-near"), near.fragmentation_ratio, rel_tol=1e-9)
    assert [lab["run"] for lab, _ in m.all("memq_run_headroom_ratio")] == ["m-near"]
    # analysis latency: from each snapshot row to its analysis attached
    assert m.get("memq_analysis_latency_seconds_count") == 5
    series = m.all("memq_analysis_latency_seconds_bucket")
    buckets = [v for _, v in sorted((float(lab["le"]), v) for lab, v in series)]
    assert buckets == sorted(buckets) and buckets[-1] == 5
    lat = stack.rows("SELECT extract(epoch FROM analysed_at - created_at) FROM snapshots")
    assert math.isclose(m.get("memq_analysis_latency_seconds_sum"), sum(float(r[0]) for r in lat), rel_tol=1e-6)
    # the ingest path
    assert m.get("memq_stream_lag") == 0 and m.get("memq_stream_pending") == 0
    assert m.get("memq_stream_length") == stack.redis.xlen(stack.stream)
    assert m.get("memq_dead_letters") == 1
    assert m.get("memq_dead_lettered_total") == 1  # the dispatcher counts what it dead-letters
    # the dead stream is trimmed (MAXLEN ~100,000); the counter goes on: trimmed to nothing, still 1
    stack.redis.xtrim(stack.settings.dead_letter_key, maxlen=0)
    m2 = Samples(scrape(a))
    assert m2.get("memq_dead_letters") == 0 and m2.get("memq_dead_lettered_total") == 1
    assert m.get("memq_workers") == 1 and m.get("memq_dispatchers") == 1
    assert 0 <= m.get("memq_heartbeat_age_seconds", kind="worker") < 5
    assert 0 <= m.get("memq_heartbeat_age_seconds", kind="dispatcher") < 5
    assert m.get("memq_queue_depth", queue="memq.analyze") == 0
    assert m.get("memq_up", component="database") == 1 and m.get("memq_up", component="redis") == 1

    # a second exporter (or this one restarted) reports the same counters: they are SQL counts
    m2 = Samples(scrape(b))
    for name in ("memq_snapshots_analysed_total", "memq_oom_snapshots_total", "memq_verdicts_total",
                 "memq_analysis_latency_seconds_count", "memq_analysis_latency_seconds_sum"):
        assert sorted(map(repr, m.all(name))) == sorted(map(repr, m2.all(name))), name

    # the alerts: one per verdict, with the cause, the evidence, the recommendation and the link
    got = rx.distinct()
    assert sorted(rx.keys().values()) == [1, 1]
    states = _alert_states(stack)
    assert {v[1] for v in states.values()} == set(got)
    cap = got[states["m-cap/oom:capacity"][1]]["text"]
    assert "cause: capacity" in cap and "evidence: " in cap and "recommendation: " in cap
    assert "<http://memq.test/runs/m-cap|run m-cap>" in cap
    assert "% headroom, under the 5% threshold" in got[states["m-near/near_miss"][1]]["text"]


def test_an_alert_survives_a_sigkill_during_the_send(stack, rx):
    before = rx.keys()
    rx.hold_next()  # the next POST is received and never answered
    stack.memq("push", *(str(REAL / "frag_synthetic" / f) for f in ("fragmented.pickle.gz", "oom.pickle.gz")),
               "--run", "m-frag", "--cluster", "c-m", "--job", "job-frag", "--limit", "8GiB", "--status", "oom")
    assert rx.held.wait(120), stack.log_tail("worker")
    key = next(r["key"] for r in rx.requests if r["key"] not in before)
    row = stack.rows("SELECT state, attempts, lease_until > now() AS leased FROM alerts WHERE idem_key = :k", k=key)
    assert [tuple(r) for r in row] == [("sending", 1, True)]  # received, not recorded as sent
    for name, p in list(stack.procs.items()):
        if name.startswith("worker") and p.poll() is None:
            kill_group(p)  # SIGKILL to the worker and its pool process (the sender)
    stack.start_worker(concurrency=1)
    wait_for(lambda: _alert_states(stack).get("m-frag/oom:fragmentation", ("",))[0] == "sent", 90, 0.3,
             "the alert taken over and sent after the lease expired")
    rx.release.set()
    time.sleep(3)  # a few more sweeps: nothing is sent again
    keys = rx.keys()
    assert keys[key] == 2  # the killed send and the resend, under one key
    assert all(keys[k] == 1 for k in keys if k != key)
    states = _alert_states(stack)
    assert states["m-frag/oom:fragmentation"][2] == 2
    assert set(rx.distinct()) == {v[1] for v in states.values()}  # each verdict once, after dedup by key
    assert all(v[0] == "sent" for v in states.values())
    text = rx.distinct()[key]["text"]
    assert "cause: fragmentation" in text and "m-frag" in text
    assert json.dumps(rx.distinct()[key]) == json.dumps(
        next(r["body"] for r in reversed(rx.requests) if r["key"] == key))  # the resend is the same document
