"""Importing the analysis (and the offline CLI path) must not pull in heavy or service libraries."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("torch", "sqlalchemy", "celery", "redis", "alembic", "kombu", "click", "rich")


def test_analysis_imports_no_services():
    code = ("import sys, memq.analysis, memq.snapshot, memq.codec, memq.load, memq.oom_message;"
            f"bad=[m for m in {FORBIDDEN!r} if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_analyze_command_does_not_import_storage_or_torch():
    code = ("import sys; from click.testing import CliRunner; from memq.cli import cli;"
            "r = CliRunner().invoke(cli, ['analyze', 'tests/fixtures/real/frag_synthetic/oom.pickle.gz', '--json']);"
            "assert r.exit_code == 0, r.output;"
            "bad=[m for m in ('torch','sqlalchemy','celery','redis') if m in sys.modules]; print(bad);"
            "sys.exit(1 if bad else 0)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
