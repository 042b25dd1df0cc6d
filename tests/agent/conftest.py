"""Agent tests run on CPU against real Redis: the shared server on 6379 (with a unique key prefix and
stream per test, deleting only their own keys) and private `redis-server` processes on free ports for
kill / restart / full tests. No mocks: faults are injected by wrapping the real client or by killing
the private server."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
import redis

from memq import codec, envelope

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
SHARED_URL = os.environ.get("MEMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateRedis:
    """A redis-server of our own: `redis-server --port P --save "" --dir TMP`, killable."""

    def __init__(self, tmp: Path, port: int | None = None, extra: tuple[str, ...] = ()):
        self.tmp, self.port, self.extra = tmp, port or free_port(), extra
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed; the fault tests need it")
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--save", "", "--appendonly", "no",
                                      "--dir", str(self.tmp), "--bind", "127.0.0.1", *self.extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if redis.Redis.from_url(self.url, socket_timeout=0.5).ping():
                    return self
            except redis.AuthenticationError:
                return self  # up, and wants a password
            except redis.RedisError:
                time.sleep(0.05)
        raise RuntimeError("private redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=5)


@pytest.fixture
def private_redis(tmp_path):
    servers: list[PrivateRedis] = []

    def make(port: int | None = None, extra: tuple[str, ...] = (), start: bool = True) -> PrivateRedis:
        d = tmp_path / f"redis{len(servers)}"
        d.mkdir()
        srv = PrivateRedis(d, port, extra)
        servers.append(srv)
        return srv.start() if start else srv

    yield make
    for s in servers:
        s.kill()


@pytest.fixture
def shared():
    """The shared Redis plus a unique prefix and stream; only our own keys are deleted afterwards."""
    r = redis.Redis.from_url(SHARED_URL, socket_timeout=5)
    try:
        r.ping()
    except redis.RedisError as exc:
        pytest.fail(f"the shared Redis at {SHARED_URL} is not reachable: {exc}")
    prefix = f"memqtest:agent:{uuid.uuid4().hex[:12]}:"
    yield r, prefix, prefix + "ingest"
    for key in r.scan_iter(match=prefix + "*", count=1000):
        r.delete(key)


@pytest.fixture(autouse=True)
def _no_global_agent():
    """Tests build Agent objects directly; make sure none leaks through the module singleton."""
    yield
    from memq import agent

    a = agent.current()
    if a is not None and not a.stopped:
        a.stop(2)


def entries(r: redis.Redis, stream: str) -> list[envelope.Envelope]:
    return [envelope.parse(fields) for _id, fields in r.xrange(stream)]


def blob_of(r: redis.Redis, env: envelope.Envelope, prefix: str) -> bytes:
    """Uncompressed pickle bytes of a snapshot envelope's blob, checked against its sha256 and size."""
    raw = r.get(env.blob_key(prefix))
    assert raw is not None, "blob missing"
    assert codec.compression_of(raw) == env.codec
    data = codec.decompress(raw)
    assert hashlib.sha256(data).hexdigest() == env.sha256
    assert len(data) == env.size
    return data


def fixture_sha(folder: str, file: str) -> str:
    return hashlib.sha256(codec.decompress((REAL / folder / file).read_bytes())).hexdigest()


def make_agent(**kw):
    """An Agent (not the module singleton) with test-friendly defaults: fast back-off, no fsync."""
    from memq.agent import Agent
    from memq.agent.source import ReplaySource

    kw.setdefault("source", ReplaySource(REAL / "seed_adamw"))
    kw.setdefault("backoff_s", (0.05, 0.2))
    kw.setdefault("fsync", False)
    kw.setdefault("signal", None)
    kw.setdefault("stats_interval_s", 3600)
    kw.setdefault("snapshot_every_s", 0)
    kw.setdefault("send_timeout_s", 1.0)
    return Agent(kw.pop("run", "test-run"), kw.pop("cluster", "test-cluster"), **kw).start()


class FaultyClient:
    """Wraps a real redis-py client; `fail[name] = n` makes the next n calls of `name` raise, as a
    dropped connection would."""

    def __init__(self, real: redis.Redis, fail: dict[str, int]):
        self.real, self.fail, self.calls = real, fail, []

    def _maybe_fail(self, name: str) -> None:
        self.calls.append(name)
        if self.fail.get(name, 0) > 0:
            self.fail[name] -= 1
            raise redis.ConnectionError(f"injected fault in {name}")

    def ping(self):
        self._maybe_fail("ping")
        return self.real.ping()

    def set(self, *a, **k):
        self._maybe_fail("set")
        return self.real.set(*a, **k)

    def xadd(self, *a, **k):
        self._maybe_fail("xadd")
        return self.real.xadd(*a, **k)

    def close(self):
        pass


def wait_for(pred, timeout: float = 10.0, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()
