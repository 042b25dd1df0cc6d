"""A dispatcher told to stop says so and why (issue 42 item 9): a real `memq dispatcher` process on the
shared Redis under a key prefix of its own and a SQLite history, sent SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

from tests.conftest import memq_environ


def test_sigterm_is_logged_with_its_reason(tmp_path):
    prefix = f"memq-test-stop-{uuid.uuid4().hex[:8]}:"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env |= memq_environ(f"sqlite:///{tmp_path / 'memq.db'}", tmp_path) | {
        "MEMQ_REDIS_URL": "redis://127.0.0.1:6379/0", "MEMQ_KEY_PREFIX": prefix, "MEMQ_STREAM": prefix + "ingest"}
    subprocess.run([sys.executable, "-m", "memq", "db", "upgrade"], env=env, check=True, capture_output=True)
    p = subprocess.Popen([sys.executable, "-m", "memq", "dispatcher", "--block-ms", "100", "-l", "WARNING"], env=env,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(3)  # past start-up: the loop is reading
        assert p.poll() is None
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0, err
    line = [ln for ln in err.splitlines() if "stopped on" in ln]
    assert len(line) == 1 and "SIGTERM" in line[0] and "finishing the entries in hand" in line[0], err
