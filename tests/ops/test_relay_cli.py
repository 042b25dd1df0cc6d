"""`memq relay load|version` (issue 28: the argparse CLI of redis_functions.py joined memq): on a
private redis-server, the library is missing, then loaded, then current; an unreachable Redis is one
line and exit 1, the password hidden."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memq import redis_functions
from tests.workers.stack import ROOT, PrivateRedis, free_port

pytestmark = pytest.mark.redis


def _memq(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memq", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})


def test_relay_loads_the_library_once_and_reports_its_version(tmp_path):
    srv = PrivateRedis(tmp_path / "r", aof=False).start()
    try:
        got = _memq("relay", "version", "--redis-url", srv.url)
        assert got.returncode == 0 and got.stdout.strip() == f"loaded: None; shipped: {redis_functions.VERSION}"
        got = _memq("relay", "load", "--redis-url", srv.url)
        assert got.returncode == 0 and ": loaded at redis://127.0.0.1:" in got.stdout, got.stderr
        got = _memq("relay", "load", "--redis-url", srv.url)
        assert ": current at" in got.stdout
        got = _memq("relay", "version", "--redis-url", srv.url)
        assert got.stdout.strip() == f"loaded: {redis_functions.VERSION}; shipped: {redis_functions.VERSION}"
    finally:
        srv.kill()


def test_relay_against_no_redis_is_one_line_with_the_password_hidden():
    got = _memq("relay", "load", "--redis-url", f"redis://:hunter2@127.0.0.1:{free_port()}/0")
    assert got.returncode == 1, got
    assert got.stderr.count("\n") == 1 and "cannot reach Redis" in got.stderr and "hunter2" not in got.stderr
