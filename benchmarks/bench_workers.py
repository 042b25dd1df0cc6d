"""Redis -> dispatcher -> Celery workers -> PostgreSQL, measured end to end in one run.

Goals (issue 5), on this 2-core machine with two worker processes:
- analysed snapshots per second for the real 8k-entry fixtures (seed_sgd epoch snapshots): >= 20/s
- stat samples ingested per second: >= 20,000/s
- push -> queryable latency p50 / p95 at half the maximum rate: p95 < 2 s

What runs: `memq dispatcher` and `memq worker -c 2` as subprocesses, on the shared Redis (a unique key
prefix, removed afterwards) and a temporary database on the shared PostgreSQL (created, migrated,
dropped). Snapshots are pushed exactly as the agent sends them (its Transport builds the messages:
pickle bytes -> sha256 -> zstd -> envelope; then SET blob + XADD), each with DISTINCT bytes (a
`memq_bench` key added to the pickled dict), since identical bytes dedupe. Messages are built before
the clock starts. "Queryable" = the snapshot row is `done` with its analysis attached (what
`memq history` shows); the benchmark polls for it every 20 ms.

    python benchmarks/bench_workers.py [--snapshots 200] [--runs 20] [--samples 200000] [--latency-s 30]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import secrets
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import codec  # noqa: E402
from memq.agent.spool import Message, Spool  # noqa: E402
from memq.agent.transport import Item, Transport  # noqa: E402
from memq.config import load_settings, redact_url  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "real" / "seed_sgd"
FILES = ["epoch0.pickle.gz", "epoch1.pickle.gz", "epoch2.pickle.gz"]
PG_ADMIN = os.environ.get("MEMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("MEMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Bench:
    def __init__(self, tmp: Path, workers: int):
        import psycopg
        from sqlalchemy.engine import make_url

        self.tmp = tmp
        self.db = f"memq_bench_{secrets.token_hex(4)}"
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{self.db}"')
        url = make_url(PG_ADMIN).set(database=self.db).render_as_string(hide_password=False)
        self.prefix = f"memqbench:{secrets.token_hex(5)}:"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        self.env.update({
            "MEMQ_REDIS_URL": REDIS, "MEMQ_KEY_PREFIX": self.prefix, "MEMQ_STREAM": self.prefix + "ingest",
            "MEMQ_DEAD_STREAM": self.prefix + "dead", "MEMQ_DATABASE_URL": url,
            "MEMQ_DATA_DIR": str(tmp / "data"), "MEMQ_BLOB_DIR": str(tmp / "blobs"),
            "MEMQ_CONFIG": str(tmp / "none.toml"), "MEMQ_HEARTBEAT_S": "1",
        })
        self.st = load_settings(self.env)
        self.procs: list[subprocess.Popen] = []
        self.workers = workers
        import redis

        self.r = redis.Redis.from_url(REDIS)
        from memq.store.db import make_engine

        self.engine = make_engine(url)

    def memq(self, *args: str) -> None:
        subprocess.run([sys.executable, "-m", "memq", *args], env=self.env, check=True, cwd=ROOT,
                       capture_output=True)

    def start(self) -> None:
        self.memq("db", "upgrade")
        for name, args in (("worker", ["worker", "-c", str(self.workers), "-l", "WARNING", "--without-mingle",
                                       "--without-gossip"]),
                           ("dispatcher", ["dispatcher", "-l", "WARNING", "--batch", "200"])):
            out = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115
            self.procs.append(subprocess.Popen([sys.executable, "-m", "memq", *args], env=self.env, cwd=ROOT,
                                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.monotonic() + 60
        while len(list(self.r.scan_iter(match=self.prefix + "heartbeat:*"))) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("worker/dispatcher did not start; see " + str(self.tmp))
            time.sleep(0.2)

    def close(self) -> None:
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        for k in self.r.scan_iter(match=self.prefix + "*", count=1000):
            self.r.delete(k)
        self.engine.dispose()
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{self.db}" WITH (FORCE)')

    # -- messages, built as the agent builds them ------------------------------------------------
    def transport(self, run: str) -> Transport:
        return Transport(identity={"run": run, "cluster": "bench", "rank": 0, "host": "bench"},
                         spool=Spool(self.tmp / "unused", 0), redis_url=None, stream=self.st.stream_key,
                         key_prefix=self.st.key_prefix)

    def snapshot_messages(self, n: int, runs: int, tag: str) -> list[Message]:
        objs = [codec.decode_plain(codec.decompress((FIX / f).read_bytes())) for f in FILES]
        ts = {f"{tag}-run{k:03d}": self.transport(f"{tag}-run{k:03d}") for k in range(runs)}
        names = sorted(ts)
        out = []
        for i in range(n):
            obj = dict(objs[i % len(objs)], memq_bench=f"{tag}-{i}")
            data = pickle.dumps(obj, protocol=4)
            out.append(ts[names[i % runs]].serialize(Item("snapshot", obj=data, trigger="periodic", step=i)))
        return out

    def send(self, msgs: list[Message]) -> None:
        pipe = self.r.pipeline(transaction=False)
        for m in msgs:
            if m.blob_key:
                pipe.set(m.blob_key, m.blob, ex=3600)
            pipe.xadd(self.st.stream_key, m.fields)
        pipe.execute()

    # -- what the database holds ------------------------------------------------------------------
    def scalar(self, sql: str, **kw):
        from sqlalchemy import text

        with self.engine.connect() as c:
            return c.execute(text(sql), kw).scalar_one()

    def done_shas(self) -> set[str]:
        from sqlalchemy import text

        with self.engine.connect() as c:
            return {r[0] for r in c.execute(text("SELECT sha256 FROM snapshots WHERE state = 'done' "
                                                 "AND analysis_id IS NOT NULL"))}

    def wait_done(self, n: int, timeout: float = 600) -> float:
        t0 = time.monotonic()
        while self.scalar("SELECT count(*) FROM snapshots WHERE state = 'done'") < n:
            if time.monotonic() - t0 > timeout:
                raise SystemExit(f"only {self.scalar('SELECT count(*) FROM snapshots WHERE state = :s', s='done')}"
                                 f" of {n} done after {timeout} s")
            time.sleep(0.05)
        return time.monotonic()


def _tree(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*/children"):
            with contextlib.suppress(OSError):
                todo += [int(x) for x in task.read_text().split()]
    return out


def cpu_seconds(b: Bench) -> list[float]:
    """user+system CPU of the worker and the dispatcher process trees (PostgreSQL, Redis excluded)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = []
    for p in b.procs:
        total = 0
        for pid in _tree(p.pid):
            with contextlib.suppress(OSError, IndexError, ValueError):
                f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += int(f[11]) + int(f[12])
        out.append(total / tick)
    return out


