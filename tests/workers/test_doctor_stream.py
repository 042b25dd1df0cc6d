"""`memq doctor` sees what issue 13 found it blind to: a stuck pending entry, an entry delivered more
than MEMQ_MAX_DELIVERIES times, and a stream near its limits (length near MAXLEN, entries trimmed
before anyone read them, a last ID ahead of the clock or at the end of the ID space). A private
redis-server and a SQLite history; the command runs as `memq doctor --json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import redis

from memq import envelope
from memq.workers.runtime import GROUP
from tests.workers.stack import ROOT

pytestmark = pytest.mark.redis


@pytest.fixture
def doc_env(tmp_path, private_redis):
    srv = private_redis(aof=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_REDIS_URL": srv.url, "MEMQ_DATABASE_URL": f"sqlite:///{tmp_path}/h.db",
                "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_BLOB_DIR": str(tmp_path / "blobs"),
                "MEMQ_CONFIG": str(tmp_path / "none.toml"), "MEMQ_STREAM": "memq:ingest",
                "MEMQ_STREAM_MAXLEN": "10", "MEMQ_MAX_DELIVERIES": "5", "MEMQ_CLAIM_IDLE_S": "1"})
    return env, redis.Redis.from_url(srv.url)


def doctor(env: dict) -> tuple[int, dict[str, list[dict]]]:
    p = subprocess.run([sys.executable, "-m", "memq", "doctor", "--json"], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    doc = json.loads(p.stdout)
    checks: dict[str, list[dict]] = {}
    for c in doc["checks"]:
        checks.setdefault(c["name"], []).append(c)
    return p.returncode, checks


def _good(run: str) -> dict:
    return envelope.build("run_start", run=run, cluster="c")


def test_stuck_and_over_delivered_pending_entries_are_reported_and_a_dispatcher_clears_them(doc_env):
    env, r = doc_env
    r.xgroup_create("memq:ingest", GROUP, id="0", mkstream=True)
    ids = [r.xadd("memq:ingest", _good(f"r{i}")) for i in range(3)]
    r.xreadgroup(GROUP, "crashed-dispatcher", {"memq:ingest": ">"}, count=3)
    code, checks = doctor(env)
    assert checks["pending"][0]["status"] == "ok" and "3 pending entries, none stuck" in checks["pending"][0]["detail"]

    # one entry idle for 10 minutes (nobody took it over), one delivered 9 times (a poison entry
    # that a dispatcher without delivery counts keeps retrying)
    r.xclaim("memq:ingest", GROUP, "crashed-dispatcher", 0, [ids[0]], idle=600_000)
    r.xclaim("memq:ingest", GROUP, "crashed-dispatcher", 0, [ids[1]], retrycount=9)
    code, checks = doctor(env)
    assert code == 0  # warnings
    details = " | ".join(c["detail"] for c in checks["pending"])
    assert all(c["status"] == "warning" for c in checks["pending"]), details
    assert "1 pending entries were delivered more than MEMQ_MAX_DELIVERIES (5) times" in details
    assert f"{ids[1].decode()} (consumer 'crashed-dispatcher'" in details and "delivered 9 times" in details
    assert "1 pending entries idle for over 300 s" in details and ids[0].decode() in details

    from memq.config import load_settings
    from memq.workers.dispatcher import Dispatcher

    d = Dispatcher(load_settings(env), consumer="live", block_ms=50, enqueue=lambda sid: None)
    d.run(install_signals=False, idle_exit_s=2.0)
    (letter,) = [{k.decode(): v.decode() for k, v in f.items()} for _i, f in r.xrange("memq:dead")]
    assert letter["run"] == "r1" and "not acknowledged after 9 deliveries" in letter["reason"]
    code, checks = doctor(env)
    assert "pending" not in checks  # nothing pending any more
    assert not [c for c in checks.get("stream-limits", []) if c["status"] != "ok"]


def test_a_stream_near_its_limits_is_reported(doc_env):
    env, r = doc_env
    r.xgroup_create("memq:ingest", GROUP, id="0", mkstream=True)
    for i in range(10):
        r.xadd("memq:ingest", _good(f"r{i}"))
    code, checks = doctor(env)
    (near,) = checks["stream-limits"]
    assert near["status"] == "warning" and "100% of MEMQ_STREAM_MAXLEN (10)" in near["detail"]

    # `XADD ... MAXLEN 0`: every unread entry gone
    r.xadd("memq:ingest", _good("trimmer"), maxlen=0)
    code, checks = doctor(env)
    (lost,) = checks["stream-limits"]
    assert lost["status"] == "warning", lost
    assert "11 entries were removed before any dispatcher read them" in lost["detail"], lost

    # an explicit ID a year ahead of the clock: a warning; at the end of the ID space: an error
    sec, _ = r.time()
    r.xadd("memq:ingest", _good("ahead"), id=f"{(int(sec) + 365 * 86400) * 1000}-0")
    r.xgroup_setid("memq:ingest", GROUP, id="$")
    code, checks = doctor(env)
    assert code == 0
    assert any("ahead of this clock" in c["detail"] for c in checks["stream-limits"]), checks["stream-limits"]
    r.xadd("memq:ingest", _good("end"), id="18446744073709551615-18446744073709551614")
    code, checks = doctor(env)
    (end,) = [c for c in checks["stream-limits"] if c["status"] == "error"]
    assert "end of the ID space (1 IDs left)" in end["detail"] and "DEL" in end["fix"]
    assert code == 1
