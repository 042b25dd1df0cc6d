"""Ten model families for `memq fit`, beyond the five of fit.py: real training runs on one H200 at
several batch sizes (and lengths), each family's largest batch bisected under a cap, in one command.

    python3 fit_families.py all --out DIR [--only a,b] [--budget 300] [--parallel 8] [--recordings-only]
    python3 fit_families.py job FAMILY --batch B --size S --result R.json [--record defaults|hand --spool DIR]
                                [--cap-bytes N]
    python3 fit_families.py split          (which families tune the interval and which are held back)

Every family is plain torch written here (no downloads, no torchvision), trains STEPS steps of random
data per run, in its own process:
| family | what | precision | optimizer | base |
|---|---|---|---|---|
| resnet_bn | ResNet-like, bottleneck blocks with BatchNorm, 128 px | fp32 | SGD momentum | 16 images |
| vit_bf16 | ViT (16 px patches, 224 px, d 512 x 8) | bf16 autocast | AdamW | 8 images |
| vit_ckpt | ViT (d 384 x 8), activation checkpointing per block | fp32 | AdamW | 16 images |
| bert_mlm | BERT-like encoder (d 512 x 6, vocabulary 30,522), MLM on 15% | fp32 | AdamW | 16 x 128 |
| gpt_compile | GPT-like decoder (d 512 x 6, vocabulary 32,000), torch.compile | bf16 autocast | AdamW | 8 x 256 |
| moe_lm | decoder with a top-2 routed FFN (8 experts), d 384 x 4 | fp32 | AdamW | 8 x 256 |
| unet_diff | diffusion UNet, 64 px, GroupNorm res blocks, attention at 16 px | bf16 autocast | AdamW | 8 images |
| lora_gpt | GPT d 768 x 8, base frozen, rank-16 LoRA adapters trained | bf16 autocast | AdamW | 4 x 256 |
| lstm_lm | 2-layer LSTM LM (cuDNN), hidden 1024 | fp32 | Adam | 16 x 128 |
| seq2seq | nn.Transformer encoder-decoder (d 512, 4 + 4 layers) | fp32 | AdamW | 16 x 128 |

Per family, in this order (jobs of one stage in parallel, at most --parallel processes on the GPU):
1. the base shape recorded twice: with the agent at its defaults (`agent.start`, `mark_step(tokens=)`,
   `mark_epoch`; spool in DIR/spools/FAMILY/defaults) and by hand (`_record_memory_history` before the
   model is built, `_snapshot()` after the last step, pickled (frames interned) to
   DIR/hand/FAMILY.pickle.gz); and without
   either, at 1x, 2x, 4x and 8x the batch (2x and 4x the length for the sequence families), measuring
   `max_memory_reserved()`/`max_memory_allocated()` of the whole run: the real peaks;
2. the cap halfway between the 4x and 8x runs' peak reserved, and the largest batch that trains under it,
   bisected between 4x and 8x, up to three capped processes a round placed around the straight line
   through the 4x and 8x peaks; then the answer and the next batch both run under the cap.
Uncapped runs (not the two recordings) are fenced at FENCE_BYTES (set_per_process_memory_fraction) so
that parallel processes cannot take each other's memory: a run that reaches the fence is an OOM at the
fence, noted as such.
Results: DIR/summary.json, rewritten after every job (a cut-short run keeps what it finished);
DIR/results/*.json one per job; `split` in the summary says which families tune and which are held back.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import heapq
import itertools
import json
import math
import os
import pickle
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from job_process import run_job_process  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 6
FENCE_BYTES = 16 << 30
GiB = 1 << 30

# family: base batch, base size (sequence length or image side), length ladder, precision, notes
FAMILIES = {
    "resnet_bn": dict(batch=16, size=128, seq=False, bf16=False, ckpt=False, compile=False, opt="sgd_momentum"),
    "vit_bf16": dict(batch=8, size=224, seq=False, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "vit_ckpt": dict(batch=16, size=224, seq=False, bf16=False, ckpt=True, compile=False, opt="adamw"),
    "bert_mlm": dict(batch=16, size=128, seq=True, bf16=False, ckpt=False, compile=False, opt="adamw"),
    "gpt_compile": dict(batch=8, size=256, seq=True, bf16=True, ckpt=False, compile=True, opt="adamw"),
    "moe_lm": dict(batch=8, size=256, seq=True, bf16=False, ckpt=False, compile=False, opt="adamw"),
    "unet_diff": dict(batch=8, size=64, seq=False, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "lora_gpt": dict(batch=4, size=256, seq=True, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "lstm_lm": dict(batch=16, size=128, seq=True, bf16=False, ckpt=False, compile=False, opt="adam"),
    "seq2seq": dict(batch=16, size=128, seq=True, bf16=False, ckpt=False, compile=False, opt="adamw"),
}


def split(names=None) -> dict[str, list[str]]:
    """Fixed before any result: the families ordered by sha256 of their name; the first half tunes the
    interval, the second half is held back to report its coverage."""
    names = sorted(names or FAMILIES, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    half = (len(names) + 1) // 2
    return {"tuning": sorted(names[:half]), "held_back": sorted(names[half:]),
            "rule": "families ordered by sha256(name) hex digest; the first half tunes, the rest is held back"}


# ---------------------------------------------------------------- models (torch only inside the job)
def build(name: str, size: int):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    class Attn(nn.Module):
        def __init__(self, d, heads, causal):
            super().__init__()
            self.qkv, self.proj, self.heads, self.causal = nn.Linear(d, 3 * d), nn.Linear(d, d), heads, causal

        def forward(self, x):
            b, t, d = x.shape
            q, k, v = self.qkv(x).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
            return self.proj(y.transpose(1, 2).reshape(b, t, d))

    class MoE(nn.Module):
        def __init__(self, d, experts=8, top=2):
            super().__init__()
            self.gate = nn.Linear(d, experts, bias=False)
            self.fc = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(experts))
            self.out = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(experts))
            self.top = top

        def forward(self, x):
            b, t, d = x.shape
            flat = x.reshape(-1, d)
            w, idx = F.softmax(self.gate(flat), dim=-1).topk(self.top, dim=-1)
            w = w / w.sum(-1, keepdim=True)
            y = torch.zeros_like(flat)
            for e in range(len(self.fc)):
                tok, slot = (idx == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                h = self.out[e](F.gelu(self.fc[e](flat[tok])))
                y = y.index_add(0, tok, h * w[tok, slot].unsqueeze(1))
            return y.view(b, t, d)

    class Block(nn.Module):
        def __init__(self, d, heads, causal=True, moe=False):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = Attn(d, heads, causal)
            self.mlp = MoE(d) if moe else nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class Transformer(nn.Module):
        """Token (or patch) embedding, blocks, head; optional checkpointing per block."""

        def __init__(self, vocab, d, layers, heads, causal, ctx, out, moe=False, ckpt=False, patch=0):
            super().__init__()
            self.patch = nn.Conv2d(3, d, patch, stride=patch) if patch else None
            self.tok = None if patch else nn.Embedding(vocab, d)
            self.cls = nn.Parameter(torch.zeros(1, 1, d)) if patch else None
            self.pos = nn.Parameter(torch.randn(1, ctx, d) * 0.02)
            self.blocks = nn.ModuleList(Block(d, heads, causal, moe) for _ in range(layers))
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, out, bias=False)
            self.ckpt = ckpt

        def body(self, x):
            for blk in self.blocks:
                x = checkpoint(blk, x, use_reentrant=False) if self.ckpt else blk(x)
            return self.ln(x)

        def forward(self, x):
            if self.patch is not None:
                x = self.patch(x).flatten(2).transpose(1, 2)
                x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1)
            else:
                x = self.tok(x)
            return self.body(x + self.pos[:, : x.shape[1]])

    class Bottleneck(nn.Module):
        def __init__(self, cin, mid, stride):
            super().__init__()
            cout = mid * 4
            self.c1, self.b1 = nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid)
            self.c2, self.b2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid)
            self.c3, self.b3 = nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout)
            self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else nn.Identity())

        def forward(self, x):
            y = F.relu(self.b1(self.c1(x)))
            y = F.relu(self.b2(self.c2(y)))
            return F.relu(self.b3(self.c3(y)) + self.down(x))

    class ResNet(nn.Module):
        def __init__(self, depths=(2, 3, 3, 2), classes=1000):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks, cin = [], 64
            for i, (n, mid) in enumerate(zip(depths, (64, 128, 256, 512), strict=True)):
                for j in range(n):
                    blocks.append(Bottleneck(cin, mid, 2 if (j == 0 and i > 0) else 1))
                    cin = mid * 4
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, classes)

        def forward(self, x):
            return self.fc(self.blocks(self.stem(x)).mean((2, 3)))

    class Res(nn.Module):
        def __init__(self, cin, cout, tdim):
            super().__init__()
            self.n1, self.c1 = nn.GroupNorm(32, cin), nn.Conv2d(cin, cout, 3, padding=1)
            self.t = nn.Linear(tdim, cout)
            self.n2, self.c2 = nn.GroupNorm(32, cout), nn.Conv2d(cout, cout, 3, padding=1)
            self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

        def forward(self, x, temb):
            h = self.c1(F.silu(self.n1(x))) + self.t(temb)[:, :, None, None]
            return self.skip(x) + self.c2(F.silu(self.n2(h)))

    class SelfAttn2d(nn.Module):
        def __init__(self, c, heads=4):
            super().__init__()
            self.n, self.attn = nn.GroupNorm(32, c), Attn(c, heads, False)

        def forward(self, x):
            b, c, h, w = x.shape
            y = self.attn(self.n(x).flatten(2).transpose(1, 2))
            return x + y.transpose(1, 2).reshape(b, c, h, w)

    class UNet(nn.Module):
        def __init__(self, ch=(64, 128, 256), tdim=256):
            super().__init__()
            self.tdim = tdim
            self.temb = nn.Sequential(nn.Linear(tdim, tdim), nn.SiLU(), nn.Linear(tdim, tdim))
            self.inp = nn.Conv2d(3, ch[0], 3, padding=1)
            self.down, self.pool = nn.ModuleList(), nn.ModuleList()
            c = ch[0]
            for i, co in enumerate(ch):
                self.down.append(nn.ModuleList([Res(c, co, tdim), Res(co, co, tdim)]))
                c = co
                self.pool.append(nn.Conv2d(c, c, 3, 2, 1) if i < len(ch) - 1 else nn.Identity())
            self.mid1, self.mid_attn, self.mid2 = Res(c, c, tdim), SelfAttn2d(c), Res(c, c, tdim)
            self.up, self.ups = nn.ModuleList(), nn.ModuleList()
            for i, co in reversed(list(enumerate(ch))):
                self.up.append(nn.ModuleList([Res(c + co, co, tdim), Res(co, co, tdim)]))
                c = co
                self.ups.append(nn.Upsample(scale_factor=2) if i > 0 else nn.Identity())
            self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

        def forward(self, x, t):
            half = self.tdim // 2
            f = torch.exp(-math.log(10_000) * torch.arange(half, device=x.device) / half)
            temb = self.temb(torch.cat([torch.sin(t[:, None] * f), torch.cos(t[:, None] * f)], 1))
            h, skips = self.inp(x), []
            for (r1, r2), pool in zip(self.down, self.pool, strict=True):
                h = r2(r1(h, temb), temb)
                skips.append(h)
                h = pool(h)
            h = self.mid2(self.mid_attn(self.mid1(h, temb)), temb)
            for (r1, r2), up in zip(self.up, self.ups, strict=True):
                h = r2(r1(torch.cat([h, skips.pop()], 1), temb), temb)
                h = up(h)
            return self.out(h)

    class LoRALinear(nn.Module):
        def __init__(self, base: nn.Linear, r=16, alpha=32):
            super().__init__()
            self.base = base
            self.a = nn.Parameter(torch.randn(r, base.in_features) * 0.01)
            self.b = nn.Parameter(torch.zeros(base.out_features, r))
            self.scale = alpha / r

        def forward(self, x):
            return self.base(x) + (x @ self.a.t() @ self.b.t()) * self.scale

    class LSTMLM(nn.Module):
        def __init__(self, vocab=16_000, emb=512, hidden=1024):
            super().__init__()
            self.emb = nn.Embedding(vocab, emb)
            self.rnn = nn.LSTM(emb, hidden, num_layers=2, batch_first=True)
            self.head = nn.Linear(hidden, vocab)

        def forward(self, x):
            return self.head(self.rnn(self.emb(x))[0])

    class Seq2Seq(nn.Module):
        def __init__(self, vocab=16_000, d=512):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, 4096, d) * 0.02)
            self.tf = nn.Transformer(d, 8, 4, 4, 4 * d, dropout=0.1, batch_first=True)
            self.head = nn.Linear(d, vocab)

        def forward(self, src, tgt):
            t = tgt.shape[1]
            mask = torch.triu(torch.full((t, t), float("-inf"), device=src.device), 1)
            s = self.emb(src) + self.pos[:, : src.shape[1]]
            y = self.emb(tgt) + self.pos[:, :t]
            return self.head(self.tf(s, y, tgt_mask=mask))

    if name == "resnet_bn":
        return ResNet()
    if name == "vit_bf16":
        m = Transformer(0, 512, 8, 8, False, (size // 16) ** 2 + 1, 1000, patch=16)
        return m
    if name == "vit_ckpt":
        return Transformer(0, 384, 8, 6, False, (size // 16) ** 2 + 1, 1000, patch=16, ckpt=True)
    if name == "bert_mlm":
        return Transformer(30_522, 512, 6, 8, False, 2048, 30_522)
    if name == "gpt_compile":
        return Transformer(32_000, 512, 6, 8, True, 2048, 32_000)
    if name == "moe_lm":
        return Transformer(16_000, 384, 4, 6, True, 2048, 16_000, moe=True)
    if name == "unet_diff":
        return UNet()
    if name == "lora_gpt":
        m = Transformer(32_000, 768, 8, 12, True, 2048, 32_000)
        for p in m.parameters():
            p.requires_grad_(False)
        for blk in m.blocks:
            blk.attn.qkv, blk.attn.proj = LoRALinear(blk.attn.qkv), LoRALinear(blk.attn.proj)
            blk.mlp[0], blk.mlp[2] = LoRALinear(blk.mlp[0]), LoRALinear(blk.mlp[2])
        return m
    if name == "lstm_lm":
        return LSTMLM()
    if name == "seq2seq":
        return Seq2Seq()
    raise ValueError(name)


def step_loss(name: str, model, b: int, size: int, dev):
    """One step's loss on random data of batch b at size (length or image side); returns (loss, tokens)."""
    import torch
    import torch.nn.functional as F

    if name == "resnet_bn":
        x = torch.randn(b, 3, size, size, device=dev)
        return F.cross_entropy(model(x), torch.randint(0, 1000, (b,), device=dev)), b
    if name in ("vit_bf16", "vit_ckpt"):
        x = torch.randn(b, 3, size, size, device=dev)
        h = model(x)
        return F.cross_entropy(model.head(h[:, 0]).float(), torch.randint(0, 1000, (b,), device=dev)), b
    if name == "unet_diff":
        x0 = torch.randn(b, 3, size, size, device=dev)
        t = torch.randint(0, 1000, (b,), device=dev).float()
        noise = torch.randn_like(x0)
        a = (1 - t / 1000).view(b, 1, 1, 1)
        xt = a.sqrt() * x0 + (1 - a).sqrt() * noise
        return F.mse_loss(model(xt, t).float(), noise), b
    if name == "bert_mlm":
        x = torch.randint(0, 30_522, (b, size), device=dev)
        n = max(1, int(0.15 * size))
        pos = torch.rand(b, size, device=dev).argsort(1)[:, :n]  # 15% of each sequence, a fixed count
        h = model(x)
        hm = h.gather(1, pos.unsqueeze(-1).expand(-1, -1, h.shape[-1]))
        logits = model.head(hm)
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), x.gather(1, pos).reshape(-1)), b * size
    if name in ("gpt_compile", "moe_lm", "lora_gpt"):
        vocab = 16_000 if name == "moe_lm" else 32_000
        x = torch.randint(0, vocab, (b, size), device=dev)
        logits = model(x) if name == "gpt_compile" else model.head(model(x))  # compiled: the head inside
        return F.cross_entropy(logits.float().reshape(-1, vocab), torch.roll(x, -1, 1).reshape(-1)), b * size
    if name == "lstm_lm":
        x = torch.randint(0, 16_000, (b, size), device=dev)
        return F.cross_entropy(model(x).reshape(-1, 16_000), torch.roll(x, -1, 1).reshape(-1)), b * size
    if name == "seq2seq":
        src = torch.randint(0, 16_000, (b, size), device=dev)
        tgt = torch.randint(0, 16_000, (b, size), device=dev)
        logits = model(src, tgt)
        return F.cross_entropy(logits.reshape(-1, 16_000), torch.roll(tgt, -1, 1).reshape(-1)), b * size
    raise ValueError(name)


