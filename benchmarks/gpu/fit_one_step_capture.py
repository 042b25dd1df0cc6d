"""memq fit captures on one GPU, beside benchmarks/gpu/fit_families.py (whose models and steps it reuses):

1. real step-1 dumps: a hand recording (torch's defaults, stacks="all") with `_snapshot()` taken at the end of
   the first step's forward and at the end of its backward (before the optimizer step), as a framework's
   dump inside step 1 holds them;
2. hand recordings at 2x, 4x and 8x the batch of the tuning families (3 steps): where the real allocator
   puts the scaled blocks;
3. four new families, not among the ten, with their ladders (uncapped runs at 1x-8x the batch, 2x-4x the
   length for the sequence one), a hand recording and step-1 dumps of the base shape.

    python3 fit_one_step_capture.py all --out DIR [--parallel 8] [--budget 420]
    python3 fit_one_step_capture.py caps --summary DIR/summary.json --out DIR2 [--budget 300]
    python3 fit_one_step_capture.py job FAM --batch B --size S --mode plain|hand|dump --result R.json
        [--out-pickle P] [--steps N]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
# beside fit_families.py (benchmarks/gpu), or in a folder of the repository root carried to the GPU machine
sys.path.insert(0, HERE if os.path.exists(os.path.join(HERE, "fit_families.py"))
                else os.path.join(os.path.dirname(HERE), "benchmarks", "gpu"))
import fit_families as ff  # noqa: E402

GiB = 1 << 30
NEW = {
    "convnext_ln": dict(batch=16, size=128, seq=False, bf16=True, ckpt=False, compile=False, opt="adamw"),
    "mlp_mixer": dict(batch=16, size=224, seq=False, bf16=False, ckpt=False, compile=False, opt="sgd_momentum"),
    "gpt_ckpt_bf16": dict(batch=8, size=256, seq=True, bf16=True, ckpt=True, compile=False, opt="adamw"),
    "vae_conv": dict(batch=32, size=64, seq=False, bf16=False, ckpt=False, compile=False, opt="adam"),
}
TUNING = ("lora_gpt", "resnet_bn", "seq2seq", "unet_diff", "vit_bf16")
ff.FAMILIES.update(NEW)
_build, _step_loss = ff.build, ff.step_loss


def build(name, size):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    if name == "gpt_ckpt_bf16":
        m = _build("gpt_compile", size)  # the same GPT (d 512 x 6), not compiled, checkpointed per block
        m.ckpt = True
        return m
    if name == "convnext_ln":
        class Blk(nn.Module):
            def __init__(self, c):
                super().__init__()
                self.dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
                self.ln = nn.LayerNorm(c)
                self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)

            def forward(self, x):
                y = self.dw(x).permute(0, 2, 3, 1)
                y = self.fc2(F.gelu(self.fc1(self.ln(y))))
                return x + y.permute(0, 3, 1, 2)

        class ConvNeXt(nn.Module):
            def __init__(self, dims=(96, 192, 384, 768), depths=(2, 2, 6, 2)):
                super().__init__()
                layers = [nn.Conv2d(3, dims[0], 4, 4)]
                for i, (d, n) in enumerate(zip(dims, depths, strict=True)):
                    if i:
                        layers.append(nn.Conv2d(dims[i - 1], d, 2, 2))
                    layers += [Blk(d) for _ in range(n)]
                self.body = nn.Sequential(*layers)
                self.head = nn.Linear(dims[-1], 1000)

            def forward(self, x):
                return self.head(self.body(x).mean((2, 3)))

        return ConvNeXt()
    if name == "mlp_mixer":
        class Mix(nn.Module):
            def __init__(self, t, d):
                super().__init__()
                self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.tok = nn.Sequential(nn.Linear(t, 256), nn.GELU(), nn.Linear(256, t))
                self.ch = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

            def forward(self, x):
                x = x + self.tok(self.n1(x).transpose(1, 2)).transpose(1, 2)
                return x + self.ch(self.n2(x))

        class Mixer(nn.Module):
            def __init__(self, size, d=512, depth=8):
                super().__init__()
                self.patch = nn.Conv2d(3, d, 16, 16)
                self.blocks = nn.Sequential(*[Mix((size // 16) ** 2, d) for _ in range(depth)])
                self.head = nn.Linear(d, 1000)

            def forward(self, x):
                return self.head(self.blocks(self.patch(x).flatten(2).transpose(1, 2)).mean(1))

        return Mixer(size)
    if name == "vae_conv":
        class VAE(nn.Module):
            def __init__(self, z=256):
                super().__init__()
                self.enc = nn.Sequential(nn.Conv2d(3, 64, 4, 2, 1), nn.SiLU(), nn.Conv2d(64, 128, 4, 2, 1), nn.SiLU(),
                                         nn.Conv2d(128, 256, 4, 2, 1), nn.SiLU(), nn.Conv2d(256, 2 * z, 3, 1, 1))
                self.dec = nn.Sequential(nn.Conv2d(z, 256, 3, 1, 1), nn.SiLU(),
                                         nn.ConvTranspose2d(256, 128, 4, 2, 1), nn.SiLU(),
                                         nn.ConvTranspose2d(128, 64, 4, 2, 1), nn.SiLU(),
                                         nn.ConvTranspose2d(64, 3, 4, 2, 1))

            def forward(self, x):
                mu, logv = self.enc(x).chunk(2, 1)
                zz = mu + torch.randn_like(mu) * (0.5 * logv).exp()
                return self.dec(zz), mu, logv

        return VAE()
    return _build(name, size)


def step_loss(name, model, b, size, dev):
    import torch
    import torch.nn.functional as F

    if name == "gpt_ckpt_bf16":
        x = torch.randint(0, 32_000, (b, size), device=dev)
        logits = model.head(model(x))
        return F.cross_entropy(logits.float().reshape(-1, 32_000), torch.roll(x, -1, 1).reshape(-1)), b * size
    if name in ("convnext_ln", "mlp_mixer"):
        x = torch.randn(b, 3, size, size, device=dev)
        return F.cross_entropy(model(x).float(), torch.randint(0, 1000, (b,), device=dev)), b
    if name == "vae_conv":
        x = torch.randn(b, 3, size, size, device=dev)
        y, mu, logv = model(x)
        kl = -0.5 * (1 + logv - mu.pow(2) - logv.exp()).mean()
        return F.mse_loss(y, x) + 1e-3 * kl, b
    return _step_loss(name, model, b, size, dev)


ff.build, ff.step_loss = build, step_loss


def save(snap: dict, path: str) -> int:
    ff.intern_frames(snap)
    with gzip.open(path, "wb", compresslevel=6) as fh:
        pickle.dump(snap, fh, protocol=4)
    return os.path.getsize(path)


def run_job(a) -> None:
    import torch

    spec = ff.FAMILIES[a.family]
    dev = torch.device("cuda", 0)
    res = {"family": a.family, "batch": a.batch, "size": a.size, "mode": a.mode, "outcome": "completed",
           "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "optimizer": spec["opt"],
           "precision": "bf16 autocast" if spec["bf16"] else "fp32", "checkpointing": spec["ckpt"],
           "steps": a.steps, "step_peak_reserved": [], "step_peak_allocated": []}
    if a.mode in ("hand", "dump"):
        torch.cuda.init()
        torch.cuda.memory._record_memory_history(max_entries=400_000)
    else:
        total = torch.cuda.get_device_properties(0).total_memory
        cap = a.cap_bytes or ff.FENCE_BYTES
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), 0)
        res["cap_bytes" if a.cap_bytes else "fence_bytes"] = int(min(1.0, cap / total) * total)
    torch.manual_seed(0)
    model = build(a.family, a.size).to(dev)
    res["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    res["trainable_param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    opt = ff.make_optimizer(spec, model.parameters())
    try:
        for step in range(a.steps):
            for _micro in range(a.accum - 1):  # earlier micro-batches of gradient accumulation
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=spec["bf16"]):
                    loss, _tokens = step_loss(a.family, model, a.batch, a.size, dev)
                loss.backward()
                del loss
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=spec["bf16"]):
                loss, _tokens = step_loss(a.family, model, a.batch, a.size, dev)
            if a.mode == "dump" and step == 0:
                torch.cuda.synchronize(dev)
                res["forward_bytes"] = save(torch.cuda.memory._snapshot(), a.out_pickle + ".forward.pickle.gz")
            loss.backward()
            if a.mode == "dump" and step == 0:
                torch.cuda.synchronize(dev)
                res["backward_bytes"] = save(torch.cuda.memory._snapshot(), a.out_pickle + ".backward.pickle.gz")
            opt.step()
            opt.zero_grad(set_to_none=not a.keep_grads)
            del loss
            torch.cuda.synchronize(dev)
            res["step_peak_reserved"].append(torch.cuda.max_memory_reserved(dev))
            res["step_peak_allocated"].append(torch.cuda.max_memory_allocated(dev))
    except torch.OutOfMemoryError as exc:
        res.update(outcome="oom", message=str(exc)[:300])
    finally:
        res["max_reserved"] = torch.cuda.max_memory_reserved(dev)
        res["max_allocated"] = torch.cuda.max_memory_allocated(dev)
        if a.mode == "hand":
            res["hand_bytes"] = save(torch.cuda.memory._snapshot(), a.out_pickle)
        if a.mode in ("hand", "dump"):
            torch.cuda.memory._record_memory_history(enabled=None)
        with open(a.result, "w") as fh:
            json.dump(res, fh, indent=1)


def jobs() -> list[tuple]:
    """(family, batch, size, mode, steps, tag), the most wanted first."""
    out = []
    for fam, spec in NEW.items():
        b, s = spec["batch"], spec["size"]
        out += [(fam, b * k, s, "plain", 6, f"{fam}-b{b * k}-s{s}") for k in (1, 2, 4, 8)]
        if spec["seq"]:
            out += [(fam, b, s * k, "plain", 6, f"{fam}-b{b}-s{s * k}") for k in (2, 4)]
        out += [(fam, b, s, "hand", 6, f"{fam}-hand"), (fam, b, s, "dump", 2, f"{fam}-dump")]
    for fam in TUNING:
        spec = ff.FAMILIES[fam]
        out.append((fam, spec["batch"], spec["size"], "dump", 2, f"{fam}-dump"))
    for k in (2, 4, 8):
        for fam in TUNING:
            spec = ff.FAMILIES[fam]
            out.append((fam, spec["batch"] * k, spec["size"], "hand", 3, f"{fam}-hand-b{spec['batch'] * k}"))
    return out


def main_all(a) -> None:
    os.makedirs(os.path.join(a.out, "results"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "pickles"), exist_ok=True)
    t0 = time.time()
    summary = {"new_families": NEW, "tuning": TUNING, "runs": {}}

    def one(j):
        fam, b, s, mode, steps, tag = j
        if time.time() - t0 > a.budget:
            return tag, {"outcome": "skipped (budget)"}
        res_path = os.path.join(a.out, "results", tag + ".json")
        pk = os.path.join(a.out, "pickles", tag + (".pickle.gz" if mode == "hand" else ""))
        cmd = [sys.executable, os.path.abspath(__file__), "job", fam, "--batch", str(b), "--size", str(s),
               "--mode", mode, "--steps", str(steps), "--result", res_path, "--out-pickle", pk]
        try:
            left = a.budget + 60 - (time.time() - t0)
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=max(10, min(150, left)))
            rc, err = p.returncode, p.stderr[-1500:]
        except subprocess.TimeoutExpired:
            rc, err = -9, "timeout"
        try:
            with open(res_path) as fh:
                res = json.load(fh)
        except (OSError, ValueError):
            res = {"outcome": "failed"}
        res["rc"] = rc
        if rc:
            res["stderr"] = err
        return tag, res

    with ThreadPoolExecutor(a.parallel) as ex:
        for tag, res in ex.map(one, jobs()):
            summary["runs"][tag] = res
            print(tag, res.get("outcome"), res.get("max_reserved"), res.get("rc"), flush=True)
            summary["elapsed_s"] = round(time.time() - t0, 1)
            with open(os.path.join(a.out, "summary.json"), "w") as fh:
                json.dump(summary, fh, indent=1)


def main_caps(a) -> None:
    """The new families' largest batch under a cap halfway between their 4x and 8x peaks (as
    fit_families.py chooses it), bisected by real capped runs, the families in parallel."""
    with open(a.summary) as fh:
        summary = json.load(fh)
    os.makedirs(os.path.join(a.out, "results"), exist_ok=True)
    t0 = time.time()

    def probe(fam, b, size, cap):
        tag = f"{fam}-b{b}-s{size}-cap{cap}"
        res_path = os.path.join(a.out, "results", tag + ".json")
        cmd = [sys.executable, os.path.abspath(__file__), "job", fam, "--batch", str(b), "--size", str(size),
               "--mode", "plain", "--steps", "6", "--result", res_path, "--cap-bytes", str(cap)]
        try:
            subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            with open(res_path) as fh:
                return json.load(fh).get("outcome", "failed")
        except (OSError, ValueError, subprocess.TimeoutExpired):
            return "failed"

    def family(fam):
        spec = NEW[fam]
        b0, s0 = spec["batch"], spec["size"]
        runs = summary["runs"]
        p4, p8 = runs[f"{fam}-b{4 * b0}-s{s0}"]["max_reserved"], runs[f"{fam}-b{8 * b0}-s{s0}"]["max_reserved"]
        cap = (p4 + p8) // 2
        probes = {}
        lo, hi = 4 * b0, 8 * b0
        for b in (lo, hi):
            probes[b] = probe(fam, b, s0, cap)
        if probes[lo] != "completed" or probes[hi] != "oom":
            return fam, {"cap_bytes": cap, "probes": probes, "note": "the ends did not bracket"}
        while hi - lo > 1 and time.time() - t0 < a.budget:
            mid = (lo + hi) // 2
            probes[mid] = probe(fam, mid, s0, cap)
            if probes[mid] == "completed":
                lo = mid
            else:
                hi = mid
        return fam, {"cap_bytes": cap, "max_batch": lo, "max_batch_outcome": probes[lo],
                     "next_outcome": probes.get(lo + 1, "not probed"), "probes": {str(k): v for k, v in probes.items()}}

    out = {}
    with ThreadPoolExecutor(len(NEW)) as ex:
        for fam, res in ex.map(family, list(NEW)):
            out[fam] = res
            print(fam, res, flush=True)
    with open(os.path.join(a.out, "caps.json"), "w") as fh:
        json.dump({"elapsed_s": round(time.time() - t0, 1), "caps": out}, fh, indent=1)


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    al = sub.add_parser("all")
    al.add_argument("--out", required=True)
    al.add_argument("--parallel", type=int, default=8)
    al.add_argument("--budget", type=float, default=420)
    c = sub.add_parser("caps")
    c.add_argument("--summary", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--budget", type=float, default=300)
    j = sub.add_parser("job")
    j.add_argument("family")
    j.add_argument("--batch", type=int, required=True)
    j.add_argument("--size", type=int, required=True)
    j.add_argument("--mode", choices=("plain", "hand", "dump"), required=True)
    j.add_argument("--steps", type=int, default=6)
    j.add_argument("--result", required=True)
    j.add_argument("--out-pickle", default="")
    j.add_argument("--cap-bytes", type=int, default=0)
    j.add_argument("--accum", type=int, default=1, help="micro-batches a step (gradient accumulation)")
    j.add_argument("--keep-grads", action="store_true", help="zero_grad(set_to_none=False): .grad kept, zeroed")
    a = ap.parse_args()
    if a.cmd == "all":
        main_all(a)
    elif a.cmd == "caps":
        main_caps(a)
    else:
        run_job(a)


if __name__ == "__main__":
    main()
