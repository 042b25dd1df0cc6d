"""Fixtures of the worker tests; the helpers (private servers, the Stack of processes) are in stack.py."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
import redis

from tests.workers.stack import SHARED_REDIS, PrivatePostgres, PrivateRedis, Stack

# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def shared_redis() -> str:
    try:
        redis.Redis.from_url(SHARED_REDIS, socket_timeout=5).ping()
    except redis.RedisError as exc:
        pytest.fail(f"the shared Redis at {SHARED_REDIS} is not reachable: {exc}")
    return SHARED_REDIS


@pytest.fixture(scope="module")
def private_pg():
    # Not under pytest's tmp dir: that one is private to root, and the server runs as postgres.
    tmp = Path(tempfile.mkdtemp(prefix="memq-test-pg-"))
    pg = PrivatePostgres(tmp).init().start()
    yield pg
    pg.stop()
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def private_redis(tmp_path):
    servers: list[PrivateRedis] = []

    def make(**kw) -> PrivateRedis:
        srv = PrivateRedis(tmp_path / f"redis{len(servers)}", **kw).start()
        servers.append(srv)
        return srv

    yield make
    for s in servers:
        s.kill()


@pytest.fixture
def fault_stack(tmp_path, private_pg, private_redis):
    """A private Redis (AOF) and a fresh database on the private PostgreSQL; no processes yet."""
    srv = private_redis()
    stack = Stack(tmp_path, srv.url, private_pg.create_database())
    # fault tests kill, restart and stop these: never the shared services
    assert ":6379/" not in stack.env["MEMQ_REDIS_URL"] and ":5432/" not in stack.env["MEMQ_DATABASE_URL"]
    stack.redis_server = srv  # type: ignore[attr-defined]
    stack.pg = private_pg  # type: ignore[attr-defined]
    stack.upgrade()
    yield stack
    stack.close()
