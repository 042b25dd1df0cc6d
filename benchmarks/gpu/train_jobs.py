"""Training jobs for the agent-defaults scenarios, each instrumented exactly as the README says
(`agent.start(run, cluster)`, `mark_step`, `mark_epoch`; nothing else of memq), run by agent_defaults.py.

    python train_jobs.py SCENARIO --name R --result R.json [--cap-bytes N] [--device cpu]

dynamic    random (batch, sequence) shapes from a seeded schedule under a tight cap (the parent runs the
           same schedule under several PYTORCH_CUDA_ALLOC_CONF settings at the same cap)
probe      the dynamic schedule without cap and without agent: the peak allocated bytes, for the cap
oversized  normal steps, then one batch with an 8x longer sequence under a cap of 2x the normal peak
optstep    a cap that fits forward and backward but not AdamW's state: OOM in the first optimizer step
healthy    a small GPT, generous cap, completes
The OutOfMemoryError is not caught: it reaches the top of the script, as in a real job.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt_agent_train import GPT  # noqa: E402

DYN_SEED = 1234
DYN_BATCHES = [8, 12, 16, 20, 24]
DYN_SEQS = [128, 256, 384, 512, 768, 1024]


def dyn_schedule(steps):
    rng = random.Random(DYN_SEED)
    shapes = [(b, t) for b in DYN_BATCHES for t in DYN_SEQS]
    return [rng.choice(shapes) for _ in range(steps)]


def set_cap(dev, cap):
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(idx).total_memory
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), idx)
    return int(min(1.0, cap / total) * total)


def lm_step(model, opt, x, vocab, cuda):
    with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, vocab), torch.roll(x, -1, 1).view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["dynamic", "probe", "oversized", "optstep", "healthy"])
    ap.add_argument("--name", default="job")
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--result", required=True)
    ap.add_argument("--cap-bytes", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="tiny sizes (CPU dry run)")
    ap.add_argument("--empty-cache-every-step", action="store_true",
                    help="dynamic: call torch.cuda.empty_cache() after every step (the forum advice)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    agent = None
    if args.scenario != "probe":
        from memq import agent

        agent.start(run=args.name, cluster=args.cluster)
    res = {"scenario": args.scenario, "outcome": "completed",
           "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    step, epoch = 0, 0
    t0 = time.time()
    sm = args.small
    try:
        if args.scenario in ("dynamic", "probe"):
            vocab = 512 if sm else 45_000
            torch.manual_seed(0)
            if cuda and args.cap_bytes:
                res["cap_bytes"] = set_cap(dev, args.cap_bytes)
            model = GPT(vocab=vocab, d=64 if sm else 768, layers=2 if sm else 12, heads=4 if sm else 12,
                        ctx=1024, ckpt=True).to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
            epochs, per = 3, 15
            sched = dyn_schedule(epochs * per)
            res["schedule"] = sched
            gen = torch.Generator(device=dev)
            gen.manual_seed(DYN_SEED)
            for epoch in range(epochs):
                for _ in range(per):
                    b, t = sched[step]
                    res["shape"] = [b, t]
                    x = torch.randint(0, vocab, (b // 4 if sm else b, t // 8 if sm else t), device=dev, generator=gen)
                    ts = time.perf_counter()
                    lm_step(model, opt, x, vocab, cuda)
                    if args.empty_cache_every_step and cuda:
                        torch.cuda.empty_cache()
                    if cuda:
                        torch.cuda.synchronize(dev)
                        res.setdefault("step_ms", []).append(round((time.perf_counter() - ts) * 1000, 3))
                        # read before mark_step resets the peaks: the run's own peaks, step by step
                        res["run_peak_reserved"] = max(res.get("run_peak_reserved", 0),
                                                       torch.cuda.max_memory_reserved(dev))
                        res["run_peak_allocated"] = max(res.get("run_peak_allocated", 0),
                                                        torch.cuda.max_memory_allocated(dev))
                    if agent is not None:
                        agent.mark_step(step, epoch)
                    step += 1
                if agent is not None:
                    agent.mark_epoch(epoch)
        elif args.scenario in ("oversized", "healthy"):
            over = args.scenario == "oversized"
            vocab = 512 if sm else (45_000 if over else 32_000)
            torch.manual_seed(0)
            model = GPT(vocab=vocab, d=64 if sm else 512, layers=2 if sm else (6 if over else 4), heads=8,
                        ctx=4096, ckpt=over).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
            batch, seq = (2, 16) if sm else (8, 512) if over else (16, 256)
            epochs, per = (3, 10) if over else (3, 20)
            big_at = per * 2 + 4  # the 5th step of the 3rd epoch
            res["big_step"] = big_at if over else None
            for epoch in range(epochs):
                for _ in range(per):
                    t = seq * 8 if over and step == big_at else seq
                    res["shape"] = [batch, t]
                    x = torch.randint(0, vocab, (batch, t), device=dev)
                    lm_step(model, opt, x, vocab, cuda)
                    if agent is not None:
                        agent.mark_step(step, epoch)
                    if step == 0 and cuda:
                        # twice the normal step's need (the long step needs several times that)
                        res["cap_bytes"] = set_cap(dev, 2 * torch.cuda.memory_reserved(dev))
                    step += 1
                if agent is not None:
                    agent.mark_epoch(epoch)
        elif args.scenario == "optstep":
            vocab = 512 if sm else 45_000
            torch.manual_seed(0)
            model = GPT(vocab=vocab, d=64 if sm else 1024, layers=2 if sm else 12, heads=16 if not sm else 4,
                        ctx=1024, ckpt=True).to(dev)
            opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
            pbytes = sum(p.numel() * p.element_size() for p in model.parameters())
            res["param_bytes"] = pbytes
            x = torch.randint(0, vocab, (2 if sm else 8, 16 if sm else 256), device=dev)
            with torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=cuda):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, vocab), torch.roll(x, -1, 1).view(-1))
            loss.backward()
            del logits, loss
            if cuda:
                # parameters and gradients fit, plus half of AdamW's two state tensors per parameter
                # (the activations' cached blocks are released first: the cap applies to new segments)
                torch.cuda.empty_cache()
                res["cap_bytes"] = set_cap(dev, torch.cuda.memory_allocated(dev) + pbytes)
            opt.step()  # state creation: the OutOfMemoryError comes from here
            opt.zero_grad(set_to_none=True)
            if agent is not None:
                agent.mark_step(step, epoch)
            step += 1
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, message=str(exc)[:600])
        raise
    finally:
        res["steps_completed"], res["secs"] = step, round(time.time() - t0, 1)
        res["empty_cache_every_step"] = bool(args.empty_cache_every_step)
        if cuda:
            # the agent resets the peak counters at every step boundary: its per-step figures hold the
            # run's peaks; these are the peaks since the last boundary (the whole run without an agent)
            res["max_allocated"] = torch.cuda.max_memory_allocated(dev)
            res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
            res["reserved_at_end"] = torch.cuda.memory_reserved(dev)
            res["run_peak_reserved"] = max(res.get("run_peak_reserved", 0), res["max_reserved"])
            res["run_peak_allocated"] = max(res.get("run_peak_allocated", 0), res["max_allocated"])
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
