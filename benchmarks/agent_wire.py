"""The agent's wire output for four fixed scenarios, normalized, to compare two versions of the agent.

A change that only moves the agent's code must leave every envelope, snapshot payload (its
`memq_agent` metadata included) and stats batch as it was. This drives a replayed recording through
marks, epochs, manual and signal snapshots, an OOM and a crash, reads back what reached Redis (the
shared server, under a key prefix of its own, deleted afterwards), drops what differs between two runs
of the same code (times, durations, pids, digests of bytes that embed a time, nonces, the counters that
race with delivery) and writes one JSON document:

    python benchmarks/agent_wire.py after.json
    (in the other version) python benchmarks/agent_wire.py before.json
    diff before.json after.json
"""
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import redis

from memq import codec, envelope
from memq.agent import Agent
from memq.agent.source import ReplaySource

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "real"
GIB = 1 << 30
URL = os.environ.get("MEMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
SPOOL = tempfile.mkdtemp(prefix="memq-wire-")
VOLATILE = {"ts", "t", "time", "took_ms", "ms", "pid", "sha256", "size", "sig", "argv", "host", "spool_files", "nonce",
            "queued", "sent"}

class DictSource(ReplaySource):
    def snapshot(self):
        data = super().snapshot()
        return codec.loads_restricted(data) if data is not None else None

def norm(x):
    if isinstance(x, dict):
        # the OOM frames name this file: where the two versions' copies lie does not matter
        return {k: ("<v>" if k in VOLATILE else Path(v).name if k == "filename" else norm(v))
                for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [norm(v) for v in x]
    return x

def sig(live, peak=None, retries=0):
    return (live, 2 * GIB, peak or live, 2 * GIB, retries)

def scenario(name, r, prefix, stream):
    src = DictSource(REAL / ("capacity" if name != "seed" else "seed_adamw"))
    kw = dict(source=src, stream=stream, key_prefix=prefix, backoff_s=(0.05, 0.2), fsync=False, signal=None,
              snapshot_every_s=0, send_timeout_s=1.0, tick_s=3600, stats_flush_s=3600,
              redis_url=URL, spool_dir=SPOOL)
    if name == "steps":
        live = [GIB] * 14 + [GIB + (300 << 20)] * 12 + [GIB + (700 << 20)] * 4 + [GIB + (700 << 20)] * 20
        src.signals = [sig(x, peak=(8 * GIB if i == 20 else None), retries=(1 if i > 40 else 0))
                       for i, x in enumerate(live)]
        a = Agent("wire-steps", "c", stats_interval_s=0, optimizer="AdamW", model="Net",
                  comparable_every_steps=7, comparable_min_s=0, step_budget=1.0, metadata={"k": "v"}, **kw).start()
        for i in range(45):
            a.mark_step(i, i // 15, tokens=10 * i if i % 3 == 0 else None)
            if i % 15 == 14:
                a.mark_epoch(i // 15)
        a.snapshot("manual")
        src.fire_oom()
        a.note_exception(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    elif name == "epochs":
        src.signals = [sig(GIB + (i // 5) * (300 << 20)) for i in range(40)]
        a = Agent("wire-epochs", "c", stats_interval_s=3600, history="auto", step_budget=1.0, **kw).start()
        for i in range(30):
            a.mark_step(None, None)
            if i % 5 == 4:
                a.mark_epoch()
        a.note_exception(ValueError("boom nccl"))
    elif name == "seed":
        a = Agent("wire-seed", "c", stats_interval_s=3600, history="on", **kw).start()
        a.snapshot()
        a.snapshot("signal")
        a.mark_step(3, 1)
        a.mark_epoch(1)
    elif name == "silent":
        src.set_ready(False)
        a = Agent("wire-silent", "c", announce="on_ready", **kw).start()
        a.mark_step(1, 0)
        a.mark_epoch(0)
    c = a.stop(10)
    out = []
    for _id, fields in r.xrange(stream):
        env = envelope.parse(fields)
        d = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in fields.items()}
        d = {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}
        d["payload"] = json.loads(d["payload"]) if d.get("payload") else None
        if env.kind == "snapshot":
            raw = r.get(env.blob_key(prefix))
            obj = codec.loads_restricted(codec.decompress(raw))
            d["blob_keys"] = sorted(obj.keys()) if isinstance(obj, dict) else type(obj).__name__
            d["memq_agent"] = obj.get("memq_agent") if isinstance(obj, dict) else None
        out.append(d)
    return {"entries": norm(out), "counters": norm(c), "history_calls": src.history_calls,
            "snapshot_calls": src.snapshot_calls}

r = redis.Redis.from_url(URL)
res = {}
for name in ("steps", "epochs", "seed", "silent"):
    prefix = f"memqtest:wire:{uuid.uuid4().hex[:8]}:"
    try:
        res[name] = scenario(name, r, prefix, prefix + "ingest")
    finally:
        for k in r.scan_iter(match=prefix + "*"):
            r.delete(k)
json.dump(res, open(sys.argv[1], "w"), indent=1, sort_keys=True, default=str)
print("ok", {k: len(v["entries"]) for k, v in res.items()})
