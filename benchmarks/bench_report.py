#!/usr/bin/env python3
"""How long the nightly report of a day with 10,000 runs takes (goal: under 30 s).

    python benchmarks/bench_report.py [--runs 10000] [--db sqlite|postgresql|both]

Fills a fresh database with bulk inserts (no ingest: that is not what is measured), then times
`memq.report.generate`: build the figures, render HTML (plots included), Markdown and JSON,
write the three files and upsert the reports row, as the nightly task does.

The data is made from real analysis results: the real fixtures (tests/fixtures/real, captured)
are analysed once, and every run's run-level diagnosis is a copy of one of those documents
(20-35 KB of JSON each, as stored) with its figures varied. Per day: `--runs` runs over 500 jobs
and 8 clusters, about 6% OOM (causes from the fixtures), some near misses, 2% leaking runs whose
stat-sample floor grows each epoch; every run has 2 snapshot rows (the last one the template's real
snapshot, its blob stored, so the top fragmented runs are replayed by the allocator model as in
production) and 30 stat samples.
The day before gets the same number of runs on an older torch version, so the regression query
and the "changes against the previous report" section have history to read.

Measured:
1. cold: no report stored yet; the previous day's report is computed on the fly for "changes".
2. warm: the previous day's report is stored (the nightly case); the day's report is rebuilt.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DAY = dt.date(2026, 11, 29)
FIX = ROOT / "tests" / "fixtures"
TEMPLATES = {  # cause -> (folder, snapshot stems, limit)
    "capacity": ("real/capacity", ["oom"], 17179869184),
    "fragmentation": ("real/frag_dynamic_1.15", ["oom"], 20244645632),
    "external_memory": ("real/external", ["oom"], None),
    "leak": ("captured/leak_epochs", ["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"], 7516192768),
    "healthy": ("real/seed_adamw", ["before_training", "epoch0", "epoch1", "epoch2"], None),
    "healthy_near": ("real/frag_dynamic_expandable_1.15", ["epoch0", "epoch1", "epoch2"], 20244645632),
}
GiB = 1024**3
BLOBS: dict[str, tuple[str, bytes]] = {}  # cause -> (sha256, raw bytes) of the template's last snapshot


def machine() -> str:
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 1024**2:.0f} GiB"
    return f"{cpu}, {os.cpu_count()} CPUs, {mem} RAM, Python {platform.python_version()}"


def templates() -> dict[str, dict]:
    from memq.analysis import analyze
    from memq.load import load_snapshot_file
    from memq.model import OomContext
    from memq.store.repository import contract_only

    out = {}
    for cause, (folder, stems, limit) in TEMPLATES.items():
        files = [FIX / folder / f"{s}.pickle.gz" for s in stems]
        snaps = [load_snapshot_file(str(f), keep_raw=True) for f in files]
        BLOBS[cause] = (snaps[-1].sha256, snaps[-1].raw)
        ctx = OomContext(limit_bytes=limit, device_total_bytes=150109880320 if cause == "external_memory" else None)
        res = contract_only(analyze(snaps, ctx, names=[f.name for f in files],
                                    triggers=["oom" if "oom" in f.name else "epoch_end" for f in files]))
        out[cause] = res
    return out


def fill(url: str, runs_per_day: int, tmpl: dict[str, dict], seed: int = 7) -> dict:
    """Bulk-insert two days of runs; returns counts."""
    from sqlalchemy import insert

    from memq.store import schema
    from memq.store.db import make_engine
    from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot, StatSample

    engine = make_engine(url)
    schema.upgrade(engine)
    sqlite = engine.dialect.name == "sqlite"
    rng = random.Random(seed)

    def ts(t: dt.datetime):
        return t.replace(tzinfo=None) if sqlite else t

    # one analysis result per template, shared by every snapshot row of that kind
    with engine.begin() as conn:
        aid = {}
        for i, (cause, res) in enumerate(tmpl.items()):
            m = res["metrics"]
            aid[cause] = conn.execute(insert(AnalysisResult).values(
                sha256=f"{i:064x}", analyzer_version="bench", context_key="", reserved_bytes=m["reserved_bytes"],
                allocated_bytes=m["allocated_bytes"], active_bytes=m["active_bytes"],
                largest_free_block_bytes=m["largest_free_block_bytes"], fragmentation_ratio=m["fragmentation_ratio"],
                oom_requested_bytes=(res.get("oom") or {}).get("requested_bytes"),
                primary_cause=res["diagnosis"]["primary_cause"], confidence=res["diagnosis"]["confidence"],
                result=res).returning(AnalysisResult.id)).scalar_one()
    counts = {"runs": 0, "snapshots": 0, "stat_samples": 0, "run_diagnoses": 0}
    run_id = 0
    for d_off, version_new in ((1, False), (0, True)):
        day0 = dt.datetime.combine(DAY - dt.timedelta(days=d_off), dt.time(), dt.UTC)
        runs, diags, snaps, stats = [], [], [], []
        for _ in range(runs_per_day):
            run_id += 1
            job = rng.randrange(500)
            r = rng.random()
            if r < 0.02:
                cause = "leak"
            elif r < 0.035:
                cause = "capacity"
            elif r < 0.05:
                cause = "fragmentation"
            elif r < 0.06:
                cause = "external_memory"
            elif r < 0.09:
                cause = "healthy_near"
            else:
                cause = "healthy"
            oom = cause not in ("healthy", "healthy_near")
            res = tmpl[cause]
            m = dict(res["metrics"])
            scale = rng.uniform(0.7, 1.3)
            for k in ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
                      "reserved_unallocated_bytes", "largest_free_block_bytes", "stranded_bytes"):
                m[k] = int(m[k] * scale)
            m["fragmentation_ratio"] = min(0.99, max(0.0, m["fragmentation_ratio"] * rng.uniform(0.8, 1.2)))
            doc = dict(res, metrics=m)
            limit = TEMPLATES[cause][2]
            if cause == "healthy_near":
                limit = int(m["reserved_bytes"] / rng.uniform(0.955, 0.995))
            elif cause == "healthy" and rng.random() < 0.7:
                limit = int(m["reserved_bytes"] * rng.uniform(1.2, 3.0))
            start = day0 + dt.timedelta(seconds=rng.uniform(0, 80000))
            end = start + dt.timedelta(seconds=rng.uniform(60, 6000))
            torch = ("2.11.0" if (job % 5 == 0 and version_new) else "2.10.0")
            if job % 5 == 0 and version_new and cause == "healthy" and rng.random() < 0.3:
                cause, oom = "capacity", True
                doc = tmpl["capacity"]
            runs.append({"id": run_id, "name": f"bench-{d_off}-{run_id}", "job": f"job{job:03d}",
                         "cluster": f"c{job % 8}", "torch_version": torch, "status": "oom" if oom else "completed",
                         "primary_cause": doc["diagnosis"]["primary_cause"],
                         "cause_confidence": doc["diagnosis"]["confidence"],
                         "peak_reserved_bytes": m["reserved_bytes"], "peak_allocated_bytes": m["allocated_bytes"],
                         "memory_limit_bytes": limit, "fragmentation_ratio": m["fragmentation_ratio"],
                         "oom_count": 1 if oom else 0, "snapshot_count": 2, "labels": {},
                         "started_at": ts(start), "ended_at": ts(end), "updated_at": ts(end)})
            diags.append({"run_id": run_id, "rank": 0, "analyzer_version": "bench",
                          "primary_cause": doc["diagnosis"]["primary_cause"],
                          "confidence": doc["diagnosis"]["confidence"], "snapshot_count": 2,
                          "peak_reserved_bytes": m["reserved_bytes"], "peak_allocated_bytes": m["allocated_bytes"],
                          "peak_composition": doc.get("composition") or {}, "result": doc,
                          "computed_at": ts(end)})
            for k in range(2):
                # the last snapshot is the template's real one (its blob is stored), so the report's
                # allocator-model replay of the top fragmented runs works on real traces
                sha = BLOBS[cause][0] if k == 1 and cause in BLOBS else f"{run_id:056x}{k:08x}"
                snaps.append({"run_id": run_id, "rank": 0, "sha256": sha, "size_bytes": 1,
                              "trigger": "oom" if (oom and k == 1) else "epoch_end", "epoch": k,
                              "taken_at": ts(start + (end - start) * (k + 1) / 2), "state": "done",
                              "analyzer_version": "bench", "analysis_id": aid[cause], "context": {}})
            base = int(m["allocated_bytes"] * 0.4)
            for i in range(30):
                epoch = i // 10
                grow = epoch * 900 * 1024**2 if cause == "leak" else 0
                alloc = base + grow + int(rng.uniform(0, 0.1) * base)
                stats.append({"run_id": run_id, "rank": 0, "sampled_at": ts(start + (end - start) * i / 30),
                              "step": i + 1, "epoch": epoch, "allocated_bytes": alloc,
                              "reserved_bytes": int(m["reserved_bytes"] * (0.5 + i / 60)), "active_bytes": alloc,
                              "inactive_split_bytes": 0, "alloc_retries": 0, "oom_count": 0})
        with engine.begin() as conn:
            for table, rows in ((Run, runs), (RunDiagnosis, diags), (Snapshot, snaps), (StatSample, stats)):
                for i in range(0, len(rows), 5000):
                    conn.execute(insert(table), rows[i:i + 5000])
        counts["runs"] += len(runs)
        counts["run_diagnoses"] += len(diags)
        counts["snapshots"] += len(snaps)
        counts["stat_samples"] += len(stats)
    engine.dispose()
    return counts


def measure(url: str, workdir: Path, runs: int, tmpl) -> dict:
    from memq.config import load_settings
    from memq.pipeline.report_source import SqlReportSource
    from memq.report import generate
    from memq.report.data import build_report
    from memq.store.connection import open_store
    from memq.store.report_queries import Scope

    t = time.perf_counter()
    counts = fill(url, runs, tmpl)
    fill_s = time.perf_counter() - t
    env = {"MEMQ_DATABASE_URL": url, "MEMQ_DATA_DIR": str(workdir), "MEMQ_CONFIG": str(workdir / "none.toml"),
           "MEMQ_REPORT_DIR": str(workdir / "reports"), "MEMQ_BLOB_DIR": str(workdir / "blobs")}
    store = open_store(load_settings(env), auto_migrate=False)
    for sha, raw in BLOBS.values():
        store.blobs.put(sha, raw)
    scope = Scope.parse("all")
    out = {"fill_s": fill_s, **counts}
    try:
        t = time.perf_counter()
        doc, texts = generate(store, DAY, scope)
        out["cold_s"] = time.perf_counter() - t
        generate(store, DAY - dt.timedelta(days=1), scope)  # the nightly of the day before
        t = time.perf_counter()
        with store.session() as s:
            build_report(SqlReportSource(s), DAY, scope)
        out["build_only_s"] = time.perf_counter() - t
        t = time.perf_counter()
        doc, texts = generate(store, DAY, scope)
        out["warm_s"] = time.perf_counter() - t
        out["window_runs"] = doc["totals"]["runs"]
        out["oom_runs"] = doc["totals"]["oom_runs"]
        out["near_misses"] = doc["totals"]["near_misses"]
        out["growing"] = len(doc["growing"])
        out["regressions"] = len(doc["regressions"])
        out["timelines"] = len(doc["timelines"])
        out["simulated"] = sum(1 for f in doc["fragmented"] if (f.get("simulated") or {}).get("predicted_oom")
                               is not None)
        out["html_kib"] = len(texts["html"]) / 1024
    finally:
        store.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10_000, help="runs per day (the report's day and the day before)")
    ap.add_argument("--db", choices=["sqlite", "postgresql", "both"], default="both")
    a = ap.parse_args()
    print(f"machine: {machine()}")
    t = time.perf_counter()
    tmpl = templates()
    print(f"analysed {len(tmpl)} real fixtures for templates in {time.perf_counter() - t:.1f} s "
          f"(result JSON {min(len(str(v)) for v in tmpl.values()) // 1024}-"
          f"{max(len(str(v)) for v in tmpl.values()) // 1024} KiB)")
    kinds = ["sqlite", "postgresql"] if a.db == "both" else [a.db]
    worst = 0.0
    for kind in kinds:
        with tempfile.TemporaryDirectory(prefix="memq-bench-report-") as tmp:
            tmpdir = Path(tmp)
            if kind == "sqlite":
                import sqlite3

                ctx = contextlib.nullcontext(f"sqlite:///{tmpdir / 'bench.db'}")
                ver = f"SQLite {sqlite3.sqlite_version}"
            else:
                from tests.conftest import temp_pg_database

                ctx = temp_pg_database("bench")
                ver = "PostgreSQL"
            with ctx as url:
                if kind == "postgresql":
                    import psycopg

                    from tests.conftest import _plain

                    with psycopg.connect(_plain(url)) as c:
                        ver = "PostgreSQL " + c.execute("SHOW server_version").fetchone()[0]
                r = measure(url, tmpdir, a.runs, tmpl)
        worst = max(worst, r["cold_s"], r["warm_s"])
        print(f"{ver}: filled {r['runs']} runs, {r['snapshots']} snapshots, {r['stat_samples']} stat samples "
              f"in {r['fill_s']:.1f} s")
        print(f"  report of {DAY} over {r['window_runs']} runs ({r['oom_runs']} OOM, {r['near_misses']} near "
              f"misses, {r['growing']} growing, {r['regressions']} regressions, {r['timelines']} timelines, "
              f"{r['simulated']} settings replayed by the allocator model, "
              f"HTML {r['html_kib']:.0f} KiB)")
        print(f"  cold (previous day computed on the fly): {r['cold_s']:.2f} s")
        print(f"  warm (previous day's report stored):     {r['warm_s']:.2f} s   (figures only: "
              f"{r['build_only_s']:.2f} s)")
    print(f"slowest: {worst:.2f} s; goal < 30 s: {'met' if worst < 30 else 'NOT met'}")
    return 0 if worst < 30 else 1


if __name__ == "__main__":
    sys.exit(main())
