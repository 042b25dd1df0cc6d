"""Calibration set for the failing step's need (ARCHITECTURE.md "The failing step's need"): real jobs
that run out of memory on an H200, each run four ways, in one command.

    python3 step_need.py all --out DIR [--only a,b] [--budget S] [--parallel 2]
    python3 step_need.py job SCENARIO --variant V --result R.json [--cap-bytes N] [--spool DIR]

Variants of every scenario (one process each; the schedule of shapes is seeded, so every variant runs
the same steps):
- `measure`: no cap, no agent. The allocator's peak counters are reset before every step and read
  after it: `torch.cuda.max_memory_allocated()` of step i is the need of step i, the ground truth.
- `defaults`: the agent at its defaults (`agent.start(run, cluster, spool_dir)`, `mark_step`,
  `mark_epoch`), under the scenario's cap. Caps are `set_per_process_memory_fraction`.
- `full`: the same with `history="on"` (full trace with Python stacks, 60,000 entries).
- `expandable`: `defaults` with `PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` at the same cap: a
  step that fits completes here when the default allocator failed for want of one free block.
The cap of each scenario comes from its `measure` run (`cap_rule`); fragmentation scenarios try
several ratios and keep the first at which the default allocator runs out of memory.

The OutOfMemoryError is never caught by the job: it ends the process as in a real job. Results:
DIR/summary.json (rewritten after every run) and the agents' spools in DIR/spools/<scenario>/<variant>.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

GiB = 1 << 30

# name: (kind, cap rule, what the ground truth should be, one line of what runs)
SCENARIOS = {
    "dyn": ("frag", ("peak_alloc", (1.04, 1.02, 1.01, 1.0)),
            "dynamic (batch, length) shapes, SGD momentum, under a cap just above the run's peak"),
    "dyn_ema": ("frag", ("peak_alloc", (1.05, 1.03, 1.02, 1.01)),
                "dynamic shapes and an EMA copy of the weights made at step 12 (GPU), then updated every step"),
    "bf16_dyn": ("frag", ("peak_alloc", (1.04, 1.02, 1.01, 1.0)),
                 "dynamic shapes, bf16 autocast, no activation checkpointing, AdamW"),
    "cnn_dyn": ("frag", ("peak_alloc", (1.04, 1.02, 1.01, 1.0)),
                "a CNN on images of varying size and batch"),
    "long_batch": ("spike", ("normal_reserved", (2.0,)),
                   "steps of 8 x 512 tokens, then at step 14 one batch of 8 x 4096 (no checkpointing)"),
    "ckpt_long": ("spike", ("normal_reserved", (2.0,)),
                  "the same with activation checkpointing per block"),
    "bigger_batch": ("spike", ("normal_reserved", (1.5,)),
                     "batch 16 for 10 steps, then batch 64 (the step needs about 4x)"),
    "compile_bigger": ("spike", ("normal_reserved", (1.5,)),
                       "the same model under torch.compile: batch 16, then 64 (recompiled graph)"),
    "cnn_big": ("spike", ("normal_reserved", (1.6,)),
                "a CNN at batch 32 for 10 steps, then batch 160"),
    "accum": ("spike", ("normal_reserved", (1.8,)),
              "gradient accumulation over 4 micro-batches; step 12's third micro-batch is 8x longer"),
    "capacity": ("capacity", ("fixed_gib", (3.0,)),
                 "batch 32 x 1024 from the first step under a 3 GiB cap: no step fits"),
    "resume": ("resume", ("resume", (1.0,)),
               "5 steps, torch.save, then torch.load(map_location='cuda') beside the live model and AdamW"),
    "first_step": ("first_step", ("first_step", (1.0,)),
                   "a cap that holds forward and backward but not AdamW's state: OOM in the first step"),
    "ddp_long": ("spike", ("normal_reserved", (2.0,)),
                 "two DDP ranks (torchrun, gloo on one GPU); rank 1's batch at step 8 is 8x longer"),
}
# Scenarios run as two torchrun ranks; the failing rank's result is the scenario's.
DDP = {"ddp_long": 1}


# ----------------------------------------------------------------------------------------------------
# jobs (run on the GPU machine; torch imported here only)

def _models():
    import torch.nn as nn

    sys.path.insert(0, HERE)
    # the GPT every capture here uses (tied embeddings, optional checkpointing)
    from gpt_agent_train import GPT

    class CNN(nn.Module):
        def __init__(self, classes=1000):
            super().__init__()
            chans = [3, 64, 128, 256, 512]
            layers = []
            for a, b in zip(chans, chans[1:], strict=False):
                layers += [nn.Conv2d(a, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True),
                           nn.Conv2d(b, b, 3, padding=1, bias=False), nn.BatchNorm2d(b), nn.ReLU(inplace=True),
                           nn.MaxPool2d(2)]
            self.features = nn.Sequential(*layers)
            self.head = nn.Linear(512, classes)

        def forward(self, x):
            return self.head(self.features(x).mean((2, 3)))

    return GPT, CNN


def schedule(scenario: str) -> list[tuple]:
    """Per optimizer step: (kind, batch, length) for LMs (length = image side for CNNs); accum gives
    a list of micro-batches. Seeded: every variant runs the same steps."""
    rng = random.Random(1234)
    if scenario in ("dyn", "dyn_ema", "bf16_dyn"):
        shapes = [(b, t) for b in (4, 6, 8, 12, 16) for t in (128, 256, 384, 512, 768, 1024)]
        return [("lm",) + rng.choice(shapes) for _ in range(36)]
    if scenario == "cnn_dyn":
        shapes = [(b, s) for b in (16, 24, 32, 48) for s in (64, 96, 128, 160)]
        return [("cnn",) + rng.choice(shapes) for _ in range(36)]
    if scenario in ("long_batch", "ckpt_long"):
        return [("lm", 8, 4096 if i == 14 else 512) for i in range(20)]
    if scenario in ("bigger_batch", "compile_bigger"):
        return [("lm", 16 if i < 10 else 64, 256) for i in range(14)]
    if scenario == "cnn_big":
        return [("cnn", 32 if i < 10 else 160, 128) for i in range(14)]
    if scenario == "accum":
        return [("accum", [(4, 4096 if (i == 12 and j == 2) else 512) for j in range(4)]) for i in range(16)]
    if scenario == "capacity":
        return [("lm", 32, 1024) for _ in range(6)]
    if scenario == "ddp_long":  # the rank's own shard: rank 1 gets one long batch
        rank = int(os.environ.get("RANK", "0"))
        return [("lm", 8, 4096 if (rank == 1 and i == 8) else 512) for i in range(12)]
    if scenario in ("resume", "first_step"):
        return [("lm", 2, 128) for _ in range(8 if scenario == "resume" else 5)]
    raise SystemExit(f"unknown scenario {scenario}")


def run_job(args) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, ROOT)
    GPT, CNN = _models()
    sc, variant = args.scenario, args.variant
    dev = torch.device("cuda", 0)
    if sc in DDP:
        import torch.distributed as dist

        torch.cuda.set_device(dev)
        dist.init_process_group("gloo")  # both ranks on one GPU (NCCL needs one device per rank)
        args.result = f"{args.result}.rank{dist.get_rank()}"
    res = {"scenario": sc, "variant": variant, "outcome": "completed", "step_peaks": [], "step_tokens": [],
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    agent = None
    if variant != "measure":
        from memq import agent

        opts = {"history": "on", "max_entries": 60_000, "snapshot_on_epoch": False} if variant == "full" else {}
        agent.start(run=f"sn-{sc}-{variant}", cluster="h200", spool_dir=args.spool, **opts)
    if args.cap_bytes:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), 0)
        res["cap_bytes"] = int(min(1.0, args.cap_bytes / total) * total)
    torch.manual_seed(0)
    vocab = 32_000
    is_cnn = sc.startswith("cnn")
    if is_cnn:
        model = CNN().to(dev).to(memory_format=torch.channels_last)
    elif sc in ("resume", "first_step"):  # parameters and AdamW state dominate: a small batch, a wider model
        model = GPT(vocab=vocab, d=1024, layers=12, heads=16, ctx=4096, ckpt=False).to(dev)
    else:
        model = GPT(vocab=vocab, d=512, layers=6, heads=8, ctx=4096,
                    ckpt=sc in ("ckpt_long", "dyn", "dyn_ema")).to(dev)
    if sc in DDP:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0])
    fwd = torch.compile(model) if sc == "compile_bigger" else model
    adam = sc in ("bf16_dyn", "resume", "first_step", "bigger_batch", "compile_bigger", "long_batch", "ckpt_long")
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if adam
           else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    autocast = sc != "cnn_dyn" and sc != "cnn_big"
    ema = None
    gen = torch.Generator(device=dev)
    gen.manual_seed(7)
    sched = schedule(sc)
    step = epoch = 0
    per_epoch = 6
    res["phase"] = "train"

    def micro(b, t):
        if is_cnn:
            x = torch.randn(b, 3, t, t, device=dev, generator=gen).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (b,), device=dev, generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(fwd(x).float(), y)
        else:
            x = torch.randint(0, vocab, (b, t), device=dev, generator=gen)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                logits = fwd(x)
                loss = F.cross_entropy(logits.float().view(-1, vocab), torch.roll(x, -1, 1).view(-1))
            del logits
        loss.backward()
        return b * t

    try:
        for i, item in enumerate(sched):
            step = i
            if sc == "resume" and i == 5:
                ck = os.path.join(args.tmp, f"ckpt-{os.getpid()}.pt")
                torch.save({"model": model.state_dict(), "opt": opt.state_dict()}, ck)
                res["phase"] = "resume"
                torch.cuda.reset_peak_memory_stats(dev)
                base = torch.cuda.memory_allocated(dev)
                state = torch.load(ck, map_location="cuda")  # the mistake: onto the GPU beside the live ones
                res["load_peak_allocated"] = torch.cuda.max_memory_allocated(dev)
                res["load_base_allocated"] = base
                model.load_state_dict(state["model"])
                opt.load_state_dict(state["opt"])
                del state
                os.unlink(ck)
                res["phase"] = "train"
            torch.cuda.reset_peak_memory_stats(dev)
            if item[0] == "accum":
                toks = sum(micro(b, t) for b, t in item[1])
            else:
                toks = micro(item[1], item[2])
            if sc == "first_step" and i == 0:
                res["before_step_allocated"] = torch.cuda.memory_allocated(dev)
            opt.step()
            opt.zero_grad(set_to_none=True)
            if sc == "dyn_ema" and i == 12:
                ema = [p.detach().clone() for p in model.parameters()]
            if ema is not None:
                with torch.no_grad():
                    torch._foreach_lerp_(ema, [p.detach() for p in model.parameters()], 0.01)
            torch.cuda.synchronize(dev)
            res["step_peaks"].append(torch.cuda.max_memory_allocated(dev))
            res.setdefault("step_peak_reserved", []).append(torch.cuda.max_memory_reserved(dev))
            res.setdefault("step_end_allocated", []).append(torch.cuda.memory_allocated(dev))
            res["step_tokens"].append(toks)
            if agent is not None:
                agent.mark_step(i, epoch, tokens=toks)
            if (i + 1) % per_epoch == 0:
                if agent is not None:
                    agent.mark_epoch(epoch)
                epoch += 1
        if agent is not None:
            agent.mark_epoch(epoch)
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, oom_phase=res["phase"], message=str(exc)[:800],
                   oom_allocated=torch.cuda.memory_allocated(dev))
        raise
    finally:
        res["steps_completed"] = len(res["step_peaks"])
        res["max_reserved_total"] = torch.cuda.max_memory_reserved(dev)
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()


# ----------------------------------------------------------------------------------------------------
# orchestration

class Runner:
    def __init__(self, out: str, budget: float, timeout: float):
        self.out, self.deadline, self.timeout = out, time.time() + budget, timeout
        self.summary: dict = {}
        self.caps: dict = {}
        self.variants: list = ["defaults", "full", "expandable"]
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def job(self, sc: str, variant: str, cap: int = 0, tag: str = "") -> dict | None:
        name = f"{sc}-{variant}{tag}"
        if time.time() + 20 > self.deadline:
            print(f"[skip] {name}: budget", flush=True)
            return None
        result = os.path.join(self.out, "results", name + ".json")
        spool = os.path.join(self.out, "spools", sc, variant + tag)
        tmp = os.path.join(self.out, "tmp")
        os.makedirs(tmp, exist_ok=True)
        env = dict(os.environ)
        env.pop("PYTORCH_ALLOC_CONF", None)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(self.out, "inductor")
        if variant == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        cmd = [sys.executable, os.path.abspath(__file__), "job", sc, "--variant", variant, "--result", result,
               "--cap-bytes", str(cap), "--spool", spool, "--tmp", tmp]
        if sc in DDP:
            env.pop("TORCHELASTIC_RUN_ID", None)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", *cmd[1:]]
            result = f"{result}.rank{DDP[sc]}"  # the failing rank's figures are the scenario's
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                               timeout=min(self.timeout, max(10, self.deadline - time.time())))
            rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", ""
        try:
            with open(result) as fh:
                res = json.load(fh)
        except (OSError, ValueError):
            res = {"outcome": "no result"}
        res.update(rc=rc, secs=round(time.time() - t0, 1), cap_bytes=cap)
        if res.get("outcome") == "no result" or rc not in (0, 1) or (rc == 1 and res.get("outcome") != "oom"):
            res["tail"] = tail
        print(f"[{name}] rc={rc} {res.get('outcome')} step={res.get('oom_step')} cap={cap / GiB:.2f}GiB "
              f"{res['secs']}s", flush=True)
        self.summary.setdefault(sc, {})[variant + tag] = res
        self.save()
        return res

    def save(self) -> None:
        with open(os.path.join(self.out, "summary.json"), "w") as fh:
            json.dump(self.summary, fh, indent=1)


def cap_for(sc: str, rule: tuple, measure: dict, ratio: float) -> int:
    kind = rule[0]
    peaks = measure.get("step_peaks") or []
    if kind == "peak_alloc":
        return int(ratio * max(peaks))
    if kind == "normal_reserved":
        # the steps before the first large one: what the job needed before its input grew
        # the steps before the first larger one (later ones hold the larger step's cached segments)
        res, toks = measure["step_peak_reserved"], measure["step_tokens"]
        n = next((i for i, t in enumerate(toks) if t != toks[0]), len(toks))
        return int(ratio * max(res[:n]))
    if kind == "fixed_gib":
        return int(ratio * GiB)
    if kind == "resume":
        # the live model and optimizer plus half of what the load brings
        # between what the training steps reserved before the load and what the load needs on top of
        # the live model and optimizer: the steps fit, the load does not
        train = max(measure["step_peak_reserved"][:5])
        return int((train + measure["load_peak_allocated"]) / 2)
    if kind == "first_step":
        # forward and backward fit, and half of AdamW's state
        before = measure["before_step_allocated"]
        return int(before + 0.5 * (measure["step_peaks"][0] - before) + 256 * (1 << 20))
    raise ValueError(kind)


def scenario(r: Runner, sc: str, measured: dict) -> None:
    kind, rule, _ = SCENARIOS[sc]
    m = measured.get(sc, {}).get("measure")
    if m and m.get("outcome") == "completed":  # an earlier run's ground truth (same script, same seed)
        r.summary.setdefault(sc, {})["measure"] = m
    else:
        m = r.job(sc, "measure")
    if not m or m.get("outcome") != "completed":
        return
    cap = 0
    if sc in r.caps:  # a cap found by an earlier run (its search already done)
        r.summary[sc].update(cap_bytes=r.caps[sc], kind=kind)
        for v in r.variants:
            r.job(sc, v, r.caps[sc])
        return
    for ratio in rule[1]:
        cap = cap_for(sc, rule, m, ratio)
        d = r.job(sc, "defaults", cap, tag="" if ratio == rule[1][0] else f"@{ratio}")
        if d is None:
            return
        if d.get("outcome") == "oom":
            if ratio != rule[1][0]:  # the OOM cap's run is the `defaults` one
                r.summary[sc]["defaults"] = r.summary[sc].pop(f"defaults@{ratio}")
                src = os.path.join(r.out, "spools", sc, f"defaults@{ratio}")
                dst = os.path.join(r.out, "spools", sc, "defaults")
                if os.path.isdir(dst):
                    os.rename(dst, dst + f"-nooom{time.time_ns()}")
                os.rename(src, dst)
            break
    r.summary[sc]["cap_bytes"] = cap
    r.summary[sc]["kind"] = kind
    r.job(sc, "full", cap)
    r.job(sc, "expandable", cap)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=560)
    a.add_argument("--timeout", type=float, default=150)
    a.add_argument("--parallel", type=int, default=2)
    a.add_argument("--measured", default="", help="summary.json of an earlier run: reuse its measure runs")
    a.add_argument("--reuse-caps", action="store_true", help="and its caps (no search), running --variants only")
    a.add_argument("--variants", default="defaults,full,expandable")
    j = sub.add_parser("job")
    j.add_argument("scenario", choices=sorted(SCENARIOS))
    j.add_argument("--variant", choices=["measure", "defaults", "full", "expandable"], required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--cap-bytes", type=int, default=0)
    j.add_argument("--spool", default="/tmp/step_need_spool")
    j.add_argument("--tmp", default="/tmp")
    args = ap.parse_args()
    if args.cmd == "job":
        run_job(args)
        return
    names = [s for s in (args.only.split(",") if args.only else SCENARIOS) if s]
    r = Runner(args.out, args.budget, args.timeout)
    measured = {}
    if args.measured:
        with open(args.measured) as fh:
            measured = json.load(fh)
    r.variants = args.variants.split(",")
    if args.reuse_caps:
        r.caps = {k: v["cap_bytes"] for k, v in measured.items() if v.get("cap_bytes")}
    with ThreadPoolExecutor(max_workers=args.parallel) as ex:
        list(ex.map(lambda s: scenario(r, s, measured), names))
    r.save()


if __name__ == "__main__":
    main()
