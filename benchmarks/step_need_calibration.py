"""The failing step's need on the calibration set (tests/fixtures/step_need, captured on an H200 by
benchmarks/gpu/step_need.py): for every scenario, at agent defaults and at full history, memq's
primary cause and `diagnosis.step_need` against the ground truth (the uncapped twin's
`max_memory_allocated()` around the failing step). No services: the spools are read as the worker
reads them and analysed with the worker's `analyze`.

    python benchmarks/step_need_calibration.py [--markdown]

Prints one row per (scenario, variant) and the totals the issue's "done when" asks for: every primary
cause right, every interval containing the measured need (or null with its reason), the point within
10% of the measured need in at least 80% of the scenarios that have one.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import analyze  # noqa: E402
from tests.analysis.agent_data import rank_folder, spool_run, step_need_truth  # noqa: E402

GiB = 1 << 30
POINT_TOL = 0.10


def expected_cause(row: dict) -> str:
    """The cause the scenario's measurements make true (ARCHITECTURE.md causes 3, 4, 7, 8)."""
    kind = row["kind"]
    if kind in ("resume", "first_step"):
        return "optimizer_state"
    need, cap, earlier = row["measured_need_bytes"], row["cap_bytes"], row.get("earlier_peak_bytes")
    if need <= cap:
        return "fragmentation"  # the step fits; its expandable_segments twin completed
    return "activation_spike" if earlier and need > 1.5 * earlier else "capacity"


def evaluate() -> list[dict]:
    rows = []
    for sc, row in step_need_truth().items():
        for variant in ("defaults", "full"):
            snaps, ctx, trig = spool_run(rank_folder(sc, variant))
            t0 = time.perf_counter()
            r = analyze(snaps, ctx, triggers=trig)
            secs = time.perf_counter() - t0
            d = r["diagnosis"]
            n = d["step_need"]
            truth = row["measured_need_bytes"]
            contains = None if n is None or truth is None else (
                None if n["bytes"] is None else n["low"] <= truth <= n["high"])
            err = None if n is None or n["bytes"] is None or truth is None else (n["bytes"] - truth) / truth
            rows.append({"scenario": sc, "variant": variant, "expected": expected_cause(row),
                         "primary": d["primary_cause"], "confidence": d["confidence"], "cap": row["cap_bytes"],
                         "truth": truth, "need": n, "contains": contains, "error": err, "secs": secs,
                         "expandable": row["variants"]["expandable"]["outcome"]})
    return rows


def _g(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    ap.parse_args()
    rows = evaluate()
    head = ("| scenario | variant | cap GiB | measured need | memq need (low-high) | fits | error | primary "
            "(expected) | expandable twin |")
    print(head)
    print("|---" * (head.count("|") - 1) + "|")
    for x in rows:
        n = x["need"]
        need = "null (not a step)" if n is None else (
            f"null, >= {_g(n['low'])}" if n["bytes"] is None else f"{_g(n['bytes'])} ({_g(n['low'])}-{_g(n['high'])})")
        fits = "-" if n is None else str(n["fits_limit"]).lower()
        err = "-" if x["error"] is None else f"{100 * x['error']:+.1f}%"
        ok = "" if x["primary"] == x["expected"] else " **WRONG**"
        print(f"| {x['scenario']} | {x['variant']} | {_g(x['cap'])} | {_g(x['truth'])} | {need} | {fits} | {err} | "
              f"{x['primary']} {x['confidence']:.2f} ({x['expected']}){ok} | {x['expandable']} |")
    right = sum(x["primary"] == x["expected"] for x in rows)
    with_truth = [x for x in rows if x["truth"] is not None]
    missed = [x for x in with_truth if x["contains"] is False]
    nulls = [x for x in with_truth if x["need"] is not None and x["need"]["bytes"] is None]
    within = [x for x in with_truth if x["error"] is not None and abs(x["error"]) <= POINT_TOL]
    worst = max((abs(x["error"]) for x in with_truth if x["error"] is not None), default=0.0)
    print()
    print(f"primary cause right: {right}/{len(rows)}")
    print(f"intervals containing the measured need: {len(with_truth) - len(missed) - len(nulls)}/{len(with_truth)}"
          f" ({len(nulls)} null with their reason, {len(missed)} missed)")
    print(f"point within {100 * POINT_TOL:.0f}%: {len(within)}/{len(with_truth)} "
          f"({100 * len(within) / max(1, len(with_truth)):.0f}%); largest error {100 * worst:.1f}%")
    print(f"analysis time per run: max {max(x['secs'] for x in rows):.2f} s")
    return 0 if right == len(rows) and not missed else 1


if __name__ == "__main__":
    raise SystemExit(main())
