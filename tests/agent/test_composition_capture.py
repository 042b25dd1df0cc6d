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


def _role_bytes(job_dir: Path) -> dict:
    truth = json.loads((job_dir / "truth.json").read_text())
    assert truth["spec"]["set"] == "fresh"
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
