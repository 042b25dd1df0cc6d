"""The OOM forecast on the calibration set (tests/fixtures/forecast, captured on an H200 by
benchmarks/gpu/forecast.py): each run is replayed as the worker sees it while the job still runs,
snapshot by snapshot, with `--limit` set to the job's cap, and the forecast is judged against what the
run then did. No services: the spools are read as the dispatcher reads them and analysed with the
worker's `analyze`.

    python benchmarks/forecast_calibration.py [--markdown]

For a leak: the forecast given the first half of the run's comparable points (the epoch within one of
the real OOM's, or the step within 15%), and the lead time: how long before the OOM the first forecast
that says so came. For a control: any forecast of an OOM, at any point, is a false alarm.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import analyze  # noqa: E402
from memq.model import OomContext  # noqa: E402
from tests.analysis.agent_data import spool_run  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "forecast"
STEP_TOL = 0.15


def truth() -> dict:
    return json.loads((FIX / "truth.json").read_text())


def folder(sc: str, variant: str) -> Path:
    return next((FIX / sc / variant).iterdir())


def replay(sc: str, variant: str) -> list[dict]:
    """The forecast after each snapshot the run sent before its OOM: [{"k", "comparable", "forecast"}]."""
    snaps, _ctx, triggers = spool_run(folder(sc, variant))
    cap = truth()[sc][variant].get("cap_bytes")
    ctx = OomContext(limit_bytes=cap) if cap else None
    out, seen = [], 0
    for k in range(1, len(snaps) + 1):
        if snaps[k - 1].oom_event() is not None or triggers[k - 1] == "oom":
            break
        a = snaps[k - 1].agent
        comparable = triggers[k - 1] == "epoch_end" or bool(a and a.comparable)
        seen += comparable
        res = analyze(snaps[:k], ctx=ctx, triggers=triggers[:k])
        out.append({"k": k, "comparable": seen, "forecast": res["forecast"],
                    "time": a.time if a else None, "step": a.step if a else None})
    return out


def judge(sc: str, variant: str) -> dict:
    t = truth()[sc][variant]
    rows = replay(sc, variant)
    total = max(r["comparable"] for r in rows) if rows else 0
    # the comparable points the whole run had, OOM snapshot excluded
    half = next((r for r in rows if r["comparable"] >= max(1, total // 2)), rows[-1] if rows else None)
    fc = half["forecast"] if half else None
    row = {"scenario": sc, "variant": variant, "leak": t["leak"], "outcome": t["outcome"],
           "oom_step": t.get("oom_step"), "oom_epoch": t.get("oom_epoch"), "points": total,
           "at_point": half["comparable"] if half else None, "forecast": fc}
    alarms = [r for r in rows if r["forecast"] and r["forecast"]["oom_expected"]]
    if t["leak"]:
        ok = bool(fc and fc["oom_expected"])
        if ok and fc.get("epoch") is not None and t.get("oom_epoch") is not None:
            ok = abs(fc["epoch"] - t["oom_epoch"]) <= 1
        elif ok:
            ok = abs(fc["step"] - t["oom_step"]) <= STEP_TOL * t["oom_step"]
        row["ok"] = ok
        first = alarms[0] if alarms else None
        end = rows[-1]["time"] if rows else None
        oom_t = _oom_time(sc, variant)
        row["lead_s"] = round(oom_t - first["time"], 2) if first and first["time"] and oom_t else None
        row["lead_steps"] = (t["oom_step"] - first["step"]) if first and first["step"] is not None else None
        del end
        # once made, it stays: every later forecast expects the OOM, within one epoch (or an epoch's steps, or 15%)
        # of the first
        tol = t.get("steps_per_epoch") or STEP_TOL * t["oom_step"]
        later = [r["forecast"] for r in rows[rows.index(first):]] if first else []
        # the contract's own measure where both name an epoch: the epoch within one
        row["stable"] = all(f and f["oom_expected"] and (
            abs(f["epoch"] - first["forecast"]["epoch"]) <= 1
            if f.get("epoch") is not None and first["forecast"].get("epoch") is not None
            else abs(f["step"] - first["forecast"]["step"]) <= tol) for f in later)
        row["ok"] = row["ok"] and row["stable"]
    else:
        row["ok"] = not alarms
        row["false_alarms"] = len(alarms)
        row["snapshots"] = len(rows)
    return row


def _oom_time(sc: str, variant: str) -> float | None:
    snaps, _c, triggers = spool_run(folder(sc, variant))
    for s, tr in zip(snaps, triggers, strict=True):
        if tr == "oom" and s.agent is not None:
            return s.agent.time
    return None


def runs() -> list[tuple[str, str]]:
    return [(sc, v) for sc, vs in sorted(truth().items()) for v in sorted(vs)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    rows = [judge(sc, v) for sc, v in runs()]
    if args.markdown:
        print("| run | variant | real outcome | forecast at half the points | lead time | ok |")
        print("|---|---|---|---|---|---|")
    for r in rows:
        fc = r["forecast"] or {}
        real = (f"OOM in step {r['oom_step']} (epoch {r['oom_epoch']})" if r["outcome"] == "oom" else "completed")
        said = ("OOM in step {} (epoch {}, steps {}-{})".format(fc.get("step"), fc.get("epoch"), fc.get("step_low"),
                                                             fc.get("step_high"))
                if fc.get("oom_expected") else f"no OOM ({'null' if fc.get('oom_expected') is None else 'false'})")
        lead = (f"{r['lead_s']} s, {r['lead_steps']} steps" if r.get("lead_s") is not None
                else (f"{r.get('false_alarms')} false alarms" if not r["leak"] else "none"))
        cells = [r["scenario"], r["variant"], real, f"{said} at point {r['at_point']}/{r['points']}", lead,
                 "yes" if r["ok"] else "NO"]
        print(("| " + " | ".join(cells) + " |") if args.markdown else "  ".join(cells))
        if not args.markdown and not r["ok"]:
            print("    basis:", fc.get("basis"))
    leaks = [r for r in rows if r["leak"]]
    ctl = [r for r in rows if not r["leak"]]
    print(f"\nleaks forecast right at half their points: {sum(r['ok'] for r in leaks)}/{len(leaks)}; "
          f"controls with no false alarm: {sum(r['ok'] for r in ctl)}/{len(ctl)} "
          f"({sum(r.get('false_alarms', 0) for r in ctl)} false alarms after {sum(r['snapshots'] for r in ctl)} "
          "snapshots)")


if __name__ == "__main__":
    main()
