"""How well `memq fit` predicts the ten model families of benchmarks/gpu/fit_families.py (captured on an
H200): per family, the base run recorded by the agent at its defaults and by hand
(`_record_memory_history` with torch's defaults, stacks="all") predicts the peak reserved at 2x, 4x and
8x the batch (2x and 4x the length for the sequence families) against the real uncapped runs, and the
largest batch under the cap the real runs were bisected under. The families are split before any
result (fit_families.py `split`): the interval is tuned on the first half and its coverage reported on
the held-back half. No services, no torch.

    python benchmarks/fit_families_calibration.py [--dir tests/fixtures/fit_families] [--half tuning] [--json]
    python benchmarks/fit_families_calibration.py --set fresh [--dir tests/fixtures/fit_fresh] [--json]
    python benchmarks/fit_families_calibration.py --set late [--dir tests/fixtures/fit_late] [--json]

--half tuning reads the tuning half only (what a change to the model is judged on); the held-back half
is judged once, after.
--set fresh judges the fresh held-back families of benchmarks/gpu/fit_families.py's sibling fit_fresh.py
(every family held back, captured after the model was tuned): beside the agent's and the hand recording,
the hand dump taken at the end of the first backward (`--optimizer` the family's own), each prediction
inside or outside its interval, the largest batch under the cap, and the agent against the hand recording.
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
FRESH_DIR = ROOT / "tests" / "fixtures" / "fit_fresh"
LATE_DIR = ROOT / "tests" / "fixtures" / "fit_late"  # benchmarks/gpu/fit_fresh.py --set late
SOURCES = ("agent", "hand", "dump")


def recordings(d: Path, fam: str, opt: str | None = None) -> dict[str, fit.Measured]:
    """{"agent": ..., "hand": ..., "dump": ...}: what each recording of the base shape measures (missing
    ones left out); "dump", of a capture that has one, the snapshot taken at the end of the first
    backward, its optimizer given as a user would (`--optimizer`)."""
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
    dump = d / "dumps" / f"{fam}-dump.backward.pickle.gz"
    if dump.is_file():
        try:
            out["dump"] = fit.classify(load_snapshot_file(str(dump), max_bytes=1 << 32).snapshot, optimizer=opt)
        except fit.NotAssessable as exc:
            print(f"{fam} dump: {exc}", file=sys.stderr)
    return out


def _opt(m: fit.Measured, opt: str) -> str | None:
    """The optimizer a user names for a trace of part of the first step; none for a whole step."""
    return opt if m.partial else None


def family_rows(d: Path, fam: str, doc: dict) -> dict:
    spec, runs = doc["spec"], doc.get("runs", {})
    b0, s0 = spec["batch"], spec["size"]
    opt = spec.get("opt")
    meas = recordings(d, fam, opt)
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
                p = fit.predict(m, k, _opt(m, opt), k if "length" in label else 1.0).peak_reserved
            except fit.NotAssessable:
                continue
            row[src] = p
            row[f"{src}_err"] = (p - real) / real
            row[f"{src}_margin"] = fit.asked(m, length="length" in label).margin
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
            o = _opt(m, opt)
            largest[src] = fit.largest_unit(m, b0, cap["cap_bytes"], o)
            largest[f"{src}_range"] = (fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 - m.margin)), o),
                                       fit.largest_unit(m, b0, int(cap["cap_bytes"] * (1 + m.margin)), o))
    return {"spec": spec, "shapes": shapes, "largest": largest,
            "cast_share": {src: m.cast_share for src, m in meas.items()},
            "steps": {src: m.steps for src, m in meas.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--half", choices=("tuning", "held_back", "all"), default="all")
    ap.add_argument("--set", choices=("families", "fresh", "late"), default="families")
    args = ap.parse_args()
    if args.dir is None:
        args.dir = {"fresh": FRESH_DIR, "late": LATE_DIR}.get(args.set, DEFAULT_DIR)
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
    if args.set in ("fresh", "late"):
        judge_fresh(rows, took)
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
        inside = sum(abs(s[f"{src}_err"]) <= s[f"{src}_margin"] + 1e-12 for fam in split[half] if fam in rows
                     for s in rows[fam]["shapes"] for src in ("agent", "hand") if f"{src}_err" in s)
        # per class: the narrow interval (the model's own ops) and the library one, each with its largest error
        by_class: dict[float, list[float]] = {}
        for fam in split[half]:
            for s in rows.get(fam, {}).get("shapes", ()):
                for src in ("agent", "hand"):
                    if f"{src}_err" in s:
                        by_class.setdefault(s[f"{src}_margin"], []).append(abs(s[f"{src}_err"]))
        classes = "; ".join(f"+/-{mg:.0%}: {len(es)} predictions, largest error {max(es) * 100:.1f}%"
                            for mg, es in sorted(by_class.items()))
        exact = [(fam, src) for fam in split[half] if fam in rows and rows[fam]["largest"]
                 for src in ("agent", "hand") if src in rows[fam]["largest"]]
        lg = {f: rows[f]["largest"] for f, _s in exact}
        n_exact = sum(lg[f]["real_range"][0] <= lg[f][s] <= lg[f]["real_range"][1] for f, s in exact)
        # the range holds the truth: they overlap (a truth not pinned is itself a range)
        n_range = sum(rows[f]["largest"][s + "_range"][0] <= rows[f]["largest"]["real_range"][1]
                      and rows[f]["largest"]["real_range"][0] <= rows[f]["largest"][s + "_range"][1] for f, s in exact)
        worst = max((abs(e) for e in errs), default=0.0)
        print(f"{half}: {inside}/{len(errs)} predictions inside their interval ({classes}; largest error "
              f"{worst * 100:.1f}%); largest batch exact {n_exact}/{len(exact)}, inside its range "
              f"{n_range}/{len(exact)}")
    agree = [abs(s["agent"] - s["hand"]) / s["hand"] for r in rows.values() for s in r["shapes"]
             if "agent" in s and "hand" in s]
    print(f"agent vs hand recording: largest disagreement {max(agree, default=0) * 100:.2f}% over {len(agree)} "
          f"predictions; {took:.1f} s for all of it")


def judge_fresh(rows: dict, took: float) -> None:
    """The fresh set judged: each prediction against the real run, inside or outside its own interval
    (the recording's margin: FIT_MARGIN, or FIT_MARGIN_LIBRARY, of a whole step), the largest batch, agent
    against hand."""
    print("| family | shape | real peak reserved | " + " | ".join(f"{s} | error" for s in SOURCES) + " |")
    print("|---|---|---|" + "---|---|" * len(SOURCES))
    for fam, r in rows.items():
        for s in r["shapes"]:
            cells = []
            for src in SOURCES:
                if src not in s:
                    cells.append("- | -")
                    continue
                e, mg = s[f"{src}_err"], s[f"{src}_margin"]
                inside = "inside" if abs(e) <= mg + 1e-12 else "OUTSIDE"
                cells.append(f"{s[src] / GiB:.3f} GiB | {e * 100:+.1f}% ({inside} +/-{mg:.0%})")
            print(f"| {fam} | {s['shape']} | {s['real'] / GiB:.3f} GiB | {' | '.join(cells)} |")
    print()
    print("| family | cap | largest batch: real | " + " | ".join(f"{s} (range)" for s in SOURCES) + " |")
    print("|---|---|---|" + "---|" * len(SOURCES))
    for fam, r in rows.items():
        lg = r["largest"]
        if not lg:
            print(f"| {fam} | - | no bracketed cap | " + " | ".join("-" for _ in SOURCES) + " |")
            continue
        lo, hi = lg["real_range"]
        real = f"{lo}" if lo == hi else f"{lo}-{hi} (not pinned)"
        cells = []
        for src in SOURCES:
            if src not in lg:
                cells.append("-")
                continue
            a, b = lg[src + "_range"]
            verdict = ("exact" if lo <= lg[src] <= hi else
                       "range holds it" if a <= hi and lo <= b else "MISSED")
            cells.append(f"{lg[src]} ({a}-{b}) {verdict}")
        print(f"| {fam} | {lg['cap'] / GiB:.3f} GiB | {real} | {' | '.join(cells)} |")
    print()
    for src in SOURCES:
        errs = [(s[f"{src}_err"], s[f"{src}_margin"]) for r in rows.values() for s in r["shapes"] if src in s]
        if not errs:
            continue
        inside = sum(abs(e) <= mg + 1e-12 for e, mg in errs)
        at_fit = sum(abs(e) <= fit.FIT_MARGIN + 1e-12 for e, _mg in errs)  # the narrow interval's
        lgs = [r["largest"] for r in rows.values() if r["largest"] and src in r["largest"]]
        exact = sum(lg["real_range"][0] <= lg[src] <= lg["real_range"][1] for lg in lgs)
        held = sum(lg[src + "_range"][0] <= lg["real_range"][1] and lg["real_range"][0] <= lg[src + "_range"][1]
                   for lg in lgs)
        widest = max(mg for _e, mg in errs)
        print(f"{src}: {inside}/{len(errs)} predictions inside their interval (widest +/-{widest:.0%}), "
              f"{at_fit}/{len(errs)} within FIT_MARGIN +/-{fit.FIT_MARGIN:.0%}; largest error "
              f"{max(abs(e) for e, _mg in errs) * 100:.1f}%; largest batch exact {exact}/{len(lgs)}, "
              f"inside its range {held}/{len(lgs)}")
    agree = [(fam, s["shape"], (s["agent"] - s["hand"]) / s["hand"]) for fam, r in rows.items() for s in r["shapes"]
             if "agent" in s and "hand" in s]
    within = sum(abs(d) <= 0.01 for _f, _s, d in agree)
    worst = max(agree, key=lambda t: abs(t[2]), default=None)
    print(f"agent vs hand recording: {within}/{len(agree)} predictions agree within 1%"
          + (f"; largest disagreement {worst[2] * 100:+.2f}% ({worst[0]}, {worst[1]})" if worst else "")
          + f"; {took:.1f} s for all of it")
    missing = {fam: [s for s in SOURCES if s not in r["steps"]] for fam, r in rows.items()}
    for fam, srcs in missing.items():
        if srcs:
            print(f"{fam}: no prediction from {', '.join(srcs)} (not captured or not assessable)")


if __name__ == "__main__":
    main()
