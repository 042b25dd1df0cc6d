"""A fresh held-back set for judging `memq fit`: seven model families that no tuning of the model has
seen (none of the ten of fit_families.py, the four of fit_one_step_capture.py, nor the five in-house
ones), captured on one GPU in one command with the machinery of those two scripts (their models' step
loop, their agent and hand recordings, their step-1 dumps, their ladder and capped bisection).

    python3 fit_fresh.py all --out DIR [--only a,b] [--budget 480] [--parallel 8]
    python3 fit_fresh.py job FAMILY --batch B --size S --result R.json [--record defaults|hand|dump]
                         [--spool DIR] [--hand-out P] [--dump-out P] [--cap-bytes N]
    python3 fit_fresh.py smoke              (every model, one forward and backward on CPU at a tiny shape)

| family | what | precision | optimizer | base |
|---|---|---|---|---|
| effnet_se | EfficientNet-like (MBConv: depthwise, squeeze-excite, SiLU), BN, 128 px | fp32 | SGD mom. | 32 |
| swin_bf16 | Swin-like: 7x7 windows (shifted), relative bias, patch merging, 224 px | bf16 | AdamW | 16 |
| t5_relpos | T5-like encoder-decoder (d 512, 4 + 4), bucketed relative bias, RMSNorm | fp32 | AdamW | 8 x 128 |
| whisper_enc | Whisper-like: 2 conv1d over 80 mel bins (stride 2), encoder d 512 x 6 | bf16 | AdamW | 16 x 800 |
| gqa_lm | decoder LM: GQA (8 heads, 2 kv), SwiGLU, RMSNorm, RoPE, torch.compile | bf16 | AdamW | 8 x 256 |
| gnn_rec | 1M x 128 node table, 2 rounds gather + index_add, degree mean, link score | fp32 | Adam | 4 x 1024 |
| vit_ckpt_bf16 | the ViT of vit_bf16 (d 512 x 8), activation checkpointing per block | bf16 | AdamW | 32 |
(bf16: autocast; base: images, sequences x tokens (mel frames), or subgraphs x nodes)

Per family (jobs in parallel, at most --parallel processes on the GPU; fit_families.Runner's order):
the base shape recorded by the agent at its defaults (DIR/spools/FAM/defaults) and by hand (torch's
defaults, stacks="all"; DIR/hand/FAM.pickle.gz), the step-1 dumps after the first forward and after the
first backward (DIR/dumps/FAM-dump.{forward,backward}.pickle.gz, as fit_one_step_capture.py dumps them),
uncapped runs at 1x, 2x, 4x, 8x the batch (2x, 4x the length for the sequence families), and the
largest batch under a cap halfway between the 4x and 8x peaks, bisected by real capped runs.
DIR/summary.json is rewritten after every job; every family is held back (`split`).

FITFAM_FAKE=1: no torch, no GPU (the parent's orchestration tested): peaks linear in the batch, the
recordings and dumps copied from tests/fixtures (of other families: their numbers mean nothing).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fit_one_step_capture as cap  # noqa: E402  (imports fit_families as ff, adds its four families)

ff = cap.ff
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
GiB = 1 << 30
FRESH = {
    "effnet_se": dict(batch=32, size=128, seq=False, bf16=False, ckpt=False, compile=False, opt="sgd_momentum"),
    "swin_bf16": dict(batch=16, size=224, seq=False, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "t5_relpos": dict(batch=8, size=128, seq=True, bf16=False, ckpt=False, compile=False, opt="adamw"),
    "whisper_enc": dict(batch=16, size=800, seq=True, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "gqa_lm": dict(batch=8, size=256, seq=True, bf16=True, ckpt=False, compile=True, opt="adamw"),
    "gnn_rec": dict(batch=4, size=1024, seq=False, bf16=False, ckpt=False, compile=False, opt="adam"),
    "vit_ckpt_bf16": dict(batch=32, size=224, seq=False, bf16=True, ckpt=True, compile=False, opt="adamw"),
}
# The late set: written after the fresh set was judged and read (its t5_relpos missed at 4x the length),
# to judge what that reading changed on models it never saw: an encoder whose learned relative bias sends
# attention down its math path (the softmax kept, (batch, heads, t, t)), and a decoder whose fixed ALiBi
# bias leaves attention on a fused kernel (no t x t softmax kept: nothing may be read as one).
LATE = {
    "relbias_enc_bf16": dict(batch=8, size=256, seq=True, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "alibi_lm": dict(batch=8, size=256, seq=True, bf16=False, ckpt=False, compile=False, opt="adamw"),
}
SETS = {"fresh": FRESH, "late": LATE}
SEEN = set(ff.FAMILIES) | {"cnn", "gpt_s", "gpt_m", "gpt_ckpt", "gpt_bf16"}
assert not SEEN & (set(FRESH) | set(LATE)), SEEN & (set(FRESH) | set(LATE))
ff.FAMILIES.update(FRESH)
ff.FAMILIES.update(LATE)
ALL = {**FRESH, **LATE}
T5_VOCAB, LM_VOCAB, ASR_VOCAB, GNN_NODES, GNN_EDGES_PER_NODE = 32_128, 32_000, 5_000, 1_000_000, 8
_prev_build, _prev_step_loss = cap.build, cap.step_loss
_compiled: dict[int, object] = {}


def build(name: str, size: int):  # noqa: C901 (one model per branch)
    if name not in ALL:
        return _prev_build(name, size)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if name == "vit_ckpt_bf16":
        m = _prev_build("vit_bf16", size)
        m.ckpt = True
        return m

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.w, self.eps = nn.Parameter(torch.ones(d)), eps

        def forward(self, x):
            return self.w * x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype)

    if name == "effnet_se":
        class MBConv(nn.Module):
            def __init__(self, cin, cout, expand, k, stride):
                super().__init__()
                mid = cin * expand
                self.expand = (nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
                               if expand != 1 else nn.Identity())
                self.dw = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False),
                                        nn.BatchNorm2d(mid), nn.SiLU())
                sq = max(1, cin // 4)
                self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, sq, 1), nn.SiLU(),
                                        nn.Conv2d(sq, mid, 1), nn.Sigmoid())
                self.proj = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
                self.res = stride == 1 and cin == cout

            def forward(self, x):
                y = self.dw(self.expand(x))
                y = self.proj(y * self.se(y))
                return x + y if self.res else y

        class EffNet(nn.Module):
            # EfficientNet-B0's stages: (expand, channels, repeats, stride, kernel)
            STAGES = ((1, 16, 1, 1, 3), (6, 24, 2, 2, 3), (6, 40, 2, 2, 5), (6, 80, 3, 2, 3), (6, 112, 3, 1, 5),
                      (6, 192, 4, 2, 5), (6, 320, 1, 1, 3))

            def __init__(self):
                super().__init__()
                layers, c = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU()], 32
                for e, co, n, s, k in self.STAGES:
                    for i in range(n):
                        layers.append(MBConv(c, co, e, k, s if i == 0 else 1))
                        c = co
                layers += [nn.Conv2d(c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.SiLU()]
                self.body = nn.Sequential(*layers)
                self.head = nn.Linear(1280, 1000)

            def forward(self, x):
                return self.head(self.body(x).mean((2, 3)))

        return EffNet()

    if name == "swin_bf16":
        class WinBlock(nn.Module):
            def __init__(self, d, heads, win, shift):
                super().__init__()
                self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
                self.heads, self.win, self.shift = heads, win, shift
                self.table = nn.Parameter(torch.zeros((2 * win - 1) ** 2, heads))
                ys, xs = torch.meshgrid(torch.arange(win), torch.arange(win), indexing="ij")
                c = torch.stack([ys.flatten(), xs.flatten()])
                rel = (c[:, :, None] - c[:, None, :]).permute(1, 2, 0) + (win - 1)
                self.register_buffer("idx", rel[..., 0] * (2 * win - 1) + rel[..., 1], persistent=False)

            def forward(self, x):
                b, h, w, d = x.shape
                win, nh = self.win, self.heads
                y = self.n1(x)
                if self.shift:
                    y = torch.roll(y, (-(win // 2), -(win // 2)), (1, 2))
                y = y.view(b, h // win, win, w // win, win, d).permute(0, 1, 3, 2, 4, 5).reshape(-1, win * win, d)
                q, k, v = self.qkv(y).view(y.shape[0], win * win, 3, nh, d // nh).permute(2, 0, 3, 1, 4)
                bias = self.table[self.idx].permute(2, 0, 1).unsqueeze(0).to(q.dtype)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
                y = self.proj(y.transpose(1, 2).reshape(-1, win * win, d))
                y = y.view(b, h // win, w // win, win, win, d).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, d)
                if self.shift:
                    y = torch.roll(y, (win // 2, win // 2), (1, 2))
                x = x + y
                return x + self.mlp(self.n2(x))

        class Swin(nn.Module):
            def __init__(self, dims=(64, 128, 256, 512), depths=(2, 2, 4, 2), heads=(2, 4, 8, 16), win=7):
                super().__init__()
                self.patch = nn.Conv2d(3, dims[0], 4, 4)
                self.stages, self.merge = nn.ModuleList(), nn.ModuleList()
                for i, (d, n, nh) in enumerate(zip(dims, depths, heads, strict=True)):
                    self.stages.append(nn.Sequential(*[WinBlock(d, nh, win, j % 2 == 1) for j in range(n)]))
                    self.merge.append(nn.Sequential(nn.LayerNorm(4 * d), nn.Linear(4 * d, dims[i + 1], bias=False))
                                      if i + 1 < len(dims) else nn.Identity())
                self.norm, self.head = nn.LayerNorm(dims[-1]), nn.Linear(dims[-1], 1000)

            def forward(self, x):
                x = self.patch(x).permute(0, 2, 3, 1)
                for stage, merge in zip(self.stages, self.merge, strict=True):
                    x = stage(x)
                    if not isinstance(merge, nn.Identity):
                        x = merge(torch.cat([x[:, 0::2, 0::2], x[:, 1::2, 0::2], x[:, 0::2, 1::2],
                                             x[:, 1::2, 1::2]], -1))
                return self.head(self.norm(x).mean((1, 2)))

        return Swin()

    def rotate(z, rope):
        cos, sin = rope
        return torch.cat([z[..., ::2] * cos - z[..., 1::2] * sin, z[..., ::2] * sin + z[..., 1::2] * cos], -1)

    class MHA(nn.Module):
        """Attention with an additive bias (T5) or grouped-query heads and rotary positions (the LM)."""

        def __init__(self, d, heads, kv_heads=None, bias=True):
            super().__init__()
            self.h, self.kv = heads, kv_heads or heads
            hd = d // heads
            self.q = nn.Linear(d, d, bias=bias)
            self.k, self.v = nn.Linear(d, self.kv * hd, bias=bias), nn.Linear(d, self.kv * hd, bias=bias)
            self.o = nn.Linear(d, d, bias=bias)

        def forward(self, x, mem=None, mask=None, causal=False, rope=None):
            b, t, d = x.shape
            src = x if mem is None else mem
            hd = d // self.h
            q = self.q(x).view(b, t, self.h, hd).transpose(1, 2)
            k = self.k(src).view(b, src.shape[1], self.kv, hd).transpose(1, 2)
            v = self.v(src).view(b, src.shape[1], self.kv, hd).transpose(1, 2)
            if rope is not None:
                q, k = rotate(q, rope).to(v.dtype), rotate(k, rope).to(v.dtype)
            if self.kv != self.h:
                k, v = k.repeat_interleave(self.h // self.kv, 1), v.repeat_interleave(self.h // self.kv, 1)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if mask is None else mask.to(q.dtype),
                                               is_causal=causal and mask is None)
            return self.o(y.transpose(1, 2).reshape(b, t, d))

    class RelBias(nn.Module):
        def __init__(self, heads, bidirectional, buckets=32, max_dist=128):
            super().__init__()
            self.emb, self.bi, self.nb, self.md = nn.Embedding(buckets, heads), bidirectional, buckets, max_dist

        def forward(self, tq, tk, dev):
            rel = torch.arange(tk, device=dev)[None, :] - torch.arange(tq, device=dev)[:, None]
            nb, out = self.nb, torch.zeros_like(rel)
            if self.bi:
                nb //= 2
                out += (rel > 0).long() * nb
                rel = rel.abs()
            else:
                rel = -torch.clamp(rel, max=0)
            exact = nb // 2
            # past max_dist every distance shares the last bucket (T5's own clamp is of the sum)
            big = (exact + (torch.log(rel.float().clamp(min=1) / exact) / math.log(self.md / exact)
                            * (nb - exact)).long()).clamp(max=nb - 1)
            out += torch.where(rel < exact, rel, big)
            return self.emb(out).permute(2, 0, 1).unsqueeze(0)

    if name == "t5_relpos":
        class T5Layer(nn.Module):
            def __init__(self, d, heads, cross):
                super().__init__()
                self.n1, self.att = RMSNorm(d), MHA(d, heads, bias=False)
                self.nc, self.cross = (RMSNorm(d), MHA(d, heads, bias=False)) if cross else (None, None)
                self.n2 = RMSNorm(d)
                self.ff = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.ReLU(), nn.Dropout(0.1),
                                        nn.Linear(4 * d, d, bias=False))

            def forward(self, x, bias, mem=None):
                x = x + self.att(self.n1(x), mask=bias)
                if self.cross is not None:
                    x = x + self.cross(self.nc(x), mem=mem)
                return x + self.ff(self.n2(x))

        class T5(nn.Module):
            def __init__(self, d=512, heads=8, layers=4):
                super().__init__()
                self.emb = nn.Embedding(T5_VOCAB, d)
                self.enc = nn.ModuleList(T5Layer(d, heads, False) for _ in range(layers))
                self.dec = nn.ModuleList(T5Layer(d, heads, True) for _ in range(layers))
                self.enc_bias, self.dec_bias = RelBias(heads, True), RelBias(heads, False)
                self.ne, self.nd = RMSNorm(d), RMSNorm(d)
                self.head = nn.Linear(d, T5_VOCAB, bias=False)

            def forward(self, src, tgt):
                dev, ts, tt = src.device, src.shape[1], tgt.shape[1]
                h, eb = self.emb(src), self.enc_bias(ts, ts, dev)
                for blk in self.enc:
                    h = blk(h, eb)
                mem = self.ne(h)
                causal = torch.triu(torch.full((tt, tt), float("-inf"), device=dev), 1)
                y, db = self.emb(tgt), self.dec_bias(tt, tt, dev) + causal
                for blk in self.dec:
                    y = blk(y, db, mem)
                return self.head(self.nd(y))

        return T5()

    class MaskedBlock(nn.Module):
        """A pre-LayerNorm transformer block whose attention takes an additive float mask (the late set's)."""

        def __init__(self, d, heads, bias):
            super().__init__()
            self.n1, self.att, self.n2 = nn.LayerNorm(d), MHA(d, heads, bias=bias), nn.LayerNorm(d)
            self.ff = nn.Sequential(nn.Linear(d, 4 * d, bias=bias), nn.GELU(), nn.Linear(4 * d, d, bias=bias))

        def forward(self, x, mask):
            x = x + self.att(self.n1(x), mask=mask)
            return x + self.ff(self.n2(x))

    if name == "relbias_enc_bf16":
        class RelEncoder(nn.Module):
            """A masked-LM encoder (d 768 x 6, 12 heads) with one learned bucketed relative bias."""

            def __init__(self, d=768, heads=12, layers=6):
                super().__init__()
                self.emb = nn.Embedding(LM_VOCAB, d)
                self.bias = RelBias(heads, True)
                self.layers = nn.ModuleList(MaskedBlock(d, heads, True) for _ in range(layers))
                self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, LM_VOCAB)

            def forward(self, ids):
                t = ids.shape[1]
                h, bias = self.emb(ids), self.bias(t, t, ids.device)
                for layer in self.layers:
                    h = layer(h, bias)
                return self.head(self.norm(h))

        return RelEncoder()

    if name == "alibi_lm":
        class AlibiLM(nn.Module):
            """A decoder LM (d 512 x 6, 8 heads) with ALiBi: a fixed linear distance penalty per head and the
            causal mask, one float mask that needs no gradient."""

            def __init__(self, d=512, heads=8, layers=6):
                super().__init__()
                self.tok = nn.Embedding(LM_VOCAB, d)
                self.blocks = nn.ModuleList(MaskedBlock(d, heads, False) for _ in range(layers))
                self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, LM_VOCAB, bias=False)
                self.register_buffer("slopes", 2.0 ** (-8.0 * torch.arange(1, heads + 1) / heads), persistent=False)

            def forward(self, x):
                t = x.shape[1]
                pos = torch.arange(t, device=x.device)
                dist = (pos[None, :] - pos[:, None]).float()
                mask = self.slopes[:, None, None] * dist.clamp(max=0)
                mask = mask.masked_fill(dist > 0, float("-inf")).unsqueeze(0)
                h = self.tok(x)
                for blk in self.blocks:
                    h = blk(h, mask)
                return self.head(self.norm(h))

        return AlibiLM()

    if name == "whisper_enc":
        class Layer(nn.Module):
            def __init__(self, d, heads):
                super().__init__()
                self.n1, self.n2, self.att = nn.LayerNorm(d), nn.LayerNorm(d), MHA(d, heads)
                self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

            def forward(self, x):
                x = x + self.att(self.n1(x))
                return x + self.mlp(self.n2(x))

        class Whisper(nn.Module):
            def __init__(self, mels=80, d=512, heads=8, layers=6, ctx=4096):
                super().__init__()
                self.c1, self.c2 = nn.Conv1d(mels, d, 3, padding=1), nn.Conv1d(d, d, 3, stride=2, padding=1)
                half = d // 2
                f = torch.exp(-math.log(10_000) * torch.arange(half) / (half - 1))
                t = torch.arange(ctx)[:, None] * f[None]
                self.register_buffer("pos", torch.cat([t.sin(), t.cos()], 1), persistent=False)
                self.layers = nn.ModuleList(Layer(d, heads) for _ in range(layers))
                self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, ASR_VOCAB)

            def forward(self, mel):
                x = F.gelu(self.c2(F.gelu(self.c1(mel)))).transpose(1, 2)
                x = x + self.pos[: x.shape[1]].to(x.dtype)
                for blk in self.layers:
                    x = blk(x)
                return self.head(self.ln(x))

        return Whisper()

    if name == "gqa_lm":
        class Block(nn.Module):
            def __init__(self, d, heads, kv):
                super().__init__()
                self.n1, self.n2, self.att = RMSNorm(d), RMSNorm(d), MHA(d, heads, kv, bias=False)
                hid = 1408  # SwiGLU's 2/3 of 4d, rounded to 64
                self.gate, self.up, self.down = (nn.Linear(d, hid, bias=False), nn.Linear(d, hid, bias=False),
                                                 nn.Linear(hid, d, bias=False))

            def forward(self, x, rope):
                x = x + self.att(self.n1(x), causal=True, rope=rope)
                h = self.n2(x)
                return x + self.down(F.silu(self.gate(h)) * self.up(h))

        class LM(nn.Module):
            """forward gives the final hidden states; `head` the logits (as fit_families' compiled GPT)."""

            def __init__(self, d=512, heads=8, kv=2, layers=6):
                super().__init__()
                self.tok = nn.Embedding(LM_VOCAB, d)
                self.blocks = nn.ModuleList(Block(d, heads, kv) for _ in range(layers))
                self.norm, self.head = RMSNorm(d), nn.Linear(d, LM_VOCAB, bias=False)
                self.hd = d // heads

            def forward(self, x):
                t = x.shape[1]
                f = 1.0 / (10_000 ** (torch.arange(0, self.hd, 2, device=x.device).float() / self.hd))
                ang = torch.arange(t, device=x.device).float()[:, None] * f[None]
                rope = (ang.cos(), ang.sin())
                h = self.tok(x)
                for blk in self.blocks:
                    h = blk(h, rope)
                return self.norm(h)

        return LM()

    if name == "gnn_rec":
        class GNN(nn.Module):
            """A recommender's node table (1M x 128) looked up per subgraph, two rounds of messages
            gathered by edge source and summed into their targets (index_add), a degree mean, a link
            score per edge."""

            def __init__(self, d=128, hid=256, layers=2):
                super().__init__()
                self.table = nn.Embedding(GNN_NODES, d)
                self.inp = nn.Linear(d, hid)
                self.msg = nn.ModuleList(nn.Linear(hid, hid) for _ in range(layers))
                self.upd = nn.ModuleList(nn.Linear(2 * hid, hid) for _ in range(layers))
                self.score = nn.Linear(hid, hid, bias=False)

            def forward(self, ids, src, dst):
                h = F.relu(self.inp(self.table(ids)))
                deg = torch.zeros(h.shape[0], device=h.device).index_add_(
                    0, dst, torch.ones_like(dst, dtype=h.dtype)).clamp(min=1)[:, None]
                for msg, upd in zip(self.msg, self.upd, strict=True):
                    m = F.relu(msg(h[src]))
                    agg = torch.zeros_like(h).index_add(0, dst, m) / deg
                    h = F.relu(upd(torch.cat([h, agg], 1)))
                return (self.score(h[src]) * h[dst]).sum(-1)

        return GNN()
    raise ValueError(name)


