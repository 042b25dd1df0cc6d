"""memq agent on a GPU: real OOM through the one-line agent, overhead at default settings, trigger costs.

Run on the H200 (not CI):  python benchmarks/gpu/agent_gpu.py --out DIR [--rounds 16 --block 60]

1. oom: `gpt_agent_train.py --oom-fraction 0.12` in a child process: the agent (one line, defaults,
   spooling to DIR/spool_oom because that machine has no Redis) sees a real OutOfMemoryError; the
   error must reach the script unchanged (the child dies with the usual traceback).
2. degrade: the same agent under PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (no snapshots,
   stats only, nothing raised).
3. bench: the ~120M GPT training step (bf16, batch 32 x 256, activation checkpointing, AdamW) without
   and with the agent at default settings, interleaved blocks of steps in one process; MEAN step time
   from block wall times (sync at block ends), so a duty cycle cannot hide in a median.
4. frames: after the agent paused recording, do parameter / gradient / optimizer-state blocks keep
   their frames? Does a ring buffer survive the pause?
5. triggers: cost of one snapshot (in the training thread) and of its serialization (agent thread)
   at 8,000 and 100,000 trace entries with stacks="python", of a segments-only snapshot, of
   memory_stats() and mem_get_info().
Results: DIR/agent_gpu.json and a summary on stdout.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import pickle
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)


def run_child(args, env_extra=None, timeout=300):
    env = dict(os.environ, PYTHONUNBUFFERED="1", **(env_extra or {}))
    t0 = time.time()
    p = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)
    return {"rc": p.returncode, "secs": round(time.time() - t0, 1), "stdout_tail": p.stdout[-3000:],
            "stderr_tail": p.stderr[-3000:]}


def part_oom(out):
    r = run_child([os.path.join(HERE, "gpt_agent_train.py"), "--name", "gpu-oom", "--spool",
                   os.path.join(out, "spool_oom"), "--epochs", "2", "--steps", "8", "--oom-fraction", "0.12"])
    r["oom_reached_user"] = r["rc"] != 0 and "torch.OutOfMemoryError" in r["stderr_tail"] \
        and "CUDA out of memory" in r["stderr_tail"]
    return r


def part_degrade(out):
    code = (
        "import torch, time\n"
        "from memq import agent\n"
        f"a = agent.start(run='gpu-async', cluster='h200', spool_dir={os.path.join(out, 'spool_async')!r})\n"
        "x = torch.randn(4096, 4096, device='cuda')\n"
        "for i in range(20):\n"
        "    y = x @ x; agent.mark_step(i, 0)\n"
        "agent.mark_epoch(0)\n"
        "t=time.perf_counter(); ok = agent.snapshot(); dt=time.perf_counter()-t\n"
        "print('backend', torch.cuda.get_allocator_backend(), 'snapshot', ok, 'ms', dt*1e3)\n"
        "print('counters', agent.stop())\n")
    return run_child(["-c", code], {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, timeout=120)


def part_bench(out, rounds, block, torch, train):
    from memq import agent

    device = torch.device("cuda", 0)
    a = agent.start(run="gpu-bench", cluster="h200", spool_dir=os.path.join(out, "spool_bench"))
    model, opt = train.make(device)
    data = [train.batch(32, 256, device) for _ in range(4)]
    step = 0
    warm = []
    for _ in range(10):  # warm-up: cuBLAS/cuDNN init; the agent's 3 recorded warm-up steps happen here
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train.train_step(model, opt, *data[step % 4])
        agent.mark_step(step, 0)
        torch.cuda.synchronize()
        warm.append(time.perf_counter() - t0)
        step += 1
    times = {"off": [], "agent": []}
    recorded_steps = 0
    for r in range(rounds):
        for mode in (("off", "agent") if r % 2 == 0 else ("agent", "off")):
            if mode == "off" and a.recording:
                a.recorder.apply_history(False)  # the baseline records nothing
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(block):
                train.train_step(model, opt, *data[step % 4])
                if mode == "agent":
                    agent.mark_step(step, 0)
                    recorded_steps += bool(a.recording)
                step += 1
            torch.cuda.synchronize()
            times[mode].append((time.perf_counter() - t0) / block)
    off, on = statistics.fmean(times["off"]), statistics.fmean(times["agent"])
    ratios = [b / o for o, b in zip(times["off"], times["agent"], strict=True)]
    diffs = [(b - o) / off for o, b in zip(times["off"], times["agent"], strict=True)]
    half = 1.96 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    res = {"rounds": rounds, "block": block, "steps_per_mode": rounds * block,
           "mean_step_ms_off": off * 1e3, "mean_step_ms_agent": on * 1e3,
           "overhead_mean_pct": (on / off - 1) * 100,
           "overhead_paired_mean_pct": statistics.fmean(diffs) * 100,
           "overhead_paired_ci95_pct": half * 100 if half is not None else None,
           "overhead_per_round_pct": [round((x - 1) * 100, 3) for x in ratios],
           "overhead_round_sd_pct": statistics.stdev(ratios) * 100 if len(ratios) > 1 else None,
           "median_block_ms_off": statistics.median(times["off"]) * 1e3,
           "median_block_ms_agent": statistics.median(times["agent"]) * 1e3,
           "recorded_steps_in_agent_blocks": recorded_steps, "warmup_step_ms": [round(w * 1e3, 2) for w in warm],
           "agent_policy": a.policy.reason, "counters_before_stop": a.counters()}
    # frames after the pause: parameters, gradients, optimizer state were allocated while recording
    if a.recording:
        a.recorder.apply_history(False)
    snap = torch.cuda.memory._snapshot()
    res["frames_after_pause"] = frames_report(snap, model, opt)
    res["trace_entries_while_paused"] = sum(len(t) for t in snap.get("device_traces", []))
    epoch_t0 = time.perf_counter()
    agent.mark_epoch(0)
    res["mark_epoch_ms"] = (time.perf_counter() - epoch_t0) * 1e3
    res["agent_counters"] = agent.stop(30)
    return res, model, opt


def frames_report(snap, model, opt):
    """Active bytes with and without frames, and the bytes of parameter / optimizer-state blocks."""
    import torch

    param_ptrs = {p.data_ptr() for p in model.parameters()}
    grad_ptrs = {p.grad.data_ptr() for p in model.parameters() if p.grad is not None}
    state_ptrs = {t.data_ptr() for st in opt.state.values() for t in st.values() if torch.is_tensor(t) and t.is_cuda}
    out = {k: {"bytes": 0, "with_frames": 0} for k in ("active", "parameters", "gradients", "optimizer_state")}
    for seg in snap["segments"]:
        for b in seg["blocks"]:
            if b["state"] != "active_allocated":
                continue
            has = bool(b.get("frames"))
            kinds = ["active"]
            if b["address"] in param_ptrs:
                kinds.append("parameters")
            if b["address"] in grad_ptrs:
                kinds.append("gradients")
            if b["address"] in state_ptrs:
                kinds.append("optimizer_state")
            for k in kinds:
                out[k]["bytes"] += b["size"]
                out[k]["with_frames"] += b["size"] if has else 0
    for v in out.values():
        v["pct_with_frames"] = round(100 * v["with_frames"] / v["bytes"], 1) if v["bytes"] else None
    return out


def part_triggers(torch, train, model, opt):
    device = torch.device("cuda", 0)
    mem = torch.cuda.memory
    data = train.batch(32, 256, device)
    res = {}

    def timed(fn, n=5):
        ts = []
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            v = fn()
            ts.append(time.perf_counter() - t0)
        return statistics.median(ts) * 1e3, v

    res["memory_stats_ms"], _ = timed(lambda: torch.cuda.memory_stats(device), 20)
    res["mem_get_info_ms"], _ = timed(lambda: torch.cuda.mem_get_info(device), 20)
    mem._record_memory_history(enabled=None)
    mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=1, clear_history=True)
    mem._record_memory_history(enabled=None)
    ms, s = timed(lambda: mem._snapshot(), 10)
    res["segments_only"] = {"snapshot_ms": ms, "pickle_bytes": len(pickle.dumps(s, 4))}
    for n in (8_000, 100_000):
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=n, clear_history=True)
        steps = 0
        while True:
            train.train_step(model, opt, *data)
            steps += 1
            torch.cuda.synchronize()
            if steps == 1:
                per = max(1, len(mem._snapshot()["device_traces"][0]))
                need = n // per + 2
            if steps >= need:
                break
        ms, s = timed(lambda: mem._snapshot(), 3)  # recording still on: the trace is there
        entries = len(s["device_traces"][0])
        t0 = time.perf_counter()
        data_bytes = pickle.dumps(s, 4)
        t_pickle = time.perf_counter() - t0
        t0 = time.perf_counter()
        hashlib.sha256(data_bytes).hexdigest()
        t_sha = time.perf_counter() - t0
        t0 = time.perf_counter()
        gz = gzip.compress(data_bytes, compresslevel=6)
        t_gz = time.perf_counter() - t0
        zs = None
        try:
            import zstandard

            t0 = time.perf_counter()
            zs = (len(zstandard.ZstdCompressor(level=3).compress(data_bytes)), (time.perf_counter() - t0) * 1e3)
        except ImportError:
            pass
        t0 = time.perf_counter()
        mem._record_memory_history(enabled=None)
        t_off = time.perf_counter() - t0
        kept = len(mem._snapshot()["device_traces"][0])
        t0 = time.perf_counter()
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=n)
        t_on = time.perf_counter() - t0
        back = len(mem._snapshot()["device_traces"][0])
        mem._record_memory_history(enabled=None)
        res[f"entries_{n}"] = {"trace_entries": entries, "entries_per_step": per, "steps_recorded": steps,
                               "snapshot_ms_training_thread": ms, "pickle_ms": t_pickle * 1e3,
                               "sha256_ms": t_sha * 1e3, "gzip_ms": t_gz * 1e3, "pickle_bytes": len(data_bytes),
                               "gzip_bytes": len(gz), "zstd": zs, "pause_ms": t_off * 1e3, "resume_ms": t_on * 1e3,
                               "trace_entries_after_pause": kept, "trace_entries_after_resume": back}
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--parts", default="oom,degrade,bench,triggers")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    parts = args.parts.split(",")
    results = {"argv": sys.argv}
    path = os.path.join(args.out, "agent_gpu.json")

    def save():
        with open(path, "w") as fh:
            json.dump(results, fh, indent=1, default=str)

    if "oom" in parts:
        results["oom"] = part_oom(args.out)
        print("OOM:", {k: v for k, v in results["oom"].items() if "tail" not in k}, flush=True)
        print(results["oom"]["stderr_tail"][-1500:], flush=True)
        save()
    if "degrade" in parts:
        results["degrade"] = part_degrade(args.out)
        print("DEGRADE:", results["degrade"], flush=True)
        save()
    import gpt_agent_train as train
    import torch

    results["env"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
                      "python": sys.version.split()[0]}
    if "bench" in parts:
        bench, model, opt = part_bench(args.out, args.rounds, args.block, torch, train)
        results["bench"] = bench
        print("BENCH:", json.dumps({k: v for k, v in bench.items() if k != "overhead_per_round_pct"}, default=str),
              flush=True)
        save()
    else:
        model, opt = train.make(torch.device("cuda", 0))
    if "triggers" in parts:
        results["triggers"] = part_triggers(torch, train, model, opt)
        print("TRIGGERS:", json.dumps(results["triggers"]), flush=True)
        save()


if __name__ == "__main__":
    main()
