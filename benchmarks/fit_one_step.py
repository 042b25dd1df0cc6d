"""How well `memq fit` predicts from one step or part of one: each whole-run trace of the calibration sets
cut where a snapshot dumped in the first training step would be (tests/analysis/one_step.py: the trace up
to the cut, the blocks live at the cut): at the end of the first forward, and at the end of the first
backward (no optimizer step yet). The rest of the step is inferred (fit._one_step) and the peak predicted
at 2x and 4x (8x too) the batch or length, against the real uncapped runs' peak reserved, beside what the
whole six-step trace predicts (the allocator model's own error at the new shape). The optimizer is
given as a user would (`--optimizer`, the family's own). No services, no torch.

    python benchmarks/fit_one_step.py [--half tuning|held_back|all] [--set families|inhouse|both] [--json]

The ten families (tests/fixtures/fit_families, hand recordings from the model's build, stacks="all")
are split as fit_families_calibration.py splits them: tuned on the tuning half, the held-back half
reported once. The five in-house models (tests/fixtures/fit, history="on" recordings from the start).
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
from tests.analysis.one_step import cut, cut_points  # noqa: E402

GiB = 1 << 30
FAM = ROOT / "tests" / "fixtures" / "fit_families"
FIX = ROOT / "tests" / "fixtures" / "fit"
INHOUSE_OPT = {"cnn": "sgd_momentum"}  # the GPTs: adamw


def family_cases(half: str):
    """(set, name, half, snapshot, optimizer, [(label, k, real)]) per family."""
    summary = json.loads((FAM / "summary.json").read_text())
    split = summary["split"]
    for fam, doc in sorted(summary["families"].items()):
        h = "tuning" if fam in split["tuning"] else "held_back"
        if half not in ("all", h):
            continue
        spec, runs = doc["spec"], doc["runs"]
        shapes = ladder(fam, spec, runs)
        snap = load_snapshot_file(str(FAM / "hand" / f"{fam}.pickle.gz"), max_bytes=1 << 32).snapshot
        yield "families", fam, h, snap, spec["opt"], shapes


def ladder(fam: str, spec: dict, runs: dict) -> list[tuple[str, int, int]]:
    """(label, scale, real peak reserved) of a family's completed runs at 2x/4x/8x the batch and, for
    sequence models, 2x/4x the length."""
    b0, s0 = spec["batch"], spec["size"]
    wanted = [(f"{k}x batch", f"{fam}-b{k * b0}-s{s0}", k) for k in (2, 4, 8)]
    if spec.get("seq"):
        wanted += [(f"{k}x length", f"{fam}-b{b0}-s{k * s0}", k) for k in (2, 4)]
    return [(lab, k, runs[key]["max_reserved"]) for lab, key, k in wanted
            if runs.get(key, {}).get("outcome") == "completed"]


ONE = ROOT / "tests" / "fixtures" / "fit_one_step"


def dump_cases(half: str):
    """Real step-1 dumps (benchmarks/gpu/fit_one_step_capture.py): `_snapshot()` at the end of the first
    forward and of the first backward. The tuning families' truth is tests/fixtures/fit_families; the four
    new families (not among the ten: a fresh held-back set) carry their own ladders. Yields
    (set, name, half, {part: snapshot}, optimizer, shapes, whole snapshot or None)."""
    cap = json.loads((ONE / "summary.json").read_text())
    fams = json.loads((FAM / "summary.json").read_text())["families"]
    for fam in cap["tuning"] + list(cap["new_families"]):
        new = fam in cap["new_families"]
        h = "new" if new else "tuning"
        if half not in ("all", h):
            continue
        spec = cap["new_families"][fam] if new else fams[fam]["spec"]
        runs = cap["runs"] if new else fams[fam]["runs"]
        shapes = ladder(fam, spec, runs)
        parts = {p: load_snapshot_file(str(ONE / "dumps" / f"{fam}-dump.{p}.pickle.gz"), max_bytes=1 << 32).snapshot
                 for p in ("forward", "backward")}
        hand = (ONE / "hand" / f"{fam}.pickle.gz") if new else (FAM / "hand" / f"{fam}.pickle.gz")
        whole = load_snapshot_file(str(hand), max_bytes=1 << 32).snapshot
        yield "dumps", fam, h, parts, spec["opt"], shapes, whole


def inhouse_cases():
    from benchmarks.fit_calibration import full_raw
    from memq.snapshot import parse_snapshot

    truth = json.loads((FIX / "truth.json").read_text())
    for model, d in truth.items():
        runs = d["runs"]
        base = next(v for k, v in runs.items() if k.endswith("-defaults"))
        b0, t0 = base["batch"], base["seq"]
        wanted = [(f"{k}x batch", f"{model}-b{b0 * k}-t{t0}", k) for k in (2, 4, 8)]
        if model != "cnn":
            wanted += [(f"{k}x length", f"{model}-b{b0}-t{t0 * k}", k) for k in (2, 4)]
        shapes = [(lab, k, runs[key]["max_reserved"]) for lab, key, k in wanted if key in runs]
        yield "inhouse", model, "in-house", parse_snapshot(full_raw(model)), INHOUSE_OPT.get(model, "adamw"), shapes


def rows(cases) -> list[dict]:
    out = []
    for set_, name, half, snap, opt, shapes, *rest in cases:
        if rest:  # real dumps: the parts as dumped, and the whole run's recording
            parts, whole_snap = snap, rest[0]
        else:
            try:
                points = cut_points(snap)
            except ValueError as exc:
                print(f"{name}: {exc}", file=sys.stderr)
                continue
            parts, whole_snap = {p: (snap, at) for p, at in points.items()}, snap
        try:
            whole = fit.classify(whole_snap)
        except fit.NotAssessable:
            whole = None
        whole_pred = {(lb, k): fit.predict(whole, k, seq_k=k if "length" in lb else 1.0).peak_reserved
                      for lb, k, _r in shapes} if whole else {}
        for part, got in parts.items():
            try:
                m = fit.classify(cut(*got) if isinstance(got, tuple) else got, optimizer=opt)
            except fit.NotAssessable as exc:
                out.append({"set": set_, "name": name, "half": half, "cut": part, "error": str(exc)})
                continue
            for label, k, real in shapes:
                p = fit.predict(m, k, opt, k if "length" in label else 1.0).peak_reserved
                w = whole_pred.get((label, k))
                out.append({"set": set_, "name": name, "half": half, "cut": part, "shape": label, "k": k,
                            "real": real, "predicted": p, "err": (p - real) / real,
                            "whole": w, "whole_err": (w - real) / real if w else None,
                            "vs_whole": (p - w) / w if w else None,
                            "margin": fit.asked(m, length="length" in label).margin,
                            "whole_margin": fit.asked(whole, length="length" in label).margin if whole else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--half", choices=("tuning", "held_back", "new", "all"), default="all")
    ap.add_argument("--set", choices=("families", "inhouse", "dumps", "both"), default="both")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    cases = []
    if args.set in ("families", "both"):
        cases += list(family_cases(args.half))
    if args.set in ("inhouse", "both") and args.half in ("tuning", "all"):
        cases += list(inhouse_cases())
    if args.set == "dumps":
        cases += list(dump_cases(args.half))
    out = rows(cases)
    took = time.perf_counter() - t0
    if args.json:
        json.dump(out, sys.stdout, indent=1)
        return
    print("| set | model | half | recorded part | shape | real peak reserved | predicted | error "
          "| whole trace's error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in out:
        if "error" in r:
            print(f"| {r['set']} | {r['name']} | {r['half']} | {r['cut']} | - | - | refused: {r['error']} | - |")
            continue
        we = f"{r['whole_err'] * 100:+.1f}%" if r["whole_err"] is not None else "-"
        print(f"| {r['set']} | {r['name']} | {r['half']} | {r['cut']} | {r['shape']} | {r['real'] / GiB:.3f} GiB "
              f"| {r['predicted'] / GiB:.3f} GiB | {r['err'] * 100:+.1f}% | {we} |")
    print()
    for half in ("tuning", "held_back", "in-house", "new"):
        for part in ("forward", "backward"):
            rs = [r for r in out if r["half"] == half and r["cut"] == part and "err" in r]
            if not rs:
                continue
            at24 = [r for r in rs if r["k"] in (2, 4)]
            inside = sum(abs(r["err"]) <= 0.03 for r in at24)
            worst = max(abs(r["err"]) for r in rs)
            vs = [abs(r["vs_whole"]) for r in rs if r["vs_whole"] is not None]
            w_in = sum(abs(r["whole_err"]) <= 0.03 for r in at24 if r["whole_err"] is not None)
            print(f"{half}, cut after the first {part}: {inside}/{len(at24)} predictions at 2x and 4x within 3% "
                  f"(the whole trace: {w_in}/{len(at24)}); largest error at 2x-8x {worst * 100:.1f}%; largest "
                  f"difference from the whole trace's prediction {max(vs, default=0) * 100:.1f}%")
            own = sum(abs(r["err"]) <= r["margin"] + 1e-12 for r in rs)
            whole = [r for r in rs if r["whole_err"] is not None]
            w_own = sum(abs(r["whole_err"]) <= r["whole_margin"] + 1e-12 for r in whole)
            widths = ", ".join(sorted({f"+/-{r['margin']:.0%}" for r in rs}))
            print(f"  inside their own interval ({widths}): {own}/{len(rs)} at 2x-8x (the whole trace, inside its "
                  f"own: {w_own}/{len(whole)})")
    if args.set == "dumps" and args.half in ("new", "all"):
        largest_rows()
    print(f"{took:.1f} s for all of it")


def largest_rows() -> None:
    """The new families' largest batch under their cap (real capped runs, bisected) against `memq fit`'s
    from the whole hand recording and from the dump after the first backward, with the ranges (the cap
    -/+ the margin)."""
    cap = json.loads((ONE / "summary.json").read_text())
    print("\n| model | cap | largest batch: real | whole recording (range) | dump after the first backward (range) |")
    print("|---|---|---|---|---|")
    exact = inside = n = 0
    for fam, c in cap.get("caps", {}).items():
        spec = cap["new_families"][fam]
        b0, limit = spec["batch"], c["cap_bytes"]
        srcs = {"whole": fit.classify(load_snapshot_file(str(ONE / "hand" / f"{fam}.pickle.gz"),
                                                         max_bytes=1 << 32).snapshot),
                "dump": fit.classify(load_snapshot_file(str(ONE / "dumps" / f"{fam}-dump.backward.pickle.gz"),
                                                        max_bytes=1 << 32).snapshot, optimizer=spec["opt"])}
        cells = []
        for m in srcs.values():
            best = fit.largest_unit(m, b0, limit, spec["opt"] if m.partial else None)
            lo = fit.largest_unit(m, b0, int(limit * (1 - m.margin)), spec["opt"] if m.partial else None)
            hi = fit.largest_unit(m, b0, int(limit * (1 + m.margin)), spec["opt"] if m.partial else None)
            cells.append(f"{best} ({lo}-{hi})")
            n += 1
            exact += best == c["max_batch"]
            inside += lo <= c["max_batch"] <= hi
        print(f"| {fam} | {limit / GiB:.3f} GiB | {c['max_batch']} | {cells[0]} | {cells[1]} |")
    print(f"largest batch exact {exact}/{n}, inside its range {inside}/{n}")


if __name__ == "__main__":
    main()
