"""How well `memq fit` predicts the peak at a larger batch or sequence length from one measured run,
against the real runs of the H200 calibration set (tests/fixtures/fit, captured by
benchmarks/gpu/fit.py). No services, no torch.

    python benchmarks/fit_calibration.py [--markdown] [--mid-run] [--optimizers]

Per model: the base run with the agent at its defaults is the measurement; predicted is
`memq.analysis.fit.predict` at k x the base batch (and k x the length for the GPTs), against
`max_memory_reserved()` of the real run at that shape; then the largest batch under the cap the real
runs were bisected under, against the real largest (the next larger ran out of memory for real).
Beside them, the anchor every estimator without a run gives: the parameter-count formula
(weights + gradients + optimizer state = 16 bytes a parameter for AdamW in float32 or with float32
master weights, 12 for SGD with momentum; `accelerate estimate-memory`'s training figure for Adam is
the same 4x the float32 model size), which does not change with the batch.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import fit  # noqa: E402
from tests.analysis.agent_data import spool_run  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "fit"
GiB = 1 << 30
BYTES_PER_PARAM = {"adamw": 16, "sgd_momentum": 12}


def measured(model: str) -> fit.Measured:
    snaps, _ctx, _triggers = spool_run(FIX / model / "defaults")
    return fit.classify(next(s for s in snaps if s.trace))


def rows(truth: dict):
    """(model, label, predicted, real, param-formula bytes) per shape; (model, predicted max, real max,
    next outcome)."""
    shapes, caps = [], []
    for model, d in truth.items():
        runs = d["runs"]
        base = next(v for k, v in runs.items() if k.endswith("-defaults"))
        b0, t0 = base["batch"], base["seq"]
        m = measured(model)
        formula = base["param_bytes"] // 4 * BYTES_PER_PARAM["sgd_momentum" if model == "cnn" else "adamw"]
        wanted = [(f"{k}x batch", f"{model}-b{b0 * k}-t{t0}", k) for k in (2, 4, 8)]
        if model != "cnn":
            wanted += [(f"{k}x length", f"{model}-b{b0}-t{t0 * k}", k) for k in (2, 4)]
        for label, key, k in wanted:
            if key in runs:
                p = fit.predict(m, k, seq_k=k if "length" in label else 1.0).peak_reserved
                shapes.append((model, label, p, runs[key]["max_reserved"], formula))
        cap = d["cap"]
        caps.append((model, fit.largest_unit(m, b0, cap["cap_bytes"]), cap["max_batch"], cap["next_outcome"],
                     cap["cap_bytes"]))
    return shapes, caps


def full_raw(model: str) -> dict:
    """The history="on" recording of a model's base run (its whole trace from the start), as sent."""
    from memq import codec
    from memq.agent.spool import decode

    for f in sorted(next((FIX / model / "full").iterdir()).rglob("*.mqs")):
        msg = decode(f.read_bytes())
        if msg.fields["kind"] == "snapshot":
            return codec.decode(msg.blob)
    raise FileNotFoundError(model)


def mid_run(truth: dict, cuts=tuple(i * 0.05 for i in range(1, 13))):
    """(model, cut, k, predicted, real) from each model's whole trace cut where a ring buffer that
    wrapped would have cut it (the first `cut` of its entries dropped; segments and blocks as they are)."""
    from memq.snapshot import parse_snapshot

    out = []
    for model, d in truth.items():
        base = next(v for k, v in d["runs"].items() if k.endswith("-defaults"))
        b0, t0 = base["batch"], base["seq"]
        raw = full_raw(model)
        trace = raw["device_traces"][0]
        for cut in cuts:
            snap = parse_snapshot(dict(raw, device_traces=[trace[int(cut * len(trace)):]]))
            try:
                m = fit.classify(snap)
            except fit.NotAssessable:
                continue
            for k in (2, 4, 8):
                real = d["runs"][f"{model}-b{b0 * k}-t{t0}"]["max_reserved"]
                out.append((model, cut, k, fit.predict(m, k).peak_reserved, real))
    return out


def main() -> None:
    truth = json.loads((FIX / "truth.json").read_text())
    if "--optimizers" in sys.argv:
        names = ("sgd", "sgd_momentum", "adamw", "adafactor", "adamw_8bit")
        ms = {}
        for k in names:
            snaps, _ctx, _trig = spool_run(ROOT / "tests" / "fixtures" / "playbook" / f"optim_{k}" / "spool")
            ms[k] = fit.classify(next(s for s in snaps if s.trace))
        print("one GPT measured with each optimizer (tests/fixtures/playbook/optim_*): `memq fit --optimizer` from "
              "the row's trace against the column's recorded peak reserved")
        print("| from \\ to | " + " | ".join(names) + " |")
        print("|---" * (len(names) + 1) + "|")
        for a in names:
            cells = [(fit.predict(ms[a], 1.0, b).peak_reserved - ms[b].recorded_peak) / ms[b].recorded_peak
                     for b in names]
            print(f"| {a} | " + " | ".join(f"{c * 100:+.1f}%" for c in cells) + " |")
        return
    if "--mid-run" in sys.argv:
        cut = mid_run(truth)
        dev = [real / pred - 1 for *_x, pred, real in cut]
        print(f"{len(cut)} predictions from traces cut mid-run: the real peak between {min(dev) + 1:.3f}x and "
              f"{max(dev) + 1:.3f}x the predicted one (MIDRUN_MARGIN {fit.MIDRUN_MARGIN:.0%})")
        return
    t0 = time.perf_counter()
    shapes, caps = rows(truth)
    took = time.perf_counter() - t0
    print("| model | shape | memq fit: predicted / real peak reserved | error | parameter formula | its error |")
    print("|---|---|---|---|---|---|")
    worst = 0.0
    for model, label, pred, real, formula in shapes:
        err = (pred - real) / real
        worst = max(worst, abs(err))
        print(f"| {model} | {label} | {pred / GiB:.3f} / {real / GiB:.3f} GiB | {err * 100:+.1f}% "
              f"| {formula / GiB:.3f} GiB | {(formula - real) / real * 100:+.0f}% |")
    print()
    print("| model | cap | largest batch: predicted | real | the next larger, for real |")
    print("|---|---|---|---|---|")
    for model, pred, real, nxt, cap in caps:
        print(f"| {model} | {cap / GiB:.3f} GiB | {pred} | {real} | {nxt} |")
    margins = {model: measured(model).margin for model in truth}
    inside = sum(abs(pred - real) / real <= margins[model] + 1e-12 for model, _l, pred, real, _f in shapes)
    print("\nintervals: " + ", ".join(f"{model} +/-{mg:.0%}" for model, mg in margins.items())
          + f"; {inside}/{len(shapes)} predictions inside their interval")
    print(f"largest peak error {worst * 100:.1f}% over {len(shapes)} predictions; "
          f"{sum(p == r for _, p, r, n, _ in caps if n == 'oom')}/{sum(n == 'oom' for *_, n, _ in caps)} largest "
          f"batches exact; {took:.1f} s for all of it")


if __name__ == "__main__":
    main()
