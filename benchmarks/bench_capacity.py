"""Figures for the capacity plan (deploy/CAPACITY.md), measured on this machine in one run.

    python benchmarks/bench_capacity.py [--stats-entries 20000] [--snapshot-copies 200] [--out PATH]

Inputs are real: stat samples and snapshots from the agent spools the H200 runs returned
(tests/fixtures/agent_gpu: default agent settings, a ~120M-parameter GPT), plus the 100,000-entry
H200 snapshot (benchmarks/data/big.pickle.gz) as the upper bound of a fully recorded snapshot.
What it measures:
1. Redis (a private redis-server on a free port, no persistence): bytes of memory per ingest-stream
   entry (a `stats` envelope of 6 samples = one agent flush at the defaults: a sample every 10 s,
   flushed every 60 s) and per snapshot entry + blob (zstd, as the agent sends with zstandard),
   from INFO used_memory before and after.
2. The dispatcher (memq.workers.dispatcher.Dispatcher, in-process, real PostgreSQL database of its own):
   stats entries/s and samples/s moved from the stream into stat_samples; snapshot entries/s moved
   into the blob store and snapshot rows.
3. Worker cost: CPU and wall seconds per snapshot analysis (memq.pipeline.analyse.analyse_snapshot,
   what the analyze task runs), by snapshot kind.
4. PostgreSQL bytes on disk per stat-sample row and per analysed snapshot (rows of snapshots +
   analysis_results, indexes and TOAST included: pg_total_relation_size after VACUUM), and blob
   store bytes per snapshot.
5. Retention: `memq gc`'s rate of removing stat samples and blobs (everything made old by running
   it two days ahead).
The database is created on MEMQ_BENCH_POSTGRES_URL (default MEMQ_TEST_POSTGRES_URL or the shared
server) and dropped at the end; the private Redis is stopped. Prints a summary and writes JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import pickle
import platform
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memq import codec, envelope  # noqa: E402
from memq.agent import spool  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SPOOLS = ROOT / "tests" / "fixtures" / "agent_gpu"
BIG = ROOT / "benchmarks" / "data" / "big.pickle.gz"
ADMIN_URL = os.environ.get("MEMQ_BENCH_POSTGRES_URL") or os.environ.get(
    "MEMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


# ------------------------------------------------------------------------------------ inputs


def real_messages() -> tuple[list[dict], dict[str, list[bytes]]]:
    """(real stat samples, real raw snapshot pickles by trigger) from the GPU spools."""
    samples: list[dict] = []
    snaps: dict[str, list[bytes]] = {}
    seen: set[str] = set()
    for f in sorted(SPOOLS.rglob("*.mqs")):
        m = spool.decode(f.read_bytes())
        kind = m.fields["kind"]
        if kind == "stats":
            for s in json.loads(m.fields["payload"])["samples"]:
                if "device_metadata" not in s and "allocated_bytes.all.current" in s:
                    samples.append(s)
        elif kind == "snapshot" and m.fields["sha256"] not in seen:
            seen.add(m.fields["sha256"])
            snaps.setdefault(m.fields["trigger"], []).append(codec.decompress(m.blob))
    return samples, snaps


def variant(raw: bytes, i: int) -> bytes:
    """Distinct bytes of the same snapshot (a counter key in the dict), so every copy is a new blob."""
    obj = codec.decode_plain(raw)
    obj["memq_capacity_copy"] = i
    return pickle.dumps(obj, protocol=4)


# ------------------------------------------------------------------------------------ services


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def private_redis(tmp: Path):
    import redis

    port = free_port()
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    r = redis.Redis.from_url(url)
    deadline = time.monotonic() + 15
    while True:
        try:
            r.ping()
            break
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    try:
        yield url, r
    finally:
        proc.kill()
        proc.wait(10)


@contextlib.contextmanager
def bench_database():
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    name = f"memq_capacity_{os.getpid()}_{secrets.token_hex(4)}"
    admin = ADMIN_URL.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(admin).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(admin, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def used_memory(r) -> int:
    return int(r.info("memory")["used_memory"])


def table_bytes(db_url: str) -> dict[str, dict[str, int]]:
    import psycopg

    url = db_url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(url, autocommit=True) as c:
        c.execute("VACUUM ANALYZE")
        out = {}
        for t in ("stat_samples", "snapshots", "analysis_results", "run_diagnoses", "runs"):
            # summed over partitions (stat_samples is partitioned by day; a parent has no storage)
            total, heap, idx = c.execute(
                "SELECT sum(pg_total_relation_size(relid)), sum(pg_relation_size(relid)), "
                "sum(pg_indexes_size(relid)) FROM (SELECT relid FROM pg_partition_tree(%s::regclass) "
                "UNION SELECT %s::regclass) tree", (t, t)).fetchone()
            rows = c.execute(f"SELECT count(*) FROM {t}").fetchone()[0]  # noqa: S608 - constant table names
            out[t] = {"rows": int(rows), "total": int(total), "heap": int(heap), "indexes": int(idx)}
        return out


# ------------------------------------------------------------------------------------ bench


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats-entries", type=int, default=20_000, help="stats envelopes of 6 samples each")
    ap.add_argument("--snapshot-copies", type=int, default=200, help="distinct epoch-end snapshots pushed")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "capacity.json"))
    args = ap.parse_args(argv)

    from memq.config import load_settings
    from memq.pipeline import analyse as svc
    from memq.store import schema
    from memq.store.connection import open_store
    from memq.store.db import make_engine
    from memq.workers.dispatcher import Dispatcher

    t_all = time.monotonic()
    samples, snaps = real_messages()
    fig: dict = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                            f"Python {platform.python_version()}, {platform.system()}",
                 "load_average_start": os.getloadavg()[0], "inputs": {}}
    fig["inputs"]["real_samples"] = len(samples)
    fig["inputs"]["snapshots"] = {k: [len(v) for v in vs] for k, vs in snaps.items()}
    big_raw = gzip.decompress(BIG.read_bytes())

    # snapshot blob sizes as the agent sends them (zstd), per kind
    kinds = {"epoch_end": snaps["epoch_end"][0], "warmup_periodic": snaps["periodic"][0], "oom": snaps["oom"][0],
             "full_100k_entries": big_raw}
    fig["blob_bytes"] = {k: {"pickle": len(raw), "zstd": len(codec.compress(raw, "zstd")),
                             "gzip": len(codec.compress(raw, "gzip"))} for k, raw in kinds.items()}

    tmp = Path(tempfile.mkdtemp(prefix="memq-capacity-"))
    try:
        with private_redis(tmp) as (redis_url, r), bench_database() as db_url:
            st = load_settings({"MEMQ_CONFIG": str(tmp / "none.toml"), "MEMQ_DATA_DIR": str(tmp / "data"),
                                "MEMQ_DATABASE_URL": db_url, "MEMQ_REDIS_URL": redis_url,
                                "MEMQ_BLOB_DIR": str(tmp / "blobs"), "MEMQ_STREAM": "memq:ingest"})
            engine = make_engine(st.database_url)
            schema.upgrade(engine)
            engine.dispose()
            # stat_samples' day partitions for the days the samples below fall on, as a deployment
            # that has run for a while has them (its dispatchers make them a week ahead)
            import datetime as dt

            from memq.store import partitions

            cap_store = open_store(st)
            with cap_store.session() as s:
                today = dt.datetime.now(dt.UTC).date()
                partitions.ensure_days(s, today - dt.timedelta(days=2), today)
            cap_store.close()

            # 1a. stats entries in Redis: 6 real samples per envelope, 100 runs x 100 ranks cycling
            n = args.stats_entries
            base_t = time.time() - 86400
            before = used_memory(r)
            pipe = r.pipeline(transaction=False)
            field_bytes = 0
            for i in range(n):
                run, rank = f"cap-run-{i % 100}", (i // 100) % 100
                batch = []
                for j in range(6):
                    s = dict(samples[(i * 6 + j) % len(samples)])
                    s["t"] = base_t + (i // 10_000) * 60 + j * 10 + (i % 10_000) * 1e-3
                    batch.append(s)
                fields = envelope.build("stats", run=run, cluster="cap", rank=rank, job="cap-job",
                                        host=f"node{rank:03d}", payload={"samples": batch})
                field_bytes += sum(len(k) + len(v) for k, v in fields.items())
                pipe.xadd(st.stream_key, fields, maxlen=st.stream_maxlen, approximate=True)
                if i % 1000 == 999:
                    pipe.execute()
            pipe.execute()
            after = used_memory(r)
            fig["redis_stats_entry"] = {"entries": n, "samples_per_entry": 6,
                                        "bytes_per_entry": round((after - before) / n, 1),
                                        "field_bytes_per_entry": round(field_bytes / n, 1),
                                        "memory_usage_stream_key": int(r.memory_usage(st.stream_key, samples=0))}

            # 2a. dispatcher: stats entries -> stat_samples
            d = Dispatcher(st, consumer="cap", batch=100, block_ms=50, enqueue=lambda _sid: None)
            t0 = time.perf_counter()
            c0 = time.process_time()
            counts = d.run(install_signals=False, idle_exit_s=1.0)
            wall = time.perf_counter() - t0 - 1.0
            cpu = time.process_time() - c0
            fig["dispatcher_stats"] = {"entries": counts["stats"], "samples": counts["samples"],
                                       "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                                       "entries_per_s": round(counts["stats"] / wall, 1),
                                       "samples_per_s": round(counts["samples"] / wall, 1)}
            r.delete(st.stream_key)

            # 1b + 2b. snapshot entries + blobs (distinct epoch-end snapshots), Redis memory, dispatcher
            m = args.snapshot_copies
            raws = [variant(snaps["epoch_end"][i % len(snaps["epoch_end"])], i) for i in range(m)]
            before = used_memory(r)
            for i, raw in enumerate(raws):
                import hashlib

                sha = hashlib.sha256(raw).hexdigest()
                blob = codec.compress(raw, "zstd")
                r.set(envelope.blob_key(sha), blob, ex=st.blob_ttl_s)
                r.xadd(st.stream_key, envelope.build("snapshot", run=f"cap-run-{i % 100}", cluster="cap",
                                                     rank=i // 100, sha256=sha, size=len(raw), codec="zstd",
                                                     trigger="epoch_end", step=100, epoch=1),
                       maxlen=st.stream_maxlen, approximate=True)
            after = used_memory(r)
            zstd_bytes = sum(len(codec.compress(x, "zstd")) for x in raws)
            fig["redis_snapshot_entry"] = {"entries": m, "bytes_per_entry_and_blob": round((after - before) / m, 1),
                                           "zstd_blob_bytes": round(zstd_bytes / m, 1)}
            sids: list[int] = []
            d = Dispatcher(st, consumer="cap2", batch=100, block_ms=50, enqueue=sids.append)
            t0 = time.perf_counter()
            counts = d.run(install_signals=False, idle_exit_s=1.0)
            wall = time.perf_counter() - t0 - 1.0
            fig["dispatcher_snapshots"] = {"entries": counts["snapshots"], "wall_s": round(wall, 2),
                                           "entries_per_s": round(counts["snapshots"] / wall, 1),
                                           "redis_keys_left": int(r.dbsize())}

            # 3. analysis cost per snapshot, by kind (what a worker's analyze task runs)
            store = open_store(st)
            cost: dict[str, dict] = {}
            t_an = time.perf_counter()
            c_an = time.process_time()
            for sid in sids:
                svc.analyse_snapshot(store, sid)
            wall = time.perf_counter() - t_an
            cost["epoch_end"] = {"n": len(sids), "wall_s_per_snapshot": round(wall / len(sids), 4),
                                 "cpu_s_per_snapshot": round((time.process_time() - c_an) / len(sids), 4)}
            from memq.store import repository as repo

            for kind in ("warmup_periodic", "oom", "full_100k_entries"):
                raw = kinds[kind]
                sha = __import__("hashlib").sha256(raw).hexdigest()
                ref = store.blobs.put(sha, raw)
                with store.session() as s:
                    rid = repo.upsert_run(s, repo.RunMeta(name=f"cap-{kind}", cluster="cap"))
                    sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=sha, size_bytes=len(raw),
                                                                      trigger="oom" if kind == "oom" else "periodic",
                                                                      blob_ref=ref, source=kind))
                t0, c0 = time.perf_counter(), time.process_time()
                svc.analyse_snapshot(store, sid)
                cost[kind] = {"n": 1, "wall_s_per_snapshot": round(time.perf_counter() - t0, 3),
                              "cpu_s_per_snapshot": round(time.process_time() - c0, 3)}
            fig["analysis"] = cost

            # 3b. run-level diagnosis (recompute_run, debounced per run and rank after each analysis):
            # one blob decoded, the rank's earlier snapshots read as digests (up to MAX_RUN_SNAPSHOTS)
            import datetime as dt

            recompute: dict[str, float] = {}
            with store.session() as s:
                rid = repo.upsert_run(s, repo.RunMeta(name="cap-rundiag", cluster="cap"))
            series = [kinds["warmup_periodic"]] + [variant(snaps["epoch_end"][0], 10_000 + i) for i in range(63)]
            t_base = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
            for i, raw in enumerate(series, 1):
                sha = __import__("hashlib").sha256(raw).hexdigest()
                ref = store.blobs.put(sha, raw)
                with store.session() as s:
                    sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(
                        run_id=rid, sha256=sha, size_bytes=len(raw), trigger="periodic" if i == 1 else "epoch_end",
                        blob_ref=ref, source=f"e{i}", epoch=i - 1, taken_at=t_base + dt.timedelta(hours=i)))
                svc.analyse_snapshot(store, sid)
                if i in (2, 8, 16, 32, 64):
                    took = []
                    for _ in range(3):  # the median of three: one full GC pass can double a single one
                        c0 = time.process_time()
                        svc.recompute_run(store, rid, 0)
                        took.append(time.process_time() - c0)
                    recompute[str(i)] = round(sorted(took)[1], 3)
            fig["run_diagnosis_cpu_s_by_snapshots"] = recompute
            store.close()

            # 4. PostgreSQL and blob store bytes
            tb = table_bytes(db_url)
            fig["postgres"] = tb
            ss = tb["stat_samples"]
            fig["postgres_bytes_per_stat_sample"] = {"total": round(ss["total"] / ss["rows"], 1),
                                                     "heap": round(ss["heap"] / ss["rows"], 1),
                                                     "indexes": round(ss["indexes"] / ss["rows"], 1)}
            snap_rows = tb["snapshots"]["rows"]
            fig["postgres_bytes_per_snapshot"] = {
                "snapshots_row": round(tb["snapshots"]["total"] / snap_rows, 1),
                "analysis_results_row": round(tb["analysis_results"]["total"] / tb["analysis_results"]["rows"], 1)}
            blob_files = [p for p in (tmp / "blobs").rglob("*") if p.is_file()]
            fig["blob_store"] = {"files": len(blob_files), "bytes": sum(p.stat().st_size for p in blob_files)}

            # 5. retention (memq gc): everything above is made "old" by running it 2 days ahead
            from memq.store.retention import Policy, collect

            store = open_store(st)
            with store.session() as s:  # end the runs, so their blobs are not kept as "still going"
                from sqlalchemy import update

                from memq.store.orm import Run

                s.execute(update(Run).values(status="completed"))
            t0 = time.perf_counter()
            # grace_s=0: the rate of removing, without gc's fixed wait before its final reference check
            summary = collect(store, Policy(1), now=dt.datetime.now(dt.UTC) + dt.timedelta(days=2), grace_s=0.0)
            wall = time.perf_counter() - t0
            fig["gc"] = {"wall_s": round(wall, 2), "stat_samples_removed": summary["stat_samples_removed"],
                         "stat_partitions_dropped": len(summary["stat_partitions_dropped"]),
                         "blobs_removed": summary["blobs_removed"], "kept": summary["kept"],
                         "stat_samples_per_s": round(summary["stat_samples_removed"] / wall, 1)}
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    fig["load_average_end"] = os.getloadavg()[0]
    fig["total_s"] = round(time.monotonic() - t_all, 1)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(fig, indent=2) + "\n")
    print(json.dumps(fig, indent=2))
    return fig


if __name__ == "__main__":
    main()