def throughput(b: Bench, n: int, runs: int) -> dict:
    msgs = b.snapshot_messages(n, runs, "tp")
    base = b.scalar("SELECT count(*) FROM snapshots WHERE state = 'done'")
    cpu0 = cpu_seconds(b)
    t0 = time.monotonic()
    b.send(msgs)
    t_pushed = time.monotonic()
    t_done = b.wait_done(base + n)
    cpu_w, cpu_d = (a - z for a, z in zip(cpu_seconds(b), cpu0, strict=True))
    cpu = cpu_w + cpu_d
    # the run-level diagnoses catch up after the last snapshot (debounced per run)
    while b.scalar("SELECT count(*) FROM run_diagnoses d JOIN runs r ON r.id = d.run_id "
                   "WHERE r.name LIKE 'tp-%' AND d.snapshot_count = "
                   "(SELECT count(*) FROM snapshots s WHERE s.run_id = d.run_id)") < runs:
        if time.monotonic() - t_done > 300:
            break
        time.sleep(0.1)
    t_diag = time.monotonic()
    return {"snapshots": n, "runs": runs, "push_s": t_pushed - t0, "analysed_s": t_done - t0,
            "rate": n / (t_done - t0), "cpu_per_snapshot": cpu / n, "cpu_worker": cpu_w / n,
            "cpu_dispatcher": cpu_d / n, "with_run_diagnoses_s": t_diag - t0, "rate_with_diagnoses": n / (t_diag - t0)}