def step_loss(name: str, model, b: int, size: int, dev):
    if name not in ALL:
        return _prev_step_loss(name, model, b, size, dev)
    import torch
    import torch.nn.functional as F

    if name == "vit_ckpt_bf16":
        return _prev_step_loss("vit_bf16", model, b, size, dev)
    if name in ("effnet_se", "swin_bf16"):
        x = torch.randn(b, 3, size, size, device=dev)
        return F.cross_entropy(model(x).float(), torch.randint(0, 1000, (b,), device=dev)), b
    if name == "t5_relpos":
        src = torch.randint(0, T5_VOCAB, (b, size), device=dev)
        tgt = torch.randint(0, T5_VOCAB, (b, size), device=dev)
        logits = model(src, tgt)
        return F.cross_entropy(logits.float().reshape(-1, T5_VOCAB), torch.roll(tgt, -1, 1).reshape(-1)), b * size
    if name in ("relbias_enc_bf16", "alibi_lm"):
        x = torch.randint(0, LM_VOCAB, (b, size), device=dev)
        logits = model(x)
        return F.cross_entropy(logits.float().reshape(-1, LM_VOCAB), torch.roll(x, -1, 1).reshape(-1)), b * size
    if name == "whisper_enc":
        mel = torch.randn(b, 80, size, device=dev)
        logits = model(mel)
        y = torch.randint(0, ASR_VOCAB, logits.shape[:2], device=dev)
        return F.cross_entropy(logits.float().reshape(-1, ASR_VOCAB), y.reshape(-1)), b * size
    if name == "gqa_lm":
        x = torch.randint(0, LM_VOCAB, (b, size), device=dev)
        if hasattr(model, "head"):  # not fit_families' compiled wrapper (the dump job): compiled here alike
            if os.environ.get("FITFRESH_SMOKE"):
                fwd = lambda z: model.head(model(z))  # noqa: E731
            else:
                fwd = _compiled.get(id(model))
                if fwd is None:
                    fwd = _compiled[id(model)] = torch.compile(lambda z: model.head(model(z)))
        else:
            fwd = model
        logits = fwd(x)
        return F.cross_entropy(logits.float().reshape(-1, LM_VOCAB), torch.roll(x, -1, 1).reshape(-1)), b * size
    if name == "gnn_rec":
        n, e = b * size, b * size * GNN_EDGES_PER_NODE
        ids = torch.randint(0, GNN_NODES, (n,), device=dev)
        # edges inside each subgraph of `size` nodes
        g = torch.randint(0, b, (e,), device=dev) * size
        src = g + torch.randint(0, size, (e,), device=dev)
        dst = g + torch.randint(0, size, (e,), device=dev)
        logit = model(ids, src, dst)
        return F.binary_cross_entropy_with_logits(logit.float(), torch.rand(e, device=dev).round()), b
    raise ValueError(name)


