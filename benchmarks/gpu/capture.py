#!/usr/bin/env python3
"""Capture real CUDA caching-allocator snapshots for memq's tests (one GPU, one run).

    PYTHONUNBUFFERED=1 python3 benchmarks/gpu/capture.py --out /tmp/captures

Every scenario runs in its own subprocess so that PYTORCH_CUDA_ALLOC_CONF applies to it.
Each writes a folder in the layout of shared/fixtures/real: `*.pickle.gz` (gzip of the pickled
`torch.cuda.memory._snapshot()` dict), `meta.json` (label, outcome, oom_message, cap_bytes,
per-snapshot device_free/device_total, and alloc/device_alloc for OOM snapshots) and
`stats.jsonl` (a memory_stats() subset after every step). `summary.json` lists every run.

Scenarios: leak_epochs, cuda_graphs (+ cuda_graphs_oom), paused_recording, dynamic_settings
(probe, default with the full trace from an empty allocator, then the other allocator settings at
the same cap), cudnn_workspace (stacks="all"). See benchmarks/gpu/README.md.

`--selftest` checks the torch-free parts (OOM checks, label decisions) on tests/fixtures/real.
"""

import argparse
import gzip
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
import traceback

SCRIPT = os.path.realpath(__file__)
FAKE_PATH = "/workspace/train.py"  # the capture script's frames are rewritten to this path
MiB = 1 << 20
GiB = 1 << 30
K_LARGE_BUFFER = 20 * MiB

# dynamic_settings: the same seeded shape schedule in every run
DYN_SEED = 1234
DYN_BATCHES = [8, 12, 16, 20, 24]
DYN_SEQS = [128, 256, 384, 512, 768, 1024]
DYN_EPOCHS, DYN_STEPS_PER_EPOCH = 3, 15
DYN_FULL_MAX_ENTRIES = 400_000
DYN_SETTINGS = [  # (folder, PYTORCH_CUDA_ALLOC_CONF); "default" is run first, separately
    ("expandable_segments", "expandable_segments:True"),
    ("max_split_128", "max_split_size_mb:128"),
    ("max_split_512", "max_split_size_mb:512"),
    ("gc_0.6", "garbage_collection_threshold:0.6"),
    ("roundup_4", "roundup_power2_divisions:4"),
]
DYN_OPTIONAL = [
    ("max_split_128_gc_0.6", "max_split_size_mb:128,garbage_collection_threshold:0.6"),
    ("expandable_gc_0.6", "expandable_segments:True,garbage_collection_threshold:0.6"),
]
DYN_RATIOS = [1.15, 1.10, 1.05]

STAT_KEYS = [
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "reserved_bytes.all.current",
    "reserved_bytes.all.peak",
    "active_bytes.all.current",
    "inactive_split_bytes.all.current",
    "requested_bytes.all.current",
    "num_alloc_retries",
    "num_ooms",
    "num_device_alloc",
    "num_device_free",
    "num_sync_all_streams",
    "segment.all.current",
    "inactive_split.all.current",
]


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}] [{os.environ.get('CAPTURE_TAG', 'main')}]", *a, flush=True)


