"""A real snapshot with a full trace ring buffer of 1,000,000 entries and Python frames, for the
big-snapshot benchmarks (benchmarks/bench_big_snapshot.py): the small GPT of fit.py (4 x 512, AdamW,
batch 4 x 256) trains with `_record_memory_history(max_entries=1_000_000, stacks="python")` until
the ring buffer has wrapped, then `torch.cuda.memory._snapshot()` is pickled and gzipped.

    python3 big_trace.py --out FILE.pickle.gz [--entries 1000000] [--steps 1400]

About 850 trace entries a step: 1,400 steps fill the buffer and wrap it. Prints the entry count, the
pickle's size and the seconds the snapshot and the pickling took.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--entries", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=1400)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from gpt_agent_train import GPT

    dev = torch.device("cuda", 0)
    torch.cuda.memory._record_memory_history(enabled="all", context="all", stacks="python",
                                             max_entries=args.entries)
    torch.manual_seed(0)
    model = GPT(vocab=32_000, d=512, layers=4, heads=8, ctx=4096, ckpt=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t0 = time.time()
    for _ in range(args.steps):
        x = torch.randint(0, 32_000, (4, 256), device=dev)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, 32_000), torch.roll(x, -1, 1).view(-1))
        del logits
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize(dev)
    train_s = time.time() - t0
    t0 = time.time()
    snap = torch.cuda.memory._snapshot()
    snap_s = time.time() - t0
    t0 = time.time()
    raw = pickle.dumps(snap, protocol=4)
    with gzip.open(args.out, "wb", compresslevel=6) as fh:
        fh.write(raw)
    n = sum(len(t) for t in snap["device_traces"])
    print(json.dumps({"entries": n, "pickle_bytes": len(raw), "gzip_bytes": os.path.getsize(args.out),
                      "train_s": round(train_s, 1), "snapshot_s": round(snap_s, 1),
                      "pickle_s": round(time.time() - t0, 1), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
