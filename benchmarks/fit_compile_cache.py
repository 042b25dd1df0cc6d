"""`memq fit` on torch.compile'd models, judged against runs whose inductor cache state is known.

A compiled model reserves a different peak at one shape depending on whether inductor's cache already holds
its kernels: a first run autotunes them in its first step (it clones the kernels' arguments and zeroes a
buffer the size of the L2 cache to time each candidate), a restart does not. Each shape of the two compiled
families (gpt_compile of benchmarks/gpu/fit_families.py, the tuning family; gqa_lm of fit_fresh.py, held
back) was recorded by hand twice in its own cache, cold and then warm (benchmarks/gpu/fit_compile_cache.sh;
fixture tests/fixtures/fit_compile_cache, one H100). Per family, from the base shape's cold and warm
recordings, the prediction at each larger shape against its warm run (what the prediction is of, inside
FIT_MARGIN_COMPILE) and its cold one (a first run at that shape, shown beside it). No services, no torch.

    python benchmarks/fit_compile_cache.py [--dir tests/fixtures/fit_compile_cache] [--json]
    python benchmarks/fit_compile_cache.py --set judge [--dir tests/fixtures/fit_compile_judge] [--json]

--set judge: three families memq fit has only seen eager (bert_mlm, t5_relpos, alibi_lm), compiled whole by
`bash benchmarks/gpu/fit_compile_cache.sh OUT judge`, every one held back: FIT_MARGIN_COMPILE judged once.
--set judge2: moe_lm, seq2seq and lora_gpt compiled whole (`... OUT judge2`), a second such set.
--set judge3: relbias_enc_bf16, whisper_enc and gpt_ckpt_bf16 compiled whole (`... OUT judge3`), a third.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.analysis import fit  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402

DEFAULT_DIR = ROOT / "tests" / "fixtures" / "fit_compile_cache"
JUDGE_DIR = ROOT / "tests" / "fixtures" / "fit_compile_judge"
# family: (base batch, base length, the half it is in)
FAMILIES = {"gpt_compile": (8, 256, "tuning"), "gqa_lm": (8, 256, "held back")}
# written before their capture: families compiled whole that no compiled capture held before
JUDGE = {"bert_mlm": (16, 128, "held back"), "t5_relpos": (8, 128, "held back"), "alibi_lm": (8, 256, "held back")}
# a second such set, written after the first was judged and before its own capture
JUDGE2_DIR = ROOT / "tests" / "fixtures" / "fit_compile_judge2"
JUDGE2 = {"moe_lm": (8, 256, "held back"), "seq2seq": (16, 128, "held back"), "lora_gpt": (4, 256, "held back")}
# a third, written after the second was judged and read (a first compile's kept blocks freed, FIT_MARGIN_COMPILE
# back to 5%), before its own capture
JUDGE3_DIR = ROOT / "tests" / "fixtures" / "fit_compile_judge3"
JUDGE3 = {"relbias_enc_bf16": (8, 256, "held back"), "whisper_enc": (16, 800, "held back"),
          "gpt_ckpt_bf16": (8, 256, "held back")}
SETS = {"cache": (DEFAULT_DIR, FAMILIES), "judge": (JUDGE_DIR, JUDGE), "judge2": (JUDGE2_DIR, JUDGE2),
        "judge3": (JUDGE3_DIR, JUDGE3)}
STATES = ("cold", "warm")


def _spec(fam: str) -> tuple[int, int, str]:
    return FAMILIES.get(fam) or JUDGE.get(fam) or JUDGE2.get(fam) or JUDGE3[fam]


def rungs(fam: str) -> list[tuple[str, float, float]]:
    """(shape tag, k, the length's part of k): the base shape, 2x-8x the batch, 2x-4x the length."""
    b0, s0, _half = _spec(fam)
    out = [(f"b{b0 * k}-s{s0}", float(k), 1.0) for k in (1, 2, 4, 8)]
    return out + [(f"b{b0}-s{s0 * k}", float(k), float(k)) for k in (2, 4)]


def measured(d: Path, fam: str, state: str) -> fit.Measured:
    b0, s0, _half = _spec(fam)
    path = d / "hand" / f"{fam}-b{b0}-s{s0}-{state}.pickle.gz"
    return fit.classify(load_snapshot_file(str(path), max_bytes=1 << 32).snapshot)


def family_rows(d: Path, fam: str) -> list[dict]:
    base = {state: measured(d, fam, state) for state in STATES}
    rows = []
    for tag, k, seq_k in rungs(fam):
        if not all((d / "results" / f"{fam}-{tag}-{state}.json").is_file() for state in STATES):
            continue  # a run that did not finish: judged on what did
        real = {state: json.loads((d / "results" / f"{fam}-{tag}-{state}.json").read_text()) for state in STATES}
        if any(r.get("outcome") != "completed" for r in real.values()):
            continue
        row = {"family": fam, "half": _spec(fam)[2], "shape": tag, "k": k, "seq_k": seq_k,
               "real": {state: real[state]["max_reserved"] for state in STATES}}
        for src, m in base.items():
            p = fit.predict(m, k, None, seq_k)
            row[f"from_{src}"] = {"peak": p.peak_reserved, "margin": fit.asked(m, length=seq_k != 1.0).margin,
                                  "autotuning": m.autotuning,
                                  **{f"err_{state}": (p.peak_reserved - row["real"][state]) / row["real"][state]
                                     for state in STATES}}
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--set", choices=sorted(SETS), default="cache")
    ap.add_argument("--dir", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    d = Path(a.dir) if a.dir else SETS[a.set][0]
    rows = [r for fam in SETS[a.set][1] for r in family_rows(d, fam)]
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    gib = 1 << 30
    print("| family | half | shape | real, cold cache | real, warm cache | from the cold recording: vs warm "
          "(vs cold) | from the warm recording: vs warm (vs cold) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        cells = []
        for src in STATES:
            p = r[f"from_{src}"]
            inside = "inside" if abs(p["err_warm"]) <= p["margin"] else "OUTSIDE"
            cells.append(f"{p['peak'] / gib:.3f} GiB: {p['err_warm'] * 100:+.1f}% ({inside} +/-{p['margin']:.0%}) "
                         f"({p['err_cold'] * 100:+.1f}%)")
        print(f"| {r['family']} | {r['half']} | {r['shape']} | {r['real']['cold'] / gib:.3f} GiB | "
              f"{r['real']['warm'] / gib:.3f} GiB | {cells[0]} | {cells[1]} |")
    for half in ("tuning", "held back"):
        errs = [abs(r[f"from_{src}"]["err_warm"]) for r in rows if r["half"] == half for src in STATES]
        if not errs:
            continue
        inside = sum(abs(r[f"from_{src}"]["err_warm"]) <= r[f"from_{src}"]["margin"]
                     for r in rows if r["half"] == half for src in STATES)
        print(f"{half}: {inside}/{len(errs)} predictions of the warm runs inside their interval; largest error "
              f"{max(errs) * 100:.1f}%")
    same = all(r["from_cold"]["peak"] == r["from_warm"]["peak"] for r in rows)
    print(f"the cold recording, its autotuning left out, predicts as the warm one at every shape: {same}")


if __name__ == "__main__":
    main()