def stats_rate(b: Bench, samples: int, per_entry: int = 1000) -> dict:
    t = b.transport("stats-run")
    base_t = time.time() - samples
    line = json.loads((FIX / "stats.jsonl").read_text().splitlines()[5])
    msgs = []
    for e in range(samples // per_entry):
        batch = [dict(line, t=base_t + (e * per_entry + i) * 0.001, step=e * per_entry + i, epoch=0)
                 for i in range(per_entry)]
        msgs.append(t.serialize(Item("stats", payload={"samples": batch})))
    t0 = time.monotonic()
    b.send(msgs)
    want = (samples // per_entry) * per_entry
    while b.scalar("SELECT count(*) FROM stat_samples") < want:
        if time.monotonic() - t0 > 300:
            break
        time.sleep(0.02)
    dt = time.monotonic() - t0
    return {"samples": want, "seconds": dt, "rate": want / dt}


def latency(b: Bench, rate: float, seconds: float) -> dict:
    n = max(10, int(rate * seconds))
    msgs = b.snapshot_messages(n, max(1, n // 10), "lat")
    sent: dict[str, float] = {}
    seen: dict[str, float] = {}
    period = 1.0 / rate
    t_start = time.monotonic()
    i = 0
    while len(seen) < n:
        now = time.monotonic()
        while i < n and now >= t_start + i * period:
            b.send([msgs[i]])
            sent[msgs[i].fields["sha256"]] = time.monotonic()
            i += 1
        for s in b.done_shas():
            if s in sent and s not in seen:
                seen[s] = time.monotonic()
        if now - t_start > seconds + 120:
            break
        time.sleep(0.02)
    lat = sorted(seen[s] - sent[s] for s in seen)
    q = statistics.quantiles(lat, n=100) if len(lat) > 2 else lat
    return {"snapshots": n, "rate": rate, "measured": len(lat), "p50_s": statistics.median(lat),
            "p95_s": q[94] if len(q) >= 95 else max(lat), "max_s": max(lat)}


def reference_cpu_ms() -> float:
    """This machine's speed, for comparing runs across machines: median CPU ms to decode (restricted
    unpickling + parsing) and analyse one of the fixture snapshots in this process, no services."""
    from memq.analysis import analyze
    from memq.load import decode_snapshot_bytes

    data = (FIX / FILES[1]).read_bytes()
    took = []
    for _ in range(7):
        t0 = time.process_time()
        analyze([decode_snapshot_bytes(data)])
        took.append(time.process_time() - t0)
    return 1000 * statistics.median(took)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--snapshots", type=int, default=200)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--samples", type=int, default=200_000)
    ap.add_argument("--latency-s", type=float, default=30.0)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix="memq-bench-"))
    load0 = f"{os.getloadavg()[0]:.2f}"
    b = Bench(tmp, args.workers)
    try:
        b.start()
        log("warm-up ...")
        warm = b.snapshot_messages(4, 1, "warm")
        b.send(warm)
        b.wait_done(4)
        log(f"throughput: {args.snapshots} snapshots in {args.runs} runs ...")
        tp = throughput(b, args.snapshots, args.runs)
        log("stat samples ...")
        sr = stats_rate(b, args.samples)
        half = tp["rate"] / 2
        log(f"latency at {half:.1f}/s for {args.latency_s} s ...")
        lt = latency(b, half, args.latency_s)
        dead = b.r.xlen(b.st.dead_letter_key)
    finally:
        b.close()
    raw = codec.decompress((FIX / FILES[0]).read_bytes())
    cap = (os.cpu_count() or 1) / tp["cpu_per_snapshot"]
    ref = reference_cpu_ms()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, {platform.system()}")
    print(f"services: Redis {redact_url(REDIS)}, PostgreSQL (temporary database), memq worker -c {args.workers}, "
          f"one memq dispatcher")
    print(f"snapshots: seed_sgd epoch fixtures, 8000 trace entries, {len(raw)} bytes uncompressed, distinct bytes "
          f"each")
    print(f"end-to-end: {tp['snapshots']} snapshots ({tp['runs']} runs) pushed in {tp['push_s']:.2f} s, all "
          f"analysed after {tp['analysed_s']:.2f} s: {tp['rate']:.1f} snapshots/s "
          f"(goal >= 20/s: {'met' if tp['rate'] >= 20 else 'NOT met'}); run diagnoses current after "
          f"{tp['with_run_diagnoses_s']:.2f} s ({tp['rate_with_diagnoses']:.1f}/s)")
    print(f"CPU (worker + dispatcher processes, PostgreSQL/Redis excluded): {tp['cpu_per_snapshot'] * 1000:.0f} ms "
          f"per snapshot ({tp['cpu_worker'] * 1000:.0f} worker incl. run diagnoses, {tp['cpu_dispatcher'] * 1000:.0f} "
          f"dispatcher), so at most {cap:.1f} snapshots/s on {os.cpu_count()} otherwise idle cores")
    print(f"machine speed reference: decode + analysis of one snapshot in-process {ref:.0f} ms CPU; the pipeline "
          f"costs {tp['cpu_per_snapshot'] * 1000 / ref:.1f}x that per snapshot "
          "(compare runs on other machines by this)")
    print(f"load average before/after: {load0} / {os.getloadavg()[0]:.2f} (other jobs on this machine)")
    print(f"stat samples: {sr['samples']} in {sr['seconds']:.2f} s: {sr['rate']:,.0f} samples/s "
          f"(goal >= 20,000/s: {'met' if sr['rate'] >= 20000 else 'NOT met'})")
    print(f"latency push -> queryable at {lt['rate']:.1f} snapshots/s (half the maximum), {lt['measured']} of "
          f"{lt['snapshots']}: p50 {lt['p50_s']:.2f} s, p95 {lt['p95_s']:.2f} s, max {lt['max_s']:.2f} s "
          f"(goal p95 < 2 s: {'met' if lt['p95_s'] < 2 else 'NOT met'})")
    print(f"dead letters: {dead}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