def make_optimizer(spec: dict, params):
    import torch

    params = [p for p in params if p.requires_grad]
    if spec["opt"] == "sgd_momentum":
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if spec["opt"] == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    return torch.optim.AdamW(params, lr=1e-4)


def fake_job(args) -> None:
    """FITFAM_FAKE=1: no torch, no GPU; a peak linear in the batch, OOM over the cap (tests the parent)."""
    peak = int((1 + 0.37 * args.batch * args.size / FAMILIES[args.family]["size"]) * GiB)
    oom = bool(args.cap_bytes) and peak > args.cap_bytes
    if args.record == "hand":
        os.makedirs(os.path.dirname(args.hand_out), exist_ok=True)
        open(args.hand_out, "wb").close()
    with open(args.result, "w") as fh:
        json.dump({"family": args.family, "batch": args.batch, "size": args.size, "fake": True,
                   "outcome": "oom" if oom else "completed", "max_reserved": peak, "max_allocated": peak}, fh)
    sys.exit(1 if oom else 0)


def intern_frames(snap: dict) -> None:
    """The same frame (and the same stack) as one object wherever it occurs, so that the pickle stores
    it once: a stacks="all" trace repeats its C++ frames in every entry (a hundred MB pickled as is).
    The snapshot's content is unchanged."""
    frames: dict = {}
    stacks: dict = {}

    def one(stack):
        key = tuple(tuple(sorted(f.items())) if isinstance(f, dict) else f for f in stack)
        got = stacks.get(key)
        if got is None:
            got = stacks[key] = [frames.setdefault(k, f) if isinstance(f, dict) else f
                                 for k, f in zip(key, stack, strict=True)]
        return got

    for trace in snap.get("device_traces", []):
        for ev in trace:
            if isinstance(ev.get("frames"), list):
                ev["frames"] = one(ev["frames"])
    for seg in snap.get("segments", []):
        for b in seg.get("blocks", []):
            if isinstance(b.get("frames"), list):
                b["frames"] = one(b["frames"])


