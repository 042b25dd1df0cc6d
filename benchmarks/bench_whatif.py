"""Time the what-if replay: a 100,000-entry trace (benchmarks/data/big.pickle.gz) under 5 allocator
configurations. Prints measured seconds and the machine. Goal: < 2 s for the 5 simulations.

    python benchmarks/bench_whatif.py [FILE] [--repeat N]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memq.analysis.alloc_conf import parse_alloc_conf  # noqa: E402
from memq.analysis.whatif import _simulate, compile_trace, run_whatif  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402

CONFS = ["", "expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.6",
         "roundup_power2_divisions:4"]


def machine() -> str:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file", nargs="?", default=str(ROOT / "benchmarks" / "data" / "big.pickle.gz"))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    t0 = time.perf_counter()
    snap = load_snapshot_file(args.file).snapshot
    t_load = time.perf_counter() - t0
    t0 = time.perf_counter()
    rep = compile_trace(snap)
    t_compile = time.perf_counter() - t0
    n_entries = len(snap.trace)
    n_ops = len(rep.program.ops)
    # a per-process limit 10% above the recorded reserved bytes, so GC and the limit are exercised
    limit = int(sum(s.size for s in rep.start_segments) * 1.10) or None

    sims = []
    cpus = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        c0 = time.process_time()
        for c in CONFS:
            cfg = rep.recorded_config if c == "" else parse_alloc_conf(c)
            _simulate(rep, cfg, limit, "recorded" if c == "" else "compact", record=False)
        sims.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    ends = []
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        run_whatif(snap, limit, CONFS, replay=rep)
        ends.append(time.perf_counter() - t0)

    print(f"machine: {machine()}")
    print(f"trace: {args.file}: {n_entries} entries, {n_ops} alloc/free ops replayed per configuration")
    print(f"configurations: {', '.join(c or '(recorded)' for c in CONFS)}; limit {limit} bytes")
    print(f"load+parse snapshot: {t_load:.3f} s; compile trace: {t_compile:.3f} s (once, shared)")
    print(f"simulate 5 configurations: median {statistics.median(sims):.3f} s, min {min(sims):.3f} s "
          f"over {args.repeat} runs ({n_ops * len(CONFS) / statistics.median(sims) / 1e6:.2f} M ops/s)")
    print(f"  CPU time of this process for the 5 simulations: median {statistics.median(cpus):.3f} s "
          f"(wall above includes waiting for a busy CPU; load average now {os.getloadavg()[0]:.2f})")
    print(f"run_whatif end to end (5 configurations + fidelity check + compact baseline): median "
          f"{statistics.median(ends):.3f} s")
    ok = statistics.median(sims) < 2.0
    print(f"goal < 2 s for 5 configurations: {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