# --------------------------------------------------------------------------------------------
# torch-free analysis of a snapshot dict (definitions from shared/ARCHITECTURE.md "Causes")
# --------------------------------------------------------------------------------------------
def seg_for(S):
    """The segment a request of S bytes needs: 2 MiB up to 1 MiB, 20 MiB up to 10 MiB, else S up to 2 MiB."""
    if S <= MiB:
        return 2 * MiB
    if S <= 10 * MiB:
        return 20 * MiB
    return -(-S // (2 * MiB)) * (2 * MiB)


def parse_conf(conf):
    out = {}
    for part in (conf or "").split(","):
        if ":" in part:
            k, v = part.split(":", 1)
            out[k.strip()] = v.strip()
    return out


def block_usable(bsize, S, max_split, need_size=True):
    """Could the caching allocator hand a free block of bsize bytes to a request of S bytes?
    need_size=False applies only the max_split_size rules (is the block a candidate at all)."""
    if need_size and bsize < S:
        return False
    if max_split is None:
        return True
    if S < max_split and bsize >= max_split:  # no oversize block for a small request
        return False
    if S >= max_split and bsize >= S + K_LARGE_BUFFER:  # oversize blocks only within 20 MiB
        return False
    return True


def roundup_min_request(S, conf):
    """Smallest request that roundup_power2_divisions:N (plain N) rounds up to S; S itself otherwise.
    The snapshot's OOM entry and the observer give only the rounded size."""
    v = parse_conf(conf).get("roundup_power2_divisions", "")
    if not v.isdigit() or int(v) < 2 or S <= 512 * int(v):
        return S
    div = int(v)
    p2 = 1 << (S.bit_length() - 1)
    step = (p2 // 2) // div if p2 == S else p2 // div
    return max(S - step + 1, 1)


def is_default_pool(pid):
    return pid is None or tuple(pid) == (0, 0)


def last_oom_entry(snap):
    for tr in snap.get("device_traces") or []:
        for e in reversed(tr):
            if e.get("action") == "oom":
                return e
    return None


def trace_len(snap):
    return sum(len(t) for t in snap.get("device_traces") or [])


def oom_checks(snap, S, limit, conf=""):
    """The numbers the deciding tests read, for an OOM snapshot taken in the observer."""
    segs = snap.get("segments") or []
    A = A_req = R = 0
    inactive_private = 0
    for s in segs:
        R += s["total_size"]
        for b in s.get("blocks") or []:
            if str(b.get("state", "")).startswith("active"):
                A += b["size"]
                A_req += b.get("requested_size", b["size"])
            elif not is_default_pool(s.get("segment_pool_id")):
                inactive_private += b["size"]
    e = last_oom_entry(snap)
    stream = e.get("stream") if e else None
    kind = "large" if S > MiB else "small"
    ms = parse_conf(conf).get("max_split_size_mb")
    max_split = int(ms) * MiB if ms else None
    free_same = []
    for s in segs:
        if not is_default_pool(s.get("segment_pool_id")) or s.get("segment_type") != kind:
            continue
        if stream is not None and s.get("stream") != stream:
            continue
        free_same += [b["size"] for b in s.get("blocks") or [] if b.get("state") == "inactive"]
    largest_free = max(free_same, default=0)
    largest_usable = max((x for x in free_same if block_usable(x, S, max_split, need_size=False)), default=0)
    blocked_by_max_split = [x for x in free_same if x >= S and not block_usable(x, S, max_split)]
    out = {
        "S": S,
        "limit": limit,
        "A": A,
        "A_req": A_req,
        "R": R,
        "F": R - A,
        "inactive_in_private_pools": inactive_private,
        "largest_free_block_same_pool_stream": largest_free,
        "largest_usable_free_block": largest_usable,
        "free_blocks_fitting_but_blocked_by_max_split": len(blocked_by_max_split),
        "oom_trace_entry": bool(e),
        "oom_stream": stream,
    }
    out["S_min_before_rounding"] = S_min = roundup_min_request(S, conf)
    if limit:
        out["fits_if_compacted"] = A + S <= limit
        out["capacity_test"] = A + S > limit
        out["fragmentation_test"] = (A + S <= limit < R + seg_for(S)) and S > largest_usable
        out["roundup_test"] = A_req + S_min <= limit < A + S
        out["headroom_frac"] = round((limit - A - S) / limit, 4)
    return out


def decide_oom_label(ch, conf=""):
    """Label for an OOM from the deciding tests 6-8 (external/leak/optimizer/spike/workspace are
    decided by the scenario itself). Returns (label, why)."""
    c = parse_conf(conf)
    if not ch.get("limit"):
        return "unknown", "no limit known"
    if ch["capacity_test"]:
        if "roundup_power2_divisions" in c and ch["roundup_test"]:
            return "allocator_config", (
                "A+S > LIMIT only because of rounding waste: A_req + the smallest request that rounds to S fits"
            )
        return "capacity", "A+S > LIMIT: the live set itself does not fit"
    if "max_split_size_mb" in c and ch["free_blocks_fitting_but_blocked_by_max_split"]:
        return "allocator_config", "A+S fits; a free block >= S exists but max_split_size_mb forbids using it"
    if ch["fragmentation_test"]:
        why = "A+S <= LIMIT < R+seg(S) and S > largest usable free block"
        if ch["inactive_in_private_pools"] > ch["S"]:
            why += f"; {ch['inactive_in_private_pools']} free bytes sit in private (CUDA-graph) pools"
        return "fragmentation", why
    return "unclear", "A+S fits LIMIT but the fragmentation test does not hold"


def frames_text(frames):
    return " ".join(f"{f.get('name', '')} {f.get('filename', '')}" for f in frames or []).lower()


def is_workspace_frames(frames):
    t = frames_text(frames)
    return any(k in t for k in ("cudnn", "workspace", "cublas"))


def workspace_evidence(snap, top=12):
    """Largest allocations and every OOM entry of the trace, with whether their (C++) frames name
    cuDNN/cuBLAS workspace code."""
    allocs, ooms = [], []
    for tr in snap.get("device_traces") or []:
        for e in tr:
            if e.get("action") == "alloc":
                allocs.append(e)
            elif e.get("action") == "oom":
                ooms.append(e)
    allocs.sort(key=lambda e: -e.get("size", 0))

    def desc(e):
        fr = e.get("frames") or []
        hit = [f.get("name", "") for f in fr if is_workspace_frames([f])]
        return {
            "action": e.get("action"),
            "size": e.get("size"),
            "n_frames": len(fr),
            "workspace_frames": is_workspace_frames(fr),
            "matching_frames": hit[:6],
            "first_frames": [f.get("name", "")[:160] for f in fr[:10]],
        }

    return {
        "largest_allocs": [desc(e) for e in allocs[:top]],
        "ooms": [desc(e) for e in ooms[:20]],
        "n_allocs": len(allocs),
        "n_ooms": len(ooms),
    }


def pool_summary(snap):
    pools = {}
    for s in snap.get("segments") or []:
        pid = str(tuple(s.get("segment_pool_id") or (0, 0)))
        p = pools.setdefault(pid, {"segments": 0, "total_size": 0, "active_size": 0})
        p["segments"] += 1
        p["total_size"] += s["total_size"]
        p["active_size"] += s.get("active_size", 0)
    return pools


def rewrite_frames(snap):
    def fix(frames):
        for f in frames or ():
            if f.get("filename") == SCRIPT:
                f["filename"] = FAKE_PATH

    for s in snap.get("segments") or []:
        fix(s.get("frames"))
        for b in s.get("blocks") or []:
            fix(b.get("frames"))
    for tr in snap.get("device_traces") or []:
        for e in tr:
            fix(e.get("frames"))


# --------------------------------------------------------------------------------------------
# torch side (workers)
# --------------------------------------------------------------------------------------------
OOM = {"cap": None, "max": 1, "taken": 0, "events": [], "conf": ""}
CUR = {"step": None, "epoch": None}


class Cap:
    """One output folder: snapshots, meta.json, stats.jsonl."""

    def __init__(self, d, scenario, label=None, conf=None):
        import torch

        os.makedirs(d, exist_ok=True)
        self.d = d
        self.conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "") if conf is None else conf
        self.meta = {
            "scenario": scenario,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(0),
            "alloc_conf": self.conf,
            "events": [],
            "label": label,
            "cap_bytes": None,
            "outcome": "completed",
            "oom_message": None,
            "snapshots": [],
        }
        self.stats_f = open(os.path.join(d, "stats.jsonl"), "w")
        self.t0 = time.time()

    def set_cap(self, cap):
        import torch

        total = torch.cuda.mem_get_info()[1]
        frac = cap / total
        torch.cuda.set_per_process_memory_fraction(frac)
        self.meta["cap_bytes"] = int(frac * total)  # what the allocator computes (size_t(frac*total))
        self.meta["memory_fraction"] = frac
        log(
            f"cap {self.meta['cap_bytes']} bytes ({self.meta['cap_bytes'] / GiB:.2f} GiB), fraction {frac:.5f}"
        )
        return self.meta["cap_bytes"]

    def snap(self, tag, **extra):
        import torch

        t0 = time.perf_counter()
        s = torch.cuda.memory._snapshot()
        secs = time.perf_counter() - t0
        rewrite_frames(s)
        raw = pickle.dumps(s, protocol=4)
        gz = gzip.compress(raw, compresslevel=6)
        fn = f"{tag}.pickle.gz"
        with open(os.path.join(self.d, fn), "wb") as f:
            f.write(gz)
        free, total = torch.cuda.mem_get_info()
        entry = {
            "tag": tag,
            "file": fn,
            "bytes": len(gz),
            "pickle_bytes": len(raw),
            "secs": round(secs, 3),
            "device_free": free,
            "device_total": total,
            "trace_entries": trace_len(s),
        }
        entry.update(extra)
        entry["stats"] = torch.cuda.memory_stats()
        self.meta["snapshots"].append(entry)
        self.meta.setdefault("allocator_settings", s.get("allocator_settings"))
        self.write_meta()
        log(f"snapshot {tag}: {len(gz)} B gz, {entry['trace_entries']} trace entries, {secs:.2f}s")
        return s, entry

    def stat(self, **kw):
        import torch

        st = torch.cuda.memory_stats()
        line = {k: st.get(k, 0) for k in STAT_KEYS}
        line.update(kw)
        line["t"] = time.time()
        self.stats_f.write(json.dumps(line) + "\n")
        self.stats_f.flush()

    def write_meta(self):
        with open(os.path.join(self.d, "meta.json"), "w") as f:
            json.dump(self.meta, f, indent=1, default=str)

    def finish(self):
        import torch

        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        st = torch.cuda.memory_stats()
        self.meta["max_allocated"] = st.get("allocated_bytes.all.peak", 0)
        self.meta["max_reserved"] = st.get("reserved_bytes.all.peak", 0)
        self.meta["final_stats"] = st
        self.meta["oom_observer_events"] = list(OOM["events"])
        self.meta["wall_s"] = round(time.time() - self.t0, 2)
        self.write_meta()
        self.stats_f.close()


def _observer(device, alloc, device_alloc, device_free):
    try:
        ev = {
            "alloc": int(alloc),
            "device_alloc": int(device_alloc),
            "device_free": int(device_free),
            "step": CUR["step"],
            "epoch": CUR["epoch"],
            "t": time.time(),
        }
        OOM["events"].append(ev)
        log(f"OOM observer: alloc={alloc} device_alloc={device_alloc} device_free={device_free}")
        c = OOM["cap"]
        if c is None or OOM["taken"] >= OOM["max"]:
            return
        OOM["taken"] += 1
        tag = "oom" if OOM["taken"] == 1 else f"oom{OOM['taken']}"
        s, entry = c.snap(
            tag,
            trigger="oom",
            alloc=int(alloc),
            device_alloc=int(device_alloc),
            device_free_at_oom=int(device_free),
            step=CUR["step"],
            epoch=CUR["epoch"],
        )
        entry["checks"] = oom_checks(s, int(alloc), c.meta.get("cap_bytes"), c.conf)
        c.write_meta()
    except Exception:
        traceback.print_exc()


def cuda_setup(seed=0):
    import torch

    assert torch.cuda.is_available(), "no CUDA"
    torch._C._cuda_attach_out_of_memory_observer(_observer)
    torch.manual_seed(seed)
    return torch


def record(torch, max_entries, stacks="python"):
    torch.cuda.memory._record_memory_history(
        enabled="all", context="all", stacks=stacks, max_entries=max_entries
    )


def gpt(n_layer, d, n_head, vocab, max_t, ckpt):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(max_t, d)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(d)

        def forward(self, idx, targets):
            B, T = idx.shape
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            for b in self.blocks:
                x = checkpoint(b, x, use_reentrant=False) if ckpt else b(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)  # tied embeddings
            loss = F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))
            return logits, loss

    return GPT()


