"""A snapshot too big for one Redis value is refused at the door (deploy/CAPACITY.md, "Big snapshots"):
the agent sends nothing for it, keeps it in its spool folder for `memq analyze`, counts it, and goes on
with the run; `memq push` refuses the file with the reason. Real Redis, real fixture snapshots."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from memq import codec

from .conftest import REAL, entries, fixture_sha, make_agent

ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_keeps_an_oversize_snapshot_aside_and_sends_the_next_one(shared, tmp_path):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, spool_dir=str(tmp_path / "spool"))
    a.transport.max_blob_bytes = 1_000  # the replayed seed_adamw snapshots are 3-64 KB compressed
    a.mark_epoch(0)  # an epoch-end snapshot: over the cap
    assert a.flush(10)
    a.transport.max_blob_bytes = 64 * 1024**2
    a.mark_epoch(1)  # the next one goes through
    counters = a.stop(10)
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert [(s.trigger, s.epoch) for s in snaps] == [("epoch_end", 1)], [(s.trigger, s.epoch, s.step) for s in snaps]
    assert counters["oversize"] == 1 and counters["dropped"] == 1
    assert "exceeds MEMQ_MAX_BLOB_BYTES" in a.transport.last_error and "kept at" in a.transport.last_error
    (kept,) = (tmp_path / "spool").rglob("oversize/*.pickle.*")
    data = codec.decompress(kept.read_bytes())
    assert kept.name.startswith(hashlib.sha256(data).hexdigest()[:16])
    assert not any(k.startswith(f"{prefix}blob:") for k in map(bytes.decode, r.keys(f"{prefix}*"))
                   if hashlib.sha256(data).hexdigest() in k)
    out = subprocess.run([sys.executable, "-m", "memq", "analyze", str(kept), "--json"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert hashlib.sha256(data).hexdigest() == fixture_sha("seed_adamw", "before_training.pickle.gz")


def test_what_is_kept_aside_stays_within_the_spool_cap(shared, tmp_path):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, spool_dir=str(tmp_path / "spool"), spool_max_bytes=2_000)
    a.transport.max_blob_bytes = 1_000
    a.mark_epoch(0)
    counters = a.stop(10)
    assert counters["oversize"] == 1
    assert "kept at" not in a.transport.last_error
    assert list((tmp_path / "spool").rglob("oversize/*.pickle.*")) == []


def test_push_refuses_a_file_over_the_blob_cap_before_sending_anything(shared, tmp_path):
    r, prefix, stream = shared
    big = ROOT / "benchmarks" / "data" / "h200_1m_trace.pickle.gz"  # 85 MB of pickle, ~7 MB compressed
    env = {"MEMQ_KEY_PREFIX": prefix, "MEMQ_STREAM": stream, "MEMQ_MAX_BLOB_BYTES": str(2 * 1024**2),
           "MEMQ_DATA_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-m", "memq", "push", str(REAL / "seed_adamw" / "epoch0.pickle.gz"),
                          str(big), "--run", "big-run", "--cluster", "c"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.returncode == 2, out.stderr
    assert "h200_1m_trace.pickle.gz" in out.stderr and "exceeds MEMQ_MAX_BLOB_BYTES" in out.stderr
    assert "memq analyze" in out.stderr
    assert entries(r, stream) == []  # the whole push was refused: nothing half sent
