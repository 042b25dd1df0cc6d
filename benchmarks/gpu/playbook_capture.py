"""Capture every run behind docs/playbook.md in one go (GPU only; issue 17). Writes DIR/<scenario>/
{result.json, log.txt, spool/} and DIR/summary.json; the folders become tests/fixtures/playbook/ and
benchmarks/playbook.py turns them into the playbook's tables (here, no GPU, no torch).

    python3 benchmarks/gpu/playbook_capture.py --out /tmp/pb --only optim,ckpt,empty_cache --budget 540
    python3 benchmarks/gpu/playbook_capture.py --out /tmp/pb --only alloc,leak --budget 540
    python3 benchmarks/gpu/playbook_capture.py --selftest        # no GPU: the commands it would run

Groups (each job is its own process, so PYTORCH_CUDA_ALLOC_CONF applies and caps do not leak):
  optim        playbook_jobs.py optim for each optimizer (8-bit only where bitsandbytes imports)
  ckpt         playbook_jobs.py ckpt: checkpointing on/off at batch 8 and 32 (x 512 tokens)
  empty_cache  playbook_jobs.py empty_cache
  alloc        train_jobs.py probe (no cap, no agent) -> peak P; then train_jobs.py dynamic at --alloc-ratio x P
               under each setting in ALLOC_SETTINGS, plus the default with empty_cache() after every step
  leak         train_leak.py --memq, kept logits and the fix (a float per batch), 12 epochs
The agent spools (the GPU machines reach no Redis): MEMQ_SPOOL_DIR per job, MEMQ_REDIS_URL at a closed port.
Jobs that do not fit the remaining --budget are skipped and logged; summary.json is rewritten after each.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
GROUPS = ("optim", "ckpt", "empty_cache", "alloc", "leak")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "adamw", "adamw_forloop", "adamw_fused", "adafactor", "adamw_8bit")
# (scenario suffix, PYTORCH_CUDA_ALLOC_CONF, empty_cache() after every step)
ALLOC_SETTINGS = (
    ("default", "", False),
    ("expandable", "expandable_segments:True", False),
    ("split128", "max_split_size_mb:128", False),
    ("split512", "max_split_size_mb:512", False),
    ("gc06", "garbage_collection_threshold:0.6", False),
    ("gc06_split256", "garbage_collection_threshold:0.6,max_split_size_mb:256", False),
    ("roundup4", "roundup_power2_divisions:4", False),
    ("empty_cache_every_step", "", True),
)


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def jobs_for(group: str, out: Path, alloc_cap: int | None = None) -> list[tuple[str, list[str], str]]:
    """(scenario, argv, PYTORCH_CUDA_ALLOC_CONF) for one group; alloc needs the probe's cap first."""
    py = sys.executable
    pj = str(HERE / "playbook_jobs.py")

    def common(sc):
        return ["--name", f"pb-{sc}", "--result", str(out / sc / "result.json")]

    if group == "optim":
        return [(f"optim_{k}", [py, pj, "optim", "--kind", k, "--spool", str(out / f"optim_{k}" / "spool"),
                                *common(f"optim_{k}")], "") for k in OPTIMIZERS]
    if group == "ckpt":
        return [(f"ckpt_{c}_b{b}", [py, pj, "ckpt", "--ckpt", c, "--batch", str(b),
                                     "--spool", str(out / f"ckpt_{c}_b{b}" / "spool"), *common(f"ckpt_{c}_b{b}")], "")
                for b in (8, 32) for c in ("on", "off")]
    if group == "empty_cache":
        return [("empty_cache", [py, pj, "empty_cache", "--spool", str(out / "empty_cache" / "spool"),
                                 *common("empty_cache")], "")]
    if group == "alloc":
        tj = str(HERE / "train_jobs.py")
        if alloc_cap is None:
            return [("alloc_probe", [py, tj, "probe", *common("alloc_probe")], "expandable_segments:True")]
        return [(f"alloc_{n}", [py, tj, "dynamic", "--cap-bytes", str(alloc_cap), *common(f"alloc_{n}"),
                                *(["--empty-cache-every-step"] if every else [])], conf)
                for n, conf, every in ALLOC_SETTINGS]
    if group == "leak":
        tl = str(HERE / "train_leak.py")
        return [(sc, [py, tl, "--memq", "--epochs", "12", *common(sc), *(["--fixed"] if sc == "leak_fixed" else [])],
                 "")
                for sc in ("leak_kept", "leak_fixed")]
    raise ValueError(group)