ff.build = cap.build = build
ff.step_loss = cap.step_loss = step_loss

# ---------------------------------------------------------------- one job (torch only here)
FAKE_FROM = ("lora_gpt", "resnet_bn", "seq2seq", "unet_diff", "vit_bf16")  # fixtures with every part


def fake_copy(args) -> None:
    """FITFAM_FAKE: the recording or dump copied from tests/fixtures (another family's), so that the
    importer and the judging read real files."""
    src = FAKE_FROM[sorted(FRESH).index(args.family) % len(FAKE_FROM)]
    fx = os.path.join(ROOT, "tests", "fixtures")
    if args.record == "hand":
        shutil.copyfile(os.path.join(fx, "fit_families", "hand", f"{src}.pickle.gz"), args.hand_out)
    elif args.record == "defaults":
        shutil.copytree(os.path.join(fx, "fit_families", "spools", src, "defaults"), args.spool, dirs_exist_ok=True)
    elif args.record == "dump":
        for part in ("forward", "backward"):
            shutil.copyfile(os.path.join(fx, "fit_one_step", "dumps", f"{src}-dump.{part}.pickle.gz"),
                            f"{args.dump_out}.{part}.pickle.gz")


def dump_job_args(args) -> argparse.Namespace:
    """What fit_one_step_capture.run_job reads for the step-1 dumps: two steps, no cap, no gradient
    accumulation, gradients set to None."""
    return argparse.Namespace(family=args.family, batch=args.batch, size=args.size, mode="dump", steps=2,
                              result=args.result, out_pickle=args.dump_out, cap_bytes=0, accum=1, keep_grads=False)


