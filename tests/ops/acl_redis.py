"""A private redis-server started with deploy/'s ACL file (passwords from make-secrets.sh), shared by
the ACL and inbox-relay tests. Never the shared Redis: FLUSHALL and friends are sent to check that
the ACL refuses them."""

from __future__ import annotations

import contextlib
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import redis

from tests.ops.stackfile import make_secrets
from tests.workers.stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "deploy" / "SECURITY.md"


def setuser_line() -> str:
    lines = [ln.strip() for ln in SECURITY.read_text().splitlines() if ln.strip().startswith("ACL SETUSER memq-agent")]
    assert len(lines) == 1, "deploy/SECURITY.md must give exactly one `ACL SETUSER memq-agent ...` line"
    return lines[0]


def password(url: str) -> str:
    return url.split("//", 1)[1].split("@", 1)[0].split(":", 1)[1]


@contextlib.contextmanager
def acl_redis(tmp: Path) -> Iterator[dict]:
    """Yields port, op (a test-only operator), memq (the services' user), memq_url, agent_url, and
    agents: "file" (memq-agent of the ACL file) and "doc" (a user made with SECURITY.md's line)."""
    port = free_port()
    assert port != 6379, "the ACL tests must never talk to the shared Redis"
    sec = make_secrets(tmp, "127.0.0.1", port, "postgresql://unused@127.0.0.1:1/unused")
    acl = tmp / "users.acl"  # the generated file plus a test-only operator (an administrator's account)
    acl.write_text((sec / "users.acl").read_text() + "user operator on >operator-pw ~* &* +@all\n")
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp), "--aclfile", str(acl)],
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
               "memq_url": memq_url, "agent_url": agent_url,
               "agents": {"file": redis.Redis(port=port, username="memq-agent", password=password(agent_url),
                                              socket_timeout=5),
                          "doc": redis.Redis(port=port, username="memq-agent-doc", password="doc-agent-pw",
                                             socket_timeout=5)}}
    finally:
        proc.kill()
        proc.wait(10)
