"""The liveness probes the manifests name: deploy/probe.py (dispatcher, worker) and the beat's
schedule-file check, run for real (a private redis-server; the beat snippet as written in the manifest)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml

from tests.ops.stackfile import Server
from tests.workers.stack import free_port

ROOT = Path(__file__).resolve().parents[2]
PROBE = ROOT / "deploy" / "probe.py"


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("probe"), "--save", "").start()
    yield s
    s.kill()


def probe(kind: str, redis_url: str, prefix: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_REDIS_URL": redis_url, "MEMQ_KEY_PREFIX": prefix, "MEMQ_CONFIG": "/nonexistent.toml",
                "PYTHONPATH": str(ROOT)})
    return subprocess.run([sys.executable, str(PROBE), kind], env=env, capture_output=True, text=True, timeout=60)


def test_probe_passes_with_this_hosts_heartbeat_only(srv):
    r = redis.Redis.from_url(srv.url)
    prefix = "memqprobe:"
    assert probe("worker", srv.url, prefix).returncode == 1  # nothing alive here
    r.set(f"{prefix}heartbeat:worker:celery@elsewhere", json.dumps({"kind": "worker", "host": "elsewhere"}), ex=60)
    assert probe("worker", srv.url, prefix).returncode == 1  # another pod's heartbeat does not count
    r.set(f"{prefix}heartbeat:worker:celery@me", json.dumps({"kind": "worker", "host": socket.gethostname()}), ex=60)
    assert probe("worker", srv.url, prefix).returncode == 0
    assert probe("dispatcher", srv.url, prefix).returncode == 1


def test_probe_does_not_fail_a_pod_for_a_redis_outage():
    p = probe("dispatcher", f"redis://127.0.0.1:{free_port()}/0", "memq:")
    assert p.returncode == 0 and "assuming alive" in p.stderr


def test_beat_liveness_snippet(tmp_path):
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "32-beat.yaml").read_text()) if d]
    cmd = docs[0]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"]["command"]
    assert cmd[:2] == ["python3", "-c"]
    code = cmd[2].replace("/var/lib/memq/beat", str(tmp_path))
    run = lambda: subprocess.run([sys.executable, "-c", code], timeout=30).returncode  # noqa: E731
    assert run() == 1  # no schedule file yet
    sched = tmp_path / "celerybeat-schedule"
    sched.write_bytes(b"x")
    assert run() == 0
    old = time.time() - 3600
    os.utime(sched, (old, old))
    assert run() == 1  # beat stopped writing it
