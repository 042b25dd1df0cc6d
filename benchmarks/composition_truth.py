"""Composition and phase by provenance against snapshots whose truth their source states.

For each snapshot: the share of live bytes in the right class (parameters, gradients, optimizer state,
the rest) and in the right phase (before the trace, forward, backward, optimizer step), split into the
tuning half and the held-back half by a fixed rule: the first hex digit of the sha256 of the
uncompressed pickle, 0-7 tuning, 8-f held back.

    python benchmarks/composition_truth.py [--extra DIR]
    python benchmarks/composition_truth.py --gpu DIR [--half tuning|held-back] [--only NAME]
        [--no-history | --strip-frames]
        (a `--set fresh`, `--set late` or `--set eve` capture is held back whole: score it once, never tune on it)
        (the captures of benchmarks/gpu/composition_capture.py; +roles: with the roles the agent sent, and
        "+roles -cache" without the inference cache the job declared; --no-history: every capture with its
        trace and its blocks' frames removed, as if recording had never been on, no roles)

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
from memq.analysis.provenance import block_classes, entry_phase
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
    pred, phase = Counter(), Counter()
    for b in live:
        bc = classes.get(b.address)
        cls = bc.cls if bc else fr.UNKNOWN
        pred[cls if cls in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE) else "rest"] += b.size
        if bc is None or bc.event < 0:
            phase["before_trace"] += b.size
        else:
            phase[entry_phase(snap, bc.event) or "unknown"] += b.size
    want = {k: truth.get(k, 0) for k in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE)}
    want["rest"] = max(0, total - sum(want.values()))
    right = sum(min(pred[k], v) for k, v in want.items())
    want_phase: Counter = Counter()
    for k, v in want.items():
        want_phase[truth.get("phase", {}).get(k, PHASE_OF[k])] += v
    right_phase = sum(min(phase[k], v) for k, v in want_phase.items())
    return {"live_gib": total / 2**30, "class_share": right / total, "phase_share": right_phase / total,
            "pred_gib": {k: round(v / 2**30, 2) for k, v in pred.items()}}


# The capture's phase names (benchmarks/gpu/composition_capture.py) as the analysis names phases.
GPU_PHASE = {"zero_grad": "forward", "forward": "forward", "backward": "backward", "after_backward": "backward",
             "optimizer_step": "optimizer_step", "end": "optimizer_step", "setup": "setup",
             "before_trace": "before_trace"}


def _pred_phase(bc, snap) -> str:
    if bc is None or bc.event < 0:
        return "before_trace"
    return entry_phase(snap, bc.event) or "unknown"


def strip_frames(snap) -> None:
    """The snapshot as `_record_memory_history(context=None)` would have recorded it: the same entries,
    no stack on any of them or on any block."""
    empty: list = []
    snap.traces[:] = [[ev._replace(frames=empty) for ev in t] for t in snap.traces]
    for seg in snap.segments:
        for b in seg.blocks:
            b.frames = empty
    snap.memo.clear()


def score_gpu(job_dir: Path, with_roles: bool, declared: bool = True, no_history: bool = False,
              strip: bool = False) -> dict:
    """One capture of benchmarks/gpu/composition_capture.py against the truth taken from its tensors:
    the share of live bytes whose class is right, block by block (truth `other`, a step's leftovers,
    is right as other or activations); the share whose allocation phase is right (a block made before
    the first step, `setup`, is right as anything but backward or the optimizer step; one older than
    the trace only as before_trace); the peak's phase. `with_roles`: the roles the agent sent with it
    (the capture's `agent_roles`) are given to the analysis, as at the agent's defaults; `declared`
    False: without the cache the job declared (a job that declared none)."""
    from dataclasses import replace

    from memq.analysis import analyze
    from memq.model import AgentInfo

    truth = json.loads((job_dir / "truth.json").read_text())
    snap = load_snapshot_file(job_dir / "snapshot.pickle.gz")
    snap = getattr(snap, "snapshot", snap)
    if strip:
        strip_frames(snap)
    roles = truth.get("agent_roles") or {}
    if no_history:  # as if recording had never been on: no trace, no block frames
        snap.traces[snap.trace_device] = []
        for seg in snap.segments:
            for b in seg.blocks:
                b.frames = []
    if with_roles:
        if not isinstance(roles.get("ranges"), list):
            return {}
        from memq.model import AGENT_ROLES

        ranges = [r for r in roles["ranges"] if declared or r[2] != AGENT_ROLES.index("cache")]
        if not declared and len(ranges) == len(roles["ranges"]):
            return {}  # nothing was declared: the same as with the roles
        snap.agent = replace(snap.agent or AgentInfo(), roles=tuple(sorted(tuple(r) for r in ranges)))
    classes = block_classes(snap)
    total = right = right_phase = 0
    wrong: Counter = Counter()
    for addr, size, _label, cls, alloc_phase in truth["blocks"]:
        bc = classes.get(addr)
        got = bc.cls if bc is not None else "unknown"
        total += size
        if got == cls or (cls == "other" and got in ("other", fr.ACTIVATIONS)):
            right += size
        else:
            wrong[f"{cls}->{got}"] += size
        want, ph = GPU_PHASE.get(alloc_phase, alloc_phase), _pred_phase(bc, snap)
        # `setup`: made in the trace before the dump step's boundaries (the 2026-12-04 captures mark the
        # dump step only), so any phase the analysis gives a block made inside the trace is allowed
        if ph == want or (want == "setup" and ph != "before_trace"):
            right_phase += size
    res = analyze([snap])
    peak = ((res.get("details") or {}).get("timeline") or {}).get("peak_phase") or ""
    want_peak = _trace_peak_phase(snap, truth)
    return {"live_gib": total / 2**30, "class_share": right / max(total, 1), "phase_share": right_phase / max(total, 1),
            "peak_phase": peak.split(" ")[0] or None, "peak_truth": want_peak,
            "peak_right": (peak.split(" ")[0] or None) == want_peak if snap.trace and want_peak else None,
            "wrong_gib": {k: round(v / 2**30, 3) for k, v in wrong.most_common(4)}}


def _trace_peak_phase(snap, truth: dict) -> str | None:
    """The phase of the trace's highest live point (what the timeline's peak_phase names), from the
    capture's own phase boundaries: the trace replayed, its maximum's time placed among them. None where
    the maximum falls before the boundaries the capture marked (an earlier step's)."""
    level = peak = 0
    t_peak = None
    for ev in snap.trace:
        if ev.action == "alloc":
            level += ev.size
        elif ev.action == "free_completed":
            level -= ev.size
        else:
            continue
        if level > peak:
            peak, t_peak = level, ev.time_us
    bounds = truth.get("boundaries") or []
    if t_peak is None or not bounds:
        return None
    t = t_peak - (truth.get("clock_offset_us") or 0.0)
    if t < bounds[0][0]:
        return None
    name = [n for b, n in bounds if b <= t][-1]
    return GPU_PHASE.get(name, name)


def gpu_half(job_dir: Path) -> str:
    """The half a capture belongs to: every judging set's (composition_capture.py --set other than tuning:
    fresh, late) is held back whole, as it was made to judge what was tuned elsewhere; the tuning set's
    captures split by their pickle's sha256."""
    spec = json.loads((job_dir / "truth.json").read_text()).get("spec") or {}
    if spec.get("set", "tuning") != "tuning":
        return "held-back"
    return "tuning" if int(raw_sha(job_dir / "snapshot.pickle.gz")[0], 16) < 8 else "held-back"


def main_gpu(folder: Path, only_half: str | None = None, no_history: bool = False, only: str = "",
             strip: bool = False) -> int:
    rows = []
    for job_dir in sorted(p for p in folder.iterdir() if (p / "truth.json").exists()):
        half = gpu_half(job_dir)
        if only_half and half != only_half or only and only not in job_dir.name:
            continue
        variants = ((False, True, " -history"),) if no_history else \
            ((False, True, ""), (True, True, " +roles"), (True, False, " +roles -cache"))
        for roles, declared, tag in variants:
            r = score_gpu(job_dir, roles, declared, no_history, strip)
            if r:
                rows.append((half, job_dir.name + tag, r))
    print(f"{'half':10} {'capture':44} {'live':>8} {'class':>7} {'phase':>7} {'peak':>16}  wrong (GiB)")
    for half, name, r in sorted(rows, key=lambda x: (x[0] != "tuning", x[1])):
        peak = f"{r['peak_phase']}/{r['peak_truth']}" if r["peak_right"] is not None else "(not scored)"
        print(f"{half:10} {name:44} {r['live_gib']:6.2f}Gi {r['class_share']:7.1%} {r['phase_share']:7.1%} "
              f"{peak:>16}  {r['wrong_gib']}")
    for half in ("tuning", "held-back"):
        for tag, words in (("", ""), (" +roles", " with the agent roles"),
                           (" +roles -cache", " with the agent roles, no cache declared"),
                           (" -history", " with no history (trace and frames removed)")):
            got = [r for h, n, r in rows if h == half and n.endswith(tag)
                   and (tag or ("+roles" not in n and "-history" not in n))]
            if got:
                peaks = [r["peak_right"] for r in got if r["peak_right"] is not None]
                mean = sum(r["class_share"] for r in got) / len(got)
                print(f"{half}{words}: {len(got)} captures, class share worst "
                      f"{min(r['class_share'] for r in got):.1%} mean {mean:.1%}; "
                      f"phase share worst {min(r['phase_share'] for r in got):.1%}; peak phase right "
                      f"{sum(peaks)}/{len(peaks)}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", type=Path, default=None)
    ap.add_argument("--half", choices=("tuning", "held-back"), default=None,
                    help="with --gpu: score one half only (tune on the tuning half; the held-back half once)")
    ap.add_argument("--gpu", type=Path, default=None,
                    help="a benchmarks/gpu/composition_capture.py --out folder: score its captures instead")
    ap.add_argument("--no-history", action="store_true",
                    help="with --gpu: score every capture with its trace and block frames removed, no roles")
    ap.add_argument("--only", default="", help="with --gpu: the captures whose name holds this")
    ap.add_argument("--strip-frames", action="store_true",
                    help="with --gpu: every stack removed first, as a recording without stacks would have them")
    args = ap.parse_args()
    if args.gpu is not None:
        return main_gpu(args.gpu, args.half, args.no_history, args.only, args.strip_frames)
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
