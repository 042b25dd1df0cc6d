"""The Redis ACL of deploy/SECURITY.md and deploy/redis/users.acl.template, on a private redis-server.

The agent user may PING, SET memq:blob:* and XADD memq:ingest (write-only), and nothing else; the
real agent transport replays a real H200 spool through it. The services' user cannot run the
@dangerous commands or touch keys outside memq:*. The default user is off. The agent is checked
twice: as the ACL file defines it, and as the `ACL SETUSER` line of SECURITY.md defines it (applied by
a test-only operator user, as an administrator would)."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.ops.stackfile import make_secrets
from tests.workers.stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "deploy" / "SECURITY.md"
SPOOL = ROOT / "tests" / "fixtures" / "agent_gpu" / "spool_oom"
SHA = "ab" * 32


def setuser_line() -> str:
    lines = [ln.strip() for ln in SECURITY.read_text().splitlines() if ln.strip().startswith("ACL SETUSER memq-agent")]
    assert len(lines) == 1, "deploy/SECURITY.md must give exactly one `ACL SETUSER memq-agent ...` line"
    return lines[0]


def _password(url: str) -> str:
    return url.split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("acl")
    port = free_port()
    # FLUSHALL/FLUSHDB below are sent to check the ACL refuses them; they go to this private server only.
    assert port != 6379, "the ACL tests must never talk to the shared Redis"
    sec = make_secrets(tmp, "127.0.0.1", port, "postgresql://unused@127.0.0.1:1/unused")
    acl = tmp / "users.acl"  # the generated file plus a test-only operator (an administrator's account)
    acl.write_text((sec / "users.acl").read_text() + "user operator on >operator-pw ~* &* +@all\n")
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--dir", str(tmp), "--aclfile", str(acl)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    op = redis.Redis(port=port, username="operator", password="operator-pw", socket_timeout=5)

    def up():
        try:
            return op.ping()
        except redis.RedisError:
            return False

    try:
        wait_for(up, 15, 0.05, "private redis-server with the ACL file")
        line = setuser_line().replace(">AGENT_PASSWORD", ">doc-agent-pw").replace("memq-agent", "memq-agent-doc", 1)
        assert op.execute_command(*shlex.split(line)) in (b"OK", "OK", True)
        memq_url = (sec / "memq_redis_url").read_text().strip()
        agent_url = (sec / "agent_redis_url").read_text().strip()
        yield {"port": port, "op": op, "memq": redis.Redis.from_url(memq_url, socket_timeout=5),
               "agent_url": agent_url,
               "agents": {"file": redis.Redis(port=port, username="memq-agent", password=_password(agent_url)),
                          "doc": redis.Redis(port=port, username="memq-agent-doc", password="doc-agent-pw")}}
    finally:
        proc.kill()
        proc.wait(10)


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


def test_agent_can_write_its_stream_and_blobs(agent, server):
    assert agent.ping()
    assert agent.set(f"memq:blob:{SHA}", b"\x28\xb5\x2f\xfd blob", ex=3600)
    eid = agent.xadd("memq:ingest", {"v": "1", "kind": "stats"}, maxlen=1000, approximate=True)
    assert eid
    # it landed (read back with the services' user)
    assert server["memq"].get(f"memq:blob:{SHA}").endswith(b"blob")
    assert server["memq"].xrange("memq:ingest", min=eid, max=eid)


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
])
def test_agent_cannot(agent, what, call):
    assert refused(call, agent), f"the agent user could {what}"


def test_real_agent_transport_replays_a_gpu_spool_through_the_agent_user(server, tmp_path):
    from profiler import envelope
    from profiler.agent.replay import replay_dir
    from profiler.agent.transport import make_client

    spool = tmp_path / "spool"
    shutil.copytree(SPOOL, spool)
    before = server["memq"].xlen("memq:ingest")
    n = replay_dir(spool, make_client(server["agent_url"], 5.0), stream="memq:ingest", remove=True)
    assert n >= 5
    entries = server["memq"].xrange("memq:ingest")[before:]
    assert len(entries) == n
    kinds = [envelope.parse(f).kind for _, f in entries]
    assert "snapshot" in kinds and kinds[0] == "run_start"
    for _, f in entries:
        env = envelope.parse(f)
        if env.kind == "snapshot":
            assert server["memq"].exists(envelope.blob_key(env.sha256))
    assert not list(spool.rglob("*.mqs"))  # all sent


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
