"""deploy/compose.yaml, run for real as plain processes (no Docker engine here).

One module-scoped stack (tests/ops/stackfile.py): the compose file's own Redis command (AOF,
noeviction, the ACL file that deploy/make-secrets.sh writes) on a private port, a database of our own
on the shared PostgreSQL, `migrate` run to completion, then `dispatcher`, `worker` and `beat` as
long-running processes, all with the compose environment (credentials from `*_FILE` secrets).
Then the end-to-end flow: `memq push` of a real snapshot with the AGENT's Redis user (write-only:
SET blob + XADD), and `memq history --run R --json` shows it analysed. `memq doctor --strict` is
green on this stack, and every process stops on SIGTERM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import temp_pg_database
from tests.ops.stackfile import ComposeStack, wait_for

ROOT = Path(__file__).resolve().parents[2]
OOM_FIXTURE = ROOT / "tests" / "fixtures" / "real" / "capacity" / "oom.pickle.gz"

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.postgres]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, pg_server):
    tmp = tmp_path_factory.mktemp("compose")
    with temp_pg_database("compose") as db:
        st = ComposeStack(tmp, db, extra_env={"MEMQ_REAPER_INTERVAL_S": "2", "MEMQ_HEARTBEAT_S": "2",
                                                  "MEMQ_STREAM_TRIM_INTERVAL_S": "2", "MEMQ_STREAM_KEEP_S": "0"})
        try:
            st.start("redis")
            wait_for(lambda: _ping(st.url()), 20, what="redis-server from compose.yaml")
            res = st.run("migrate")
            assert res.returncode == 0, res.stderr[-3000:]
            st.start("dispatcher")
            st.start("worker")
            st.start("beat")
            yield st
        finally:
            st.close()


def _ping(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_timeout=1).ping())
    except redis.RedisError:
        return False


def test_compose_redis_has_aof_noeviction_and_no_default_user(stack):
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    r = redis.Redis.from_url(stack.url(), socket_timeout=5)
    assert r.info("persistence")["aof_enabled"] == 1
    assert r.info("memory")["maxmemory_policy"] == "noeviction"
    anon = redis.Redis(port=stack.redis_port, socket_timeout=5, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        anon.ping()


def test_migrate_is_idempotent(stack):
    res = stack.run("migrate")
    assert res.returncode == 0 and "already at" in res.stdout, res.stdout + res.stderr


def test_doctor_is_green_on_the_compose_stack(stack):
    def green():
        p = stack.memq("doctor", "--strict", "--json")
        return p if p.returncode == 0 else None

    try:
        p = wait_for(green, 120, 1.0, "memq doctor --strict to pass")
    except AssertionError:
        p = stack.memq("doctor", "--json")
        raise AssertionError(p.stdout + "\n" + stack.log("worker") + stack.log("dispatcher")) from None
    doc = json.loads(p.stdout)
    names = {c["name"]: c["status"] for c in doc["checks"]}
    assert names["workers"] == "ok" and names["dispatchers"] == "ok" and names["persistence"] == "ok"
    secret = stack.url().split(":")[2].split("@")[0]
    assert secret and secret not in p.stdout + p.stderr


def test_push_with_the_agent_user_then_history_shows_it_analysed(stack):
    agent_env = dict(stack.env)
    agent_env["MEMQ_REDIS_URL_FILE"] = str(stack.secrets / "agent_redis_url")
    run = "compose-e2e-oom"
    p = stack.memq("push", str(OOM_FIXTURE), "--run", run, "--cluster", "compose", "--trigger", "oom",
                   "--status", "oom", "--json", env=agent_env)
    assert p.returncode == 0, p.stdout + p.stderr

    def analysed():
        h = stack.memq("history", "--run", run, "--json")
        if h.returncode != 0:
            return None
        doc = json.loads(h.stdout)
        snaps = doc["snapshots"]
        return doc if snaps and all(s["state"] == "done" for s in snaps) and doc.get("diagnosis") else None

    try:
        doc = wait_for(analysed, 180, 1.0, "the pushed snapshot to be analysed")
    except AssertionError:
        raise AssertionError("\n".join(f"--- {s}\n{stack.log(s)}" for s in ("dispatcher", "worker", "beat"))) from None
    snap = doc["snapshots"][0]
    assert snap["trigger"] == "oom" and snap["oom"] is not None
    assert doc["run"]["status"] == "oom"
    assert doc["diagnosis"]["primary_cause"] == "capacity"


def test_beat_drives_the_periodic_tasks(stack):
    # the reaper entry (every MEMQ_REAPER_INTERVAL_S) arrives at the worker through the one beat
    wait_for(lambda: "workers.tasks.reap" in stack.log("worker", 200_000), 60, 1.0, "a beat-sent reap task")
    assert stack.procs["beat"].poll() is None, stack.log("beat")
    assert "beat: Starting" in stack.log("beat", 200_000)
    # the stream trim: once everything pushed is read and acknowledged, the stream is emptied
    import redis

    r = redis.Redis.from_url(stack.url(), socket_timeout=5)
    wait_for(lambda: r.exists("memq:ingest") and r.xlen("memq:ingest") == 0, 60, 1.0, "the beat-driven stream trim")
    assert "workers.retention.trim_stream" in stack.log("worker", 200_000)
    # the schedule file the k8s liveness probe watches (compose: -s /var/lib/memq/celerybeat-schedule)
    assert list((stack.tmp / "lib").glob("celerybeat-schedule*"))


def test_processes_stop_on_sigterm(stack):
    for service in ("beat", "dispatcher", "worker"):
        p = stack.procs[service]
        assert p.poll() is None, f"{service} died early:\n{stack.log(service)}"
        rc = stack.stop(service, timeout=60)
        assert rc is not None and rc in (0, -15), f"{service} exited {rc}:\n{stack.log(service)}"


def test_no_credentials_in_any_log(stack):
    secrets_ = [stack.url().split("//", 1)[1].split("@", 1)[0].split(":", 1)[1],
                stack.url("agent_redis_url").split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]]
    for service in ("dispatcher", "worker", "beat", "redis"):
        text = stack.log(service, 10_000_000)
        assert text or service == "redis"
        for pw in secrets_:
            assert pw not in text, f"a Redis password appears in the {service} log"


def test_redis_keeps_the_stream_across_a_restart(stack):
    """The compose Redis command persists (AOF): a restart of the same command keeps the stream."""
    import redis

    r = redis.Redis.from_url(stack.url(), socket_timeout=5)
    for i in range(100):
        r.xadd("memq:aof-check", {"i": str(i)})
    before = r.xlen("memq:aof-check")
    r.close()
    assert stack.stop("redis", timeout=30) == 0  # SIGTERM: Redis flushes the AOF and exits
    stack.start("redis")
    wait_for(lambda: _ping(stack.url()), 30, what="redis-server restarted from compose.yaml")
    assert redis.Redis.from_url(stack.url(), socket_timeout=5).xlen("memq:aof-check") == before == 100
