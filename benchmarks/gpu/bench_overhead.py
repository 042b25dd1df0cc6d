"""The agent's overhead at DEFAULT settings on the ~120M GPT step (gpt_agent_train.py), and each new
trigger's cost. One process, interleaved blocks: `off` (no agent call at all: the optimizer hook
removed, no mark_step, recording paused) and `agent` (mark_step after every step, the agent at
defaults: boundary readings, decisions, comparable snapshots every 100 steps, stats every 10 s).
MEAN step time from block wall times (synchronised at block ends); paired differences per round give
the 95% interval. Then: per-call costs (boundary reading, a whole mark_step, a comparable snapshot in
the training thread) and what a recording window costs per step (blocks recorded vs not).

    python bench_overhead.py --out DIR [--rounds 150 --block 10 --deadline-s 240]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)


def ci95(xs):
    return 1.96 * statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--deadline-s", type=float, default=240)
    ap.add_argument("--window-rounds", type=int, default=16)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--no-ckpt", action="store_true", help="no activation checkpointing (a GPU-bound step)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    t_start = time.monotonic()
    import gpt_agent_train as train
    import torch

    from memq import agent

    dev = torch.device("cuda", 0)
    a = agent.start(run="ad-bench", cluster="h200")
    model, opt = train.make(dev)
    model.ckpt = not args.no_ckpt
    data = [train.batch(args.batch, args.seq, dev) for _ in range(4)]
    step = 0
    for _ in range(30):  # warm-up: kernels, cuBLAS; the agent's recorded warm-up steps happen here
        train.train_step(model, opt, *data[step % 4])
        agent.mark_step(step, 0, tokens=args.batch * args.seq)
        step += 1
    torch.cuda.synchronize()
    times = {"off": [], "agent": []}
    mark_costs = []
    rounds_done = 0
    budget = args.deadline_s * 0.75
    for r in range(args.rounds):
        if time.monotonic() - t_start > budget:
            break
        for mode in (("off", "agent") if r % 2 == 0 else ("agent", "off")):
            if mode == "off":
                if a.triggers.hook_handle is not None:
                    a.triggers.hook_handle.remove()
                    a.triggers.hook_handle = None
                if a.recording:
                    a.recorder.apply_history(False)
            else:
                a.triggers.install_step_hook()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.block):
                train.train_step(model, opt, *data[step % 4])
                if mode == "agent":
                    c0 = time.perf_counter()
                    agent.mark_step(step, 0, tokens=args.batch * args.seq)
                    mark_costs.append(time.perf_counter() - c0)
                step += 1
            torch.cuda.synchronize()
            times[mode].append((time.perf_counter() - t0) / args.block)
        rounds_done += 1
    off, on = statistics.fmean(times["off"]), statistics.fmean(times["agent"])
    diffs = [(b - o) / off for o, b in zip(times["off"], times["agent"], strict=True)]
    res = {"config": {"batch": args.batch, "seq": args.seq, "ckpt": not args.no_ckpt},
           "rounds": rounds_done, "block": args.block, "steps_per_mode": rounds_done * args.block,
           "mean_step_ms_off": off * 1e3, "mean_step_ms_agent": on * 1e3,
           "overhead_mean_pct": (on / off - 1) * 100,
           "overhead_paired_mean_pct": statistics.fmean(diffs) * 100,
           "overhead_paired_ci95_pct": (ci95(diffs) or 0) * 100,
           "block_sd_pct_off": statistics.stdev(times["off"]) / off * 100,
           "mark_step_us_mean": statistics.fmean(mark_costs) * 1e6,
           "mark_step_us_median": statistics.median(mark_costs) * 1e6,
           "mark_step_us_p99": sorted(mark_costs)[int(0.99 * len(mark_costs))] * 1e6,
           "mark_step_us_max": max(mark_costs) * 1e6,
           "stride": a.recorder.reading.stride, "figures": len(a.tracker.figures),
           "policy": a.policy.reason, "recording_at_end": bool(a.recording),
           "block_ms_off": [round(x * 1e3, 3) for x in times["off"]],
           "block_ms_agent": [round(x * 1e3, 3) for x in times["agent"]]}
    print("BENCH", json.dumps({k: v for k, v in res.items() if not k.startswith("block_ms")}), flush=True)
    # per-call costs
    src = a.source
    n = 2000
    c0 = time.perf_counter()
    for _ in range(n):
        src.step_signals(reset=False)
    res["boundary_reading_us"] = (time.perf_counter() - c0) / n * 1e6
    c0 = time.perf_counter()
    for _ in range(n):
        src.step_signals(reset=True)
    res["boundary_reading_with_peak_reset_us"] = (time.perf_counter() - c0) / n * 1e6
    torch.cuda.synchronize()
    tl = []
    for i in range(n):  # mark_step in a tight loop (no training between): its own Python cost, warm caches
        c0 = time.perf_counter()
        agent.mark_step(step + i, 0, tokens=args.batch * args.seq)
        tl.append(time.perf_counter() - c0)
    step += n
    res["mark_step_tight_loop_us_mean"] = statistics.fmean(tl) * 1e6
    res["mark_step_tight_loop_us_median"] = statistics.median(tl) * 1e6
    c0 = time.perf_counter()
    for _ in range(200):
        torch.cuda.memory_stats(dev)
    res["memory_stats_us"] = (time.perf_counter() - c0) / 200 * 1e6
    c0 = time.perf_counter()
    for _ in range(200):
        torch.cuda.memory_allocated(dev)
        torch.cuda.max_memory_allocated(dev)
    res["memory_allocated_plus_max_us"] = (time.perf_counter() - c0) / 200 * 1e6
    snaps = []
    for _ in range(10):
        torch.cuda.synchronize()
        c0 = time.perf_counter()
        a.take_snapshot("periodic", payload={"reason": "bench"}, comparable=True, at_boundary=True)
        snaps.append(time.perf_counter() - c0)
    res["comparable_snapshot_ms_training_thread"] = statistics.median(snaps) * 1e3
    a.flush(30)
    # a recording window: what each recorded step costs (interleaved recorded / paused blocks)
    win = {"off": [], "rec": []}
    for r in range(args.window_rounds):
        if time.monotonic() - t_start > args.deadline_s * 0.95:
            break
        for mode in (("off", "rec") if r % 2 == 0 else ("rec", "off")):
            a.recorder.apply_history(mode == "rec")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.block):
                train.train_step(model, opt, *data[step % 4])
                step += 1
            torch.cuda.synchronize()
            win[mode].append((time.perf_counter() - t0) / args.block)
    a.recorder.apply_history(False)
    if win["off"] and len(win["off"]) == len(win["rec"]):
        wd = [(b - o) / o for o, b in zip(win["off"], win["rec"], strict=True)]
        res["window_recorded_step_overhead_pct"] = statistics.fmean(wd) * 100
        res["window_recorded_step_ci95_pct"] = (ci95(wd) or 0) * 100
        res["window_rounds"] = len(wd)
    res["env"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0)}
    res["counters"] = agent.stop(30)
    with open(os.path.join(args.out, "overhead.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print("OVERHEAD", json.dumps({k: v for k, v in res.items() if not k.startswith("block_ms")}), flush=True)


if __name__ == "__main__":
    main()
