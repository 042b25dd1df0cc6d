"""Growth captures: small, fast training jobs on one H200 that leak until they run out of memory, and
controls whose memory moves without leaking, each at the agent's defaults (`agent.start` + `mark_step`
+ `mark_epoch`), under `memq run` (no memq line in the job) and, where it fits, hand-recorded
(`_record_memory_history` + `_dump_snapshot` at every epoch end, no agent). One command records them all:

    python3 growth_capture.py all --out DIR [--only a,b] [--parallel 8] [--budget S]
    python3 growth_capture.py job SCENARIO --variant defaults|run|hand --result R.json [--spool DIR]

Capped jobs (`set_per_process_memory_fraction` after the first optimizer step: the reserved bytes then
plus the scenario's headroom) run several at a time on the one GPU; uncapped jobs (the card is the
limit) run alone first. The model is a 4-layer MLP (width 1024, AdamW): a step is a few ms.
Per-epoch leak rates are fractions of the cap; per-step leaks are bytes. The leaking line is the one
`keep()` line below (truth.json names it). DIR/truth.json: the ground truth of every job;
DIR/spools/<scenario>/<variant>: the agent's spool; DIR/hand/<scenario>/*.pickle: hand-recorded files.
`GROWTH_CPU=1` runs the orchestration on the CPU (no caps, a few epochs) to check it before a device run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_process import run_job_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
MiB, GiB = 1 << 20, 1 << 30
CPU = os.environ.get("GROWTH_CPU") == "1"

# name: leak?, headroom over the first step's reserved bytes (None: uncapped, the card), steps per epoch,
# epochs, and what grows: `ep` (fraction of the cap kept each epoch), `st` (bytes kept each step),
# `from_ep` (the leak starts at this epoch), `cache` ({epoch: bytes} a bounded cache adds), `kind`.
S = {
    # per-epoch leaks, 0.3% to 10% of the cap an epoch
    "ep_leak_0p3": dict(leak=True, head=1 * GiB, spe=4, epochs=500, ep=0.003),
    "ep_leak_1": dict(leak=True, head=1 * GiB, spe=8, epochs=200, ep=0.01),
    "ep_leak_3": dict(leak=True, head=1 * GiB, spe=20, epochs=80, ep=0.03),
    "ep_leak_10": dict(leak=True, head=1 * GiB, spe=30, epochs=30, ep=0.10),
    "late_leak": dict(leak=True, head=1 * GiB, spe=10, epochs=150, ep=0.03, from_ep=40),
    "dynamic_leak": dict(leak=True, head=1 * GiB, spe=10, epochs=150, ep=0.02, kind="dynamic"),
    # per-step leaks: 64 KiB (OOM near step 5,000) to 256 MiB (uncapped card)
    "st_leak_64k": dict(leak=True, head=320 * MiB, spe=100, epochs=80, st=64 << 10),
    "st_leak_1m": dict(leak=True, head=1 * GiB, spe=50, epochs=40, st=1 * MiB),
    "st_leak_16m": dict(leak=True, head=3 * GiB, spe=20, epochs=20, st=16 * MiB),
    "st_leak_128m": dict(leak=True, head=int(1.5 * GiB), spe=5, epochs=10, st=128 * MiB),
    "card_st_leak_256m": dict(leak=True, head=None, spe=50, epochs=40, st=256 * MiB),
    "card_ep_leak": dict(leak=True, head=None, spe=10, epochs=120, ep=0.015),
    # controls
    "cache_early": dict(leak=False, head=1 * GiB, spe=10, epochs=60, cache={e: 24 * MiB for e in range(6)}),
    "cache_bursts": dict(leak=False, head=1 * GiB, spe=10, epochs=50,
                         cache={e: 32 * MiB for e in (0, 1, 4, 5, 9, 14)}),
    "curriculum": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="curriculum"),
    "warmup_ramp": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="warmup"),
    "grad_accum": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="accum"),
    "val_grad": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="val_grad"),
    "val_nograd": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="val_nograd"),
    "dynamic": dict(leak=False, head=1 * GiB, spe=10, epochs=40, kind="dynamic"),
    "card_cache_early": dict(leak=False, head=None, spe=10, epochs=40,
                             cache={e: 2 * GiB for e in range(5)}),
}
HAND = ("ep_leak_10", "ep_leak_3", "cache_early", "val_grad")


def half(name: str) -> str:
    """The fixed split, decided before any result was seen: sha256 of the name, first hex digit even
    -> tuning, odd -> held back."""
    return "tuning" if int(hashlib.sha256(name.encode()).hexdigest()[0], 16) % 2 == 0 else "held_back"


KEPT: list = []


def keep(nbytes: int, dev) -> None:
    import torch

    KEPT.append(torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=dev))  # LEAK: kept for good


def cache_fill(cache: dict, key, nbytes: int, dev) -> None:
    import torch

    if key not in cache:
        cache[key] = torch.zeros(max(1, nbytes // 4), device=dev)  # a bounded cache: each key once


LEAK_LINE = next(i for i, line in enumerate(open(__file__), 1) if "# LEAK: kept" in line and "KEPT.append" in line)


def run_job(args) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    name, variant = args.scenario, args.variant
    sc = S[name]
    dev = torch.device("cpu" if CPU else "cuda", 0 if not CPU else None)
    agent = None
    if variant == "defaults":
        from memq import agent

        agent.start(run=f"gr-{name}-defaults", cluster="h200", spool_dir=args.spool)
    if variant == "hand" and not CPU:
        torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python", max_entries=1500)
        os.makedirs(args.spool, exist_ok=True)
    torch.manual_seed(0)
    gen = random.Random(7)
    d = 64 if CPU else 1024
    model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(d, d), nn.GELU())], nn.Linear(d, 10)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    kind, spe, epochs = sc.get("kind"), (sc["spe"] if not CPU else 2), (sc["epochs"] if not CPU else 3)
    cache: dict = {}
    res = {"scenario": name, "variant": variant, "leak": sc["leak"], "half": half(name), "outcome": "completed",
           "steps_per_epoch": spe, "capped": sc["head"] is not None, "epoch_end_allocated": [],
           "step_end_allocated": []}
    leak_epoch = 0
    step = epoch = 0
    phase = "train"
    t0 = time.time()

    def batch_size() -> int:
        if kind == "dynamic":
            return gen.choice((64, 128, 256, 384, 512))
        if kind == "curriculum":
            return (128, 256, 512, 768)[min(3, epoch // 5)]
        if kind == "warmup" and epoch < 3:
            return 64 + (448 * (epoch * spe + step % spe)) // (3 * spe)
        return 256

    def loss_of(b: int):
        x = torch.randn(b, d, device=dev)
        return F.cross_entropy(model(x), torch.randint(0, 10, (b,), device=dev))

    try:
        for epoch in range(epochs):
            model.train()
            phase = "train"
            for _ in range(spe):
                if kind == "accum":
                    for _ in range(4):
                        (loss_of(128) / 4).backward()
                else:
                    loss_of(batch_size()).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                if sc.get("st"):
                    keep(sc["st"], dev)
                if not CPU:
                    torch.cuda.synchronize(dev)
                    res["step_end_allocated"].append(torch.cuda.memory_allocated(dev))
                if agent is not None:
                    agent.mark_step(step, epoch)
                if step == 1 and sc["head"] is not None and not CPU:
                    total = torch.cuda.get_device_properties(0).total_memory
                    cap = torch.cuda.max_memory_reserved(dev) + sc["head"]
                    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
                    res["cap_bytes"] = int(min(1.0, cap / total) * total)
                if step == 1:
                    if not CPU:
                        free, total = torch.cuda.mem_get_info(dev)
                        res["device_total"] = int(total)
                        res["non_pytorch_bytes"] = int(total - free - torch.cuda.memory_reserved(dev))
                        limit = res.get("cap_bytes") or int(free + torch.cuda.memory_reserved(dev))
                    else:
                        limit = GiB
                    res["limit_bytes"] = limit
                    leak_epoch = int(sc.get("ep", 0) * limit)
                    res["leak_bytes_per_epoch"] = leak_epoch or None
                    res["leak_bytes_per_step"] = sc.get("st")
                step += 1
            phase = "validation"
            if kind in ("val_grad", "val_nograd"):
                model.eval()
                for _ in range(3):
                    if kind == "val_nograd":
                        with torch.no_grad():
                            loss_of(512)
                    else:
                        loss_of(512).item()  # the graph is built, then freed with the loss: no leak
            if leak_epoch and epoch >= sc.get("from_ep", 0):
                keep(leak_epoch, dev)
            if sc.get("cache") and epoch in sc["cache"]:
                cache_fill(cache, epoch, sc["cache"][epoch], dev)
            if not CPU:
                torch.cuda.synchronize(dev)
                res["epoch_end_allocated"].append(torch.cuda.memory_allocated(dev))
            if agent is not None:
                agent.mark_epoch(epoch)
            if variant == "hand" and not CPU:
                torch.cuda.memory._dump_snapshot(os.path.join(args.spool, f"epoch_{epoch:04d}.pickle"))
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, oom_phase=phase, message=str(exc)[:600])
        if variant == "hand":
            torch.cuda.memory._dump_snapshot(os.path.join(args.spool, f"oom_{epoch:04d}.pickle"))
        raise
    finally:
        res["steps_completed"], res["epochs_completed"], res["secs"] = step, epoch, round(time.time() - t0, 2)
        if not CPU:
            res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()


def truth_of(name: str, variant: str, res: dict) -> dict:
    sc = S[name]
    t = {k: res.get(k) for k in ("outcome", "oom_step", "oom_epoch", "oom_phase", "steps_completed",
                                 "steps_per_epoch", "cap_bytes", "limit_bytes", "device_total",
                                 "non_pytorch_bytes", "leak_bytes_per_epoch", "leak_bytes_per_step", "rc",
                                 "wall_s", "message")}
    t.update(scenario=name, variant=variant, leak=sc["leak"], half=half(name), capped=sc["head"] is not None,
             leak_line=f"benchmarks/gpu/growth_capture.py:{LEAK_LINE}" if sc["leak"] else None,
             leak_function="keep" if sc["leak"] else None, leak_from_epoch=sc.get("from_ep", 0) if sc["leak"] else None,
             kind=sc.get("kind") or ("cache" if sc.get("cache") else "plain"))
    return t


class Runner:
    def __init__(self, out: str, budget: float, timeout: float):
        self.out, self.deadline, self.timeout = out, time.time() + budget, timeout
        self.truth: dict = {}
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def job(self, name: str, variant: str) -> None:
        key = f"{name}-{variant}"
        if time.time() + 15 > self.deadline:
            print(f"[skip] {key}: budget", flush=True)
            return
        result = os.path.join(self.out, "results", key + ".json")
        spool = os.path.join(self.out, "hand" if variant == "hand" else "spools", name,
                             "" if variant == "hand" else variant)
        cmd = [sys.executable, os.path.abspath(__file__), "job", name, "--variant", variant, "--result", result,
               "--spool", spool]
        if variant == "run":
            cmd = [sys.executable, "-m", "memq", "run", "--run", f"gr-{name}-run", "--cluster", "h200",
                   "--spool-dir", spool, "--", *cmd]
        res = run_job_process(cmd, result, min(self.timeout, max(10, self.deadline - time.time())))
        print(f"[{key}] rc={res['rc']} {res.get('outcome')} step={res.get('oom_step')} epoch={res.get('oom_epoch')}"
              f" {res['wall_s']}s {res.get('tail', '')[-300:]}", flush=True)
        self.truth[key] = truth_of(name, variant, res)
        with open(os.path.join(self.out, "truth.json"), "w") as fh:
            json.dump(dict(sorted(self.truth.items())), fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=420)
    a.add_argument("--timeout", type=float, default=150)
    a.add_argument("--parallel", type=int, default=8)
    j = sub.add_parser("job")
    j.add_argument("scenario", choices=sorted(S))
    j.add_argument("--variant", choices=["defaults", "run", "hand"], required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--spool", default="/tmp/growth_spool")
    args = ap.parse_args()
    if args.cmd == "job":
        run_job(args)
        return
    names = [s for s in (args.only.split(",") if args.only else S) if s]
    r = Runner(args.out, args.budget, args.timeout)
    jobs = [(n, v) for n in names for v in ("defaults", "run", "hand") if v != "hand" or n in HAND]
    capped = [j for j in jobs if S[j[0]]["head"] is not None]
    card = [j for j in jobs if S[j[0]]["head"] is None]
    capped.sort(key=lambda j: -S[j[0]]["spe"] * S[j[0]]["epochs"])  # the long ones first
    for nv in card:  # the whole card each: one at a time, before the capped ones share it
        r.job(*nv)
    with ThreadPoolExecutor(max_workers=args.parallel) as ex:
        list(ex.map(lambda nv: r.job(*nv), capped))


if __name__ == "__main__":
    main()
