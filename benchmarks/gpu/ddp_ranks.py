"""Two-rank DDP jobs, one balanced and two with one rank unlike the other (GPU only, not CI; issue 18).

Every scenario runs under torchrun (so the launcher's own teardown is what happens: when one rank
fails, torchrun sends SIGTERM to the others), with the memq agent started in one line in each rank and
spooling to disk (the GPU machines reach no Redis). Each rank sets the same per-process memory cap.
- balanced: both ranks train on batches of 32 x 256 tokens; no OOM.
- data:     rank 1's shard holds only long documents (32 x 1024 tokens against 32 x 256 on rank 0):
            rank 1 runs out of memory in its first step; rank 0 is torn down.
- leak:     rank 1 keeps every step's logits (a metrics list filled on rank 1 only): its live bytes
            grow until it runs out of memory; rank 0 stays flat and is torn down.
The model is benchmarks/gpu/gpt_agent_train.py's ~120M GPT (bf16 autocast, checkpointed blocks, AdamW).

On one GPU both ranks share cuda:0 with the gloo backend (each process its own cap); on two or more,
NCCL with one device per rank.

    python3 benchmarks/gpu/ddp_ranks.py --all --out /tmp/ddp_ranks [--fraction 0.10] [--steps 6]
    python3 benchmarks/gpu/ddp_ranks.py --selftest        # no GPU: argument and command checks only

--all writes DIR/<scenario>/spool (the agents' spools, as tests/fixtures/agent_gpu), DIR/<scenario>/log.txt
and DIR/summary.json (each scenario's torchrun exit code and each rank's last lines). The fixture is
the spool folders, replayed in CI through the dispatcher and worker (tests/workers/test_ranks_e2e.py
shows the assertions: failing rank, cause, imbalance kind).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCENARIOS = ("balanced", "data", "leak")


def rank_main(args) -> None:
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(HERE))
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from memq import agent

    # the one line a user adds (spool_dir only because this machine has no Redis)
    agent.start(run=f"ddp-{args.scenario}", cluster=args.cluster, spool_dir=args.spool,
                redis_url="redis://127.0.0.1:1/0")
    from gpt_agent_train import GPT, batch

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    own_device = torch.cuda.device_count() >= world
    dev = torch.device("cuda", local if own_device else 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if own_device else "gloo")
    torch.cuda.set_per_process_memory_fraction(args.fraction, dev)
    model = torch.nn.parallel.DistributedDataParallel(GPT().to(dev), device_ids=[dev.index])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    seq = 1024 if args.scenario == "data" and rank == 1 else 256
    kept = []  # the leak: rank 1 keeps what it should have reduced to a number
    step = 0
    for epoch in range(args.epochs):
        for _ in range(args.steps):
            x, y = batch(args.batch, seq, dev)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if args.scenario == "leak" and rank == 1:
                kept.append(logits.detach())
            agent.mark_step(step, epoch)
            step += 1
        agent.mark_epoch(epoch)
        print(f"rank {rank} epoch {epoch} seq {seq} loss {loss.item():.3f} "
              f"peak {torch.cuda.max_memory_allocated(dev) / 2**30:.2f} GiB", flush=True)
    print(f"rank {rank} agent counters {agent.stop()}", flush=True)
    dist.destroy_process_group()


def torchrun_cmd(scenario: str, spool: Path, a) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", str(Path(__file__).resolve()),
            "--rank-main", "--scenario", scenario, "--spool", str(spool), "--fraction", str(a.fraction),
            "--epochs", str(a.epochs), "--steps", str(a.steps), "--batch", str(a.batch), "--cluster", a.cluster]


def run_all(a) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = {"fraction": a.fraction, "steps": a.steps, "epochs": a.epochs, "batch": a.batch, "scenarios": {}}
    for sc in a.only.split(","):
        d = out / sc
        d.mkdir(exist_ok=True)
        cmd = torchrun_cmd(sc, d / "spool", a)
        t0 = time.time()
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("TORCHELASTIC_RUN_ID", None)  # torchrun's default "none": what users get
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout, env=env, cwd=ROOT)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as exc:
            out, err = (exc.stdout or b"").decode(errors="replace"), (exc.stderr or b"").decode(errors="replace")
            rc, text = "timeout", out + err
        (d / "log.txt").write_text(text)
        lines = [ln for ln in text.splitlines() if ln.startswith("rank ") or "OutOfMemoryError" in ln]
        summary["scenarios"][sc] = {"rc": rc, "secs": round(time.time() - t0, 1), "lines": lines[-12:]}
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        print(sc, rc, f"{time.time() - t0:.0f}s", *lines[-4:], sep="\n  ", flush=True)
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--all", action="store_true", help="run every scenario under torchrun")
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--out", default="/tmp/ddp_ranks")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", choices=SCENARIOS, default="balanced")
    ap.add_argument("--spool")
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--fraction", type=float, default=0.10,
                    help="per-process cap: 0.10 of an H200 (14 GiB) fits 32 x 256 (peak ~7.6 GiB), not 32 x 1024")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--timeout", type=int, default=240)
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    if a.selftest:
        for sc in SCENARIOS:
            cmd = torchrun_cmd(sc, Path("/tmp/x"), a)
            assert cmd[cmd.index("--scenario") + 1] == sc and "--rank-main" in cmd
        assert set(a.only.split(",")) <= set(SCENARIOS)
        print("selftest ok")
        return 0
    if a.rank_main:
        rank_main(a)
        return 0
    if a.all:
        return run_all(a)
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())