class Capture:
    def __init__(self, a):
        self.a = a
        self.out = Path(a.out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.t_end = time.time() + a.budget
        self.summary = {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "jobs": {}}

    def run(self, sc: str, argv: list[str], conf: str, est: float) -> dict | None:
        left = self.t_end - time.time()
        if left < est:
            log(f"skip {sc}: {left:.0f}s left < {est:.0f}s estimate")
            self.summary["jobs"][sc] = {"skipped": f"budget ({left:.0f}s left)"}
            return None
        d = self.out / sc
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", MEMQ_SPOOL_DIR=str(d / "spool"),
                   MEMQ_REDIS_URL="redis://127.0.0.1:1/0",
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        env.pop("PYTORCH_ALLOC_CONF", None)  # it would take precedence over the setting under test
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        else:
            env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        t0 = time.time()
        try:
            p = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=max(10, left - 5))
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as exc:
            rc = "timeout"
            text = (exc.stdout or b"").decode(errors="replace") + (exc.stderr or b"").decode(errors="replace")
        (d / "log.txt").write_text(text[-200_000:])
        res_path = d / "result.json"
        res = json.loads(res_path.read_text()) if res_path.exists() else None
        secs = round(time.time() - t0, 1)
        self.summary["jobs"][sc] = {"rc": rc, "secs": secs, "alloc_conf": conf,
                                    "outcome": (res or {}).get("outcome"), "tail": text.splitlines()[-3:]}
        (self.out / "summary.json").write_text(json.dumps(self.summary, indent=1))
        log(sc, f"rc={rc}", f"{secs}s", (res or {}).get("outcome"), *(text.splitlines()[-2:] if rc else []))
        return res

    def group(self, g: str) -> None:
        est = {"optim": 25, "ckpt": 25, "empty_cache": 20, "alloc": 35, "leak": 45}[g]
        if g == "alloc":
            probe = self.run(*jobs_for("alloc", self.out)[0], est)
            peak = (probe or {}).get("max_allocated")
            if not peak:
                log("alloc: no probe peak, skipping the settings")
                return
            cap = int(self.a.alloc_ratio * peak)
            self.summary["alloc_cap"] = {"ratio": self.a.alloc_ratio, "probe_max_allocated": peak, "cap_bytes": cap}
            for job in jobs_for("alloc", self.out, cap):
                self.run(*job, est)
            return
        for job in jobs_for(g, self.out):
            self.run(*job, est)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/pb")
    ap.add_argument("--only", default=",".join(GROUPS))
    ap.add_argument("--budget", type=float, default=540)
    ap.add_argument("--alloc-ratio", type=float, default=1.03,
                    help="cap for the allocator-settings runs, x the probe's peak allocated (1.03: where the "
                         "default allocator ran out of memory on 2026-12-01)")
    ap.add_argument("--selftest", action="store_true")
    a = ap.parse_args(argv)
    groups = a.only.split(",")
    bad = set(groups) - set(GROUPS)
    if bad:
        ap.error(f"unknown group(s): {', '.join(sorted(bad))}")
    if a.selftest:
        out = Path("/tmp/pb-selftest")
        for g in GROUPS:
            for sc, cmd, _conf in jobs_for(g, out) + (jobs_for(g, out, 1 << 30) if g == "alloc" else []):
                assert str(out / sc / "result.json") in cmd, (sc, cmd)
                assert Path(cmd[1]).exists(), cmd[1]
        print("selftest ok")
        return 0
    cap = Capture(a)
    for g in groups:
        log("group", g)
        cap.group(g)
    cap.summary["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    (cap.out / "summary.json").write_text(json.dumps(cap.summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
