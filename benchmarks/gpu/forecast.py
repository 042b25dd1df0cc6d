"""Calibration set for the OOM forecast (ARCHITECTURE.md "Forecast"): real jobs on an H200 that leak
until they run out of memory, and jobs whose memory moves without leaking, in one command.

    python3 forecast.py all --out DIR [--only a,b] [--budget S] [--parallel 3]
    python3 forecast.py job SCENARIO --variant V --result R.json [--spool DIR]

Leaks (each runs out of memory after several epochs under its cap, OOM step and epoch recorded):
- `val_logits`: a GPT's validation loop keeps every batch's float logits on the GPU.
- `best_weights`: every epoch's "best" weights are kept as GPU copies in a list (meant to be replaced).
- `cnn_val_graph`: a CNN's validation runs without no_grad and keeps its losses (and their graphs).
- `opt_recreate`: an AdamW is re-created every epoch (a new schedule) while the old ones stay referenced.
- `hook_feats`: a forward hook keeps one layer's output of every training step (no epochs at all).
Controls (none runs out of memory; none may be forecast to):
- `healthy`, `dynamic` (seeded random batch and length per step), `warmup` (a batch-size ramp over the
  first epoch), `unfreeze` (one more block trained every epoch: gradients and optimizer state grow
  until the model is fully unfrozen), `cache_fill` (a GPU cache that fills over two epochs and stops).

Variants: `defaults` (agent.start + mark_step + mark_epoch at the agent's defaults), `full`
(history="on"), `run` (`python -m memq run` around a script with no memq line: steps from torch's
optimizer hook, no epoch marks). Caps are `set_per_process_memory_fraction` after the second step:
the peak reserved bytes of the first two steps + `GROW_EPOCHS` epochs of the scenario's growth (controls:
1.6x that peak, 2x for dynamic shapes after an epoch of them, + 1 GiB for the cache).
Results: DIR/summary.json and the spools in DIR/spools/<scenario>/<variant>.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_process import run_job_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GiB = 1 << 30

# scenario: (leak?, variants, epochs)
SCENARIOS = {
    "val_logits": (True, ("defaults", "full", "run"), 40),
    "best_weights": (True, ("defaults", "full"), 40),
    "cnn_val_graph": (True, ("defaults", "full"), 40),
    "opt_recreate": (True, ("defaults", "full"), 40),
    "hook_feats": (True, ("defaults", "full", "run"), 40),
    "healthy": (False, ("defaults", "run"), 12),
    "dynamic": (False, ("defaults", "full"), 12),
    "warmup": (False, ("defaults",), 12),
    "unfreeze": (False, ("defaults", "full"), 12),
    "cache_fill": (False, ("defaults",), 12),
}
GROW_EPOCHS = 10  # the leaks' caps: about this many epochs of growth after the first step


def run_job(args) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from gpt_agent_train import GPT
    from step_need import _models

    sc, variant = args.scenario, args.variant
    leak, _, epochs = SCENARIOS[sc]
    dev = torch.device("cuda", 0)
    agent = None
    if variant in ("defaults", "full"):
        from memq import agent

        opts = {"history": "on", "max_entries": 15_000} if variant == "full" else {}
        agent.start(run=f"fc-{sc}-{variant}", cluster="h200", spool_dir=args.spool, **opts)
    torch.manual_seed(0)
    vocab, seq, batch, val_batch, steps_per_epoch = 32_000, 256, 16, 4, 12
    cnn = sc == "cnn_val_graph"
    if cnn:
        model = _models()[1]().to(dev).to(memory_format=torch.channels_last)
    else:
        model = GPT(vocab=vocab, d=512, layers=6, heads=8, ctx=1024, ckpt=False).to(dev)
    params = list(model.parameters())
    if sc == "unfreeze":  # only the head trains at first; one more block from the back every epoch
        for p in model.parameters():
            p.requires_grad_(False)
        model.ln.weight.requires_grad_(True)
        model.tok.weight.requires_grad_(True)
        params = [model.ln.weight, model.tok.weight]
    opt = torch.optim.AdamW(params, lr=1e-4) if not cnn else torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    kept: list = []
    gen = random.Random(99)
    if sc == "hook_feats":
        model.blocks[2].register_forward_hook(
            lambda m, i, o: kept.append(o.detach()) if m.training else None)  # LEAK: a layer's output every step
    res = {"scenario": sc, "variant": variant, "leak": leak, "outcome": "completed", "step_end_allocated": [],
           "step_peaks": [], "step_ms": [], "epoch_end_allocated": [], "steps_per_epoch": steps_per_epoch}
    step = epoch = 0
    phase = "train"
    t0 = time.time()

    def shape():
        if sc == "dynamic":
            return gen.choice((4, 8, 12, 16, 24)), gen.choice((128, 256, 384, 512))
        if sc == "warmup" and epoch == 0:
            return 4 + (12 * step) // steps_per_epoch, seq
        return batch, seq

    def loss_of(b, t, train=True):
        if cnn:
            x = torch.randn(b, 3, 96, 96, device=dev).to(memory_format=torch.channels_last)
            y = torch.randint(0, 1000, (b,), device=dev)
            return F.cross_entropy(model(x), y), None
        x = torch.randint(0, vocab, (b, t), device=dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
            return F.cross_entropy(logits.float().view(-1, vocab), torch.roll(x, -1, 1).view(-1)), logits

    try:
        for epoch in range(epochs):
            if sc == "unfreeze" and 1 <= epoch <= len(model.blocks):
                blk = model.blocks[-epoch]
                for p in blk.parameters():
                    p.requires_grad_(True)
                opt.add_param_group({"params": list(blk.parameters())})
            if sc == "opt_recreate" and epoch > 0:
                kept.append(opt)  # LEAK: the old optimizer (and its state) stays referenced
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4 * 0.9 ** epoch)
            model.train()
            phase = "train"
            for _ in range(steps_per_epoch):
                ts = time.perf_counter()
                b, t = shape() if not cnn else (32, 96)
                loss, logits = loss_of(b, t)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del loss, logits
                torch.cuda.synchronize(dev)
                res["step_ms"].append(round((time.perf_counter() - ts) * 1000, 2))
                res["step_end_allocated"].append(torch.cuda.memory_allocated(dev))
                if agent is not None:
                    agent.mark_step(step, epoch)
                # capped after the second step (the first one's peak precedes the optimizer state), after
                # the ramp, or after an epoch of shapes
                late = sc in ("warmup", "dynamic")
                if (step == 1 and not late) or (late and step == steps_per_epoch):
                    total = torch.cuda.get_device_properties(0).total_memory
                    grow = {"val_logits": 2 * val_batch * seq * vocab * 4,
                            "best_weights": sum(v.numel() * v.element_size() for v in model.state_dict().values()),
                            "opt_recreate": 2 * sum(p.numel() * 4 for p in model.parameters()),
                            "hook_feats": steps_per_epoch * sum(k.numel() * k.element_size()
                                                                for k in kept[-1:])}.get(sc)
                    if cnn:
                        grow = 0
                    if sc == "cnn_val_graph":
                        cap = None  # set after the first validation: its graph's size is measured there
                    elif leak:
                        cap = torch.cuda.max_memory_reserved(dev) + GROW_EPOCHS * grow
                    else:
                        cap = int((2.0 if sc == "dynamic" else 1.6) * torch.cuda.max_memory_reserved(dev)) + (
                            GiB if sc == "cache_fill" else 0)
                    if sc == "unfreeze":
                        cap = int(1.5 * torch.cuda.max_memory_reserved(dev)) + 6 * sum(
                            p.numel() * 4 for p in model.parameters())
                    if cap:
                        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
                        res["cap_bytes"] = int(min(1.0, cap / total) * total)
                        res["growth_per_epoch_expected"] = grow
                step += 1
            phase = "validation"
            if sc == "cnn_val_graph":
                before = torch.cuda.memory_allocated(dev)
            for _ in range(2):
                if sc == "cnn_val_graph":
                    model.eval()
                    loss, _ = loss_of(16, 96)
                    kept.append(loss)  # LEAK: the loss and its graph (no torch.no_grad in validation)
                    continue
                model.eval()
                with torch.no_grad():
                    _, logits = loss_of(val_batch, seq, train=False)
                    if sc == "val_logits":
                        kept.append(logits.float())  # LEAK: every validation batch's logits stay on the GPU
                    del logits
            if sc == "cache_fill" and epoch < 2:
                kept.append(torch.empty(256 << 20, dtype=torch.uint8, device=dev))  # a bounded cache
            if sc == "best_weights":
                kept.append({k: v.detach().clone() for k, v in model.state_dict().items()})  # LEAK: every "best"
            if sc == "cnn_val_graph" and epoch == 0:
                grow = torch.cuda.memory_allocated(dev) - before
                total = torch.cuda.get_device_properties(0).total_memory
                cap = torch.cuda.max_memory_reserved(dev) + GROW_EPOCHS * grow
                torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
                res["cap_bytes"], res["growth_per_epoch_expected"] = int(min(1.0, cap / total) * total), grow
            torch.cuda.synchronize(dev)
            res["epoch_end_allocated"].append(torch.cuda.memory_allocated(dev))
            if agent is not None:
                agent.mark_epoch(epoch)
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, oom_phase=phase, message=str(exc)[:600])
        raise
    finally:
        res["steps_completed"], res["secs"] = step, round(time.time() - t0, 2)
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()
    del nn


class Runner:
    def __init__(self, out: str, budget: float, timeout: float):
        self.out, self.deadline, self.timeout = out, time.time() + budget, timeout
        self.summary: dict = {}
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def job(self, sc: str, variant: str) -> None:
        name = f"{sc}-{variant}"
        if time.time() + 20 > self.deadline:
            print(f"[skip] {name}: budget", flush=True)
            return
        result = os.path.join(self.out, "results", name + ".json")
        spool = os.path.join(self.out, "spools", sc, variant)
        cmd = [sys.executable, os.path.abspath(__file__), "job", sc, "--variant", variant, "--result", result,
               "--spool", spool]
        if variant == "run":
            cmd = [sys.executable, "-m", "memq", "run", "--run", f"fc-{sc}-run", "--cluster", "h200",
                   "--spool-dir", spool, "--", *cmd]
        res = run_job_process(cmd, result, min(self.timeout, max(10, self.deadline - time.time())))
        rc = res["rc"]
        print(f"[{name}] rc={rc} {res.get('outcome')} step={res.get('oom_step')} epoch={res.get('oom_epoch')} "
              f"{res['wall_s']}s", flush=True)
        self.summary.setdefault(sc, {})[variant] = res
        with open(os.path.join(self.out, "summary.json"), "w") as fh:
            json.dump(self.summary, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=400)
    a.add_argument("--timeout", type=float, default=180)
    a.add_argument("--parallel", type=int, default=3)
    j = sub.add_parser("job")
    j.add_argument("scenario", choices=sorted(SCENARIOS))
    j.add_argument("--variant", choices=["defaults", "full", "run"], required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--spool", default="/tmp/forecast_spool")
    args = ap.parse_args()
    if args.cmd == "job":
        if args.variant == "run":
            args.variant = "run"  # the agent comes from `memq run` around this process
        run_job(args)
        return
    names = [s for s in (args.only.split(",") if args.only else SCENARIOS) if s]
    r = Runner(args.out, args.budget, args.timeout)
    jobs = [(s, v) for s in names for v in SCENARIOS[s][1]]
    with ThreadPoolExecutor(max_workers=args.parallel) as ex:
        list(ex.map(lambda sv: r.job(*sv), jobs))


if __name__ == "__main__":
    main()
