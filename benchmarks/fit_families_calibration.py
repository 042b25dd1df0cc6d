"""How well `memq fit` predicts the ten model families of benchmarks/gpu/fit_families.py (captured on an
H200): per family, the base run recorded by the agent at its defaults and by hand
(`_record_memory_history` with torch's defaults, stacks="all") predicts the peak reserved at 2x, 4x and
8x the batch (2x and 4x the length for the sequence families) against the real uncapped runs, and the
largest batch under the cap the real runs were bisected under. The families are split before any
result (fit_families.py `split`): the interval is tuned on the first half and its coverage reported on
the held-back half. No services, no torch.

    python benchmarks/fit_families_calibration.py [--dir tests/fixtures/fit_families] [--half tuning] [--json]

--half tuning reads the tuning half only (what a change to the model is judged on); the held-back half
is judged once, after.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import fit  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402
from tests.analysis.agent_data import spool_run  # noqa: E402

GiB = 1 << 30
DEFAULT_DIR = ROOT / "tests" / "fixtures" / "fit_families"


def recordings(d: Path, fam: str) -> dict[str, fit.Measured]:
    """{"agent": ..., "hand": ...}: what each recording of the base shape measures (missing ones left out)."""
    out = {}
    spool = d / "spools" / fam / "defaults"
    if spool.is_dir():
        runs = [p for p in spool.iterdir() if p.is_dir()]
        if runs:
            snaps, _ctx, _trig = spool_run(runs[0])
            if snaps:
                i, _why = fit.choose(snaps)
                try:
                    out["agent"] = fit.classify(snaps[i])
                except fit.NotAssessable as exc:
                    print(f"{fam} agent: {exc}", file=sys.stderr)
    for name in (f"{fam}.pickle.gz", f"{fam}.pickle"):
        hand = d / "hand" / name
        if hand.is_file():
            try:
                out["hand"] = fit.classify(load_snapshot_file(str(hand), max_bytes=1 << 32).snapshot)
            except fit.NotAssessable as exc:
                print(f"{fam} hand: {exc}", file=sys.stderr)
            break
    return out


def family_rows(d: Path, fam: str, doc: dict) -> dict:
    spec, runs = doc["spec"], doc.get("runs", {})
    b0, s0 = spec["batch"], spec["size"]
    meas = recordings(d, fam)
    wanted = [(f"{k}x batch", f"{fam}-b{k * b0}-s{s0}", k) for k in (2, 4, 8)]
    if spec.get("seq"):
        wanted += [(f"{k}x length", f"{fam}-b{b0}-s{k * s0}", k) for k in (2, 4)]
    shapes = []
    for label, key, k in wanted:
        r = runs.get(key)
        if not r or r.get("outcome") != "completed":
            continue
        real = r["max_reserved"]
        row = {"shape": label, "real": real}
        for src, m in meas.items():
            try:
                p = fit.predict(m, k).peak_reserved
            except fit.NotAssessable:
                continue
            row[src] = p
            row[f"{src}_err"] = (p - real) / real
        shapes.append(row)
    cap = doc.get("cap")
    largest = None
    if cap and cap.get("next_outcome") == "oom" and cap.get("max_batch_outcome") == "completed":
        # the truth: the largest batch that completed under the cap, up to the smallest one that did not
        # (less one); a bisection that ran out of probes leaves a range (resnet_bn: 109-127)
        ooms = [int(b) for b, o in cap.get("probes", {}).items() if o == "oom" and int(b) > cap["max_batch"]]
        hi = min(ooms) - 1 if ooms else cap["max_batch"]
        largest = {"cap": cap["cap_bytes"], "real": cap["max_batch"], "real_range": (cap["max_batch"], hi)}
        for src, m in meas.items():
            largest[src] = fit.largest_unit(m, b0, cap["cap_bytes"])
            largest[f"{src}_range"] = (fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 - m.margin))),
                                       fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 + m.margin))))
    return {"spec": spec, "shapes": shapes, "largest": largest,
            "cast_share": {src: m.cast_share for src, m in meas.items()},
            "steps": {src: m.steps for src, m in meas.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=DEFAULT_DIR)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--half", choices=("tuning", "held_back", "all"), default="all")
    args = ap.parse_args()
    summary = json.loads((args.dir / "summary.json").read_text())
    split = summary["split"]
    if args.half != "all":
        split = {h: (fams if h == args.half else []) for h, fams in split.items() if h != "rule"}
    keep = {f for h in ("tuning", "held_back") for f in split.get(h, [])}
    t0 = time.perf_counter()
    rows = {fam: family_rows(args.dir, fam, doc) for fam, doc in sorted(summary["families"].items()) if fam in keep}
    took = time.perf_counter() - t0
    if args.json:
        json.dump(rows, sys.stdout, indent=1, default=list)
        return
    print("| family | half | shape | real peak reserved | agent | error | hand | error |")
    print("|---|---|---|---|---|---|---|---|")
    for fam, r in rows.items():
        half = "tuning" if fam in split["tuning"] else "held back"
        for s in r["shapes"]:
            a = f"{s['agent'] / GiB:.3f} GiB | {s['agent_err'] * 100:+.1f}%" if "agent" in s else "- | -"
            h = f"{s['hand'] / GiB:.3f} GiB | {s['hand_err'] * 100:+.1f}%" if "hand" in s else "- | -"
            print(f"| {fam} | {half} | {s['shape']} | {s['real'] / GiB:.3f} GiB | {a} | {h} |")
    print()
    print("| family | half | cap | largest batch: real | agent (range) | hand (range) |")
    print("|---|---|---|---|---|---|")
    for fam, r in rows.items():
        lg = r["largest"]
        if not lg:
            continue
        half = "tuning" if fam in split["tuning"] else "held back"
        cells = [f"{lg[s]} ({lg[s + '_range'][0]}-{lg[s + '_range'][1]})" if s in lg else "-"
                 for s in ("agent", "hand")]
        lo, hi = lg["real_range"]
        real = f"{lo}" if lo == hi else f"{lo}-{hi} (not pinned)"
        print(f"| {fam} | {half} | {lg['cap'] / GiB:.3f} GiB | {real} | {cells[0]} | {cells[1]} |")
    print()
    for half in ("tuning", "held_back"):
        errs = [s[f"{src}_err"] for fam in split[half] if fam in rows for s in rows[fam]["shapes"]
                for src in ("agent", "hand") if f"{src}_err" in s]
        inside = sum(abs(e) <= fit.FIT_MARGIN + 1e-12 for e in errs)
        exact = [(fam, src) for fam in split[half] if fam in rows and rows[fam]["largest"]
                 for src in ("agent", "hand") if src in rows[fam]["largest"]]
        lg = {f: rows[f]["largest"] for f, _s in exact}
        n_exact = sum(lg[f]["real_range"][0] <= lg[f][s] <= lg[f]["real_range"][1] for f, s in exact)
        # the range holds the truth: they overlap (a truth not pinned is itself a range)
        n_range = sum(rows[f]["largest"][s + "_range"][0] <= rows[f]["largest"]["real_range"][1]
                      and rows[f]["largest"]["real_range"][0] <= rows[f]["largest"][s + "_range"][1] for f, s in exact)
        worst = max((abs(e) for e in errs), default=0.0)
        print(f"{half}: {inside}/{len(errs)} predictions inside +/-{fit.FIT_MARGIN:.0%} (largest error "
              f"{worst * 100:.1f}%); largest batch exact {n_exact}/{len(exact)}, inside its range "
              f"{n_range}/{len(exact)}")
    agree = [abs(s["agent"] - s["hand"]) / s["hand"] for r in rows.values() for s in r["shapes"]
             if "agent" in s and "hand" in s]
    print(f"agent vs hand recording: largest disagreement {max(agree, default=0) * 100:.2f}% over {len(agree)} "
          f"predictions; {took:.1f} s for all of it")


if __name__ == "__main__":
    main()
