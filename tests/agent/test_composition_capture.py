"""The fresh judging set of benchmarks/gpu/composition_capture.py (`--set fresh`): every job's spec is
one the script knows, and the truth it takes from the tensors names frozen weights, BatchNorm's running
statistics, momentum buffers and gradients kept zeroed by their roles. CPU torch, the script's dry run
(tiny models, empty snapshots: the roles are the CPU tensors')."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks/gpu/composition_capture.py"


def _run(*args: str, env: dict | None = None) -> str:
    p = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def _role_bytes(job_dir: Path, which: str = "fresh") -> dict:
    truth = json.loads((job_dir / "truth.json").read_text())
    assert truth["spec"]["set"] == which
    out: dict = {}
    for _addr, nbytes, role in truth["roles"]:
        out[role] = out.get(role, 0) + nbytes
    return out


def test_selftest_and_fresh_list():
    assert "fresh jobs" in _run("--selftest")
    names = [ln.split()[0] for ln in _run("--list", "--set", "fresh").splitlines()]
    assert 24 <= len(names) <= 30 and all(n.startswith("fresh_") for n in names)
    assert not set(names) & {ln.split()[0] for ln in _run("--list").splitlines()}


def test_fresh_truth_roles(tmp_path):
    env = {**os.environ, "COMPOSITION_CPU_DRY": "1"}
    jobs = ("fresh_lora_adamw_step_py_start", "fresh_cnn_sgd_keepgrad_bwd_none_start")
    _run("--set", "fresh", "--only", ",".join(jobs), "--out", str(tmp_path), "--parallel", "2", env=env)
    lora = _role_bytes(tmp_path / jobs[0])
    # the frozen GPT is parameters; only the adapters have gradients, and AdamW's two moments of them
    # (plus its step counters: CPU tensors, on the CPU device of the dry run only)
    assert lora["parameter"] > 10 * lora["gradient"]
    assert 2 * lora["gradient"] <= lora["optimizer_state"] <= 2 * lora["gradient"] + 1024
    cnn = _role_bytes(tmp_path / jobs[1])
    # BatchNorm's running statistics; SGD's momentum buffer and the gradient, one of each per parameter
    assert cnn["buffer"] > 0 and cnn["optimizer_state"] == cnn["gradient"] == cnn["parameter"]


def test_the_late_set_is_its_own_and_its_truth_names_each_optimizers_state(tmp_path):
    """The late judging set (`--set late`): its own jobs, none in the other two sets; SGD without momentum
    keeps no state at all, NAdam two moments per parameter, an LSTM's weights are parameters."""
    names = [ln.split()[0] for ln in _run("--list", "--set", "late").splitlines()]
    assert len(names) >= 24 and all(n.startswith("late_") for n in names)
    others = {ln.split()[0] for s in ("tuning", "fresh") for ln in _run("--list", "--set", s).splitlines()}
    assert not set(names) & others
    env = {**os.environ, "COMPOSITION_CPU_DRY": "1"}
    jobs = ("late_vit_sgdplain_bwd_none_start", "late_deep_nadam_step_py_start", "late_lstm_adamw_step_py_start")
    _run("--set", "late", "--only", ",".join(jobs), "--out", str(tmp_path), "--parallel", "2", env=env)
    vit = _role_bytes(tmp_path / jobs[0], "late")
    assert "optimizer_state" not in vit and vit["gradient"] == vit["parameter"]
    deep = _role_bytes(tmp_path / jobs[1], "late")
    # two moments per parameter, and a step counter and mu_product per parameter (CPU scalars in the dry run)
    assert 2 * deep["parameter"] <= deep["optimizer_state"] <= 2 * deep["parameter"] + 64 * 1024
    lstm = _role_bytes(tmp_path / jobs[2], "late")
    assert lstm["parameter"] > 0 and lstm["gradient"] == lstm["parameter"]