def nparams(m):
    return sum(p.numel() for p in m.parameters())


# ---- leak_epochs -------------------------------------------------------------------------
def w_leak(d, p):
    torch = cuda_setup(0)
    c = Cap(d, "leak_epochs", label="leak")
    cap = c.set_cap(p["cap_bytes"])
    record(torch, 8000)
    OOM["cap"] = c
    V, B, T, spe = 32000, 8, 256, p.get("steps_per_epoch", 8)
    with torch.device("cuda"):
        model = gpt(6, 512, 8, V, T, ckpt=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    c.meta.update(
        params=nparams(model),
        optimizer="AdamW",
        batch=B,
        seq=T,
        steps_per_epoch=spe,
        bug="history.append(logits) every step: bf16 [8,256,32000] = 131 MB kept on the GPU",
    )
    torch.cuda.synchronize()
    c.snap("before_training", trigger="manual", step=0, epoch=0)
    history = []
    step, epoch = 0, 0
    ends = []
    try:
        for epoch in range(p.get("max_epochs", 10)):
            for _ in range(spe):
                CUR.update(step=step, epoch=epoch)
                x = torch.randint(0, V, (B, T), device="cuda")
                y = torch.randint(0, V, (B, T), device="cuda")
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits, loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                history.append(logits)  # the leak: output kept with no detach()/cpu()
                step += 1
                c.stat(step=step, epoch=epoch, phase="step")
            torch.cuda.synchronize()
            _, e = c.snap(f"epoch{epoch}", trigger="epoch_end", step=step, epoch=epoch)
            ends.append(e["stats"]["active_bytes.all.current"])
    except torch.cuda.OutOfMemoryError as ex:
        c.meta.update(outcome="oom", oom_message=str(ex).strip(), oom_step=step, oom_epoch=epoch)
        log("OOM at step", step, "epoch", epoch)
    growth = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    thr = max(64 * MiB, cap // 100)
    c.meta["leak_check"] = {
        "epoch_end_active_bytes": ends,
        "growth_per_epoch": growth,
        "threshold": thr,
        "intervals_over_threshold": sum(g > thr for g in growth),
        "kept_tensors": len(history),
        "note": "warm-up (first optimizer step) is inside epoch0; every interval is after it",
    }
    ok = len(growth) >= 2 and all(g > thr for g in growth)
    c.meta["label_basis"] = (
        (
            "A at epoch ends grows by more than max(64 MiB, 1% of cap) in every interval; "
            "the growth is the kept logits blocks, live at all later points"
        )
        if ok
        else "CHECK FAILED"
    )
    c.finish()


# ---- cuda_graphs -------------------------------------------------------------------------
def w_graphs(d, p):
    torch = cuda_setup(0)
    import torch.nn as nn

    root = os.path.dirname(d)
    c = Cap(d, "cuda_graphs", label="healthy")
    record(torch, 8000)
    H, L = 4096, 4
    with torch.device("cuda"):
        model = nn.Sequential(*[nn.Sequential(nn.Linear(H, H), nn.ReLU()) for _ in range(L)])
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    lossf = nn.MSELoss()
    side = torch.cuda.Stream()
    c.meta.update(
        params=nparams(model),
        optimizer="SGD momentum 0.9",
        what="whole training step (forward, backward, SGD step) captured with torch.cuda.graph; replayed",
    )

    def capture(b):
        sx = torch.randn(b, H, device="cuda")
        sy = torch.randn(b, H, device="cuda")
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                lossf(model(sx), sy).backward()
                opt.step()
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            sl = lossf(model(sx), sy)
            sl.backward()
            opt.step()
        return g, sx, sy, sl

    keep = []
    g, sx, sy, sl = capture(2048)
    keep.append((g, sx, sy, sl))
    for i in range(5):
        CUR.update(step=i, epoch=0)
        sx.copy_(torch.randn_like(sx))
        sy.copy_(torch.randn_like(sy))
        g.replay()
        c.stat(step=i + 1, epoch=0, phase="replay", loss=float(sl))
    torch.cuda.synchronize()
    s, _ = c.snap("after_replays", trigger="manual", step=5, epoch=0)
    pools = pool_summary(s)
    c.meta.update(
        graph_batches=[2048],
        pools=pools,
        private_pool_bytes=sum(v["total_size"] for k, v in pools.items() if k != "(0, 0)"),
        label_basis="no OOM; one graph's private pool, replays reuse it; peak far below the device",
    )
    c.finish()

    # cuda_graphs_oom: one graph per batch size, each with its own private pool (pytorch#117106 style),
    # then an eager step under a cap of reserved + 1 GiB.
    c2 = Cap(os.path.join(root, "cuda_graphs_oom"), "cuda_graphs_oom")
    for b in (4096, 8192):
        g2 = capture(b)
        keep.append(g2)
        for _ in range(2):
            g2[0].replay()
        torch.cuda.synchronize()
        c2.stat(step=len(keep), epoch=0, phase="captured", batch=b)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    c2.set_cap(torch.cuda.memory_reserved() + GiB)
    s2, _ = c2.snap("graphs_captured", trigger="manual", step=0, epoch=0)
    c2.meta.update(
        graph_batches=[2048, 4096, 8192],
        pools=pool_summary(s2),
        params=nparams(model),
        optimizer="SGD momentum 0.9",
        what="three graphs of the same step (batch 2048/4096/8192), each with its own private pool, "
        "kept alive; then an eager step at batch 16384 under cap = reserved + 1 GiB",
    )
    OOM["cap"], OOM["taken"], OOM["events"] = c2, 0, []
    try:
        CUR.update(step=1, epoch=0)
        bx = torch.randn(16384, H, device="cuda")
        by = torch.randn(16384, H, device="cuda")
        opt.zero_grad(set_to_none=True)
        lossf(model(bx), by).backward()
        c2.meta["outcome"] = "completed"
    except torch.cuda.OutOfMemoryError as ex:
        c2.meta.update(outcome="oom", oom_message=str(ex).strip(), oom_step=1)
    bx = by = None
    oo = [e for e in c2.meta["snapshots"] if e["tag"] == "oom"]
    if oo and "checks" in oo[0]:
        lab, why = decide_oom_label(oo[0]["checks"], "")
        c2.meta["label"] = lab
        c2.meta["label_basis"] = (
            why + ". By the ordered tests this is the label; the cached free memory is "
            "not in pieces of the default pool but reserved by CUDA-graph private pools "
            "(segment_pool_id != (0,0)), which expandable_segments would not fix; sharing "
            "one pool across graphs (pool=g.pool()) or dropping old graphs would"
        )
    else:
        c2.meta["label"] = "healthy" if c2.meta["outcome"] == "completed" else "unknown"
    c2.finish()


# ---- paused_recording --------------------------------------------------------------------
def w_pause(d, p):
    torch = cuda_setup(0)
    c = Cap(d, "paused_recording", label="healthy")
    record(torch, 8000)
    kept = [torch.empty(3 * MiB + k * 4096, dtype=torch.uint8, device="cuda") for k in range(4)]
    small = torch.empty(1000, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.memory._record_memory_history(enabled=None)
    later = torch.empty(5 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    s, _ = c.snap("paused", trigger="manual")
    blocks = {b["address"]: b for sg in s["segments"] for b in sg["blocks"]}

    def nfr(t):
        b = blocks.get(t.data_ptr())
        return None if b is None else len(b.get("frames") or [])

    res = {
        "recorded_then_paused_block_frames": [nfr(t) for t in kept],
        "small_block_frames": nfr(small),
        "allocated_after_pause_block_frames": nfr(later),
        "trace_entries_after_pause": trace_len(s),
    }
    # re-enable: do old blocks keep frames, does the trace restart?
    record(torch, 8000)
    again = torch.empty(7 * MiB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    s2, _ = c.snap("resumed", trigger="manual")
    blocks = {b["address"]: b for sg in s2["segments"] for b in sg["blocks"]}
    res.update(
        after_resume_old_block_frames=[nfr(t) for t in kept],
        after_resume_new_block_frames=nfr(again),
        after_resume_paused_block_frames=nfr(later),
        trace_entries_after_resume=trace_len(s2),
    )
    res["blocks_keep_frames_after_pause"] = all(
        (n or 0) > 0 for n in res["recorded_then_paused_block_frames"]
    )
    c.meta["pause_check"] = res
    c.meta["label_basis"] = "a few tensors, no OOM"
    log("pause check:", json.dumps(res))
    c.finish()


# ---- dynamic_settings --------------------------------------------------------------------
def dyn_schedule(steps):
    rng = random.Random(DYN_SEED)
    shapes = [(b, t) for b in DYN_BATCHES for t in DYN_SEQS]
    return [rng.choice(shapes) for _ in range(steps)]


def w_dynamic(d, p):
    torch = cuda_setup(0)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    c = Cap(d, "dynamic_settings", conf=conf)
    full = p["record"] == "full"
    if p.get("cap_bytes"):
        c.set_cap(p["cap_bytes"])
    max_entries = DYN_FULL_MAX_ENTRIES if full else 8000
    record(torch, max_entries)  # before the first CUDA allocation: the trace starts at an empty allocator
    OOM["cap"], OOM["conf"] = c, conf
    V = 45000
    with torch.device("cuda"):
        model = gpt(12, 768, 12, V, max(DYN_SEQS), ckpt=True)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    steps = DYN_EPOCHS * DYN_STEPS_PER_EPOCH
    sched = dyn_schedule(steps)
    c.meta.update(
        params=nparams(model),
        optimizer="SGD momentum 0.9",
        seed=DYN_SEED,
        batches=DYN_BATCHES,
        seqs=DYN_SEQS,
        epochs=DYN_EPOCHS,
        steps_per_epoch=DYN_STEPS_PER_EPOCH,
        schedule=sched,
        record_mode=p["record"],
        max_entries=max_entries,
        probe_ratio=p.get("ratio"),
    )
    gen = torch.Generator(device="cuda")
    gen.manual_seed(DYN_SEED)
    step, epoch, (b, t) = 0, 0, sched[0]
    try:
        for epoch in range(DYN_EPOCHS):
            for _ in range(DYN_STEPS_PER_EPOCH):
                b, t = sched[step]
                CUR.update(step=step, epoch=epoch)
                x = torch.randint(0, V, (b, t), device="cuda", generator=gen)
                y = torch.randint(0, V, (b, t), device="cuda", generator=gen)
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits, loss = model(x, y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del logits, loss, x, y
                step += 1
                c.stat(step=step, epoch=epoch, phase="step", batch=b, seq=t)
            if not full:
                torch.cuda.synchronize()
                c.snap(f"epoch{epoch}", trigger="epoch_end", step=step, epoch=epoch)
    except torch.cuda.OutOfMemoryError as ex:
        c.meta.update(
            outcome="oom", oom_message=str(ex).strip(), oom_step=step, oom_epoch=epoch, oom_shape=[b, t]
        )
        log(f"OOM at step {step} (epoch {epoch}, shape {b}x{t})")
    if full and c.meta["outcome"] == "completed":
        torch.cuda.synchronize()
        c.snap("end", trigger="manual", step=step, epoch=epoch)
    if full and c.meta["snapshots"]:
        e = c.meta["snapshots"][-1]
        c.meta["trace_complete"] = e["trace_entries"] < max_entries
        c.meta["trace_note"] = (
            f"recording started before the first CUDA allocation with max_entries={max_entries}; "
            "the trace holds every event since (not wrapped) iff trace_complete"
        )
    oo = [e for e in c.meta["snapshots"] if e["tag"] == "oom"]
    if c.meta["outcome"] == "oom" and oo and "checks" in oo[0]:
        lab, why = decide_oom_label(oo[0]["checks"], conf)
    elif c.meta["outcome"] == "oom":
        lab, why = "unknown", "OOM without an observer snapshot"
    else:
        lab, why = "healthy", "completed all steps"
    c.meta["label"], c.meta["label_basis"] = lab, why
    c.finish()


# ---- cudnn_workspace ---------------------------------------------------------------------
def w_cudnn(d, p):
    torch = cuda_setup(0)
    import torch.nn as nn
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = bool(p["benchmark"])
    c = Cap(d, "cudnn_workspace" if p["benchmark"] else "cudnn_probe")
    if p.get("cap_bytes"):
        c.set_cap(p["cap_bytes"])
    if p.get("record"):
        record(torch, p.get("max_entries", 2000), stacks="all")
    OOM["cap"], OOM["max"] = c, 1
    with torch.device("cuda"):
        net = nn.Sequential(
            nn.Conv2d(3, 64, 7, padding=3),
            nn.ReLU(),
            nn.Conv2d(64, 128, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 5, padding=2),
            nn.ReLU(),
            nn.Conv2d(256, 256, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(256, 10),
        )
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    B = 32
    x = torch.randn(B, 3, 256, 256, device="cuda")
    y = torch.randint(0, 10, (B,), device="cuda")
    c.meta.update(
        params=nparams(net),
        optimizer="SGD momentum 0.9",
        batch=B,
        input=[3, 256, 256],
        cudnn_benchmark=bool(p["benchmark"]),
        cudnn_version=torch.backends.cudnn.version(),
        stacks="all" if p.get("record") else None,
        max_entries=p.get("max_entries"),
        symbolize_mode=os.environ.get("TORCH_SYMBOLIZE_MODE", "(torch default)"),
    )
    peaks = []
    step = 0
    try:
        for step in range(p.get("steps", 3)):
            CUR.update(step=step, epoch=0)
            torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            loss = F.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
            torch.cuda.synchronize()
            dt = time.perf_counter() - t0
            st = torch.cuda.memory_stats()
            peaks.append(
                {
                    "step": step,
                    "secs": round(dt, 3),
                    "peak_allocated": st["allocated_bytes.all.peak"],
                    "peak_reserved": st["reserved_bytes.all.peak"],
                    "num_ooms": st["num_ooms"],
                }
            )
            c.stat(step=step + 1, epoch=0, phase="step", secs=dt)
            log("step", step, peaks[-1])
            if p.get("record") and step == 0:
                s, e = c.snap("after_benchmark_step", trigger="manual", step=1, epoch=0)
                c.meta["workspace_evidence"] = workspace_evidence(s)
    except torch.cuda.OutOfMemoryError as ex:
        c.meta.update(outcome="oom", oom_message=str(ex).strip(), oom_step=step)
    c.meta["per_step_peaks"] = peaks
    c.meta["internal_ooms"] = len(OOM["events"])
    if p.get("record"):
        oo = [e for e in c.meta["snapshots"] if e["tag"] == "oom"]
        if "workspace_evidence" not in c.meta and oo:  # OOM escaped before the after-step snapshot
            with gzip.open(os.path.join(d, oo[0]["file"])) as f:
                c.meta["workspace_evidence"] = workspace_evidence(pickle.load(f))  # noqa: S301 (our own file)
        ev = c.meta.get("workspace_evidence") or {}
        oom_ws = [o for o in ev.get("ooms", []) if o["workspace_frames"]]
        peak_ws = bool(ev.get("largest_allocs")) and ev["largest_allocs"][0]["workspace_frames"]
        if oom_ws:
            lab = "workspace"
            why = (
                f"{len(OOM['events'])} OOM(s) during cuDNN kernel selection (benchmark=True); the failed "
                f"request S={oom_ws[0]['size']} carries cuDNN workspace C++ frames"
            )
            if c.meta["outcome"] == "completed":
                why += "; cuDNN caught them (smaller workspace) so training went on"
        elif peak_ws:
            lab, why = "workspace", "no OOM; the largest request of the run carries cuDNN workspace frames"
        else:
            lab, why = "unclear", "no OOM or largest allocation with workspace frames found"
        if oo and "checks" in oo[0]:
            oo[0]["checks"]["frames_show_workspace"] = bool(oom_ws)
        c.meta["label"], c.meta["label_basis"] = lab, why
    else:
        c.meta["label"], c.meta["label_basis"] = "healthy", "probe without benchmark or cap"
    c.finish()


def w_fake(d, p):
    """CAPTURE_FAKE=1: exercise the parent's orchestration without a GPU (plausible fake metas)."""
    os.makedirs(d, exist_ok=True)
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    worker = os.environ.get("CAPTURE_FAKE_WORKER", "")
    oom = bool(p.get("cap_bytes")) and (conf == "" or "max_split" in conf) and p.get("ratio", 1) < 1.12
    meta = {
        "label": "fragmentation" if oom else "healthy",
        "outcome": "oom" if oom else "completed",
        "max_allocated": 17 * GiB,
        "max_reserved": 18 * GiB,
        "cap_bytes": p.get("cap_bytes"),
        "final_stats": {"num_alloc_retries": 1},
        "oom_step": 30 if oom else None,
        "snapshots": [{"tag": "oom" if oom else "end", "file": "x.pickle.gz", "alloc": 5}],
    }
    with open(os.path.join(d, "x.pickle.gz"), "wb") as f:
        f.write(gzip.compress(pickle.dumps({"segments": [], "device_traces": [[]]})))
    json.dump(meta, open(os.path.join(d, "meta.json"), "w"))
    if worker == "graphs":
        os.makedirs(os.path.join(os.path.dirname(d), "cuda_graphs_oom"), exist_ok=True)
        json.dump(meta, open(os.path.join(os.path.dirname(d), "cuda_graphs_oom", "meta.json"), "w"))
    time.sleep(0.2)


WORKERS = {"leak": w_leak, "graphs": w_graphs, "pause": w_pause, "dynamic": w_dynamic, "cudnn": w_cudnn}


# --------------------------------------------------------------------------------------------
# parent: runs the workers one after another within a time budget
# --------------------------------------------------------------------------------------------
class Runner:
    def __init__(self, out, budget):
        self.out = out
        self.t0 = time.time()
        self.deadline = self.t0 + budget
        self.summary = {
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "budget_s": budget,
            "runs": [],
            "scenarios": {},
        }
        os.makedirs(out, exist_ok=True)

    def left(self):
        return self.deadline - time.time()

    def save(self):
        self.summary["elapsed_s"] = round(time.time() - self.t0, 1)
        with open(os.path.join(self.out, "summary.json"), "w") as f:
            json.dump(self.summary, f, indent=1, default=str)

    def run(self, worker, sub, params, conf="", timeout=120, env_extra=None, min_needed=25):
        to = min(timeout, self.left() - 5)
        rec = {"worker": worker, "dir": sub, "conf": conf, "params": params}
        if to < min_needed:
            log(f"SKIP {sub}: {self.left():.0f}s left")
            rec["rc"] = "skipped"
            self.summary["runs"].append(rec)
            self.save()
            return None, rec
        d = os.path.join(self.out, sub)
        os.makedirs(d, exist_ok=True)
        env = dict(os.environ)
        env.pop("PYTORCH_ALLOC_CONF", None)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        env["PYTHONUNBUFFERED"] = "1"
        env["CAPTURE_TAG"] = sub
        env.update(env_extra or {})
        cmd = [sys.executable, SCRIPT, "--worker", worker, "--dir", d, "--params", json.dumps(params)]
        log(f"START {sub} conf={conf!r} timeout={to:.0f}s params={params}")
        t0 = time.time()
        pr = subprocess.Popen(cmd, env=env, start_new_session=True)
        try:
            rc = pr.wait(timeout=to)
        except subprocess.TimeoutExpired:
            os.killpg(pr.pid, signal.SIGKILL)
            pr.wait()
            rc = "timeout"
        rec["rc"], rec["wall_s"] = rc, round(time.time() - t0, 1)
        meta = None
        try:
            with open(os.path.join(d, "meta.json")) as f:
                meta = json.load(f)
        except Exception:
            pass
        if meta:
            for k in (
                "label",
                "label_basis",
                "outcome",
                "cap_bytes",
                "oom_step",
                "oom_epoch",
                "oom_shape",
                "max_allocated",
                "max_reserved",
                "trace_complete",
                "internal_ooms",
                "pause_check",
                "leak_check",
            ):
                if k in meta:
                    rec[k] = meta[k]
            rec["oom_message"] = meta.get("oom_message")
            rec["num_alloc_retries"] = (meta.get("final_stats") or {}).get("num_alloc_retries")
            rec["snapshots"] = [s["file"] for s in meta.get("snapshots", [])]
            oo = [s for s in meta.get("snapshots", []) if s["tag"] == "oom"]
            if oo:
                rec["oom_alloc"] = oo[0].get("alloc")
                rec["oom_checks"] = oo[0].get("checks")
        log(
            f"END {sub} rc={rc} {rec['wall_s']}s outcome={rec.get('outcome')} label={rec.get('label')} "
            f"oom_step={rec.get('oom_step')} max_alloc={rec.get('max_allocated')} max_res={rec.get('max_reserved')}"
        )
        self.summary["runs"].append(rec)
        self.save()
        return meta, rec


def annotate_dynamic(root):
    """Recompute the OOM checks and labels of dynamic_settings/* from the saved OOM snapshots (torch-free)
    and note, per setting, what the default allocator did at the same cap."""
    base = os.path.join(root, "dynamic_settings")
    metas = {}
    for sub in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        mp = os.path.join(base, sub, "meta.json")
        if os.path.isfile(mp):
            with open(mp) as f:
                metas[sub] = json.load(f)
    default = metas.get("default", {})
    for sub, m in metas.items():
        oo = [e for e in m.get("snapshots", []) if e["tag"] == "oom"]
        try:
            if oo and os.path.isfile(os.path.join(base, sub, oo[0]["file"])):
                with gzip.open(os.path.join(base, sub, oo[0]["file"])) as f:
                    snap = pickle.load(f)  # noqa: S301 (our own capture)
                conf = m.get("alloc_conf", "")
                oo[0]["checks"] = oom_checks(snap, oo[0]["alloc"], m.get("cap_bytes"), conf)
                m["label"], m["label_basis"] = decide_oom_label(oo[0]["checks"], conf)
        except Exception:
            traceback.print_exc()
        if sub != "default" and default and m.get("cap_bytes") == default.get("cap_bytes"):
            m["default_at_same_cap"] = {k: default.get(k) for k in ("outcome", "oom_step", "max_reserved")}
            if m.get("outcome") == "oom" and default.get("outcome") == "completed":
                m["note"] = (
                    f"the default allocator completed this job at the same cap; {m.get('alloc_conf')!r} "
                    "is what made it run out of memory (the label is what the deciding tests give)"
                )
        with open(os.path.join(base, sub, "meta.json"), "w") as f:
            json.dump(m, f, indent=1, default=str)
    return metas


def strip_pickles(d):
    for fn in os.listdir(d):
        if fn.endswith(".pickle.gz"):
            os.remove(os.path.join(d, fn))


def parent(args):
    R = Runner(os.path.abspath(args.out), args.budget)
    only = set(args.only.split(",")) if args.only else None
    S = R.summary["scenarios"]

    def want(x):
        return only is None or x in only

    try:
        import torch  # noqa: F401  (versions only; the parent never touches CUDA)

        R.summary["torch"] = torch.__version__
    except Exception:
        pass

    if want("leak"):
        m, r = R.run(
            "leak", "leak_epochs", {"cap_bytes": 7 * GiB, "steps_per_epoch": 8, "max_epochs": 10}, timeout=120
        )
        S["leak_epochs"] = r
    if want("pause"):
        m, r = R.run("pause", "paused_recording", {}, timeout=60)
        S["paused_recording"] = r
    if want("graphs"):
        m, r = R.run("graphs", "cuda_graphs", {}, timeout=120)
        S["cuda_graphs"] = r
        try:
            with open(os.path.join(R.out, "cuda_graphs_oom", "meta.json")) as f:
                m2 = json.load(f)
            S["cuda_graphs_oom"] = {
                k: m2.get(k)
                for k in (
                    "label",
                    "label_basis",
                    "outcome",
                    "cap_bytes",
                    "oom_message",
                    "max_allocated",
                    "max_reserved",
                )
            }
            oo = [s for s in m2.get("snapshots", []) if s["tag"] == "oom"]
            if oo:
                S["cuda_graphs_oom"]["oom_checks"] = oo[0].get("checks")
        except Exception:
            pass
        R.save()

    dyn = {
        "seed": DYN_SEED,
        "batches": DYN_BATCHES,
        "seqs": DYN_SEQS,
        "epochs": DYN_EPOCHS,
        "steps_per_epoch": DYN_STEPS_PER_EPOCH,
        "settings": {},
        "attempts": [],
    }
    if want("dynamic"):
        S["dynamic_settings"] = dyn
        m, r = R.run(
            "dynamic",
            "dynamic_settings/probe",
            {"record": "light"},
            conf="expandable_segments:True",
            timeout=150,
        )
        dyn["settings"]["probe"] = r
        peak = (m or {}).get("max_allocated")
        dyn["probe_peak_allocated"] = peak
        cap = None
        if peak:
            for i, ratio in enumerate(DYN_RATIOS):
                cap_try = int(round(ratio * peak / MiB)) * MiB
                m, r = R.run(
                    "dynamic",
                    "dynamic_settings/default",
                    {"record": "full", "cap_bytes": cap_try, "ratio": ratio},
                    conf="",
                    timeout=180,
                )
                dyn["attempts"].append(
                    {
                        "ratio": ratio,
                        "cap_bytes": cap_try,
                        "outcome": r.get("outcome"),
                        "oom_step": r.get("oom_step"),
                        "rc": r.get("rc"),
                    }
                )
                if r.get("rc") == "skipped":
                    break
                if r.get("rc") != 0:  # crashed or timed out: do not burn time on more attempts
                    cap, dyn["ratio"] = cap_try, ratio
                    dyn["settings"]["default"] = r
                    break
                cap, dyn["ratio"] = cap_try, ratio
                if r.get("outcome") == "oom" or i == len(DYN_RATIOS) - 1 or R.left() < 200:
                    dyn["settings"]["default"] = r
                    break
                # completed at this ratio: keep its meta only, try a tighter cap
                src = os.path.join(R.out, "dynamic_settings", "default")
                dst = os.path.join(R.out, "dynamic_settings", f"_default_completed_at_{ratio}")
                strip_pickles(src)
                os.rename(src, dst)
            dyn["cap_bytes"] = cap
            R.save()
        if cap:
            for slug, conf in DYN_SETTINGS:
                m, r = R.run(
                    "dynamic",
                    f"dynamic_settings/{slug}",
                    {"record": "light", "cap_bytes": cap},
                    conf=conf,
                    timeout=150,
                    min_needed=30 if R.left() > 130 else 10**6,
                )
                dyn["settings"][slug] = r
        R.save()

    if want("cudnn"):
        m, r = R.run(
            "cudnn", "_probes/cudnn_probe", {"benchmark": False, "record": False, "steps": 2}, timeout=90
        )
        S["cudnn_probe"] = r
        # w_cudnn resets the peak every step: take the largest per-step peak
        peak = max((x["peak_allocated"] for x in (m or {}).get("per_step_peaks", [])), default=None)
        if peak:
            cap = int(round(1.25 * peak / MiB)) * MiB
            params = {"benchmark": True, "record": True, "cap_bytes": cap, "max_entries": 2000, "steps": 3}
            m, r = R.run("cudnn", "cudnn_workspace", params, timeout=min(200, max(60, R.left() - 60)))
            if r.get("rc") == "timeout" and R.left() > 90:
                log("cudnn timed out (symbolization?); retrying with TORCH_SYMBOLIZE_MODE=dladdr")
                os.rename(
                    os.path.join(R.out, "cudnn_workspace"), os.path.join(R.out, "_probes", "cudnn_timed_out")
                )
                m, r = R.run(
                    "cudnn",
                    "cudnn_workspace",
                    params,
                    timeout=R.left() - 20,
                    env_extra={"TORCH_SYMBOLIZE_MODE": "dladdr"},
                )
            S["cudnn_workspace"] = r

    if want("dynamic") and dyn.get("cap_bytes"):
        for slug, conf in DYN_OPTIONAL:
            if R.left() < 60:
                break
            m, r = R.run(
                "dynamic",
                f"dynamic_settings/{slug}",
                {"record": "light", "cap_bytes": dyn["cap_bytes"]},
                conf=conf,
                timeout=min(120, R.left() - 20),
            )
            dyn["settings"][slug] = r
    if want("dynamic") and os.path.isdir(os.path.join(R.out, "dynamic_settings")):
        for k, m in annotate_dynamic(R.out).items():
            if k in dyn["settings"]:
                dyn["settings"][k].update(label=m.get("label"), label_basis=m.get("label_basis"))
        table = {
            k: {
                x: v.get(x)
                for x in (
                    "conf",
                    "rc",
                    "outcome",
                    "label",
                    "oom_step",
                    "oom_epoch",
                    "oom_shape",
                    "oom_alloc",
                    "max_allocated",
                    "max_reserved",
                    "num_alloc_retries",
                    "wall_s",
                )
            }
            for k, v in dyn["settings"].items()
        }
        dyn["table"] = table
        with open(os.path.join(R.out, "dynamic_settings", "settings.json"), "w") as f:
            json.dump({k: v for k, v in dyn.items() if k != "settings"}, f, indent=1, default=str)
    R.summary["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    R.save()
    log(f"done in {time.time() - R.t0:.0f}s")
    for k, v in S.items():
        if isinstance(v, dict) and "table" in v:
            for s, row in v["table"].items():
                log(f"  {k}/{s}: {row}")
        elif isinstance(v, dict):
            log(f"  {k}: rc={v.get('rc')} outcome={v.get('outcome')} label={v.get('label')}")


# --------------------------------------------------------------------------------------------
class _PlainUnpickler(pickle.Unpickler):
    """Snapshots hold only plain data; refuse any global (the product's codec does the same)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing global {module}.{name}")


def selftest():
    """Torch-free checks against tests/fixtures/real (the label decisions must agree with theirs)."""
    base = os.environ.get("MEMQ_REAL_FIXTURES",
                          os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures",
                                       "real"))

    def load(p):
        with gzip.open(os.path.join(base, p)) as f:
            return _PlainUnpickler(f).load()  # fixtures from other captures: no globals allowed

    for folder, expect in (
        ("frag_dynamic_1.15", "fragmentation"),
        ("capacity", "capacity"),
        ("frag_synthetic", "fragmentation"),
    ):
        meta = json.load(open(os.path.join(base, folder, "meta.json")))
        oom = [s for s in meta["snapshots"] if s["tag"] == "oom"][0]
        ch = oom_checks(
            load(f"{folder}/{oom['file']}"), oom["alloc"], meta["cap_bytes"], meta.get("alloc_conf", "")
        )
        lab, why = decide_oom_label(ch, meta.get("alloc_conf", ""))
        print(folder, lab, why, {k: ch[k] for k in ("S", "A", "R", "largest_usable_free_block", "limit")})
        assert lab == expect, (folder, lab)
    assert seg_for(512) == 2 * MiB and seg_for(5 * MiB) == 20 * MiB and seg_for(21 * MiB + 1) == 22 * MiB
    assert not block_usable(200 * MiB, 10 * MiB, 128 * MiB) and block_usable(100 * MiB, 10 * MiB, 128 * MiB)
    assert roundup_min_request(5 * GiB, "roundup_power2_divisions:4") == 4 * GiB + 1
    assert roundup_min_request(4 * GiB, "roundup_power2_divisions:4") == 4 * GiB - 512 * MiB + 1
    assert roundup_min_request(5 * GiB, "") == 5 * GiB
    assert block_usable(300 * MiB, 290 * MiB, 128 * MiB) and not block_usable(400 * MiB, 290 * MiB, 128 * MiB)
    sched = dyn_schedule(DYN_EPOCHS * DYN_STEPS_PER_EPOCH)
    print("schedule", sched, "max tokens", max(b * t for b, t in sched))
    print("selftest ok")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="/tmp/captures")
    ap.add_argument("--budget", type=float, default=510, help="seconds for all scenarios together")
    ap.add_argument("--only", default="", help="comma list of: leak,pause,graphs,dynamic,cudnn")
    ap.add_argument("--worker")
    ap.add_argument("--dir")
    ap.add_argument("--params", default="{}")
    ap.add_argument("--selftest", action="store_true")
    ap.add_argument("--relabel", metavar="DIR", help="recompute dynamic_settings labels under DIR (no torch)")
    a = ap.parse_args()
    if a.selftest:
        return selftest()
    if a.relabel:
        for k, m in annotate_dynamic(a.relabel).items():
            print(k, m.get("outcome"), m.get("label"), "|", m.get("label_basis"))
        return None
    if a.worker:
        t0 = time.time()
        try:
            if os.environ.get("CAPTURE_FAKE"):
                os.environ["CAPTURE_FAKE_WORKER"] = a.worker
                w_fake(a.dir, json.loads(a.params))
            else:
                WORKERS[a.worker](a.dir, json.loads(a.params))
        except Exception:
            traceback.print_exc()
            sys.exit(3)
        log(f"worker done in {time.time() - t0:.1f}s")
        sys.stdout.flush()
        os._exit(0)  # skip slow teardown of CUDA/graphs
    parent(a)


if __name__ == "__main__":
    main()
