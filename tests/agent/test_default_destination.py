"""agent.start() with no Redis named says once where it sends and how to change it (issue 42 item 5)."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = """
import sys
sys.modules['torch'] = None  # no GPU needed: the source records nothing
from memq import agent
for name in ('one', 'two'):
    agent.start(run=name, cluster='c', signal=None, spool_dir=sys.argv[1], key_prefix='memq-test-dest:',
                stream='memq-test-dest:ingest')
    agent.stop(2)
print('job ran')
"""


def _run(tmp_path, **env):
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    base["MEMQ_DATA_DIR"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", CODE, str(tmp_path / "spool")], capture_output=True, text=True,
                         timeout=60, env=base | env)
    assert out.returncode == 0 and "job ran" in out.stdout, out.stderr
    return [ln for ln in out.stderr.splitlines() if "sends to" in ln]


def test_the_default_destination_is_said_once(tmp_path):
    lines = _run(tmp_path)
    assert len(lines) == 1, lines
    assert "redis://127.0.0.1:6379/0" in lines[0] and "MEMQ_REDIS_URL" in lines[0] and "redis_url=" in lines[0]


def test_a_named_destination_is_not_warned_about(tmp_path):
    assert _run(tmp_path, MEMQ_REDIS_URL="redis://127.0.0.1:6379/3") == []
