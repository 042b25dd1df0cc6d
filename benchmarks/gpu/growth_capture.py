"""Calibration and judging set for the growth model (ARCHITECTURE.md cause 2 and "Forecast"): real jobs
on an H200 whose live memory grows (leaks) or moves without leaking (controls), with the real outcome,
in one command.

    python3 growth_capture.py all --out DIR [--only a,b|original|fresh] [--budget S] [--parallel 4]
    python3 growth_capture.py job SCENARIO --variant V --result R.json [--spool DIR] [--hand DIR]

Every job trains the same small MLP (4 blocks of 1024 -> 4096 -> 1024, AdamW; 1-3 ms steps), so that
runs of thousands of steps take seconds. A leak keeps a tensor allocated on one line of this script
(`kept.append(...)`, the line the verdict must name) at every epoch end or every step. Caps are
`set_per_process_memory_fraction` after the second step, sized from the job's own reserved bytes so
that the leak runs out near its target; uncapped jobs run out of the whole card.

Variants: `defaults` (agent.start + mark_step + mark_epoch, the README's way), `run` (`python -m memq
run` around the script: no memq line, no epoch marks), `hand` (no agent: a segments-only
`torch.cuda.memory._snapshot()` pickled at every epoch end, as a user would save them for `memq ingest
--trigger epoch_end`). Results: DIR/summary.json, DIR/spools/<scenario>/<variant>, DIR/hand/<scenario>.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_process import run_job_process  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30

# kind: "epoch" (bytes kept at each epoch end), "step" (after each step), or a control's own shape.
# share: the leak per interval as a share of the cap; target: intervals until the OOM (the cap is set
# so that base + target x leak meets it); fixed: bytes per interval instead of a share.
SCENARIOS: dict[str, dict] = {
    # leaks under a cap
    "epoch_p03": dict(leak=True, kind="epoch", share=0.003, target=280, spe=4, epochs=400),
    "epoch_p1": dict(leak=True, kind="epoch", share=0.01, target=60, spe=8, epochs=120, hand=True),
    "epoch_p10": dict(leak=True, kind="epoch", share=0.10, target=8, spe=20, epochs=20, hand=True),
    "epoch_readme": dict(leak=True, kind="epoch", fixed=31 * MiB, cap=int(2.6 * GiB), spe=10, epochs=200,
                         hand=True),
    "epoch_500": dict(leak=True, kind="epoch", share=0.0018, target=480, spe=2, epochs=700),
    "step_64k": dict(leak=True, kind="step", fixed=64 << 10, target=4800, spe=100, epochs=80),
    "step_1m": dict(leak=True, kind="step", fixed=MiB, target=1000, spe=50, epochs=40),
    "step_126m": dict(leak=True, kind="step", fixed=126 * MiB, target=13, spe=5, epochs=10),
    "step_256m": dict(leak=True, kind="step", fixed=256 * MiB, target=10, spe=4, epochs=10),
    "late_leak": dict(leak=True, kind="epoch", share=0.02, target=30, spe=6, epochs=150, start=40, hand=True),
    "dynamic_leak": dict(leak=True, kind="epoch", share=0.01, target=50, spe=8, epochs=120, dynamic=True),
    # controls under a cap (each completes)
    "cache_stop": dict(leak=False, kind="cache", share=0.02, until=6, spe=8, epochs=60, hand=True),
    "cache_bursts": dict(leak=False, kind="bursts", share=0.04, bursts=(3, 7, 12), spe=8, epochs=60),
    "curriculum": dict(leak=False, kind="curriculum", spe=8, epochs=45),
    "warmup_ramp": dict(leak=False, kind="ramp", spe=8, epochs=40),
    "grad_accum": dict(leak=False, kind="accum", spe=8, epochs=40),
    "val_nograd": dict(leak=False, kind="val", grad=False, spe=8, epochs=40),
    "val_grad": dict(leak=False, kind="val", grad=True, spe=8, epochs=40),
    "dynamic": dict(leak=False, kind="dynamic", spe=8, epochs=60, dynamic=True),
    # the whole card
    "uncapped_step": dict(leak=True, kind="step", fixed=2 * GiB, spe=5, epochs=40, uncapped=True),
    "uncapped_epoch": dict(leak=True, kind="epoch", fixed=4 * GiB, spe=4, epochs=60, uncapped=True),
    "uncapped_cache": dict(leak=False, kind="cache", fixed=4 * GiB, until=5, spe=4, epochs=35, uncapped=True),
}

# The fresh set: jobs added after the growth model's last change and judged once, untouched, at the end
# (tests/fixtures/growth/README.md says which half each scenario is in).
FRESH: dict[str, dict] = {
    "fr_epoch_p3": dict(leak=True, kind="epoch", share=0.03, target=30, spe=12, epochs=60, hand=True),
    "fr_epoch_p05": dict(leak=True, kind="epoch", share=0.005, target=150, spe=3, epochs=260),
    "fr_step_16m": dict(leak=True, kind="step", fixed=16 * MiB, target=150, spe=10, epochs=40),
    "fr_step_256k": dict(leak=True, kind="step", fixed=256 << 10, target=2500, spe=50, epochs=80),
    "fr_late_leak": dict(leak=True, kind="epoch", share=0.02, target=35, spe=6, epochs=150, start=15, hand=True),
    "fr_accum_leak": dict(leak=True, kind="epoch", share=0.01, target=60, spe=6, epochs=120, accum=True),
    "fr_dynamic_step_leak": dict(leak=True, kind="step", fixed=2 * MiB, target=600, spe=20, epochs=60,
                                 dynamic=True),
    "fr_cache_long": dict(leak=False, kind="cache", share=0.015, until=12, spe=6, epochs=80, hand=True),
    "fr_bursts": dict(leak=False, kind="bursts", share=0.03, bursts=(2, 6, 10, 20), spe=8, epochs=60),
    "fr_ramp_accum": dict(leak=False, kind="ramp", spe=8, epochs=40, accum=True),
    "fr_uncapped_1g": dict(leak=True, kind="step", fixed=1 * GiB, spe=10, epochs=30, uncapped=True),
    "fr_uncapped_cache": dict(leak=False, kind="cache", fixed=3 * GiB, until=8, spe=5, epochs=40, uncapped=True),
}
SCENARIOS.update(FRESH)


def variants(sc: str) -> tuple[str, ...]:
    return ("defaults", "run") + (("hand",) if SCENARIOS[sc].get("hand") else ())


def run_job(args) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sc, variant = args.scenario, args.variant
    spec = SCENARIOS[sc]
    dev = torch.device("cuda", 0)
    agent = None
    if variant == "defaults":
        from memq import agent

        agent.start(run=f"gr-{sc}-{variant}", cluster="h200", spool_dir=args.spool)
    torch.manual_seed(0)
    gen = random.Random(7)
    width, hidden = 1024, 4096
    model = nn.Sequential(*[nn.Sequential(nn.Linear(width, hidden), nn.GELU(), nn.Linear(hidden, width))
                            for _ in range(4)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kept: list = []
    cache: dict = {}
    spe, epochs = spec["spe"], spec["epochs"]
    res = {"scenario": sc, "variant": variant, "leak": spec["leak"], "outcome": "completed", "steps_per_epoch": spe,
           "step_end_allocated": [], "epoch_end_allocated": [], "uncapped": bool(spec.get("uncapped"))}
    step = epoch = 0
    per = None  # the leak's bytes per interval, once the cap is known
    t0 = time.time()

    def batch_size() -> int:
        if spec.get("dynamic"):
            return gen.choice((16, 32, 64, 96, 128))
        if spec["kind"] == "curriculum":
            return 32 * (1 + min(3, epoch // 12))
        if spec["kind"] == "ramp" and epoch < 10:
            return 8 + 6 * epoch
        return 64

    def set_cap() -> None:
        nonlocal per
        total = torch.cuda.get_device_properties(0).total_memory
        base = torch.cuda.max_memory_reserved(dev)
        if spec.get("uncapped"):
            per = spec.get("fixed")
            res["limit_bytes"] = total
            return
        if "cap" in spec:
            cap = spec["cap"]
        elif spec["leak"] and "fixed" in spec:
            cap = base + spec["target"] * spec["fixed"] + 64 * MiB
        elif spec["leak"]:
            cap = int(base / max(0.05, 1 - spec["target"] * spec["share"]))
        elif spec["kind"] in ("cache", "bursts"):
            n = spec.get("until") or len(spec.get("bursts") or ())
            cap = int(base / max(0.2, 1 - 1.5 * n * spec["share"]))
        else:
            cap = int(3.0 * base)  # controls whose peaks move: room for the largest shape
        cap = min(cap, total)
        per = spec.get("fixed") or int(spec.get("share", 0) * cap)
        torch.cuda.set_per_process_memory_fraction(cap / total, 0)
        res["cap_bytes"] = res["limit_bytes"] = int(cap)
        res["leak_per_interval"] = per

    def hand_snapshot() -> None:
        if variant != "hand":
            return
        os.makedirs(args.hand, exist_ok=True)
        with gzip.open(os.path.join(args.hand, f"epoch{epoch:04d}.pickle.gz"), "wb", compresslevel=6) as fh:
            pickle.dump(torch.cuda.memory._snapshot(), fh)

    try:
        for epoch in range(epochs):
            model.train()
            for micro_step in range(spe):
                b = batch_size()
                accum = 4 if spec["kind"] == "accum" or spec.get("accum") else 1
                for _ in range(accum):
                    x = torch.randn(b, width, device=dev)
                    loss = F.mse_loss(model(x), x) / accum
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, x
                if spec["kind"] == "step" and per and step >= 2:
                    kept.append(torch.empty(per, dtype=torch.uint8, device=dev))  # LEAK: kept every step
                torch.cuda.synchronize(dev)
                res["step_end_allocated"].append(torch.cuda.memory_allocated(dev))
                if agent is not None:
                    agent.mark_step(step, epoch)
                if step == 1:
                    set_cap()
                step += 1
                del micro_step
            if spec["kind"] == "val":
                model.eval()
                for _ in range(2):
                    x = torch.randn(64, width, device=dev)
                    if spec["grad"]:
                        out = F.mse_loss(model(x), x)  # a graph built and dropped: no leak
                    else:
                        with torch.no_grad():
                            out = model(x)
                    del out, x
            growing = per and (
                (spec["kind"] == "epoch" and epoch >= spec.get("start", 0))
                or (spec["kind"] == "cache" and epoch < spec["until"])
                or (spec["kind"] == "bursts" and epoch in spec["bursts"]))
            if growing:
                if spec["kind"] == "epoch":
                    kept.append(torch.empty(per, dtype=torch.uint8, device=dev))  # LEAK: kept every epoch
                else:
                    cache[epoch] = torch.empty(per, dtype=torch.uint8, device=dev)  # a cache that stops
            torch.cuda.synchronize(dev)
            res["epoch_end_allocated"].append(torch.cuda.memory_allocated(dev))
            hand_snapshot()
            if agent is not None:
                agent.mark_epoch(epoch)
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, message=str(exc)[:800])
        raise
    finally:
        res["steps_completed"], res["secs"] = step, round(time.time() - t0, 2)
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["device_total"] = torch.cuda.get_device_properties(0).total_memory
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()


class Runner:
    def __init__(self, out: str, budget: float, timeout: float):
        self.out, self.deadline, self.timeout = out, time.time() + budget, timeout
        self.summary: dict = {}
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def job(self, sc: str, variant: str) -> None:
        name = f"{sc}-{variant}"
        if time.time() + 15 > self.deadline:
            print(f"[skip] {name}: budget", flush=True)
            return
        result = os.path.join(self.out, "results", name + ".json")
        spool = os.path.join(self.out, "spools", sc, variant)
        hand = os.path.join(self.out, "hand", sc)
        cmd = [sys.executable, os.path.abspath(__file__), "job", sc, "--variant", variant, "--result", result,
               "--spool", spool, "--hand", hand]
        if variant == "run":
            cmd = [sys.executable, "-m", "memq", "run", "--run", f"gr-{sc}-run", "--cluster", "h200",
                   "--spool-dir", spool, "--", *cmd]
        res = run_job_process(cmd, result, min(self.timeout, max(10, self.deadline - time.time())))
        print(f"[{name}] rc={res['rc']} {res.get('outcome')} step={res.get('oom_step')} "
              f"epoch={res.get('oom_epoch')} {res['wall_s']}s {res.get('tail', '')[-300:]}", flush=True)
        self.summary.setdefault(sc, {})[variant] = res
        with open(os.path.join(self.out, "summary.json"), "w") as fh:
            json.dump(self.summary, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=600)
    a.add_argument("--timeout", type=float, default=150)
    a.add_argument("--parallel", type=int, default=4)
    j = sub.add_parser("job")
    j.add_argument("scenario", choices=sorted(SCENARIOS))
    j.add_argument("--variant", choices=["defaults", "run", "hand"], required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--spool", default="/tmp/growth_spool")
    j.add_argument("--hand", default="/tmp/growth_hand")
    args = ap.parse_args()
    if args.cmd == "job":
        run_job(args)
        return
    groups = {"fresh": list(FRESH), "original": [s for s in SCENARIOS if s not in FRESH]}
    names = groups.get(args.only) or [s for s in (args.only.split(",") if args.only else SCENARIOS) if s]
    r = Runner(args.out, args.budget, args.timeout)
    capped = [(s, v) for s in names if not SCENARIOS[s].get("uncapped") for v in variants(s)]
    whole = [(s, v) for s in names if SCENARIOS[s].get("uncapped") for v in variants(s)]
    with ThreadPoolExecutor(max_workers=args.parallel) as ex:
        list(ex.map(lambda sv: r.job(*sv), capped))
    for s, v in whole:  # the whole card: one at a time
        r.job(s, v)


if __name__ == "__main__":
    main()
