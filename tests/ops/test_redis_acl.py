"""The Redis ACL of deploy/SECURITY.md and deploy/redis/users.acl.template, on a private redis-server.

The agent user may PING, SET memq:blob:* and RPUSH memq:ingest:inbox (write-only), and nothing else:
no XADD (it takes MAXLEN 0 and explicit IDs), no FCALL, no function loading; the real agent transport
replays a real H200 spool through it and the services' relay moves it into the stream. The services'
user cannot run the @dangerous commands or touch keys outside memq:*. The default user is off. The
agent is checked twice: as the ACL file defines it, and as the `ACL SETUSER` line of SECURITY.md
defines it (applied by a test-only operator user, as an administrator would). Hostile inbox content:
tests/ops/test_ingest_relay.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memq import redis_functions
from tests.ops.acl_redis import acl_redis

ROOT = Path(__file__).resolve().parents[2]
SPOOL = ROOT / "tests" / "fixtures" / "agent_gpu" / "spool_oom"
SHA = "ab" * 32
INBOX = "memq:ingest:inbox"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with acl_redis(tmp_path_factory.mktemp("acl")) as srv:
        yield srv


@pytest.fixture(params=["file", "doc"])
def agent(request, server) -> redis.Redis:
    return server["agents"][request.param]


def refused(fn, *args, **kw) -> bool:
    try:
        fn(*args, **kw)
    except redis.exceptions.NoPermissionError:
        return True
    except redis.ResponseError as exc:  # DEBUG is also disabled by default (enable-debug-command no)
        return "NOPERM" in str(exc) or "not allowed" in str(exc)
    return False


def test_agent_can_write_its_inbox_and_blobs(agent, server):
    assert agent.ping()
    assert agent.set(f"memq:blob:{SHA}", b"\x28\xb5\x2f\xfd blob", ex=3600)
    assert agent.rpush(INBOX, redis_functions.encode_fields({"v": "1", "kind": "stats"})) >= 1
    # it landed (read back with the services' user), and the relay moves it into the stream
    assert server["memq"].get(f"memq:blob:{SHA}").endswith(b"blob")
    before = server["memq"].xlen("memq:ingest") if server["memq"].exists("memq:ingest") else 0
    relay = redis_functions.Relay(server["memq"], stream="memq:ingest", key_prefix="memq:", maxlen=1000,
                                  blob_ttl_s=3600)
    assert relay.step() >= 1 and server["memq"].llen(INBOX) == 0
    assert server["memq"].xlen("memq:ingest") > before


@pytest.mark.parametrize("what,call", [
    ("read a blob", lambda r: r.get(f"memq:blob:{SHA}")),
    ("read the stream", lambda r: r.xrange("memq:ingest")),
    ("read the stream as a consumer", lambda r: r.xreadgroup("g", "c", {"memq:ingest": ">"})),
    ("stream length", lambda r: r.xlen("memq:ingest")),
    ("another key", lambda r: r.set("other", b"x")),
    ("another memq key", lambda r: r.set("memq:heartbeat:worker:x", b"x")),
    ("replace the stream", lambda r: r.set("memq:ingest", b"x")),
    ("stream into a blob key", lambda r: r.xadd(f"memq:blob:{SHA}", {"a": "b"})),
    ("inject a Celery task", lambda r: r.lpush("memq:celery:memq.analyze", b"{}")),
    ("delete", lambda r: r.delete(f"memq:blob:{SHA}")),
    ("expire", lambda r: r.expire(f"memq:blob:{SHA}", 1)),
    ("list keys", lambda r: r.keys("*")),
    ("scan keys", lambda r: r.scan(0)),
    ("flushall", lambda r: r.flushall()),
    ("flushdb", lambda r: r.flushdb()),
    ("config get", lambda r: r.config_get("requirepass")),
    ("config set", lambda r: r.config_set("maxmemory-policy", "allkeys-lru")),
    ("info", lambda r: r.info()),
    ("acl", lambda r: r.acl_list()),
    ("publish", lambda r: r.publish("memq:celery:x", b"x")),
    ("script", lambda r: r.eval("return 1", 0)),
    ("debug", lambda r: r.execute_command("DEBUG", "SLEEP", "0")),
    ("shutdown", lambda r: r.execute_command("SHUTDOWN", "NOSAVE")),
    # the stream: no XADD at all (MAXLEN 0 would empty it, the largest ID would block it for good)
    ("xadd", lambda r: r.xadd("memq:ingest", {"v": "1"})),
    ("xadd MAXLEN 0", lambda r: r.xadd("memq:ingest", {"v": "1"}, maxlen=0)),
    ("xadd the last ID", lambda r: r.xadd("memq:ingest", {"v": "1"}, id="18446744073709551615-18446744073709551614")),
    ("xtrim", lambda r: r.xtrim("memq:ingest", maxlen=0)),
    ("xdel", lambda r: r.xdel("memq:ingest", "0-1")),
    ("xsetid", lambda r: r.execute_command("XSETID", "memq:ingest", "18446744073709551615-18446744073709551615")),
    ("xgroup destroy", lambda r: r.xgroup_destroy("memq:ingest", "memq-dispatch")),
    ("delete the stream", lambda r: r.delete("memq:ingest")),
    ("unlink the stream", lambda r: r.unlink("memq:ingest")),
    ("rename the stream", lambda r: r.rename("memq:ingest", "memq:blob:x")),
    # the inbox: append only
    ("read the inbox", lambda r: r.lrange(INBOX, 0, -1)),
    ("pop the inbox", lambda r: r.lpop(INBOX)),
    ("trim the inbox", lambda r: r.ltrim(INBOX, 1, 0)),
    ("delete the inbox", lambda r: r.delete(INBOX)),
    ("replace the inbox", lambda r: r.set(INBOX, b"x")),
    ("rpush the stream key", lambda r: r.rpush("memq:ingest", b"x")),
    ("lpush the inbox", lambda r: r.lpush(INBOX, b"x")),
    ("set a blob and read the old one", lambda r: r.set(f"memq:blob:{SHA}", b"x", get=True)),
    # functions: neither call nor load, delete or flush them
    ("fcall the relay", lambda r: r.fcall("memq_relay", 2, INBOX, "memq:ingest", 1, 1, "memq:", 1)),
    ("fcall_ro", lambda r: r.fcall_ro("memq_version", 0)),
    ("function load", lambda r: r.function_load("#!lua name=evil\nredis.register_function('e', "
                                                "function() return 1 end)", replace=True)),
    ("function delete", lambda r: r.function_delete("memq")),
    ("function flush", lambda r: r.function_flush()),
    ("function restore", lambda r: r.execute_command("FUNCTION", "RESTORE", b"x", "REPLACE")),
    ("evalsha", lambda r: r.evalsha("0" * 40, 0)),
])
def test_agent_cannot(agent, what, call):
    assert refused(call, agent), f"the agent user could {what}"


def test_real_agent_transport_replays_a_gpu_spool_through_the_agent_user(server, tmp_path):
    from memq import envelope
    from memq.agent.replay import replay_dir
    from memq.redis_client import make_client

    spool = tmp_path / "spool"
    shutil.copytree(SPOOL, spool)
    memq = server["memq"]
    before = memq.xlen("memq:ingest") if memq.exists("memq:ingest") else 0
    n = replay_dir(spool, make_client(server["agent_url"], 5.0), stream="memq:ingest", remove=True)
    assert n >= 5 and memq.llen(INBOX) == n  # XADD refused: every message went to the inbox
    relay = redis_functions.Relay.for_settings(memq, _settings())
    assert relay.step() == n and relay.counts["refused"] == 0
    entries = server["memq"].xrange("memq:ingest")[before:]
    assert len(entries) == n
    kinds = [envelope.parse(f).kind for _, f in entries]
    assert "snapshot" in kinds and kinds[0] == "run_start"
    for _, f in entries:
        env = envelope.parse(f)
        if env.kind == "snapshot":
            assert server["memq"].exists(env.blob_key())
    assert not list(spool.rglob("*.mqs"))  # all sent


def _settings():
    from memq.config import load_settings

    return load_settings({"MEMQ_CONFIG": "/nonexistent/memq.toml"})


def test_services_user_has_no_dangerous_commands(server):
    r = server["memq"]
    assert r.ping() and r.info("memory") and r.config_get("maxmemory-policy")
    assert r.set("memq:test:key", b"1") and r.get("memq:test:key") == b"1"
    for call in (lambda: r.flushall(), lambda: r.flushdb(), lambda: r.keys("*"),
                 lambda: r.config_set("maxmemory-policy", "allkeys-lru"), lambda: r.acl_list(),
                 lambda: r.execute_command("DEBUG", "SLEEP", "0"), lambda: r.set("not-memq", b"x"),
                 lambda: r.get("not-memq"), lambda: r.execute_command("SHUTDOWN", "NOSAVE")):
        assert refused(call)


def test_default_user_is_off(server):
    anon = redis.Redis(port=server["port"], socket_timeout=5, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.AuthenticationError):
        anon.ping()
