"""Calibration set for `memq fit` (the batch and sequence length that fit, predicted from one run):
real training runs on an H200 at several batch sizes and lengths, in one command.

    python3 fit.py all --out DIR [--only a,b] [--budget S] [--parallel 4]
    python3 fit.py job MODEL --batch B --seq T --result R.json [--agent defaults|full --spool DIR] [--cap-bytes N]
    python3 fit.py probe MODEL --batches 64,65,66 --cap-bytes N --out DIR   (each batch its own capped process)

Models (each trains 6 steps of random data per run, uncapped unless `--cap-bytes`):
- `gpt_s`: GPT 4 x 512, vocabulary 32,000, float32, AdamW; base batch 4 x 256.
- `gpt_m`: GPT 8 x 1024, float32, AdamW; base batch 2 x 256.
- `cnn`: a VGG-like CNN (8 convolutions with batch norm) on 128 px images, float32, SGD momentum; base 8.
- `gpt_ckpt`: GPT 6 x 768 with activation checkpointing per block, float32, AdamW; base 4 x 256.
- `gpt_bf16`: GPT 6 x 768 under bf16 autocast, AdamW; base 4 x 256.
Per model: the base shape with the agent at its defaults (`agent.start`, `mark_step(tokens=)`,
`mark_epoch`) and with history="on"; the base, 2x, 4x and 8x batch (and 2x, 4x length for the GPTs)
without the agent, measuring `max_memory_reserved()` and `max_memory_allocated()` of the whole run; then
the cap halfway between the 4x and 8x runs' peak reserved, and the largest batch that trains under it,
found by bisection between 4x and 8x (each probe its own capped process: OOM or not, for real).
Results: DIR/summary.json; spools in DIR/spools/<model>/<agent>.
`probe` trains the listed batches under one cap, four at a time, for a boundary `all` did not reach (the
CNN: every batch up to 8x the base trained under its cap). Results: DIR/probe.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_process import run_job_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

# model: (base batch, base length or image side, is a GPT)
MODELS = {"gpt_s": (4, 256, True), "gpt_m": (2, 256, True), "cnn": (8, 128, False),
          "gpt_ckpt": (4, 256, True), "gpt_bf16": (4, 256, True)}
STEPS = 6


def run_job(args) -> None:
    import torch
    import torch.nn.functional as F

    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    from gpt_agent_train import GPT
    from step_need import _models

    name = args.model
    dev = torch.device("cuda", 0)
    agent = None
    if args.agent:
        from memq import agent

        opts = {"history": "on", "max_entries": 60_000} if args.agent == "full" else {}
        agent.start(run=f"fit-{name}-{args.agent}", cluster="h200", spool_dir=args.spool, **opts)
    res = {"model": name, "batch": args.batch, "seq": args.seq, "outcome": "completed", "step_peak_reserved": [],
           "step_peak_allocated": []}
    if args.cap_bytes:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args.cap_bytes / total), 0)
        res["cap_bytes"] = int(min(1.0, args.cap_bytes / total) * total)
    torch.manual_seed(0)
    vocab = 32_000
    if name == "cnn":
        model = _models()[1]().to(dev).to(memory_format=torch.channels_last)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    else:
        d, layers = {"gpt_s": (512, 4), "gpt_m": (1024, 8)}.get(name, (768, 6))
        model = GPT(vocab=vocab, d=d, layers=layers, heads=8, ctx=4096, ckpt=name == "gpt_ckpt").to(dev)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    bf16 = name == "gpt_bf16"
    step = 0
    try:
        for step in range(STEPS):
            b, t = args.batch, args.seq
            if name == "cnn":
                x = torch.randn(b, 3, t, t, device=dev).to(memory_format=torch.channels_last)
                loss = F.cross_entropy(model(x), torch.randint(0, 1000, (b,), device=dev))
            else:
                x = torch.randint(0, vocab, (b, t), device=dev)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                    logits = model(x)
                    loss = F.cross_entropy(logits.float().view(-1, vocab), torch.roll(x, -1, 1).view(-1))
                del logits
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss, x
            torch.cuda.synchronize(dev)
            res["step_peak_reserved"].append(torch.cuda.max_memory_reserved(dev))
            res["step_peak_allocated"].append(torch.cuda.max_memory_allocated(dev))
            if agent is not None:
                agent.mark_step(step, 0, tokens=b * t if name != "cnn" else b)
        if agent is not None:
            agent.mark_epoch(0)
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, message=str(exc)[:400])
    finally:
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["max_allocated"] = torch.cuda.max_memory_allocated(dev)
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()


class Runner:
    def __init__(self, out: str, budget: float):
        self.out, self.deadline = out, time.time() + budget
        self.summary: dict = {}
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def job(self, model: str, batch: int, seq: int, agent: str = "", cap: int = 0) -> dict | None:
        tag = f"{model}-b{batch}-t{seq}" + (f"-{agent}" if agent else "") + (f"-cap{cap}" if cap else "")
        if time.time() + 15 > self.deadline:
            print(f"[skip] {tag}: budget", flush=True)
            return None
        result = os.path.join(self.out, "results", tag + ".json")
        cmd = [sys.executable, os.path.abspath(__file__), "job", model, "--batch", str(batch), "--seq", str(seq),
               "--result", result, "--cap-bytes", str(cap)]
        if agent:
            cmd += ["--agent", agent, "--spool", os.path.join(self.out, "spools", model, agent)]
        res = run_job_process(cmd, result, min(150, max(10, self.deadline - time.time())))
        print(f"[{tag}] {res.get('outcome')} reserved={res.get('max_reserved', 0) / 2**30:.3f}GiB "
              f"{res['wall_s']}s", flush=True)
        self.summary.setdefault(model, {}).setdefault("runs", {})[tag] = res
        with open(os.path.join(self.out, "summary.json"), "w") as fh:
            json.dump(self.summary, fh, indent=1)
        return res

    def model(self, m: str) -> None:
        b0, t0, lm = MODELS[m]
        self.job(m, b0, t0, agent="defaults")
        self.job(m, b0, t0, agent="full")
        runs = {k: self.job(m, k * b0, t0) for k in (1, 2, 4, 8)}
        if lm:
            for k in (2, 4):
                self.job(m, b0, k * t0)
        if not (runs[4] and runs[8]):
            return
        cap = (runs[4]["max_reserved"] + runs[8]["max_reserved"]) // 2
        lo, hi = 4 * b0, 8 * b0  # lo trains under the cap (it reserved less), hi reserved more
        while hi - lo > 1:
            mid = (lo + hi) // 2
            r = self.job(m, mid, t0, cap=cap)
            if r is None:
                return
            if r["outcome"] == "completed":
                lo = mid
            else:
                hi = mid
        # both sides of the answer, for real under the cap
        ok, bad = self.job(m, lo, t0, cap=cap), self.job(m, hi, t0, cap=cap)
        self.summary[m]["cap"] = {"cap_bytes": cap, "max_batch": lo, "max_batch_outcome": ok and ok["outcome"],
                                  "next_outcome": bad and bad["outcome"]}
        with open(os.path.join(self.out, "summary.json"), "w") as fh:
            json.dump(self.summary, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=400)
    a.add_argument("--parallel", type=int, default=4)
    j = sub.add_parser("job")
    j.add_argument("model", choices=sorted(MODELS))
    j.add_argument("--batch", type=int, required=True)
    j.add_argument("--seq", type=int, required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--agent", choices=["defaults", "full"], default="")
    j.add_argument("--spool", default="/tmp/fit_spool")
    j.add_argument("--cap-bytes", type=int, default=0)
    p = sub.add_parser("probe")
    p.add_argument("model", choices=sorted(MODELS))
    p.add_argument("--batches", required=True)
    p.add_argument("--cap-bytes", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--budget", type=float, default=300)
    args = ap.parse_args()
    if args.cmd == "probe":
        r = Runner(args.out, args.budget)
        seq = MODELS[args.model][1]
        with ThreadPoolExecutor(max_workers=4) as ex:
            done = list(ex.map(lambda b: r.job(args.model, b, seq, cap=args.cap_bytes),
                               [int(b) for b in args.batches.split(",")]))
        with open(os.path.join(args.out, "probe.json"), "w") as fh:
            json.dump({"cap_bytes": args.cap_bytes, "runs": [d for d in done if d]}, fh, indent=1)
        return
    if args.cmd == "job":
        run_job(args)
        return
    names = [s for s in (args.only.split(",") if args.only else MODELS) if s]
    r = Runner(args.out, args.budget)
    with ThreadPoolExecutor(max_workers=args.parallel) as ex:
        list(ex.map(r.model, names))


if __name__ == "__main__":
    main()
