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
        "MEMQ_REDIS_URL": "redis://127.0.0.1:6379/0", "MEMQ_KEY_PREFIX": prefix, "MEMQ_STREAM": prefix + "ingest",
        "MEMQ_DEAD_STREAM": prefix + "dead"}
    subprocess.run([sys.executable, "-m", "memq", "db", "upgrade"], env=env, check=True, capture_output=True)
    import redis

    # one entry to read (a malformed one: dead-lettered and acknowledged), so the dispatcher is a consumer
    redis.Redis.from_url("redis://127.0.0.1:6379/0").xadd(prefix + "ingest", {"type": "probe"})
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
    # nothing pending: it left the group, so `memq status` does not list it forever
    from memq.queues import GROUP

    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        assert r.xlen(prefix + "dead") == 1 or r.xinfo_groups(prefix + "ingest")[0]["entries-read"] == 1
        assert r.xinfo_consumers(prefix + "ingest", GROUP) == []
    finally:
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)


def test_status_marks_consumers_gone_past_the_threshold(tmp_path):
    import redis

    from memq.config import load_settings
    from memq.pipeline.status import CONSUMER_GONE_S, collect_status, consumer_gone
    from memq.queues import GROUP

    assert not consumer_gone(CONSUMER_GONE_S) and consumer_gone(CONSUMER_GONE_S + 0.1)
    prefix = f"memq-test-gone-{uuid.uuid4().hex[:8]}:"
    st = load_settings(memq_environ(f"sqlite:///{tmp_path / 'memq.db'}", tmp_path) | {
        "MEMQ_REDIS_URL": "redis://127.0.0.1:6379/0", "MEMQ_KEY_PREFIX": prefix, "MEMQ_STREAM": prefix + "ingest"})
    r = redis.Redis.from_url(st.redis_url)
    try:
        r.xgroup_create(st.stream_key, GROUP, id="0", mkstream=True)
        for _ in range(2):  # Redis creates a consumer on its first delivered entry
            r.xadd(st.stream_key, {"type": "probe"})
        r.xreadgroup(GROUP, "old-host-1", {st.stream_key: ">"}, count=1)
        time.sleep(1.2)
        r.xreadgroup(GROUP, "live-host-2", {st.stream_key: ">"}, count=1)
        doc = collect_status(st, with_db=False, gone_after_s=1.0)
        gone = {c["name"]: c["gone"] for c in doc["stream"]["consumers"]}
        assert gone == {"old-host-1": True, "live-host-2": False}
    finally:
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)