def run_job(args) -> None:
    os.makedirs(os.path.dirname(args.hand_out), exist_ok=True)
    os.makedirs(os.path.dirname(args.dump_out), exist_ok=True)
    if os.environ.get("FITFAM_FAKE"):
        try:
            ff.fake_job(args)  # writes the result (and an empty hand file), exits
        except SystemExit:
            if args.record:
                fake_copy(args)
            raise
    if args.record == "dump":
        cap.run_job(dump_job_args(args))
    else:
        ff.run_job(args)


# ---------------------------------------------------------------- the parent (no torch)
class Runner(ff.Runner):
    """fit_families' runner (its slots, budget, ladder and capped bisection), its jobs run by this
    script (which knows the fresh families), with the step-1 dumps beside the recordings."""

    def __init__(self, out: str, budget: float, parallel: int, names: list[str], set_name: str = "fresh"):
        super().__init__(out, budget, parallel)
        rule = f"a {set_name} set, captured after the model was tuned: every family held back"
        self.summary["split"] = {"tuning": [], "held_back": sorted(names), "rule": rule}
        self.summary["set"] = set_name

    def job(self, fam: str, batch: int, size: int, record: str = "", cap: int = 0, priority: float = 5):
        spec = ff.FAMILIES[fam]
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
                cmd += ["--record", record, "--spool", os.path.join(self.out, "spools", fam, "defaults"),
                        "--hand-out", os.path.join(self.out, "hand", fam + ".pickle.gz"),
                        "--dump-out", os.path.join(self.out, "dumps", fam + "-dump")]
            slow = spec["compile"] or record in ("hand", "dump")
            res = ff.run_job_process(cmd, result, min(180 if slow else 90, max(10, left)))
        finally:
            self.slots.release()
        print(f"[{tag}] {res.get('outcome')} reserved={res.get('max_reserved', 0) / GiB:.3f}GiB "
              f"{res['wall_s']}s", flush=True)
        with self.lock:
            self.summary["families"].setdefault(fam, {"spec": spec}).setdefault("runs", {})[tag] = res
        self.save()
        return res

    def family(self, fam: str) -> None:
        spec = ff.FAMILIES[fam]
        pri = 0 if spec["compile"] else 1
        dump = threading.Thread(target=self.job, args=(fam, spec["batch"], spec["size"], "dump", 0, pri + 0.05))
        dump.start()
        super().family(fam)
        dump.join()


