"""Run-history benchmark on PostgreSQL: 100,000 runs and 10,000,000 stat samples.

    python benchmarks/bench_history.py [--runs 100000] [--samples-per-run 100] [--repeat 15]

What it does, in its own database (`memq_bench_<pid>_<hex>` on MEMQ_BENCH_POSTGRES_URL, default
MEMQ_TEST_POSTGRES_URL or postgresql://postgres@127.0.0.1:5432/postgres), dropped at the end:
1. `memq db upgrade` (the real migrations), then bulk-generates the history server-side with
   INSERT ... SELECT generate_series: runs spread over 90 days on 20 clusters and 500 jobs, one
   analysed snapshot and one run diagnosis per run, and `samples-per-run` stat samples per run
   (FK triggers are skipped during this synthetic load only: session_replication_role = replica).
2. Ingests one real run (tests/fixtures/real/seed_sgd, 4 snapshots + 45 stat samples) with
   `memq ingest`, so `history` reads real analysis results among the synthetic ones.
3. Times, in this process (process start excluded), the `memq` commands through click's runner:
   `memq history --run <real run> --json`, `memq history --run <synthetic run> --json`,
   `memq runs --cluster c07 --since 7d --json`; and the repository queries alone.
4. Times stat-sample ingest through `repository.insert_stat_samples` (the function the workers
   call): 200,000 rows into the 10M-row table, in batches as a worker would send them.
Prints every figure and a markdown block for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import secrets
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADMIN_URL = os.environ.get("MEMQ_BENCH_POSTGRES_URL") or os.environ.get(
    "MEMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


def _plain(url: str) -> str:
    return "postgresql://" + url.split("://", 1)[1]


@contextlib.contextmanager
def bench_database():
    import psycopg
    from psycopg import sql
    from sqlalchemy.engine import make_url

    name = f"memq_bench_{os.getpid()}_{secrets.token_hex(4)}"
    with psycopg.connect(_plain(ADMIN_URL), autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield make_url(_plain(ADMIN_URL)).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(_plain(ADMIN_URL), autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def machine() -> str:
    cpu = "unknown CPU"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    return f"{cpu}, {os.cpu_count()} cores{mem}, Python {platform.python_version()}, {platform.system()}"


GENERATE = [
    # 100k runs over the last 90 days, 20 clusters, 500 jobs, 4 torch versions, ~6% OOM.
    """INSERT INTO runs (name, job, cluster, host, labels, torch_version, cuda_version, gpu_model, gpu_memory_bytes,
                        memory_limit_bytes, optimizer, param_count, world_size, rank, started_at, ended_at, status,
                        primary_cause, cause_confidence, peak_reserved_bytes, peak_allocated_bytes,
                        fragmentation_ratio, oom_count, snapshot_count)
       SELECT 'run-' || lpad(g::text, 6, '0'), 'job-' || (g % 500), 'c' || lpad((g % 20)::text, 2, '0'),
              'host-' || (g % 997), jsonb_build_object('team', 't' || (g % 13)),
              (ARRAY['2.8.0', '2.9.1', '2.10.0', '2.11.0'])[1 + g % 4], '12.4', 'NVIDIA H200', 150109880320,
              NULL, (ARRAY['AdamW', 'SGD'])[1 + g % 2], 120402432, 8, 0,
              now() - (g::double precision / :runs) * interval '90 days',
              now() - (g::double precision / :runs) * interval '90 days' + interval '2 hours',
              CASE WHEN g % 17 = 0 THEN 'oom' ELSE 'completed' END,
              CASE WHEN g % 17 = 0 THEN 'fragmentation' ELSE 'healthy' END, 0.8,
              (6 + g % 10)::bigint * 1073741824, (5 + g % 10)::bigint * 1073741824, (g % 100) / 100.0,
              CASE WHEN g % 17 = 0 THEN 1 ELSE 0 END, 1
       FROM generate_series(1, :runs) g""",
    """INSERT INTO analysis_results (sha256, analyzer_version, context_key, reserved_bytes, allocated_bytes,
                                    active_bytes, largest_free_block_bytes, fragmentation_ratio, primary_cause,
                                    confidence, result)
       SELECT md5(r.id::text) || md5(r.name), 'bench', '', r.peak_reserved_bytes, r.peak_allocated_bytes,
              r.peak_allocated_bytes, 536870912, r.fragmentation_ratio, r.primary_cause, 0.8,
              jsonb_build_object('schema', 1,
                'metrics', jsonb_build_object('reserved_bytes', r.peak_reserved_bytes,
                                              'allocated_bytes', r.peak_allocated_bytes),
                'composition', jsonb_build_object('parameters', 481781760, 'gradients', 0,
                  'optimizer_state', 963563520, 'activations', r.peak_allocated_bytes - 1445345280,
                  'workspace', 0, 'other', 0, 'unknown', 0),
                'oom', NULL,
                'diagnosis', jsonb_build_object('primary_cause', r.primary_cause, 'confidence', 0.8,
                  'causes', jsonb_build_array(), 'recommendations', jsonb_build_array()))
       FROM runs r""",
    """INSERT INTO snapshots (run_id, rank, sha256, step, epoch, trigger, taken_at, size_bytes, blob_ref, context,
                             state, analyzer_version, analysis_id, attempts)
       SELECT r.id, 0, a.sha256, 1000, 3, 'epoch_end', r.started_at + interval '1 hour', 1800000,
              substr(a.sha256, 1, 2) || '/' || a.sha256 || '.zst', '{}'::jsonb, 'done', 'bench', a.id, 1
       FROM runs r JOIN analysis_results a ON a.sha256 = md5(r.id::text) || md5(r.name)""",
    """INSERT INTO run_diagnoses (run_id, rank, analyzer_version, primary_cause, confidence, snapshot_count,
                                 peak_reserved_bytes, peak_allocated_bytes, peak_composition, result)
       SELECT s.run_id, 0, 'bench', a.primary_cause, 0.8, 1, a.reserved_bytes, a.allocated_bytes,
              a.result -> 'composition', a.result
       FROM snapshots s JOIN analysis_results a ON a.id = s.analysis_id""",
]

STATS = """INSERT INTO stat_samples (run_id, rank, sampled_at, step, epoch, allocated_bytes, reserved_bytes,
                                     active_bytes, inactive_split_bytes, alloc_retries, oom_count)
           SELECT r.id, 0, r.started_at + g * interval '10 seconds', g, g / 50,
                  r.peak_allocated_bytes - (g % 7) * 104857600, r.peak_reserved_bytes,
                  r.peak_allocated_bytes - (g % 7) * 104857600, 209715200, 0, 0
           FROM runs r CROSS JOIN generate_series(1, :per_run) g
           WHERE r.id BETWEEN :lo AND :hi"""


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm-up: imports, first connection, plan cache
    out = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


def summary(ms: list[float]) -> str:
    q = sorted(ms)
    p95 = q[min(len(q) - 1, int(round(0.95 * (len(q) - 1))))]
    return f"median {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {max(ms):.1f} ms (n={len(ms)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--samples-per-run", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--ingest-rows", type=int, default=200_000)
    args = ap.parse_args()

    from click.testing import CliRunner
    from sqlalchemy import text

    from memq.cli import cli
    from memq.config import redact_url
    from memq.pipeline import history as queries
    from memq.store import repository as repo
    from memq.store.db import make_engine, session_scope

    lines: list[str] = []

    def say(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    say(f"machine: {machine()}")
    t_all = time.perf_counter()
    with bench_database() as url, contextlib.ExitStack() as stack:
        import tempfile

        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="memq-bench-")))
        env = {"MEMQ_DATABASE_URL": url, "MEMQ_BLOB_DIR": str(tmp / "blobs"), "MEMQ_DATA_DIR": str(tmp),
               "MEMQ_CONFIG": str(tmp / "none.toml")}
        os.environ.update(env)
        engine = make_engine(url)
        stack.callback(engine.dispose)
        with engine.connect() as c:
            say(f"database: {redact_url(url).rsplit('/', 1)[0]}/<bench db>, "
                f"{c.execute(text('SHOW server_version')).scalar_one()}")
        runner = CliRunner()
        assert runner.invoke(cli, ["db", "upgrade"]).exit_code == 0

        t = time.perf_counter()
        with engine.begin() as c:
            c.execute(text("SET LOCAL session_replication_role = replica"))  # synthetic load only: no FK triggers
            for stmt in GENERATE:
                c.execute(text(stmt), {"runs": args.runs})
        t_runs = time.perf_counter() - t
        say(f"generated {args.runs:,} runs (+1 analysed snapshot and 1 run diagnosis each) in {t_runs:.1f} s")
        t = time.perf_counter()
        chunk = 10_000
        for lo in range(1, args.runs + 1, chunk):
            with engine.begin() as c:
                c.execute(text("SET LOCAL session_replication_role = replica"))
                c.execute(text(STATS), {"per_run": args.samples_per_run, "lo": lo, "hi": lo + chunk - 1})
        t_stats = time.perf_counter() - t
        n_samples = args.runs * args.samples_per_run
        say(f"generated {n_samples:,} stat samples in {t_stats:.1f} s ({n_samples / t_stats:,.0f} rows/s, "
            "INSERT ... SELECT generate_series)")
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            t = time.perf_counter()
            c.execute(text("VACUUM ANALYZE"))
            say(f"VACUUM ANALYZE in {time.perf_counter() - t:.1f} s")
            counts = {tb: c.execute(text(f"SELECT count(*) FROM {tb}")).scalar_one()  # noqa: S608 - fixed names
                      for tb in ("runs", "snapshots", "stat_samples")}
            size = c.execute(text("SELECT pg_size_pretty(pg_database_size(current_database()))")).scalar_one()
        say(f"rows: {counts}; database size {size}")

        # A real run among the synthetic ones.
        real = ROOT / "tests" / "fixtures" / "real" / "seed_sgd"
        files = [str(real / f"{s}.pickle.gz") for s in ("before_training", "epoch0", "epoch1", "epoch2")]
        res = runner.invoke(cli, ["ingest", *files, "--run", "bench-real", "--cluster", "c07", "--job", "job-7",
                                  "--stats", str(real / "stats.jsonl"), "--json"])
        assert res.exit_code == 0, res.output
        synthetic = f"run-{args.runs // 2:06d}"

        def cli_call(argv):
            def go():
                r = runner.invoke(cli, argv)
                if r.exit_code != 0:
                    raise RuntimeError(f"memq {' '.join(argv)}: {r.output} {r.exception!r}")
                return r.output
            return go

        n_runs = len(json.loads(cli_call(["runs", "--cluster", "c07", "--since", "7d", "--json"])())["runs"])
        hist = json.loads(cli_call(["history", "--run", synthetic, "--json"])())
        results = {
            "memq history --run bench-real --json (4 real snapshots, 45 samples)":
                timed(cli_call(["history", "--run", "bench-real", "--json"]), args.repeat),
            f"memq history --run {synthetic} --json ({len(hist['snapshots'])} snapshot, "
            f"{hist['stats']['count']} samples)":
                timed(cli_call(["history", "--run", synthetic, "--json"]), args.repeat),
            f"memq runs --cluster c07 --since 7d --json ({n_runs} runs shown, default --rows 50)":
                timed(cli_call(["runs", "--cluster", "c07", "--since", "7d", "--json"]), args.repeat),
            "memq runs --cluster c07 --since 7d --rows 1000 --json":
                timed(cli_call(["runs", "--cluster", "c07", "--since", "7d", "--rows", "1000", "--json"]),
                      args.repeat),
        }

        def q_history():
            with session_scope(engine) as s:
                queries.run_history(s, synthetic)

        def q_runs():
            with session_scope(engine) as s:
                queries.list_runs(s, queries.RunFilter(cluster="c07",
                                                       since=dt.datetime.now(dt.UTC) - dt.timedelta(days=7)))

        results["queries.run_history() alone"] = timed(q_history, args.repeat)
        results["queries.list_runs(cluster, since 7d) alone"] = timed(q_runs, args.repeat)
        for name, ms in results.items():
            say(f"{name}: {summary(ms)}")

        # Stat-sample ingest through the workers' batch function, into the 10M-row table.
        with session_scope(engine) as s:
            rid = repo.upsert_run(s, repo.RunMeta(name="bench-ingest", cluster="c07"))
        t0 = 1_795_984_680.0
        stats = {"allocated_bytes.all.current": 1587081728, "reserved_bytes.all.current": 5041553408,
                 "active_bytes.all.current": 1587081728, "inactive_split_bytes.all.current": 1040649728,
                 "num_alloc_retries": 0, "num_ooms": 0}
        ranks = 8
        rows = [repo.stat_row(rid, i % ranks, stats, t0 + (i // ranks) * 0.05, step=i // ranks, epoch=0)
                for i in range(args.ingest_rows)]
        batch = 5_000  # what one worker task would carry
        t = time.perf_counter()
        for i in range(0, len(rows), batch):
            with session_scope(engine) as s:
                repo.insert_stat_samples(s, rows[i:i + batch])
        dt_ingest = time.perf_counter() - t
        rate = len(rows) / dt_ingest
        say(f"stat-sample ingest via repository.insert_stat_samples: {len(rows):,} rows in {dt_ingest:.2f} s = "
            f"{rate:,.0f} rows/s (batches of {batch:,}, one transaction each, into {n_samples:,} existing rows)")
        t = time.perf_counter()
        with session_scope(engine) as s:
            repo.insert_stat_samples(s, rows[:50_000])  # redelivered: every row skipped
        say(f"redelivery of 50,000 already stored rows: {time.perf_counter() - t:.2f} s, nothing inserted")

        worst = {k: statistics.median(v) for k, v in results.items() if k.startswith("memq")}
        ok_q = all(v < 200 for v in worst.values())
        say(f"goal history/runs < 200 ms (in-process, median): {'met' if ok_q else 'NOT met'}; "
            f"goal ingest >= 20,000 rows/s: {'met' if rate >= 20_000 else 'NOT met'}")
    say(f"total benchmark time {time.perf_counter() - t_all:.0f} s (bench database dropped)")
    print("\n--- markdown for benchmarks/RESULTS.md ---")
    print("```\n" + "\n".join(lines) + "\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
