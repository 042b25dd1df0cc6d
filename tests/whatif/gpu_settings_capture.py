"""GPU capture for the what-if model (run on a CUDA machine; the tests only read its output).

A seeded allocation workload shaped like dynamic-shape training (persistent parameters, per-step
activations whose size follows a random batch scale, temporaries, small tensors) runs once without a
cap (the probe: its full trace is what the model is fed) and then under a per-process cap with each
allocator setting, each in its own process so PYTORCH_CUDA_ALLOC_CONF applies. Every run records the
full history from before its first CUDA allocation and writes its snapshot (at the end, or in the OOM
observer) and the outcome.

    python tests/whatif/gpu_settings_capture.py OUTDIR
"""

from __future__ import annotations

import gzip
import json
import os
import pickle
import random
import subprocess
import sys
import time

MiB = 1 << 20
SETTINGS = [
    ("default", ""),
    ("expandable_segments", "expandable_segments:True"),
    ("max_split_128", "max_split_size_mb:128"),
    ("max_split_512", "max_split_size_mb:512"),
    ("gc_0.6", "garbage_collection_threshold:0.6"),
    ("roundup_4", "roundup_power2_divisions:4"),
    ("max_split_128_gc_0.6", "max_split_size_mb:128,garbage_collection_threshold:0.6"),
    ("gc_0.8", "garbage_collection_threshold:0.8"),
    ("expandable_max_split_128", "expandable_segments:True,max_split_size_mb:128"),
    ("max_split_64_rounding_64", "max_split_size_mb:64,max_non_split_rounding_mb:64"),
    ("roundup_list", "roundup_power2_divisions:[4:8,64:4,>:1]"),
    ("large_segment_40", "large_segment_size_mb:40"),
]
SEED = 7
STEPS = 40
SCALES = [0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0]


def workload(alloc, free):
    """The request sequence: identical in every run (it depends only on the seed)."""
    rng = random.Random(SEED)
    params = [alloc(rng.randint(1, 40) * MiB + rng.randint(0, 4096)) for _ in range(40)]
    params += [alloc(rng.randint(1, 200000)) for _ in range(60)]
    kept = []
    for _step in range(STEPS):
        s = rng.choice(SCALES)
        acts = []
        for _layer in range(12):
            acts.append(alloc(int(s * 24 * MiB * (1 + 0.05 * rng.random()))))
            acts.append(alloc(int(s * 3 * MiB) + rng.randint(0, 1 << 16)))
            tmp = alloc(int(s * 40 * MiB))
            small = alloc(rng.randint(64, 600000))
            free(tmp)
            if rng.random() < 0.3:
                kept.append(small)
            else:
                free(small)
        grads = []
        for a in reversed(acts):
            g = alloc(int(s * 6 * MiB) + 512)
            free(a)
            grads.append(g)
            if len(grads) > 3:
                free(grads.pop(0))
        for g in grads:
            free(g)
        while len(kept) > 20:
            free(kept.pop(0))
    for k in kept:
        free(k)
    del params


def worker(out: str, tag: str, conf: str, cap: int) -> None:
    try:
        _worker(out, tag, conf, cap)
    except RuntimeError as ex:  # torch refused the setting (e.g. an option this version does not know)
        if "out of memory" in str(ex).lower():
            raise
        with open(os.path.join(out, f"{tag}.json"), "w") as f:
            json.dump({"tag": tag, "conf": conf, "cap_bytes": cap, "outcome": "refused",
                       "error": str(ex).strip().splitlines()[0], "peak_reserved": None}, f, indent=1)


def _worker(out: str, tag: str, conf: str, cap: int) -> None:
    import torch

    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap / total)
    torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
    meta = {"tag": tag, "conf": conf, "cap_bytes": cap, "device_total": total, "torch": torch.__version__,
            "outcome": "completed", "seed": SEED, "steps": STEPS}
    holder: dict = {}

    def observer(device, alloc_size, device_alloc, device_free):
        if "oom" not in holder:
            holder["oom"] = torch.cuda.memory._snapshot()
            meta.update(oom_alloc=alloc_size, oom_device_alloc=device_alloc, oom_device_free=device_free)

    torch._C._cuda_attach_out_of_memory_observer(observer)
    live: dict = {}
    counter = [0]

    def alloc(n):
        counter[0] += 1
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        live[counter[0]] = t
        return counter[0]

    def free(h):
        del live[h]

    try:
        workload(alloc, free)
        snap = torch.cuda.memory._snapshot()
    except torch.cuda.OutOfMemoryError as ex:
        meta.update(outcome="oom", oom_message=str(ex).strip().splitlines()[0])
        snap = holder.get("oom") or torch.cuda.memory._snapshot()
    stats = torch.cuda.memory_stats()
    meta.update(peak_reserved=stats["reserved_bytes.all.peak"], peak_allocated=stats["allocated_bytes.all.peak"],
                num_alloc_retries=stats["num_alloc_retries"], num_ooms=stats["num_ooms"],
                trace_entries=len(snap["device_traces"][0]))
    with gzip.open(os.path.join(out, f"{tag}.pickle.gz"), "wb") as f:
        pickle.dump(snap, f)
    with open(os.path.join(out, f"{tag}.json"), "w") as f:
        json.dump(meta, f, indent=1)


def run_one(out: str, tag: str, conf: str, cap: int) -> dict:
    env = dict(os.environ)
    env.pop("PYTORCH_ALLOC_CONF", None)
    env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    t0 = time.time()
    subprocess.run([sys.executable, __file__, "--worker", out, tag, conf, str(cap)], env=env, check=True)
    with open(os.path.join(out, f"{tag}.json")) as f:
        meta = json.load(f)
    print(f"{tag:<24} {conf!r:<58} cap={cap} outcome={meta['outcome']} peak_reserved={meta.get('peak_reserved')} "
          f"({time.time() - t0:.1f} s)", flush=True)
    return meta


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    probe = run_one(out, "probe", "", 0)
    a, r = probe["peak_allocated"], probe["peak_reserved"]
    caps = {"tight": a + (r - a) // 3, "loose": a + 2 * (r - a) // 3}
    summary = {"probe": probe, "caps": caps, "runs": {}}
    for cap_name, cap in caps.items():
        for tag, conf in SETTINGS:
            meta = run_one(out, f"{cap_name}_{tag}", conf, cap)
            if meta["outcome"] == "refused":
                summary.setdefault("refused", {})[tag] = meta["error"]
                continue
            summary["runs"][f"{cap_name}_{tag}"] = {"conf": conf, "cap_bytes": cap, "outcome": meta["outcome"],
                                                   "peak_reserved": meta["peak_reserved"]}
    with open(os.path.join(out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    if sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        main(sys.argv[1])
