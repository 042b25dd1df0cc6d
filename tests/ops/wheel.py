"""The memq wheel as a user installs it, for the tests that install it into empty virtual
environments (test_agent_install, test_packaging): built once per test process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_ok(*cmd, cwd=None, env=None) -> str:
    """Run a command; its stdout, or an assertion error with the ends of both streams."""
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=240, cwd=cwd, env=env)
    assert p.returncode == 0, (cmd, p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout


def build_wheel(dest: Path) -> Path:
    run_ok(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(ROOT))
    return next(dest.glob("memq-*.whl"))
