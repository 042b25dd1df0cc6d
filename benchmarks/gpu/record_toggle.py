"""Does switching history recording off and on leave hooks behind that slow every later allocation?
(pytorch #153571: `_record_memory_history(enabled=None)` then on again re-registered the annotation
hooks, so each toggle added work to every allocation.) The agent toggles recording by design (warm-up,
growth windows, periodic steps), so this measures it on the machine's torch:

    python3 record_toggle.py --out DIR [--toggles 0,10,100,1000] [--allocs 20000]

Per round: the mean time of `--allocs` allocate-and-free pairs of a 1 MiB tensor with recording OFF,
then the same with recording ON (python stacks, as the agent records), after the cumulative number of
toggles given. A leftover hook shows as a cost that grows with the toggles. DIR/record_toggle.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--toggles", default="0,10,100,1000")
    ap.add_argument("--allocs", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    dev = torch.device("cuda", 0)
    mem = torch.cuda.memory
    torch.empty(1, device=dev)

    def on():
        mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=50_000)

    def off():
        mem._record_memory_history(enabled=None)

    def per_alloc_us() -> float:
        xs = []
        for _ in range(args.repeats):
            torch.cuda.synchronize(dev)
            t = time.perf_counter()
            for _ in range(args.allocs):
                x = torch.empty(1 << 18, device=dev)  # 1 MiB
                del x
            torch.cuda.synchronize(dev)
            xs.append((time.perf_counter() - t) / args.allocs * 1e6)
        return statistics.median(xs)

    rows, done = [], 0
    for n in (int(x) for x in args.toggles.split(",")):
        for _ in range(n - done):
            on()
            off()
        done = n
        t_off = per_alloc_us()
        on()
        t_on = per_alloc_us()
        off()
        done += 1
        rows.append({"toggles": n, "alloc_us_recording_off": round(t_off, 3), "alloc_us_recording_on": round(t_on, 3)})
        print(rows[-1], flush=True)
    def read_us(fn, n=20000) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return round((time.perf_counter() - t) / n * 1e6, 3)

    # what a thinned step boundary reads (the live bytes alone) against a full reading
    reads = {"cuda_memoryStats_us": read_us(lambda: torch._C._cuda_memoryStats(0)["allocated_bytes"]["all"]["current"]),
             "memory_allocated_us": read_us(lambda: torch.cuda.memory_allocated(0))}
    print(reads, flush=True)
    out = {"reads": reads, "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(0),
           "allocs_per_measure": args.allocs, "repeats_median_of": args.repeats, "rows": rows}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "record_toggle.json"), "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
