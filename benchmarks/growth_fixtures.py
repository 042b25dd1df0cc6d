"""Turn a growth capture (benchmarks/gpu/growth_capture.py's --out folder) into tests/fixtures/growth.

    python benchmarks/growth_fixtures.py CAPTURE_DIR [--dest tests/fixtures/growth]

Kept as the service sees each run: the agent's spool (run_start, stats batches with their per-step
figures, snapshots, run_end) and the hand-saved epoch-end files. To keep the fixtures small, the
allocation traces of snapshots other than the OOM one are dropped (the growth model reads live bytes,
the leak's attribution reads the blocks and their frames; the OOM snapshot keeps its trace for the
failing step's need), at most MAX_SNAPSHOTS other snapshots are kept, evenly spaced (the stats
batches keep every figure), and blobs are re-compressed with gzip level 9. truth.json holds each job's
outcome (OOM step and epoch), its limit, and whether it is a leak. The scenarios are split into a
tuning half and a held-back half by the first hex digit of sha256(name): even = tuning; the fresh
set (names starting `fr_`, captured after the model's last change) is a third group, judged once.
Scenarios already in truth.json and not in this capture are kept, so two captures can share a folder.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import pickle
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import codec  # noqa: E402
from memq.agent.spool import Message, decode, encode  # noqa: E402

TRUTH_KEYS = ("leak", "outcome", "oom_step", "oom_epoch", "steps_per_epoch", "limit_bytes", "cap_bytes",
              "uncapped", "leak_per_interval", "steps_completed", "device_total")


#: Snapshots kept per spool besides the OOM one (evenly spaced): the figures carry the series, the
#: snapshots the blocks and lines the leak is attributed to.
MAX_SNAPSHOTS = 8


def half(name: str) -> str:
    if name.startswith("fr_"):
        return "fresh"
    return "tuning" if int(hashlib.sha256(name.encode()).hexdigest()[0], 16) % 2 == 0 else "held_back"


def slim(blob: bytes, keep_trace: bool) -> bytes:
    snap = codec.decode(blob)
    if not keep_trace and isinstance(snap, dict):
        snap["device_traces"] = [[] for _ in snap.get("device_traces") or []]
    # our own capture, re-pickled as plain data (dicts, lists, str, int, float, bool)
    return gzip.compress(pickle.dumps(snap, protocol=4), compresslevel=9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("capture")
    ap.add_argument("--dest", default=str(ROOT / "tests" / "fixtures" / "growth"))
    args = ap.parse_args()
    src, dest = Path(args.capture), Path(args.dest)
    summary = json.loads((src / "summary.json").read_text())
    old = dest / "truth.json"
    truth: dict = json.loads(old.read_text()) if old.exists() else {}
    for sc, runs in sorted(summary.items()):
        truth[sc] = {"half": half(sc)}
        for variant, res in sorted(runs.items()):
            truth[sc][variant] = {k: res.get(k) for k in TRUTH_KEYS if res.get(k) is not None}
            if variant == "hand":
                out = dest / sc / "hand"
                if out.exists():
                    shutil.rmtree(out)
                out.mkdir(parents=True)
                for f in sorted((src / "hand" / sc).glob("*.pickle.gz")):
                    (out / f.name).write_bytes(slim(f.read_bytes(), False))
                continue
            out = dest / sc / variant
            if out.exists():
                shutil.rmtree(out)
            out.mkdir(parents=True)
            msgs = [decode(f.read_bytes()) for f in sorted((src / "spools" / sc / variant).rglob("*.mqs"))]
            snaps = [i for i, m in enumerate(msgs) if m.blob is not None and m.fields.get("trigger") != "oom"]
            keep = set(snaps[:: max(1, -(-len(snaps) // MAX_SNAPSHOTS))]) | set(snaps[-1:])
            for i, msg in enumerate(msgs):
                if msg.blob is not None and msg.fields.get("trigger") != "oom" and i not in keep:
                    continue  # thinned: evenly spaced snapshots stay, and the last before the end
                if msg.blob is not None:
                    blob = slim(msg.blob, msg.fields.get("trigger") == "oom")
                    fields = dict(msg.fields, codec="gzip")
                    msg = Message(fields=fields, blob=blob, blob_key=msg.blob_key)
                (out / f"{i:05d}.mqs").write_bytes(encode(msg))
    (dest / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    print(f"{len(truth)} scenarios -> {dest}")


if __name__ == "__main__":
    main()
