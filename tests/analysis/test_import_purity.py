"""Importing the analysis (and the offline CLI path) must not pull in heavy or service libraries."""

from __future__ import annotations

import os
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


#: What `memq analyze` on a snapshot without an OOM never imports: each is loaded only when the input
#: needs it (benchmarks/RESULTS.md "Big snapshots": together about 10 ms of the 100k snapshot's thin
#: margin over a plain load, and OpenSSL's libcrypto 3.7 MB of its peak).
ONLY_WHEN_NEEDED = (
    "memq.analysis.allocator_model",  # the replay: only for an OOM, a what-if or a fit curve
    "memq.analysis.alloc_conf",
    "memq.analysis.whatif",
    "memq.analysis.checkpoint",  # the OOM's own rules
    "memq.analysis.fit",
    "memq.analysis.message_verdict",  # only with an OOM message to judge
    "memq.oom_message",
    "tomllib",  # only with a config file to read
    "hashlib", "_hashlib",  # `analyze` names no snapshot by its hash
    "zstandard",  # a gzip snapshot's command does not need it
    "markdown_it",  # the playbook as HTML (memq serve); the terminal shows it as text
)


def test_analyze_of_a_healthy_snapshot_loads_only_what_it_needs(tmp_path):
    code = ("import sys; from click.testing import CliRunner; from memq.cli import cli;"
            "f = 'tests/fixtures/real/seed_adamw/epoch0.pickle.gz';"
            "rs = [CliRunner().invoke(cli, ['analyze', f, *extra]) for extra in (['--json'], [])];"
            "assert all(r.exit_code == 0 for r in rs), [r.output for r in rs];"
            f"print(sorted(m for m in {ONLY_WHEN_NEEDED!r} if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k not in ("MEMQ_CONFIG", "MEMQ_DATA_DIR")}
    env.update(HOME=str(tmp_path), XDG_DATA_HOME=str(tmp_path))  # no config file to read
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.strip() == "[]", p.stdout
