"""A ~120M-parameter GPT trained with the memq agent started in one line (GPU only, not CI).

12 layers, d=768, 12 heads, vocabulary 45,000 (tied embeddings), bf16 autocast, activation
checkpointing per block, AdamW, batch 32 x 256 random tokens.

    python gpt_agent_train.py --name R --spool DIR [--epochs 2 --steps 10] [--oom-fraction 0.12]
    torchrun --nproc_per_node 2 gpt_agent_train.py --ddp ...
    memq run --run R --cluster C -- python gpt_agent_train.py --no-agent-line ...   (no code change)

With --oom-fraction F the per-process memory fraction is set to F and, after the normal epochs, the
batch doubles every step until the allocator raises OutOfMemoryError, which is NOT caught: the
process ends with the user's OOM, unchanged, and the agent's snapshot is in the spool.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, vocab=45_000, d=768, layers=12, heads=12, ctx=1024, ckpt=True):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight
        self.ckpt = ckpt

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=False) if self.ckpt and self.training else blk(x)
        return self.head(self.ln(x))


def make(device, ddp=False):
    model = GPT().to(device)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return model, opt


def train_step(model, opt, x, y):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.view(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def batch(b, t, device, vocab=45_000):
    x = torch.randint(0, vocab, (b, t), device=device)
    return x, torch.roll(x, -1, dims=1)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="gpt-agent", help="run name (not --run: torchrun would take it)")
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--spool", default=None)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--oom-fraction", type=float, default=0.0)
    ap.add_argument("--ddp", action="store_true")
    ap.add_argument("--no-agent-line", action="store_true", help="the agent comes from `memq run` instead")
    args = ap.parse_args(argv)

    if not args.no_agent_line:
        from memq import agent

        # the one line a user adds (spool_dir only because this machine has no Redis):
        agent.start(run=args.name, cluster=args.cluster, spool_dir=args.spool)
    from memq import agent

    local = int(os.environ.get("LOCAL_RANK", "0"))
    if args.ddp:
        torch.cuda.set_device(local)
        torch.distributed.init_process_group("nccl")
    device = torch.device("cuda", local)
    if args.oom_fraction:
        torch.cuda.set_per_process_memory_fraction(args.oom_fraction, device)
    model, opt = make(device, args.ddp)
    step = 0
    t0 = time.time()
    for epoch in range(args.epochs):
        for _ in range(args.steps):
            x, y = batch(args.batch, args.seq, device)
            loss = train_step(model, opt, x, y)
            agent.mark_step(step, epoch)
            step += 1
        agent.mark_epoch(epoch)
        print(f"rank {local} epoch {epoch} loss {loss.item():.3f} {time.time() - t0:.1f}s", flush=True)
    if args.oom_fraction:
        b = args.batch
        while True:  # a growing batch (say, a longer sequence bucket) until the allocator refuses
            b *= 2
            print(f"batch {b} x {args.seq} (~{b * args.seq * 45_000 * 6 / 2**30:.1f} GiB of logits)", flush=True)
            x, y = batch(b, args.seq, device)
            train_step(model, opt, x, y)  # the OutOfMemoryError propagates to the user, unchanged
            agent.mark_step(step, args.epochs)
            step += 1
            if b > 1 << 16 or math.isinf(b):
                break
    c = agent.stop()
    print(f"rank {local} agent counters {c}", flush=True)
    if args.ddp:
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