def run_job(args) -> None:
    if os.environ.get("FITFAM_FAKE"):
        fake_job(args)
    import torch
    import torch.nn as nn

    name, spec = args.family, FAMILIES[args.family]
    dev = torch.device("cuda", 0)
    agent = None
    res = {"family": name, "batch": args.batch, "size": args.size, "outcome": "completed", "record": args.record,
           "torch": torch.__version__, "cudnn": torch.backends.cudnn.version(), "device": torch.cuda.get_device_name(0),
           "precision": "bf16 autocast" if spec["bf16"] else "fp32", "checkpointing": spec["ckpt"],
           "compiled": spec["compile"], "optimizer": spec["opt"], "steps": STEPS,
           "step_peak_reserved": [], "step_peak_allocated": []}
    if args.record == "defaults":
        from memq import agent

        agent.start(run=f"fitfam-{name}-defaults", cluster="h200", spool_dir=args.spool)
    elif args.record == "hand":
        # as a user records by hand: torch's defaults (stacks="all", context="all"), before the model
        # exists; after CUDA is initialised so that older releases do not ignore it
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(max_entries=400_000)
    total = torch.cuda.get_device_properties(0).total_memory
    cap = args.cap_bytes or (0 if args.record else FENCE_BYTES)  # the recordings (base batch) run as a user's
    if cap:
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
        res["cap_bytes" if args.cap_bytes else "fence_bytes"] = int(min(1.0, cap / total) * total)
    torch.manual_seed(0)
    model = build(name, args.size).to(dev)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    res["trainable_param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    opt = make_optimizer(spec, model.parameters())
    fwd = model
    if spec["compile"]:
        class Wrap(nn.Module):  # the compiled body, the head applied inside the compiled graph
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m.head(self.m(x))

        fwd = torch.compile(Wrap(model))
    elif os.environ.get("FITFAM_COMPILE"):
        # any family compiled as a user would: the module's forward (its other submodules, a head called
        # apart, stay eager); benchmarks/gpu/fit_compile_cache.sh's judging set
        fwd = torch.compile(model)
        res["compiled"] = True
    step = 0
    try:
        for step in range(STEPS):
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=spec["bf16"]):
                loss, tokens = step_loss(name, fwd, args.batch, args.size, dev)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
            torch.cuda.synchronize(dev)
            res["step_peak_reserved"].append(torch.cuda.max_memory_reserved(dev))
            res["step_peak_allocated"].append(torch.cuda.max_memory_allocated(dev))
            if agent is not None:
                agent.mark_step(step, 0, tokens=tokens)
        if agent is not None:
            agent.mark_epoch(0)
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", oom_step=step, message=str(exc)[:400],
                   at_fence=not args.cap_bytes)
    finally:
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["max_allocated"] = torch.cuda.max_memory_allocated(dev)
        if args.record == "hand":
            snap = torch.cuda.memory._snapshot()
            torch.cuda.memory._record_memory_history(enabled=None)
            os.makedirs(os.path.dirname(args.hand_out), exist_ok=True)
            t0 = time.time()
            intern_frames(snap)
            with gzip.open(args.hand_out, "wb", compresslevel=6) as fh:
                pickle.dump(snap, fh, protocol=4)
            res.update(hand_snapshot=args.hand_out, hand_bytes=os.path.getsize(args.hand_out),
                       hand_write_s=round(time.time() - t0, 1),
                       hand_entries=sum(len(t) for t in snap.get("device_traces", [])))
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)
        if agent is not None:
            agent.stop()


