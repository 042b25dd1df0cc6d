"""One capture job as its own process, the way the GPU capture scripts (forecast.py, fit.py) run them:
a clean environment (no allocator setting inherited, the repository on PYTHONPATH), a wall-clock limit,
and the job's own JSON result read back. A job that wrote no result, or ended other than completed or
by the OutOfMemoryError it exists to raise (exit 1), keeps the tail of its output for the log; one whose
result says "completed" but that did not exit 0 (an error after a `finally` wrote it) is "crashed"."""

from __future__ import annotations

import json
import os
import subprocess
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return env


def settle(res: dict, rc) -> dict:
    """A job's result with its exit status: "crashed" where it says "completed" but the job did not exit 0
    (a `finally` wrote it after an error), which no judging counts as a measurement."""
    res["rc"] = rc
    if rc != 0 and res.get("outcome") == "completed":
        res["outcome"] = "crashed"
    return res


def run_job_process(cmd: list[str], result: str, timeout: float) -> dict:
    t0 = time.time()
    try:
        p = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, cwd=ROOT, timeout=timeout)
        rc, tail = p.returncode, (p.stdout + p.stderr)[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", ""
    try:
        with open(result) as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        res = {"outcome": "no result"}
    settle(res, rc)
    res["wall_s"] = round(time.time() - t0, 1)
    if res.get("outcome") in ("no result", "crashed") or rc not in (0, 1):
        res["tail"] = tail
    return res
