"""`memq doctor` with each dependency up and down, run as the real command (exit codes included).

Private redis-server instances on free ports (AOF + noeviction; no persistence + allkeys-lru; one
that is killed), a migrated and an empty database of our own on the shared PostgreSQL, and a
PostgreSQL URL to a port where nothing listens. Nothing shared is touched but our own databases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from tests.conftest import temp_pg_database
from tests.ops.stackfile import Server
from tests.workers.stack import free_port

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, pg_server):
    tmp = tmp_path_factory.mktemp("doctor")
    good = Server(tmp / "good", "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                  "--maxmemory", "256mb", "--maxmemory-policy", "noeviction").start()
    bad = Server(tmp / "bad", "--save", "", "--appendonly", "no", "--maxmemory-policy", "allkeys-lru").start()
    with temp_pg_database("doc") as migrated, temp_pg_database("docempty") as empty:
        subprocess.run([sys.executable, "-m", "memq", "db", "upgrade"], check=True, capture_output=True,
                       env=_env(tmp, migrated, good.url), cwd=ROOT, timeout=120)
        yield {"tmp": tmp, "good": good, "bad": bad, "db": migrated, "empty_db": empty}
    good.kill()
    bad.kill()


def _env(tmp: Path, db: str, redis_url: str, **extra: str) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_DATABASE_URL": db, "MEMQ_REDIS_URL": redis_url, "MEMQ_CONFIG": str(tmp / "none.toml"),
                "MEMQ_DATA_DIR": str(tmp / "data"), "MEMQ_BLOB_DIR": str(tmp / "blobs"), "MEMQ_KEY_PREFIX": "memq:",
                "MEMQ_HEARTBEAT_S": "60"})
    env.update(extra)
    return env


def doctor(env: dict, *args: str, subprocess_: bool = False) -> tuple[int, dict, str]:
    """Run `memq doctor --json`: in-process through click's runner (fast), or as the real command."""
    if subprocess_:
        p = subprocess.run([sys.executable, "-m", "memq", "doctor", "--json", *args], env=env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        code, out = p.returncode, p.stdout + p.stderr
        stdout = p.stdout
    else:
        from click.testing import CliRunner

        from memq.cli import cli

        unset = {k: None for k in __import__("os").environ if k.startswith("MEMQ_") and k not in env}
        res = CliRunner().invoke(cli, ["doctor", "--json", *args], env={**unset, **env}, catch_exceptions=False)
        code, out, stdout = res.exit_code, res.output, res.stdout
    doc = json.loads(stdout)
    assert doc["exit_code"] == code
    return code, {c["name"]: c for c in doc["checks"]}, out


def _live_workers(env: dict):
    """Heartbeats written by the workers' own Heartbeat class, a consumer group on the stream, and
    the day partitions a running dispatcher makes."""
    from memq.config import load_settings
    from memq.workers.app import Heartbeat
    from memq.workers.dispatcher import Dispatcher
    from memq.workers.runtime import GROUP

    st = load_settings(env)
    Dispatcher(st, consumer="d1@test")._make_partitions()
    beats = [Heartbeat(st, "worker", "w1@test"), Heartbeat(st, "dispatcher", "d1@test")]
    for b in beats:
        b.beat()
    r = redis.Redis.from_url(env["MEMQ_REDIS_URL"])
    r.xadd(st.stream_key, {"v": "1"})
    r.xgroup_create(st.stream_key, GROUP, id="$", mkstream=True)
    return beats


def test_everything_up_is_healthy_even_strict(servers):
    env = _env(servers["tmp"], servers["db"], servers["good"].url)
    beats = _live_workers(env)
    try:
        code, checks, out = doctor(env, "--strict", subprocess_=True)
        assert code == 0, out
        assert all(c["status"] in ("ok", "info") for c in checks.values()), out
        assert checks["schema"]["status"] == "ok"
        assert checks["memory"]["data"]["maxmemory_policy"] == "noeviction"
        assert checks["persistence"]["data"]["aof_enabled"] is True
        assert checks["stream"]["data"]["lag"] == 0
        assert checks["workers"]["status"] == "ok" and checks["dispatchers"]["status"] == "ok"
        assert checks["partitions"]["data"]["days_ahead"] in (st_days_ahead(env) - 1, st_days_ahead(env))
    finally:
        for b in beats:
            b.stop()


def st_days_ahead(env: dict) -> int:
    from memq.config import load_settings

    return load_settings(env).stat_partition_days_ahead


def test_no_partitions_ahead_is_a_warning_that_gc_fixes(servers, tmp_path):
    with temp_pg_database("docpart") as db:
        env = _env(servers["tmp"], db, servers["good"].url)
        subprocess.run([sys.executable, "-m", "memq", "db", "upgrade"], check=True, capture_output=True,
                       env=env, cwd=ROOT, timeout=120)
        code, checks, out = doctor(env)
        assert checks["partitions"]["status"] == "warning" and "memq gc" in checks["partitions"]["fix"], out
        gc = subprocess.run([sys.executable, "-m", "memq", "gc"], env=env, cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
        assert gc.returncode == 0 and "made stat_samples partitions" in gc.stdout, gc.stdout + gc.stderr
        code, checks, out = doctor(env)
        # 7 (6 when the test straddles midnight UTC)
        assert checks["partitions"]["status"] == "ok" and checks["partitions"]["data"]["days_ahead"] in (6, 7), out


def test_no_workers_is_a_warning(servers):
    env = _env(servers["tmp"], servers["db"], servers["good"].url, MEMQ_KEY_PREFIX="memq-noone:")
    code, checks, out = doctor(env)
    assert code == 0, out
    assert checks["workers"]["status"] == "warning" and "memq worker" in checks["workers"]["fix"]
    code, _, _ = doctor(env, "--strict")
    assert code == 1


def test_evicting_policy_and_no_persistence_warn(servers):
    env = _env(servers["tmp"], servers["db"], servers["bad"].url)
    code, checks, out = doctor(env)
    assert code == 0, out
    assert checks["memory"]["status"] == "warning" and "noeviction" in checks["memory"]["fix"]
    assert checks["persistence"]["status"] == "warning" and "appendonly yes" in checks["persistence"]["fix"]
    code, _, _ = doctor(env, "--strict", subprocess_=True)
    assert code == 1
    # the human form prints a fix line under each problem
    p = subprocess.run([sys.executable, "-m", "memq", "doctor"], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.count("fix: ") >= 2 and "WARNING memory" in p.stdout, p.stdout


def test_database_down_is_an_error(servers):
    url = f"postgresql://memq:s3cret-pw@127.0.0.1:{free_port()}/memq"
    env = _env(servers["tmp"], url, servers["good"].url)
    code, checks, out = doctor(env)
    assert code == 1, out
    assert checks["database"]["status"] == "error" and "MEMQ_DATABASE_URL" in checks["database"]["fix"]
    assert "s3cret-pw" not in out


def test_schema_out_of_date_exits_3(servers):
    env = _env(servers["tmp"], servers["empty_db"], servers["good"].url)
    code, checks, out = doctor(env, subprocess_=True)
    assert code == 3, out
    assert checks["schema"]["status"] == "error" and "memq db upgrade" in checks["schema"]["fix"]


def test_redis_down_is_an_error(servers):
    srv = Server(servers["tmp"] / "killed", "--save", "", password="r3dis-pw").start()
    url = f"redis://:r3dis-pw@127.0.0.1:{srv.port}/0"
    env = _env(servers["tmp"], servers["db"], url)
    assert doctor(env)[1]["redis"]["status"] == "ok"
    srv.kill()
    code, checks, out = doctor(env)
    assert code == 1, out
    assert checks["redis"]["status"] == "error" and "MEMQ_REDIS_URL" in checks["redis"]["fix"]
    assert "memory" not in checks  # nothing more is asked of a Redis that is down
    assert "r3dis-pw" not in out


def test_blob_store_not_writable_is_an_error(servers, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    env = _env(servers["tmp"], servers["db"], servers["good"].url, MEMQ_BLOB_DIR=str(blocker / "blobs"))
    code, checks, out = doctor(env)
    assert code == 1, out
    assert checks["blobs"]["status"] == "error" and "MEMQ_BLOB_DIR" in checks["blobs"]["fix"]


def test_credentials_from_files(servers, tmp_path):
    secret = tmp_path / "database_url"
    secret.write_text(servers["db"].replace("postgresql://", "postgresql://") + "\n")
    env = _env(servers["tmp"], "", servers["good"].url, MEMQ_DATABASE_URL_FILE=str(secret))
    del env["MEMQ_DATABASE_URL"]
    code, checks, out = doctor(env)
    assert checks["schema"]["status"] == "ok", out


def test_stream_lag_and_missing_consumer_group_warn(servers):
    r = redis.Redis.from_url(servers["good"].url)
    env = _env(servers["tmp"], servers["db"], servers["good"].url, MEMQ_STREAM="memq:lagtest",
               MEMQ_DOCTOR_MAX_LAG="2")
    r.xadd("memq:lagtest", {"v": "1"})
    code, checks, out = doctor(env)
    assert checks["stream"]["status"] == "warning" and "memq dispatcher" in checks["stream"]["fix"], out
    from memq.workers.runtime import GROUP

    r.xgroup_create("memq:lagtest", GROUP, id="$")
    for i in range(3):
        r.xadd("memq:lagtest", {"v": str(i)})
    code, checks, out = doctor(env)
    assert checks["stream"]["status"] == "warning" and checks["stream"]["data"]["lag"] == 3, out
    assert "MEMQ_DOCTOR_MAX_LAG" in checks["stream"]["detail"]


def test_lag_near_maxlen_and_a_separate_broker(servers):
    r = redis.Redis.from_url(servers["good"].url)
    from memq.workers.runtime import GROUP

    r.xgroup_create("memq:lagmax", GROUP, id="$", mkstream=True)
    for i in range(6):
        r.xadd("memq:lagmax", {"v": str(i)})
    down = f"redis://:b-pw@127.0.0.1:{free_port()}/0"
    env = _env(servers["tmp"], servers["db"], servers["good"].url, MEMQ_STREAM="memq:lagmax",
               MEMQ_STREAM_MAXLEN="10", MEMQ_BROKER_URL=down)
    code, checks, out = doctor(env)
    assert "trims the oldest entries" in checks["stream"]["detail"], out
    assert checks["broker"]["status"] == "error" and code == 1 and "b-pw" not in out


def test_untrimmed_stream_warns(servers):
    r = redis.Redis.from_url(servers["good"].url)
    from memq.workers.runtime import GROUP

    sec, _ = r.time()
    old_ms = (int(sec) - 7200) * 1000
    for i in range(5):  # entries two hours old (explicit ids), all read and acknowledged
        r.xadd("memq:untrimmed", {"v": str(i)}, id=f"{old_ms + i}-0")
    r.xgroup_create("memq:untrimmed", GROUP, id="$")
    env = _env(servers["tmp"], servers["db"], servers["good"].url, MEMQ_STREAM="memq:untrimmed")
    code, checks, out = doctor(env)
    assert checks["stream-trim"]["status"] == "warning" and "beat" in checks["stream-trim"]["fix"], out
    assert "stream-trim" not in doctor(env | {"MEMQ_STREAM_TRIM_INTERVAL_S": "0"})[1]
    assert "stream-trim" not in doctor(env | {"MEMQ_STREAM_KEEP_S": "86400"})[1]
