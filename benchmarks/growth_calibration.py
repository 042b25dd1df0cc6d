"""The growth model on the growth capture set (tests/fixtures/growth, captured on an H200 by
benchmarks/gpu/growth_capture.py and kept by benchmarks/growth_fixtures.py), judged against what each
run did, separately for the tuning half and the held-back half (truth.json's `half`).

    python benchmarks/growth_calibration.py [--markdown] [--half tuning|held_back|fresh|all]

Each run is replayed as the service sees it, with no limit given by hand (the agent reports its cap,
else the card): the agent's spool (its snapshots, with the figures they embed, and its stats batches'
per-step figures), or for `hand` the epoch-end files ingested with `--trigger epoch_end` and the job's
cap given as `--limit` (a user saving files knows the cap they set).
- A leak: the verdict at its end (the OOM) must be leak, with the allocating line where the variant
  recorded one; given the first half of its life (snapshots and figures up to half the OOM step), the
  forecast must expect the OOM, the epoch within one of the real one where it names an epoch, else the
  step within 15%.
- A control: no leak verdict at its end, and no OOM forecast at a quarter, half, three quarters or the
  end of its life.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import codec  # noqa: E402
from memq.agent.spool import decode  # noqa: E402
from memq.analysis import analyze  # noqa: E402
from memq.analysis.limits import observer_facts  # noqa: E402
from memq.model import OomContext  # noqa: E402
from memq.pipeline.analyse import oom_context as stored_context  # noqa: E402
from memq.snapshot import parse_snapshot  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "growth"
STEP_TOL = 0.15


def truth() -> dict:
    return json.loads((FIX / "truth.json").read_text())


def load_spool(folder: Path) -> tuple[list, list, list]:
    """(snapshots with their trigger and step, stats figures, the OOM envelope's observer payload)."""
    snaps, figs, ooms = [], [], []
    for f in sorted(folder.glob("*.mqs")):
        msg = decode(f.read_bytes())
        kind = msg.fields["kind"]
        payload = json.loads(msg.fields.get("payload") or "{}")
        if kind == "snapshot":
            s = parse_snapshot(codec.decode(msg.blob))
            step = s.agent.step if s.agent and s.agent.step is not None else None
            snaps.append((s, msg.fields.get("trigger"), step))
            if payload.get("oom"):
                ooms.append(payload["oom"])
        elif kind in ("stats", "run_end"):
            figs.extend(x for x in payload.get("step_figures") or [] if isinstance(x, dict))
    return snaps, figs, ooms


def replay(snaps: list, figs: list, upto: int | None, ctx: OomContext | None = None) -> dict | None:
    """analyze() over what the service had by step `upto` (None: everything)."""
    keep = [(s, t) for s, t, st in snaps if upto is None or (st is not None and st <= upto and t != "oom")]
    if not keep:
        return None
    fs = [f for f in figs if upto is None or (isinstance(f.get("step"), int) and f["step"] <= upto)]
    return analyze([s for s, _ in keep], ctx, triggers=[t for _, t in keep], figures=fs)


def hand_files(sc: str) -> list:
    return sorted((FIX / sc / "hand").glob("*.pickle.gz"))


def replay_hand(sc: str, upto_epoch: int | None, limit: int | None) -> dict | None:
    files = [f for f in hand_files(sc) if upto_epoch is None or int(f.name[5:9]) <= upto_epoch]
    if len(files) < 1:
        return None
    snaps = [parse_snapshot(codec.decode(f.read_bytes())) for f in files]
    return analyze(snaps, OomContext(limit_bytes=limit), names=[f.name for f in files],
                   triggers=["epoch_end"] * len(snaps))


def judge_forecast(fc: dict | None, t: dict) -> bool:
    if not fc or fc.get("oom_expected") is not True:
        return False
    if fc.get("epoch") is not None and t.get("oom_epoch") is not None:
        return abs(fc["epoch"] - t["oom_epoch"]) <= 1
    return fc.get("step") is not None and abs(fc["step"] - t["oom_step"]) <= STEP_TOL * t["oom_step"]


def judge(sc: str, variant: str) -> dict:
    t = truth()[sc][variant]
    leak = bool(t.get("leak"))
    end_step = t.get("oom_step") or t.get("steps_completed") or 0
    spe = t.get("steps_per_epoch") or 1
    row = {"scenario": sc, "variant": variant, "half": truth()[sc]["half"], "leak": leak,
           "outcome": t.get("outcome"), "oom_step": t.get("oom_step"), "oom_epoch": t.get("oom_epoch")}
    if variant == "hand":
        limit = t.get("cap_bytes")
        last_epoch = (t.get("oom_epoch") if t.get("oom_epoch") is not None else end_step // spe)
        end = replay_hand(sc, None, limit)
        at = {q: replay_hand(sc, int(last_epoch * q), limit) for q in (0.25, 0.5, 0.75)}
    else:
        snaps, figs, ooms = load_spool(FIX / sc / variant)
        # the OOM envelope's observer payload, as the dispatcher stores it (the cap is its allowed bytes)
        ctx = stored_context(observer_facts(ooms[-1], None, None)) if ooms else None
        end = replay(snaps, figs, None, ctx)
        at = {q: replay(snaps, figs, int(end_step * q)) for q in (0.25, 0.5, 0.75)}
    d = (end or {}).get("diagnosis") or {}
    lk = ((end or {}).get("details") or {}).get("leak") or {}
    row["verdict"] = d.get("primary_cause")
    row["site"] = lk.get("allocating_site")
    half = at[0.5]
    fc = (half or {}).get("forecast")
    row["forecast"] = fc
    if leak:
        row["verdict_ok"] = row["verdict"] == "leak"
        row["forecast_ok"] = judge_forecast(fc, t)
        row["ok"] = row["verdict_ok"] and row["forecast_ok"]
    else:
        alarms = [q for q, r in at.items() if r and (r.get("forecast") or {}).get("oom_expected") is True]
        if end and (end.get("forecast") or {}).get("oom_expected") is True:
            alarms.append(1.0)
        row["false_alarms"] = alarms
        row["verdict_ok"] = row["verdict"] != "leak"
        row["forecast_ok"] = not alarms
        row["ok"] = row["verdict_ok"] and row["forecast_ok"]
    return row


def runs(half: str = "all") -> list[tuple[str, str]]:
    tr = truth()
    return [(sc, v) for sc in sorted(tr) for v in sorted(k for k in tr[sc] if k != "half")
            if half == "all" or tr[sc]["half"] == half]


def describe(fc: dict | None) -> str:
    if not fc:
        return "no forecast"
    if fc.get("oom_expected") is True:
        where = f"epoch {fc['epoch']}" if fc.get("epoch") is not None else ""
        step = f"step {fc['step']}" if fc.get("step") is not None else ""
        return "OOM in " + ", ".join(x for x in (where, step) if x)
    return f"no OOM ({fc.get('oom_expected')})"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--half", default="all", choices=["tuning", "held_back", "fresh", "all"])
    args = ap.parse_args()
    rows = [judge(sc, v) for sc, v in runs(args.half)]
    head = ("| half | run | variant | real outcome | verdict at the end | forecast at half its life | ok |\n"
            "|---|---|---|---|---|---|---|")
    print(head if args.markdown else "")
    for r in rows:
        real = (f"OOM in step {r['oom_step']} (epoch {r['oom_epoch']})" if r["outcome"] == "oom" else "completed")
        verdict = r["verdict"] + (f" ({r['site']})" if r["leak"] and r.get("site") else "")
        cells = [r["half"], r["scenario"], r["variant"], real, verdict, describe(r["forecast"]),
                 "yes" if r["ok"] else "NO"]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))
    for h in ("tuning", "held_back", "fresh"):
        sub = [r for r in rows if r["half"] == h]
        if not sub:
            continue
        lk = [r for r in sub if r["leak"]]
        ct = [r for r in sub if not r["leak"]]
        print(f"\n{h}: leaks diagnosed leak at the end {sum(r['verdict_ok'] for r in lk)}/{len(lk)}, "
              f"forecast right at half their life {sum(r['forecast_ok'] for r in lk)}/{len(lk)}; "
              f"controls with no leak verdict and no OOM forecast {sum(r['ok'] for r in ct)}/{len(ct)}")


if __name__ == "__main__":
    main()