# ---------------------------------------------------------------- the parent (no torch)
class Slots:
    """At most n job processes at once; waiting jobs start in priority order (lower first)."""

    def __init__(self, n: int):
        self.free, self.cv, self.heap, self.seq = n, threading.Condition(), [], itertools.count()

    def __enter__(self):
        raise TypeError("use acquire(priority)")

    def acquire(self, priority: float):
        with self.cv:
            ticket = (priority, next(self.seq))
            heapq.heappush(self.heap, ticket)
            while not (self.free > 0 and self.heap[0] == ticket):
                self.cv.wait()
            heapq.heappop(self.heap)
            self.free -= 1
            self.cv.notify_all()

    def release(self):
        with self.cv:
            self.free += 1
            self.cv.notify_all()


class Runner:
    def __init__(self, out: str, budget: float, parallel: int):
        self.out, self.t0, self.deadline = out, time.time(), time.time() + budget
        self.slots = Slots(parallel)
        self.recordings_only = False
        self.lock = threading.Lock()
        self.summary: dict = {"split": split(), "steps": STEPS, "fence_bytes": FENCE_BYTES, "families": {}}
        os.makedirs(os.path.join(out, "results"), exist_ok=True)

    def save(self) -> None:
        with self.lock:
            self.summary["elapsed_s"] = round(time.time() - self.t0, 1)
            tmp = os.path.join(self.out, "summary.json.tmp")
            with open(tmp, "w") as fh:
                json.dump(self.summary, fh, indent=1)
            os.replace(tmp, os.path.join(self.out, "summary.json"))

    def job(self, fam: str, batch: int, size: int, record: str = "", cap: int = 0, priority: float = 5) -> dict | None:
        spec = FAMILIES[fam]
        tag = f"{fam}-b{batch}-s{size}" + (f"-{record}" if record else "") + (f"-cap{cap}" if cap else "")
        need = 60 if spec["compile"] else 15
        self.slots.acquire(priority)
        try:
            left = self.deadline - time.time()
            if left < need:
                print(f"[skip] {tag}: budget", flush=True)
                return None
            result = os.path.join(self.out, "results", tag + ".json")
            cmd = [sys.executable, os.path.abspath(__file__), "job", fam, "--batch", str(batch), "--size", str(size),
                   "--result", result, "--cap-bytes", str(cap)]
            if record:
                cmd += ["--record", record, "--spool", os.path.join(self.out, "spools", fam, record),
                        "--hand-out", os.path.join(self.out, "hand", fam + ".pickle.gz")]
            res = run_job_process(cmd, result, min(150 if spec["compile"] or record == "hand" else 90, max(10, left)))
        finally:
            self.slots.release()
        print(f"[{tag}] {res.get('outcome')} reserved={res.get('max_reserved', 0) / GiB:.3f}GiB "
              f"{res['wall_s']}s", flush=True)
        with self.lock:
            self.summary["families"].setdefault(fam, {"spec": spec}).setdefault("runs", {})[tag] = res
        self.save()
        return res

    def stage(self, jobs: list[tuple]) -> list:
        with ThreadPoolExecutor(max_workers=max(1, len(jobs))) as ex:
            return list(ex.map(lambda a: self.job(*a), jobs))

    def family(self, fam: str) -> None:
        spec = FAMILIES[fam]
        b0, s0 = spec["batch"], spec["size"]
        pri = 0 if spec["compile"] else 1  # the slow (compiling) family first
        jobs = [(fam, b0, s0, "defaults", 0, pri), (fam, b0, s0, "hand", 0, pri)]
        if self.recordings_only:
            self.stage(jobs)
            return
        jobs += [(fam, k * b0, s0, "", 0, pri + k / 10) for k in (1, 2, 4, 8)]
        if spec["seq"]:
            jobs += [(fam, b0, k * s0, "", 0, pri + 1 + k / 10) for k in (2, 4)]
        out = self.stage(jobs)
        r4, r8 = out[4], out[5]
        if not (r4 and r8 and r4.get("outcome") == "completed" and r8.get("outcome") == "completed"):
            return
        cap = (r4["max_reserved"] + r8["max_reserved"]) // 2
        lo, hi = 4 * b0, 8 * b0  # lo reserved less than the cap, hi more
        capped: dict[int, str] = {}
        rounds = 0
        while hi - lo > 1 and rounds < 6:
            rounds += 1
            # the straight line through the 4x and 8x peaks says where the cap falls; probe around it
            est = 4 * b0 + (cap - r4["max_reserved"]) / max(1, r8["max_reserved"] - r4["max_reserved"]) * 4 * b0
            span = hi - lo
            d = max(1, span // 8)
            pts = sorted({min(hi - 1, max(lo + 1, int(round(est)) + j * d)) for j in (-1, 0, 1)})
            if span <= 4:
                pts = list(range(lo + 1, hi))[:3]
            res = self.stage([(fam, b, s0, "", cap, 3 + rounds) for b in pts])
            if any(r is None for r in res):
                return
            for b, r in zip(pts, res, strict=True):
                capped[b] = r["outcome"]
            done = [b for b, r in zip(pts, res, strict=True) if r["outcome"] == "completed"]
            oom = [b for b, r in zip(pts, res, strict=True) if r["outcome"] != "completed"]
            if done:
                lo = max(lo, max(done))
            if oom:
                hi = min(hi, min(b for b in oom if b > lo) if any(b > lo for b in oom) else hi)
        confirm = [b for b in (lo, hi) if b not in capped]
        if confirm:
            for b, r in zip(confirm, self.stage([(fam, b, s0, "", cap, 9) for b in confirm]), strict=True):
                if r is not None:
                    capped[b] = r["outcome"]
        with self.lock:
            self.summary["families"][fam]["cap"] = {
                "cap_bytes": cap, "max_batch": lo, "max_batch_outcome": capped.get(lo), "next_outcome": capped.get(hi),
                "probes": {str(b): o for b, o in sorted(capped.items())},
                "monotone": all(o == "completed" for b, o in capped.items() if b <= lo)
                and all(o != "completed" for b, o in capped.items() if b > lo)}
        self.save()


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=300)
    a.add_argument("--parallel", type=int, default=8)
    a.add_argument("--recordings-only", action="store_true",
                   help="only the two recordings of the base shape per family (after a change to the agent)")
    j = sub.add_parser("job")
    j.add_argument("family", choices=sorted(FAMILIES))
    j.add_argument("--batch", type=int, required=True)
    j.add_argument("--size", type=int, required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--record", choices=["defaults", "hand"], default="")
    j.add_argument("--spool", default="/tmp/fitfam_spool")
    j.add_argument("--hand-out", default="/tmp/fitfam_hand.pickle.gz")
    j.add_argument("--cap-bytes", type=int, default=0)
    sub.add_parser("split")
    args = ap.parse_args()
    if args.cmd == "split":
        print(json.dumps(split(), indent=1))
        return
    if args.cmd == "job":
        run_job(args)
        return
    names = [s for s in (args.only.split(",") if args.only else FAMILIES) if s]
    unknown = sorted(set(names) - set(FAMILIES))
    if unknown:
        ap.error(f"unknown families: {', '.join(unknown)}")
    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(args.out, "inductor_cache"))
    # eight jobs share 16 cores: the compiling family's workers no more than a few each
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "4")
    # C++ frames of the hand recordings (stacks="all") symbolised by the dynamic symbol table: the
    # names memq reads (autocast's cast), seconds instead of minutes for a 6-step trace
    os.environ.setdefault("TORCH_SYMBOLIZE_MODE", "dladdr")
    r = Runner(args.out, args.budget, args.parallel)
    r.recordings_only = args.recordings_only
    r.save()
    with ThreadPoolExecutor(max_workers=len(names)) as ex:
        list(ex.map(r.family, names))
    r.save()
    print(f"done in {time.time() - r.t0:.0f}s: {args.out}/summary.json", flush=True)


if __name__ == "__main__":
    main()
