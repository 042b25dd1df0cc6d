"""Does switching allocation-history recording off and on leave hooks that slow every later allocation?
(pytorch issue #153571: `_record_memory_history(enabled=None)` re-added annotation hooks.) The agent
toggles recording by design (warm-up, growth windows, one recorded step per periodic snapshot), so
this measures, on the GPU, the time of an allocate/free pair before any recording and after N toggles,
in one process, interleaved with a fresh baseline; and whether a snapshot pickled with protocol 5 (the
default pickle protocol of Python 3.14) is what the analysis reads.

    python3 toggle_cost.py --out DIR [--toggles 0,10,100,1000] [--pairs 20000]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import time


def timed_pairs(torch, n: int, dev) -> float:
    """Mean microseconds of one allocate + free of a 1 MiB tensor (from the cache)."""
    torch.cuda.synchronize(dev)
    t = time.perf_counter()
    for _ in range(n):
        x = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
        del x
    torch.cuda.synchronize(dev)
    return (time.perf_counter() - t) / n * 1e6


def main() -> None:
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--toggles", default="0,10,100,1000")
    ap.add_argument("--pairs", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    dev = torch.device("cuda", 0)
    mem = torch.cuda.memory
    timed_pairs(torch, 2000, dev)  # warm the cache
    out = {"torch": torch.__version__, "pairs": args.pairs, "rows": []}
    done = 0
    for target in (int(t) for t in args.toggles.split(",")):
        while done < target:  # the agent's toggle: record a window of Python stacks, then pause
            mem._record_memory_history(enabled="all", context="all", stacks="python", max_entries=10_000)
            x = torch.empty(1 << 20, dtype=torch.uint8, device=dev)
            del x
            mem._record_memory_history(enabled=None)
            done += 1
        times = [timed_pairs(torch, args.pairs, dev) for _ in range(args.rounds)]
        row = {"toggles": done, "us_per_pair": round(statistics.median(times), 3),
               "us_min": round(min(times), 3), "us_max": round(max(times), 3)}
        out["rows"].append(row)
        print(json.dumps(row), flush=True)
    base = out["rows"][0]["us_per_pair"]
    for r in out["rows"]:
        r["ratio_to_none"] = round(r["us_per_pair"] / base, 3)
    # a snapshot pickled with protocol 5, as Python 3.14's default would write it
    mem._record_memory_history(enabled="all", stacks="python", max_entries=2000)
    y = torch.empty(3 << 20, dtype=torch.uint8, device=dev)
    snap = mem._snapshot()
    mem._record_memory_history(enabled=None)
    del y
    with open(os.path.join(args.out, "protocol5.pickle"), "wb") as fh:
        pickle.dump(snap, fh, protocol=5)
    with open(os.path.join(args.out, "toggle_cost.json"), "w") as fh:
        json.dump(out, fh, indent=1)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
