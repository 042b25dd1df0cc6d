"""50 agents push 2,000 snapshots and their stats while a worker is SIGKILLed and Redis restarts: does
every accepted snapshot land exactly once in PostgreSQL?

What runs: a private `redis-server` (AOF, fsync always, as a production Redis with persistence) that is
the stream, the blobs and the Celery broker; a temporary database on the shared PostgreSQL (created,
migrated, dropped); `memq dispatcher`, `memq worker -c 2` and one `celery beat` (the reaper, every
`MEMQ_REAPER_INTERVAL_S` 10 s; an analysis pending over `MEMQ_PENDING_REQUEUE_S` 60 s is enqueued
again, the defaults being 60 s and 600 s) as subprocesses. 50 real agent transports
(memq.agent.transport: their own delivery thread, Redis connection, back-off and disk spool) each
submit 40 snapshots of DISTINCT bytes (a real H200 epoch_end snapshot with a `memq_bench` key) and a
stats batch after every fourth, paced over the run. Faults, once each: the worker is SIGKILLed at 30%
of the submissions (and started again 2 s later); Redis is stopped at 60% (SIGTERM) and started again
3 s later on the same port. Agents spool while Redis is down and replay in order when it is back.

"Accepted" = a snapshot the agent's submit() took (it never drops one for these sizes: dropped must be
0). The check: every accepted sha256 is one `done` row of `snapshots` with its analysis attached, no
row twice, nothing dead-lettered; printed as one JSON object.

    python benchmarks/bench_faults.py [--agents 50] [--snapshots 40]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import platform
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from memq import codec  # noqa: E402
from memq.agent.spool import Spool  # noqa: E402
from memq.agent.transport import Item, Transport  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
# the private redis-server of the reconnect benchmark: AOF, fsync always, restartable on its port
from bench_reconnect import _Redis as PrivateRedis  # noqa: E402

FIX = ROOT / "tests" / "fixtures" / "real" / "seed_sgd" / "epoch1.pickle.gz"
PG_ADMIN = os.environ.get("MEMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--agents", type=int, default=50)
    ap.add_argument("--snapshots", type=int, default=40, help="per agent")
    ap.add_argument("--pace-s", type=float, default=45.0, help="seconds over which the agents submit")
    args = ap.parse_args()
    import psycopg
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from memq.store.db import make_engine

    tmp = Path(tempfile.mkdtemp(prefix="memq-faults-"))
    srv = PrivateRedis(tmp)
    srv.start()
    url_redis = f"redis://127.0.0.1:{srv.port}/0"
    db = f"memq_faults_{secrets.token_hex(4)}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{db}"')
    url = make_url(PG_ADMIN).set(database=db).render_as_string(hide_password=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_REDIS_URL": url_redis, "MEMQ_DATABASE_URL": url, "MEMQ_DATA_DIR": str(tmp / "data"),
                "MEMQ_BLOB_DIR": str(tmp / "blobs"), "MEMQ_CONFIG": str(tmp / "none.toml"), "MEMQ_HEARTBEAT_S": "1",
                "MEMQ_REAPER_INTERVAL_S": "10", "MEMQ_PENDING_REQUEUE_S": "60"})
    procs: dict[str, subprocess.Popen] = {}

    def spawn(name: str, argv: list[str]) -> None:
        out = open(tmp / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        procs[name] = subprocess.Popen([sys.executable, "-m", "memq", *argv], env=env, cwd=ROOT, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    worker = ["worker", "-c", "2", "-l", "WARNING", "--without-mingle", "--without-gossip"]
    engine = make_engine(url)
    result: dict = {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"}
    transports: list[Transport] = []
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))  # a timeout still cleans up (finally below)
    try:
        subprocess.run([sys.executable, "-m", "memq", "db", "upgrade"], env=env, check=True, cwd=ROOT,
                       capture_output=True)
        spawn("worker", worker)
        spawn("dispatcher", ["dispatcher", "-l", "WARNING"])
        # one beat, as deployments run it (deploy/compose.yaml): its reaper re-enqueues the analyses whose
        # task messages the broker lost while Redis was down (their rows stay `pending`)
        out = open(tmp / "beat.log", "ab")  # noqa: SIM115 - closed with the process
        procs["beat"] = subprocess.Popen([sys.executable, "-m", "celery", "-A", "memq.workers.app", "beat", "-l",
                                          "WARNING",
                                          "-s", str(tmp / "beat-schedule")], env=env, cwd=ROOT, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        base = codec.decode_plain(codec.decompress(FIX.read_bytes()))
        for i in range(args.agents):
            t = Transport(identity={"run": f"fault-{i:02d}", "cluster": "bench", "rank": 0, "host": f"h{i}"},
                          spool=Spool(tmp / "spool" / f"a{i}", 1 << 30), redis_url=url_redis,
                          stream="memq:ingest", key_prefix="memq:")
            t.start()
            transports.append(t)
        total = args.agents * args.snapshots
        accepted: list[str] = []
        lock = threading.Lock()
        counter = {"n": 0, "stats": 0}
        faults: dict = {}
        t0 = time.monotonic()

        def agent(i: int, t: Transport) -> None:
            for k in range(args.snapshots):
                obj = dict(base, memq_bench=f"{i}-{k}")
                data = pickle.dumps(obj, protocol=4)
                import hashlib

                sha = hashlib.sha256(data).hexdigest()
                if t.submit(Item("snapshot", obj=data, trigger="periodic", step=k)):
                    with lock:
                        accepted.append(sha)
                        counter["n"] += 1
                if k % 4 == 3 and t.submit(Item("stats", payload={"samples": [
                        {"t": time.time(), "step": k, "allocated_bytes": 1 << 30, "reserved_bytes": 2 << 30}]})):
                    with lock:
                        counter["stats"] += 1
                time.sleep(args.pace_s / args.snapshots)

        threads = [threading.Thread(target=agent, args=(i, t), daemon=True) for i, t in enumerate(transports)]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            done = counter["n"] / total
            if "worker_killed_at" not in faults and done >= 0.3:
                os.killpg(procs["worker"].pid, signal.SIGKILL)
                procs["worker"].wait(10)
                faults["worker_killed_at"] = round(time.monotonic() - t0, 1)
                time.sleep(2)
                spawn("worker", worker)
            if "redis_stopped_at" not in faults and done >= 0.6:
                srv.stop()
                faults["redis_stopped_at"] = round(time.monotonic() - t0, 1)
                time.sleep(3)
                srv.start()
                faults["redis_back_at"] = round(time.monotonic() - t0, 1)
            time.sleep(0.1)
        stopped = [t.stop(60) for t in transports]
        submitted_s = time.monotonic() - t0
        want = set(accepted)

        def rows():
            with engine.connect() as c:
                return c.execute(text("SELECT sha256, count(*), sum(CASE WHEN state = 'done' AND analysis_id IS NOT "
                                      "NULL THEN 1 ELSE 0 END) FROM snapshots GROUP BY sha256")).all()

        log(f"submitted in {submitted_s:.1f} s; faults {faults}; waiting for {len(want)} snapshots")
        deadline = time.monotonic() + 900
        last_log = 0.0
        while True:
            got = rows()
            done = {r[0] for r in got if r[2] == r[1]}
            if want <= done or time.monotonic() > deadline:
                break
            if time.monotonic() - last_log > 15:
                log(f"  {len(done)} of {len(want)} done ({len(got)} rows), {time.monotonic() - t0:.0f} s")
                last_log = time.monotonic()
            time.sleep(1)
        dead = redis.Redis.from_url(url_redis).xlen("memq:dead") if redis.Redis.from_url(url_redis).exists(
            "memq:dead") else 0
        counters = [t.counters.snapshot() for t in transports]
        result.update({
            "agents": args.agents, "snapshots_submitted": total, "accepted": len(accepted),
            "distinct_accepted": len(want), "stats_accepted": counter["stats"], "faults": faults,
            "agents_flushed": sum(stopped), "agent_dropped": sum(c.get("dropped", 0) for c in counters),
            "agent_spooled": sum(c.get("spooled", 0) for c in counters),
            "agent_replayed": sum(c.get("replayed", 0) for c in counters),
            "rows": len(got), "rows_done": len(done), "missing": len(want - {r[0] for r in got}),
            "not_done": len(want - done), "duplicated": sum(1 for r in got if r[1] > 1),
            "unexpected": len({r[0] for r in got} - want), "dead_letters": dead,
            "submit_s": round(submitted_s, 1), "all_done_s": round(time.monotonic() - t0, 1),
        })
        result["ok"] = (result["missing"] == 0 and result["not_done"] == 0 and result["duplicated"] == 0
                        and result["unexpected"] == 0 and result["agent_dropped"] == 0 and dead == 0)
        print(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    finally:
        for t in transports:
            with contextlib.suppress(Exception):
                t.stop(1)
        for p in procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs.values():
            with contextlib.suppress(Exception):
                p.wait(20)
        engine.dispose()
        srv.stop()
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
