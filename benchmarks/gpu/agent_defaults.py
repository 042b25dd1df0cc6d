"""Scenario jobs with the memq agent at DEFAULT settings, delivering into a Redis on the GPU machine;
the Redis dump (RDB) comes back as the fixture tests/fixtures/agent_defaults/ (README there).

    python benchmarks/gpu/agent_defaults.py --out /tmp/ad --ship $OUT [--budget 560] [--dry]

Each scenario is a subprocess (own cap, own PYTORCH_CUDA_ALLOC_CONF) running train_leak.py or
train_jobs.py; the agent reaches the Redis through MEMQ_REDIS_URL. Scenarios, in order:
  leak          train_leak.py --memq (agent.start, mark_step, mark_epoch): val logits kept, OOM after epochs
  leak_run      the same script with no memq line, under `memq run --run R --cluster C -- python ...`
  optstep       OOM while AdamW creates its state (first optimizer step)
  oversized     one batch with an 8x longer sequence under 2x the normal peak
  healthy       completes
  dyn_*         probe (expandable segments, no cap, no agent) -> peak P; the default allocator at caps
                1.15, 1.10, 1.05 x P until one runs out of memory; then the twins at that cap:
                expandable_segments:True, max_split_size_mb:128, garbage_collection_threshold:0.6,max_split_size_mb:256
  bench         bench_overhead.py in the time left (agent at defaults, interleaved blocks)
Ground truth per scenario goes to meta.json (cause by design, real outcome, OOM step, leak line).
`--dry` runs everything on CPU with tiny sizes (no caps, no OOMs) to check the orchestration.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CLUSTER = "h200"
DYN_RATIOS = [1.15, 1.10, 1.05]
TWINS = [("expandable", "expandable_segments:True"), ("split128", "max_split_size_mb:128"),
         ("gc06_split256", "garbage_collection_threshold:0.6,max_split_size_mb:256")]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(d):
    carry = os.path.join(ROOT, ".gpu_carry")
    exe = os.path.join(carry, "bin", "redis-server")
    env = dict(os.environ)
    if os.path.exists(exe):
        env["LD_LIBRARY_PATH"] = os.path.join(carry, "lib")
    else:
        exe = shutil.which("redis-server")
    port = free_port()
    os.makedirs(d, exist_ok=True)
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", d, "--dbfilename", "dump.rdb", "--maxmemory-policy", "noeviction"],
                         env=env, stdout=open(os.path.join(d, "redis.log"), "w"), stderr=subprocess.STDOUT)
    import redis

    r = redis.Redis(port=port, socket_timeout=5)
    for _ in range(100):
        try:
            if r.ping():
                return p, port, r
        except redis.RedisError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


class Runner:
    def __init__(self, args):
        self.args = args
        self.out = args.out
        os.makedirs(self.out, exist_ok=True)
        self.t0 = time.monotonic()
        self.meta = {"scenarios": {}, "argv": sys.argv, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self.redis_proc, self.port, self.r = start_redis(os.path.join(self.out, "redis"))
        self.base_env = dict(os.environ, PYTHONUNBUFFERED="1", MEMQ_REDIS_URL=f"redis://127.0.0.1:{self.port}/0",
                             MEMQ_SPOOL_DIR=os.path.join(self.out, "spool"))
        self.base_env.pop("PYTORCH_ALLOC_CONF", None)  # it would take precedence over PYTORCH_CUDA_ALLOC_CONF
        self.base_env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        pp = [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.base_env["PYTHONPATH"] = os.pathsep.join(pp)

    def left(self):
        return self.args.budget - (time.monotonic() - self.t0)

    def save_meta(self):
        self.meta["redis_keys"] = self.r.dbsize()
        self.meta["stream_len"] = self.r.xlen("memq:ingest") if self.r.exists("memq:ingest") else 0
        with open(os.path.join(self.out, "meta.json"), "w") as fh:
            json.dump(self.meta, fh, indent=1)
        if self.args.ship:
            shutil.copy(os.path.join(self.out, "meta.json"), os.path.join(self.args.ship, "meta.json"))

    def run(self, key, cmd, *, run, cause, conf="", timeout=120, extra=None):
        if self.left() < 30:
            log(f"SKIP {key}: {self.left():.0f}s left")
            self.meta["scenarios"][key] = {"skipped": True}
            return None
        res_path = os.path.join(self.out, f"{key}.result.json")
        if os.path.exists(res_path):
            os.remove(res_path)
        env = dict(self.base_env)
        if conf:
            env["PYTORCH_CUDA_ALLOC_CONF"] = conf
        full = [sys.executable, *cmd, "--result", res_path]
        if self.args.dry:
            full += ["--device", "cpu"] + (["--small"] if "train_jobs.py" in " ".join(cmd) else
                                           ["--vocab", "256", "--d", "32", "--layers", "1", "--epochs", "3"])
        if self.args.dry:
            timeout = 300  # a shared CPU is slow
        t = time.time()
        try:
            p = subprocess.run(full, env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=min(timeout, max(10, self.left() - 20)))
            rc, out, err = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out, err = "timeout", str(exc.stdout or "")[-2000:], str(exc.stderr or "")[-2000:]
        res = {}
        if os.path.exists(res_path):
            with open(res_path) as fh:
                res = json.load(fh)
        rec = {"run": run, "cluster": CLUSTER, "command": " ".join(os.path.relpath(c, ROOT) if c.startswith(ROOT)
                                                                      else c for c in full[1:]),
               "alloc_conf": conf, "cause": cause, "rc": rc, "secs": round(time.time() - t, 1),
               "stdout_tail": out[-600:], "stderr_tail": err[-1500:], **res, **(extra or {})}
        rec.pop("schedule", None)
        self.meta["scenarios"][key] = rec
        log(f"{key}: rc={rc} outcome={res.get('outcome')} oom_step={res.get('oom_step')} "
            f"cap={res.get('cap_bytes')} secs={rec['secs']}")
        if rc not in (0, 1) or (rc == 1 and res.get("outcome") != "oom"):
            log(err[-1500:])
        self.save_meta()
        return rec

    def leak(self):
        script = os.path.join(HERE, "train_leak.py")
        self.run("leak", [script, "--name", "ad-leak", "--memq"], run="ad-leak", cause="leak")
        # `memq run` is `python -m memq run`; the script has no memq line
        cmd = ["-m", "memq", "run", "--run", "ad-leak-run", "--cluster", CLUSTER, "--", sys.executable, script]
        self.run("leak_run", cmd, run="ad-leak-run", cause="leak", extra={"no_code_change": True})

    def jobs(self):
        script = os.path.join(HERE, "train_jobs.py")
        self.run("optstep", [script, "optstep", "--name", "ad-optstep"], run="ad-optstep", cause="optimizer_state")
        self.run("oversized", [script, "oversized", "--name", "ad-oversized"], run="ad-oversized",
                 cause="activation_spike")
        self.run("healthy", [script, "healthy", "--name", "ad-healthy"], run="ad-healthy", cause="healthy")

    def dynamic(self):
        script = os.path.join(HERE, "train_jobs.py")
        probe = self.run("dyn_probe", [script, "probe", "--name", "ad-dyn-probe"], run=None, cause=None,
                         conf="expandable_segments:True")
        peak = (probe or {}).get("max_allocated")
        if not peak and not self.args.dry:
            log("no probe peak: dynamic skipped")
            return
        chosen = None
        for ratio in [float(x) for x in self.args.dyn_ratios.split(",")]:
            cap = int(ratio * peak) if peak else 0
            run = f"ad-dyn-default-{ratio:.2f}"
            rec = self.run(f"dyn_default_{ratio:.2f}", [script, "dynamic", "--name", run, "--cap-bytes", str(cap)],
                           run=run, cause="fragmentation (if it runs out of memory)", extra={"cap_ratio": ratio})
            chosen = (ratio, cap)
            if rec and rec.get("outcome") == "oom":
                break
        ratio, cap = chosen
        self.meta["dyn_cap"] = {"ratio": ratio, "cap_bytes": cap, "probe_max_allocated": peak}
        for name, conf in TWINS:
            run = f"ad-dyn-{name}"
            self.run(f"dyn_{name}", [script, "dynamic", "--name", run, "--cap-bytes", str(cap)], run=run,
                     cause="twin of the default allocator at the same cap (real outcome recorded)", conf=conf,
                     extra={"cap_ratio": ratio})

    def bench(self):
        left = self.left() - 25
        if left < 60 or self.args.dry:
            log(f"bench skipped ({left:.0f}s left, dry={self.args.dry})")
            return
        cmd = [sys.executable, os.path.join(HERE, "bench_overhead.py"), "--out", self.out, "--deadline-s",
               str(int(left))]
        p = subprocess.run(cmd, env=self.base_env, cwd=ROOT, capture_output=True, text=True, timeout=left + 20)
        log("bench rc", p.returncode, p.stdout[-3000:], p.stderr[-2000:])
        src = os.path.join(self.out, "overhead.json")
        if os.path.exists(src) and self.args.ship:
            shutil.copy(src, os.path.join(self.args.ship, "overhead.json"))

    def summary(self):
        """One line per envelope (kind, trigger, step, reason), per run: what the fleet would send."""
        try:
            rows = self.r.xrange("memq:ingest")
        except Exception as exc:  # noqa: BLE001
            log("no stream", exc)
            return
        for _id, f in rows:
            g = {k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}
            pl = json.loads(g.get("payload") or "{}")
            extra = {k: pl[k] for k in ("reason", "comparable", "recording", "step_completed", "status", "steps")
                     if k in pl}
            if "oom" in pl:
                extra["alloc"] = (pl["oom"] or {}).get("alloc")
            if g["kind"] == "stats":
                extra = {"samples": len(pl.get("samples", [])), "figures": len(pl.get("step_figures", []))}
            print("ENV", g["run"], g["kind"], g.get("trigger", ""), g.get("step", ""), g.get("epoch", ""),
                  g.get("size", ""), json.dumps(extra), flush=True)

    def finish(self):
        try:
            self.r.save()
        except Exception as exc:  # noqa: BLE001
            log("SAVE failed", exc)
        self.meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.save_meta()
        try:
            self.summary()
        except Exception as exc:  # noqa: BLE001 - the dump matters more than this listing
            log("summary failed", exc)
        dump = os.path.join(self.out, "redis", "dump.rdb")
        if self.args.ship and os.path.exists(dump):
            gz = os.path.join(self.out, "dump.rdb.gz")
            with open(dump, "rb") as fi, gzip.open(gz, "wb", 6) as fo:
                shutil.copyfileobj(fi, fo)
            log("dump", os.path.getsize(dump), "bytes, gzip", os.path.getsize(gz))
            with open(gz, "rb") as fh:  # at most 16 MiB a file comes back
                for i, chunk in enumerate(iter(lambda: fh.read(15 << 20), b"")):
                    with open(os.path.join(self.args.ship, f"dump.rdb.gz.part{i}"), "wb") as fo:
                        fo.write(chunk)
        spool = os.path.join(self.out, "spool")
        if self.args.ship and os.path.isdir(spool) and any(os.scandir(spool)):
            shutil.make_archive(os.path.join(self.args.ship, "spools"), "gztar", spool)
        self.redis_proc.terminate()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/agent_defaults")
    ap.add_argument("--ship", default=os.environ.get("OUT"))
    ap.add_argument("--budget", type=float, default=560)
    ap.add_argument("--dry", action="store_true")
    ap.add_argument("--only", default="leak,jobs,dynamic,bench")
    ap.add_argument("--dyn-ratios", default=",".join(map(str, DYN_RATIOS)),
                    help="caps (x the probe's peak allocated) for the default allocator, until one runs out")
    args = ap.parse_args()
    if args.ship:
        os.makedirs(args.ship, exist_ok=True)
    r = Runner(args)
    try:
        import torch

        # no CUDA context in this process: it would count as memory outside the jobs' PyTorch
        r.meta["env"] = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0]}
        del torch
        for part in args.only.split(","):
            getattr(r, part)()
    finally:
        r.finish()


if __name__ == "__main__":
    main()