def smoke() -> None:
    """Every fresh model built and one forward and backward run on CPU at a tiny shape (bf16 autocast
    on CPU where the family runs under it on the GPU; torch.compile left out)."""
    import torch

    os.environ["FITFRESH_SMOKE"] = "1"
    tiny = {"effnet_se": (2, 64), "swin_bf16": (1, 224), "t5_relpos": (2, 16), "whisper_enc": (2, 32),
            "gqa_lm": (2, 16), "gnn_rec": (2, 32), "vit_ckpt_bf16": (1, 64), "relbias_enc_bf16": (2, 16),
            "alibi_lm": (2, 16)}
    for name, spec in ALL.items():
        t0 = time.time()
        b, s = tiny[name]
        torch.manual_seed(0)
        m = build(name, s)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=spec["bf16"]):
            loss, units = step_loss(name, m, b, s, torch.device("cpu"))
        loss.backward()
        grads = sum(p.grad is not None for p in m.parameters() if p.requires_grad)
        n = sum(p.numel() for p in m.parameters())
        print(f"{name}: loss {loss.item():.3f}, {units} units, {n / 1e6:.1f} M parameters, {grads} grads, "
              f"{time.time() - t0:.1f} s", flush=True)
        assert torch.isfinite(loss) and grads == sum(p.requires_grad for p in m.parameters()), name


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("all")
    a.add_argument("--out", required=True)
    a.add_argument("--only", default="")
    a.add_argument("--budget", type=float, default=480)
    a.add_argument("--parallel", type=int, default=8)
    a.add_argument("--set", choices=sorted(SETS), default="fresh")
    a.add_argument("--recordings-only", action="store_true",
                   help="only the base shape's recordings and dumps per family (after a change to the agent)")
    j = sub.add_parser("job")
    j.add_argument("family", choices=sorted(ff.FAMILIES))  # (every family: a judging set may compile one of the others)
    j.add_argument("--batch", type=int, required=True)
    j.add_argument("--size", type=int, required=True)
    j.add_argument("--result", required=True)
    j.add_argument("--record", choices=["defaults", "hand", "dump"], default="")
    j.add_argument("--spool", default="/tmp/fitfresh/spool")
    j.add_argument("--hand-out", default="/tmp/fitfresh/hand.pickle.gz")
    j.add_argument("--dump-out", default="/tmp/fitfresh/dump")
    j.add_argument("--cap-bytes", type=int, default=0)
    sub.add_parser("smoke")
    args = ap.parse_args()
    if args.cmd == "smoke":
        smoke()
        return
    if args.cmd == "job":
        run_job(args)
        return
    families = SETS[args.set]
    names = [s for s in (args.only.split(",") if args.only else families) if s]
    unknown = sorted(set(names) - set(families))
    if unknown:
        ap.error(f"unknown families: {', '.join(unknown)}")
    os.makedirs(args.out, exist_ok=True)
    # as fit_families.py: a cache for the compiling family, its workers few, C++ frames by dladdr
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(args.out, "inductor_cache"))
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "4")
    os.environ.setdefault("TORCH_SYMBOLIZE_MODE", "dladdr")
    r = Runner(args.out, args.budget, args.parallel, names, args.set)
    r.recordings_only = args.recordings_only
    r.save()
    with ThreadPoolExecutor(max_workers=len(names)) as ex:
        list(ex.map(r.family, names))
    r.save()
    print(f"done in {time.time() - r.t0:.0f}s: {args.out}/summary.json", flush=True)


if __name__ == "__main__":
    main()
