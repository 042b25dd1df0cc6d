"""The fresh held-back set's pipeline without a GPU: benchmarks/gpu/fit_fresh.py's orchestration in fake mode
(FITFAM_FAKE: peaks linear in the batch, recordings and dumps copied from other families' fixtures), its
importer, and the judging (`fit_families_calibration.py --set fresh`). What is pinned is the shape of what
comes out (every part captured, imported and judged), never a prediction's error: the fake numbers mean
nothing and the real capture is judged once, as it is."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stdout
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GPU = ROOT / "benchmarks" / "gpu"
FAMS = ("gnn_rec", "gqa_lm")  # one image-like family without a length ladder, one sequence family compiled


def _modules():
    for p in (str(GPU), str(ROOT / "benchmarks")):
        if p not in sys.path:
            sys.path.insert(0, p)
    import fit_families_calibration as cal
    import fit_fresh
    import fit_fresh_import

    return fit_fresh, fit_fresh_import, cal


def test_the_fresh_families_are_none_seen_before():
    fresh, _imp, _cal = _modules()
    seen = {"resnet_bn", "vit_bf16", "vit_ckpt", "bert_mlm", "gpt_compile", "moe_lm", "unet_diff", "lora_gpt",
            "lstm_lm", "seq2seq", "convnext_ln", "mlp_mixer", "gpt_ckpt_bf16", "vae_conv",
            "cnn", "gpt_s", "gpt_m", "gpt_ckpt", "gpt_bf16"}
    assert len(fresh.FRESH) >= 6 and not seen & set(fresh.FRESH)
    assert {s["opt"] for s in fresh.FRESH.values()} >= {"adamw", "adam", "sgd_momentum"}
    assert any(s["bf16"] for s in fresh.FRESH.values()) and any(not s["bf16"] for s in fresh.FRESH.values())
    assert any(s["compile"] for s in fresh.FRESH.values()) and any(s["ckpt"] for s in fresh.FRESH.values())


def test_fake_capture_import_and_judging(tmp_path):
    _fresh, imp, cal = _modules()
    out = tmp_path / "capture"
    env = dict(os.environ, FITFAM_FAKE="1")
    p = subprocess.run([sys.executable, str(GPU / "fit_fresh.py"), "all", "--out", str(out), "--only", ",".join(FAMS),
                        "--budget", "120", "--parallel", "4"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["split"]["tuning"] == [] and summary["split"]["held_back"] == sorted(FAMS)
    for fam in FAMS:
        runs = summary["families"][fam]["runs"]
        base = f"{fam}-b{summary['families'][fam]['spec']['batch']}-s{summary['families'][fam]['spec']['size']}"
        assert {f"{base}-defaults", f"{base}-hand", f"{base}-dump"} <= set(runs)
        assert summary["families"][fam]["cap"]["monotone"]
        for part in ("forward", "backward"):
            assert (out / "dumps" / f"{fam}-dump.{part}.pickle.gz").stat().st_size > 0
    dest = tmp_path / "fixture"
    assert imp.import_fresh(out, dest) > 0
    assert sorted(p.name for p in (dest / "dumps").iterdir()) == sorted(
        f"{f}-dump.{p}.pickle.gz" for f in FAMS for p in ("forward", "backward"))
    rows = {fam: cal.family_rows(dest, fam, doc) for fam, doc in sorted(summary["families"].items())}
    for fam, r in rows.items():
        want = 5 if summary["families"][fam]["spec"]["seq"] else 3  # 2x/4x/8x batch (and 2x/4x length)
        assert len(r["shapes"]) == want
        assert all({"agent", "hand", "dump"} <= set(s) for s in r["shapes"])
        assert {"agent", "hand", "dump"} <= set(r["largest"])
    buf = io.StringIO()
    with redirect_stdout(buf):
        cal.judge_fresh(rows, 0.0)
    text = buf.getvalue()
    assert "agent vs hand recording:" in text
    for src in ("agent", "hand", "dump"):
        assert f"\n{src}: " in text
