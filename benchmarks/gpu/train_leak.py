"""A training job whose validation loop keeps every batch's logits on the GPU: +`val x batch x seq x vocab x 4`
bytes each epoch until the allocator runs out (GPU only for the real thing; `--device cpu` for a dry run).

    python train_leak.py --name R --result R.json --memq                # instrumented as the README says
    memq run --run R --cluster C -- python train_leak.py --result R.json  # no memq line at all

The cap (`set_per_process_memory_fraction`) is set after the first training step: reserved bytes then
plus `--grow-epochs` epochs of leaked logits, so the OOM comes after a few epochs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from gpt_agent_train import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="leak")
    ap.add_argument("--cluster", default="h200")
    ap.add_argument("--memq", action="store_true", help="agent.start / mark_step / mark_epoch in this script")
    ap.add_argument("--result", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--val", type=int, default=2)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--val-batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--grow-epochs", type=float, default=8.0)
    ap.add_argument("--fixed", action="store_true", help="the fix: keep each batch's loss as a float, not its logits")
    args = ap.parse_args()
    agent = None
    if args.memq:
        from memq import agent

        agent.start(run=args.name, cluster=args.cluster, optimizer="AdamW", model="GPT")
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    torch.manual_seed(0)
    model = GPT(vocab=args.vocab, d=args.d, layers=args.layers, heads=8, ctx=1024, ckpt=False).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    growth = args.val * args.val_batch * args.seq * args.vocab * 4  # float32 copies of the val logits
    res = {"outcome": "completed", "fixed": args.fixed, "growth_per_epoch": growth, "leak_line": LEAK_LINE,
           "script": __file__}
    all_logits = []
    step, epoch, phase = 0, 0, "train"
    t0 = time.time()
    try:
        for epoch in range(args.epochs):
            model.train()
            phase = "train"
            for _ in range(args.steps):
                x = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev)
                with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
                    logits = model(x)
                    loss = F.cross_entropy(logits.float().view(-1, args.vocab), torch.roll(x, -1, 1).view(-1))
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                del logits, loss
                if agent is not None:
                    agent.mark_step(step, epoch)
                if step == 0 and cuda:
                    cap = torch.cuda.memory_reserved(dev) + int(args.grow_epochs * growth)
                    idx = dev.index if dev.index is not None else torch.cuda.current_device()
                    total = torch.cuda.get_device_properties(idx).total_memory
                    torch.cuda.set_per_process_memory_fraction(cap / total, idx)
                    res["cap_bytes"] = int(cap / total * total)
                step += 1
            model.eval()
            phase = "validation"
            with torch.no_grad():
                for _ in range(args.val):
                    xv = torch.randint(0, args.vocab, (args.val_batch, args.seq), device=dev)
                    with torch.autocast(args.device, dtype=torch.bfloat16, enabled=cuda):
                        logits = model(xv)
                    if args.fixed:  # the fix: a number per batch, the logits are freed with the batch
                        all_logits.append(float(logits.float().logsumexp(-1).mean()))
                    else:
                        all_logits.append(logits.float())  # LEAK: every val batch's logits stay on the GPU
            if agent is not None:
                agent.mark_epoch(epoch)
            print(f"epoch {epoch} step {step} {time.time() - t0:.1f}s kept {len(all_logits)}", flush=True)
    except torch.OutOfMemoryError as exc:
        # the step in progress: `step` training steps completed (0-based next index)
        res.update(outcome="oom", oom_step=step, oom_epoch=epoch, oom_phase=phase, message=str(exc)[:600])
        raise
    finally:
        res["steps_completed"], res["secs"] = step, round(time.time() - t0, 1)
        with open(args.result, "w") as fh:
            json.dump(res, fh, indent=1)


def _leak_line() -> int:
    with open(__file__) as fh:
        for i, line in enumerate(fh, 1):
            if "# LEAK:" in line and "all_logits.append" in line:
                return i
    return -1


LEAK_LINE = _leak_line()

if __name__ == "__main__":
    main()
