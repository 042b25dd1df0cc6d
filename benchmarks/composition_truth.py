"""Composition and phase by provenance against snapshots whose truth their source states.

For each snapshot: the share of live bytes in the right class (parameters, gradients, optimizer state,
the rest) and in the right phase (before the trace, forward, backward, optimizer step), split into the
tuning half and the held-back half by a fixed rule: the first hex digit of the sha256 of the
uncompressed pickle, 0-7 tuning, 8-f held back.

    python benchmarks/composition_truth.py [--extra DIR]

`--extra DIR` adds the public snapshots that cannot be checked in (no licence), fetched as
tests/fixtures/public_snapshots/README.md says. Truth: tests/fixtures/public_snapshots/truth.json.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import sys
from collections import Counter
from pathlib import Path

from memq.analysis import frames as fr
from memq.analysis.provenance import block_classes, event_phase
from memq.load import load_snapshot_file

ROOT = Path(__file__).resolve().parent.parent
TRUTH = ROOT / "tests/fixtures/public_snapshots/truth.json"
PHASE_OF = {fr.PARAMETERS: "before_trace", fr.GRADIENTS: "backward", fr.OPTIMIZER_STATE: "optimizer_step",
            "rest": "forward"}


def raw_sha(path: Path) -> str:
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return hashlib.sha256(data).hexdigest()


def score(path: Path, truth: dict) -> dict:
    snap = load_snapshot_file(path)
    snap = getattr(snap, "snapshot", snap)
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    total = sum(b.size for b in live)
    classes = block_classes(snap)
    has_frames = any(ev.frames for ev in snap.trace)
    pred, phase = Counter(), Counter()
    for b in live:
        bc = classes.get(b.address)
        cls = bc.cls if bc else fr.UNKNOWN
        pred[cls if cls in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE) else "rest"] += b.size
        if bc is None or bc.event < 0:
            phase["before_trace"] += b.size
        else:
            phase[event_phase(snap.trace[bc.event].frames, has_frames) or "unknown"] += b.size
    want = {k: truth.get(k, 0) for k in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE)}
    want["rest"] = max(0, total - sum(want.values()))
    right = sum(min(pred[k], v) for k, v in want.items())
    want_phase: Counter = Counter()
    for k, v in want.items():
        want_phase[truth.get("phase", {}).get(k, PHASE_OF[k])] += v
    right_phase = sum(min(phase[k], v) for k, v in want_phase.items())
    return {"live_gib": total / 2**30, "class_share": right / total, "phase_share": right_phase / total,
            "pred_gib": {k: round(v / 2**30, 2) for k, v in pred.items()}}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", type=Path, default=None)
    args = ap.parse_args()
    truth = json.loads(TRUTH.read_text())
    rows = []
    for name, t in truth["snapshots"].items():
        path = ROOT / t["path"]
        if not path.exists() and args.extra is not None:
            path = args.extra / Path(t["path"]).name
        if not path.exists():
            print(f"{name}: not here ({t['path']}): {t.get('fetch', 'see README')}")
            continue
        half = "tuning" if int(raw_sha(path)[0], 16) < 8 else "held-back"
        r = score(path, t)
        rows.append((half, name, r))
    print(f"{'half':10} {'snapshot':48} {'live':>9} {'class':>7} {'phase':>7}  predicted (GiB)")
    for half, name, r in sorted(rows, key=lambda x: (x[0] != "tuning", x[1])):
        print(f"{half:10} {name:48} {r['live_gib']:7.2f}Gi {r['class_share']:7.1%} {r['phase_share']:7.1%}  "
              f"{r['pred_gib']}")
    for half in ("tuning", "held-back"):
        got = [r for h, _, r in rows if h == half]
        if got:
            print(f"{half}: {len(got)} snapshots, worst class share {min(r['class_share'] for r in got):.1%}, "
                  f"worst phase share {min(r['phase_share'] for r in got):.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
