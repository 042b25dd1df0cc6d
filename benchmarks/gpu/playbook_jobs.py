"""Jobs behind the OOM playbook's measured tables (GPU only, not CI; issue 17). Run by playbook_capture.py.

Each job starts the memq agent the README's way (plus `spool_dir`: the GPU machines reach no Redis) and
writes what torch itself measured to --result; memq's own view of the same moments is in the agent's
spool (snapshots with the per-step figures), which benchmarks/playbook.py analyses here, without torch.

    python playbook_jobs.py optim --kind adamw_fused --name R --result R.json
    python playbook_jobs.py ckpt --ckpt on --batch 32 --name R --result R.json
    python playbook_jobs.py empty_cache --name R --result R.json

optim        a ~85M GPT, 3 steps of one optimizer: the state's bytes (from opt.state), the step's own peak
             above what was live before it (foreach/fused temporaries), opt.step time; a snapshot after the
             last opt.step with history on, so memq's composition can count the state by its frames.
ckpt         the same GPT, checkpointing on or off, batch 8 or 32 x 512: bytes saved at the end of the
             forward pass, the step's peak above the static state, step time; at the end, what
             empty_cache() returns between steps and what the next step costs after it.
empty_cache  live 8 MiB blocks in 20 MiB segments (every other one freed: stranded bytes) and whole free
             64 MiB segments: what empty_cache() returns, then a cap where a 200 MiB request fails, tried
             again after empty_cache(): it fails again (the allocator already frees every cached
             segment it can before it raises).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt_agent_train import GPT  # noqa: E402

MiB = 1 << 20
VOCAB = 32_000
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "adamw_forloop", "adamw_fused", "adafactor", "adamw_8bit")


def make_optimizer(kind: str, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=1e-3)
    if kind == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if kind == "adam":
        return torch.optim.Adam(params, lr=3e-4)
    if kind == "adamw":
        return torch.optim.AdamW(params, lr=3e-4)  # foreach: torch's default on CUDA
    if kind == "adamw_forloop":
        return torch.optim.AdamW(params, lr=3e-4, foreach=False)
    if kind == "adamw_fused":
        return torch.optim.AdamW(params, lr=3e-4, fused=True)
    if kind == "adafactor":
        return torch.optim.Adafactor(params, lr=1e-2)
    if kind == "adamw_8bit":
        import bitsandbytes as bnb  # absent on most machines: the caller records "unavailable"

        return bnb.optim.AdamW8bit(params, lr=3e-4)
    raise ValueError(kind)


def state_bytes(opt) -> int:
    seen, total = set(), 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.is_cuda:
                key = v.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += v.untyped_storage().nbytes()
    return total


def lm_loss(model, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
        return F.cross_entropy(logits.float().view(-1, VOCAB), torch.roll(x, -1, 1).view(-1))


def job_optim(a, agent, res, dev):
    try:
        probe = make_optimizer(a.kind, [torch.nn.Parameter(torch.zeros(4, device=dev))])
        del probe
    except Exception as exc:  # noqa: BLE001 - e.g. bitsandbytes not installed: the table says so
        res.update(outcome="unavailable", reason=f"{type(exc).__name__}: {exc}"[:300])
        return
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, d=768, layers=12, heads=12, ctx=1024, ckpt=True).to(dev)
    opt = make_optimizer(a.kind, model.parameters())
    params = list(model.parameters())
    res["param_count"] = sum(p.numel() for p in params)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in params)
    res["optimizer_class"] = f"{type(opt).__module__}.{type(opt).__name__}"
    res["optimizer_defaults"] = {k: v for k, v in opt.defaults.items() if isinstance(v, (bool, int, float, str))}
    times, peaks = [], []
    for step in range(3):
        x = torch.randint(0, VOCAB, (8, 256), device=dev)
        lm_loss(model, x).backward()
        torch.cuda.synchronize(dev)
        res["grad_bytes"] = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
        before = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        opt.step()
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        peaks.append(torch.cuda.max_memory_allocated(dev) - before)
        res["state_bytes"] = state_bytes(opt)
        res["allocated_after_step"] = torch.cuda.memory_allocated(dev)
        if step == 2:
            # params, grads and state all live: what memq's composition should count
            res["snapshot_taken"] = agent.snapshot("manual")
            agent.flush(30)
        opt.zero_grad(set_to_none=True)
        agent.mark_step(step, 0)
    res["step_extra_peak_bytes"] = peaks  # temporaries of opt.step above what was live before it
    res["opt_step_ms"] = [round(t * 1000, 3) for t in times]


def job_ckpt(a, agent, res, dev):
    torch.manual_seed(0)
    model = GPT(vocab=VOCAB, d=768, layers=12, heads=12, ctx=1024, ckpt=a.ckpt == "on").to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    res.update(ckpt=a.ckpt == "on", batch=a.batch, seq=a.seq)
    saved, peaks, times = [], [], []
    for step in range(a.steps):
        x = torch.randint(0, VOCAB, (a.batch, a.seq), device=dev)
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        loss = lm_loss(model, x)
        torch.cuda.synchronize(dev)
        saved.append(torch.cuda.memory_allocated(dev) - base)  # what autograd keeps for backward
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss
        torch.cuda.synchronize(dev)
        times.append(time.perf_counter() - t0)
        peaks.append(torch.cuda.max_memory_allocated(dev) - base)
        res["static_bytes"] = torch.cuda.memory_allocated(dev)  # params + optimizer state after the step
        agent.mark_step(step, 0)
    res.update(saved_after_forward=saved, step_peak_above_static=peaks, step_ms=[round(t * 1000, 3) for t in times])
    # what empty_cache() gives back between steps, and what the next step pays for it
    res["reserved_before_empty_cache"] = torch.cuda.memory_reserved(dev)
    torch.cuda.empty_cache()
    res["reserved_after_empty_cache"] = torch.cuda.memory_reserved(dev)
    x = torch.randint(0, VOCAB, (a.batch, a.seq), device=dev)
    torch.cuda.synchronize(dev)
    t0 = time.perf_counter()
    lm_loss(model, x).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    res["step_ms_after_empty_cache"] = round((time.perf_counter() - t0) * 1000, 3)
    res["reserved_after_next_step"] = torch.cuda.memory_reserved(dev)
    agent.mark_step(a.steps, 0)
    res["snapshot_taken"] = agent.snapshot("manual")  # carries the per-step figures (agent defaults)


def job_empty_cache(a, agent, res, dev):
    torch.cuda.empty_cache()
    small = [torch.empty(8 * MiB, dtype=torch.uint8, device=dev) for _ in range(64)]
    big = [torch.empty(64 * MiB, dtype=torch.uint8, device=dev) for _ in range(16)]
    del small[1::2]  # every other 8 MiB block: each 20 MiB segment keeps one live block
    del big  # whole 64 MiB segments, nothing live in them
    torch.cuda.synchronize(dev)
    res["allocated_before"] = torch.cuda.memory_allocated(dev)
    res["reserved_before"] = torch.cuda.memory_reserved(dev)
    res["snapshot_before"] = agent.snapshot("manual")
    agent.flush(30)
    torch.cuda.empty_cache()
    res["reserved_after"] = torch.cuda.memory_reserved(dev)
    res["allocated_after"] = torch.cuda.memory_allocated(dev)
    res["snapshot_after"] = agent.snapshot("manual")
    agent.flush(30)
    # a cap 100 MiB above what is reserved now: 200 MiB needs a new segment the cap refuses, while the
    # cached free bytes (12 MiB pieces beside live blocks) add up to more than 200 MiB
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(idx).total_memory
    cap = torch.cuda.memory_reserved(dev) + 100 * MiB
    torch.cuda.set_per_process_memory_fraction(cap / total, idx)
    res["cap_bytes"] = int(cap / total * total)
    res["request_bytes"] = 200 * MiB
    attempts = []
    for label in ("first try", "after empty_cache()"):
        if label != "first try":
            torch.cuda.empty_cache()
        try:
            t = torch.empty(200 * MiB, dtype=torch.uint8, device=dev)
            attempts.append({"attempt": label, "outcome": "allocated"})
            del t
        except torch.OutOfMemoryError as exc:
            attempts.append({"attempt": label, "outcome": "oom", "message": str(exc)[:400],
                             "reserved": torch.cuda.memory_reserved(dev)})
        agent.flush(30)
    res["attempts"] = attempts
    # what does work: the stranded bytes come back once their live neighbours go
    del small
    try:
        t = torch.empty(200 * MiB, dtype=torch.uint8, device=dev)
        res["after_freeing_neighbours"] = "allocated"
        del t
    except torch.OutOfMemoryError:
        res["after_freeing_neighbours"] = "oom"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("job", choices=["optim", "ckpt", "empty_cache"])
    ap.add_argument("--name", required=True)
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--result", required=True)
    ap.add_argument("--spool", required=True)
    ap.add_argument("--kind", choices=OPTIMIZERS, default="adamw")
    ap.add_argument("--ckpt", choices=["on", "off"], default="on")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    from memq import agent

    opts = {"history": "on"} if a.job == "optim" else {}  # the optimizer table needs frames for memq's count
    agent.start(run=a.name, cluster=a.cluster, spool_dir=a.spool, redis_url="redis://127.0.0.1:1/0",
                model="GPT", optimizer=a.kind if a.job == "optim" else "AdamW", **opts)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    res = {"job": a.job, "name": a.name, "outcome": "completed", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(dev), "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}
    if a.job == "optim":
        res["kind"] = a.kind
    t0 = time.time()
    try:
        {"optim": job_optim, "ckpt": job_ckpt, "empty_cache": job_empty_cache}[a.job](a, agent, res, dev)
    finally:
        res["secs"] = round(time.time() - t0, 1)
        res["agent_counters"] = agent.stop()
        with open(a.result, "w") as fh:
            json.dump(res, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
