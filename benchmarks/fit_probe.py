"""How well one measured run predicts the peak at a larger batch or sequence length, by replaying its
own recorded steps with the input-sized allocations scaled (the method for `memq fit`), against the
real runs of the H200 set (tests/fixtures/fit, benchmarks/gpu/fit.py). No services, no torch.

    python benchmarks/fit_probe.py

Per model and scale k (k x the base batch, or k x the length for the GPTs): the predicted peak
allocated bytes (the last recorded training step replayed at k: timeline.py's `last_cycle`, whose
allocations are flagged fixed-size or input-sized) and the predicted peak reserved bytes (the whole
recorded trace replayed at k through the allocator model of profiler/analysis/allocator_model.py),
each against `max_memory_allocated()` / `max_memory_reserved()` of the real run at that shape.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler.analysis import ANALYZER_VERSION  # noqa: E402
from profiler.analysis import frames as fr  # noqa: E402
from profiler.analysis import whatif as wi  # noqa: E402
from profiler.analysis.allocator_model import OP_ALLOC, OP_FREE, AllocatorModel, Program  # noqa: E402
from profiler.analysis.per_snapshot import per_snapshot  # noqa: E402
from profiler.analysis.step_need import SCALED  # noqa: E402
from tests.analysis.agent_data import spool_run  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "fit"
GiB = 1 << 30


def cycle_peak(cyc: dict, k: float) -> int:
    cur = top = 0
    for e in cyc["events"]:
        size, flag = cyc["allocs"][e if e >= 0 else -e - 1]
        d = int(size * k) if flag == SCALED else size
        cur += d if e >= 0 else -d
        top = max(top, cur)
    return top


def reserved_peak(snap, k: float) -> int:
    rep = wi.compile_trace(snap)
    prog, trace = rep.program, snap.trace
    fixed, open_ = {}, {}
    for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)):
        ev = trace[rep.op_event[i]]
        if op == OP_ALLOC:
            open_[h] = i
            fixed[h] = bool(ev.frames) and (fr.is_optimizer(ev.frames)
                                            or fr.categorize(ev.frames) in (fr.PARAMETERS, fr.OPTIMIZER_STATE))
        elif op == OP_FREE and h in open_:
            if ev.frames and fr.is_optimizer(ev.frames):
                fixed[h] = True  # freed by zero_grad: a gradient
            open_.pop(h)
    for h in open_:
        fixed[h] = True  # never freed: parameters, optimizer state
    sizes = [int(s * k) if op == OP_ALLOC and not fixed.get(h, True) else s
             for op, h, s in zip(prog.ops, prog.hid, prog.size, strict=True)]
    m = AllocatorModel(rep.recorded_config, None, n_handles=prog.n_handles)
    m.load(rep.start_segments)
    return m.run(Program(ops=prog.ops, hid=prog.hid, size=sizes, stream=prog.stream,
                         n_handles=prog.n_handles)).peak_reserved


def main() -> None:
    truth = json.loads((FIX / "truth.json").read_text())
    print("| model | shape | allocated: predicted / real | error | reserved: predicted / real | error |")
    print("|---|---|---|---|---|---|")
    for model, d in truth.items():
        runs = d["runs"]
        base = next(k for k in runs if k.endswith("-defaults"))
        b0, t0 = int(base.split("-b")[1].split("-")[0]), int(base.split("-t")[1].split("-")[0])
        snaps, _ctx, _trig = spool_run(next((FIX / model / "defaults").iterdir()))
        traced = [s for s in snaps if s.trace]
        cyc = next((per_snapshot(s, ANALYZER_VERSION)["timeline"].get("last_cycle") for s in reversed(snaps)
                    if per_snapshot(s, ANALYZER_VERSION)["timeline"].get("last_cycle")), None)
        if cyc is None or not traced:
            print(f"| {model} | - | no recorded step | | | |")
            continue
        level0 = cyc["peak"] - cycle_peak(cyc, 1)
        shapes = [(f"{k}x batch", f"{model}-b{b0 * k}-t{t0}", k) for k in (2, 4, 8)]
        if model != "cnn":
            shapes += [(f"{k}x length", f"{model}-b{b0}-t{t0 * k}", k) for k in (2, 4)]
        for label, key, k in shapes:
            if key not in runs:
                continue
            real_a, real_r = runs[key]["max_allocated"], runs[key]["max_reserved"]
            pa, pr = level0 + cycle_peak(cyc, k), reserved_peak(traced[0], k)
            print(f"| {model} | {label} | {pa / GiB:.3f} / {real_a / GiB:.3f} GiB | {(pa - real_a) / real_a * 100:+.1f}% "
                  f"| {pr / GiB:.3f} / {real_r / GiB:.3f} GiB | {(pr - real_r) / real_r * 100:+.1f}% |")


if __name__ == "__main__":
    main()
