"""The agent in a training image: the wheel installed with --no-deps beside redis and zstandard only, in
an empty virtual environment (deploy/README.md "Training images"). agent.start / mark_step / stop run,
spool what Redis did not take, and none of the service's libraries is there or imported."""

from __future__ import annotations

import json
import sys

import pytest

from memq.agent.spool import decode
from tests.ops.wheel import run_ok as _run

SERVICE_LIBS = ("sqlalchemy", "celery", "kombu", "alembic", "psycopg", "starlette", "matplotlib", "rich", "click")

pytestmark = pytest.mark.timeout(300)


def test_agent_runs_from_a_no_deps_install(tmp_path, memq_wheel):
    wheel = memq_wheel
    _run(sys.executable, "-m", "venv", str(tmp_path / "v"))
    py = str(tmp_path / "v" / "bin" / "python")
    _run(py, "-m", "pip", "install", "-q", "--no-deps", str(wheel), "redis", "zstandard")
    code = f"""
import importlib.util, json, sys
from memq import agent
agent.start(run="slim", cluster="c", redis_url="redis://127.0.0.1:1/0", spool_dir={str(tmp_path / 'spool')!r})
agent.mark_step(0, 0)
agent.stop()
print(json.dumps({{"imported": sorted(m for m in {SERVICE_LIBS!r} + ("torch",) if m in sys.modules),
                  "installed": sorted(m for m in {SERVICE_LIBS!r} if importlib.util.find_spec(m)),
                  "counters": agent.counters()}}))
"""
    out = json.loads(_run(py, "-c", code, cwd=str(tmp_path)).strip().splitlines()[-1])
    assert out["imported"] == [] and out["installed"] == []
    assert out["counters"]["spooled"] >= 1 and out["counters"]["sent"] == 0
    kinds = [decode(f.read_bytes()).fields["kind"] for f in sorted((tmp_path / "spool").rglob("*.mqs"))]
    assert kinds and kinds[0] == "run_start"
