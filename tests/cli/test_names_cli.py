"""`memq ingest` and `memq push` refuse the names the dispatcher refuses (memq.names), so the
history holds the same names on SQLite (which does not enforce String(200)) as on PostgreSQL: no
name past its column, no control characters (terminal escapes). (A NUL cannot come through argv; the
envelope tests cover it.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import REAL

FILE = str(REAL / "capacity" / "oom.pickle.gz")
ROOT = REAL.parents[2]


def memq(*args: str) -> subprocess.CompletedProcess:
    """The real command (exit codes and stderr as users see them), with this test's environment."""
    return subprocess.run([sys.executable, "-m", "memq", *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=dict(os.environ))
BAD = [("--run", "r" * 10_000), ("--run", "run\tx"), ("--run", "\x1b]0;TITLE\x07run"), ("--cluster", "c" * 201),
       ("--job", "j\x9bx"), ("--run", "  ")]


IDS = ["10000-chars", "tab", "escape", "long-cluster", "C1-job", "blank"]


@pytest.mark.parametrize("opt,value", BAD, ids=IDS)
def test_ingest_refuses_bad_names_on_both_databases(memq_env, opt, value):
    args = ["ingest", FILE, "--run", "ok-run", opt, value] if opt != "--run" else ["ingest", FILE, "--run", value]
    res = memq(*args)
    assert res.returncode == 2, res.stderr
    assert "name" in res.stderr and "\x1b" not in res.stderr and "Traceback" not in res.stderr
    assert len(res.stderr) < 600  # a 10,000-character name does not flood the message
    runs = memq("runs", "--json")
    assert runs.returncode == 0 and '"ok-run"' not in runs.stdout and "\\u0000" not in runs.stdout


def test_ingest_keeps_a_printable_unicode_name_of_200_characters(memq_env):
    name = "模" * 200
    res = memq("ingest", FILE, "--run", name, "--json")
    assert res.returncode == 0, res.stderr
    import json

    assert [r["run"] for r in json.loads(memq("runs", "--json").stdout)["runs"]] == [name]


@pytest.mark.parametrize("opt,value", BAD[:4], ids=IDS[:4])
def test_push_refuses_bad_names_before_sending(tmp_path, monkeypatch, opt, value):
    # an unreachable Redis: the name is refused before any connection is tried
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("MEMQ_CONFIG", str(tmp_path / "none.toml"))
    args = ["push", FILE, "--redis-url", "redis://127.0.0.1:1/0"]
    args += ["--run", value] if opt == "--run" else ["--run", "ok", opt, value]
    res = memq(*args)
    assert res.returncode == 2 and "name" in res.stderr, res.stderr
