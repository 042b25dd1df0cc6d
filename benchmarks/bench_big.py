"""Big snapshots: `memq analyze` with default settings against plain `pickle.loads` of the same file,
side by side in one run (each a fresh process; CPU seconds and peak RSS from wait4, wall time).

Inputs (all real H200 trace entries with their Python frames):
- the real 100,000-entry snapshot (benchmarks/data/big.pickle.gz);
- a real 1,000,000-entry capture (benchmarks/data/h200_1m_trace.pickle.gz, `max_entries=1_000_000`);
- 1,000,000 entries tiled from the 100k one: ten copies of its trace, each with its own objects (as a
  real file has), times shifted so they follow each other; written to a temporary file.

Goals (issue "Snapshots of any size"): on each file memq takes at most 1.0x the time and 1.0x the
peak RSS of the plain load (the interpreter's start-up counts on both sides), the 1M-entry files in
at most 10 s, and memq's cost per event is flat from 100k to 1M entries.

    python benchmarks/bench_big.py [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiler import codec  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
REAL_100K = DATA / "big.pickle.gz"
REAL_1M = DATA / "h200_1m_trace.pickle.gz"
PLAIN = "import gzip, pickle, sys; pickle.loads(gzip.decompress(open(sys.argv[1], 'rb').read()))"


def tiled(raw: bytes, copies: int) -> bytes:
    """A snapshot whose trace is `copies` copies of the real trace, one after the other."""
    base = codec.loads_restricted(raw)
    trace = base["device_traces"][0]
    t0, t1 = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    out = list(trace)
    for k in range(1, copies):
        part = codec.loads_restricted(raw)["device_traces"][0]
        for e in part:
            if "time_us" in e:
                e["time_us"] += k * (t1 - t0 + 1000)
        out.extend(part)
    base["device_traces"][0] = out
    return pickle.dumps(base, protocol=4)  # torch's _dump_snapshot: pickle.dump, protocol 4


def measure(cmd: list[str], env: dict) -> dict:
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-400:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--make-tiled", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_tiled:
        Path(args.make_tiled).write_bytes(gzip.compress(tiled(codec.decompress(REAL_100K.read_bytes()), 10), 6))
        return
    # default settings; byte code written once, as an installed package has it
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_") and k != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as tmp:
        env["MEMQ_DATA_DIR"] = tmp  # nothing of the user's
        tiled_path = Path(tmp) / "tiled_1m.pickle.gz"
        # built in a child: ru_maxrss survives exec, so the children measured later must not fork
        # from a process that once held the tiled trace
        subprocess.run([sys.executable, __file__, "--make-tiled", str(tiled_path)], check=True)
        subprocess.run([sys.executable, "-m", "profiler", "analyze", str(REAL_100K), "--json"], env=env,
                       stdout=subprocess.DEVNULL, check=True)  # warm-up: byte code compiled
        files = [("real 100k", REAL_100K, 100_000), ("real 1M capture", REAL_1M, 1_000_000),
                 ("1M tiled from the 100k", tiled_path, 1_000_000)]
        print(f"machine: {platform.machine()} {os.cpu_count()} cores, CPython {platform.python_version()}; "
              f"{args.rounds} interleaved rounds, medians; memq = `memq analyze FILE --json`, "
              "plain = python -c 'pickle.loads(gzip.decompress(...))'")
        out = []
        for label, path, events in files:
            raw_size = len(codec.decompress(path.read_bytes(), 2**40))
            runs: dict[str, list[dict]] = {"plain": [], "memq": []}
            for _ in range(args.rounds):
                runs["plain"].append(measure([sys.executable, "-c", PLAIN, str(path)], env))
                runs["memq"].append(measure([sys.executable, "-m", "profiler", "analyze", str(path), "--json"], env))
            med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s", "rss_mib")}
                   for k, v in runs.items()}
            row = {"file": label, "events": events, "pickle_bytes": raw_size, **med,
                   "time_ratio": med["memq"]["cpu_s"] / med["plain"]["cpu_s"],
                   "wall_ratio": med["memq"]["wall_s"] / med["plain"]["wall_s"],
                   "rss_ratio": med["memq"]["rss_mib"] / med["plain"]["rss_mib"],
                   "us_per_event": 1e6 * med["memq"]["cpu_s"] / events}
            out.append(row)
            ok = row["time_ratio"] <= 1.0 and row["rss_ratio"] <= 1.0 and (events < 1e6 or med["memq"]["wall_s"] <= 10)
            print(f"{label:>24} ({raw_size / 1e6:.0f} MB pickle): plain {med['plain']['cpu_s']:.2f} s cpu "
                  f"{med['plain']['wall_s']:.2f} s wall {med['plain']['rss_mib']:.0f} MiB | memq "
                  f"{med['memq']['cpu_s']:.2f} s cpu {med['memq']['wall_s']:.2f} s wall {med['memq']['rss_mib']:.0f} MiB"
                  f" | time {row['time_ratio']:.2f}x rss {row['rss_ratio']:.2f}x, {row['us_per_event']:.2f} us/event "
                  f"{'OK' if ok else 'MISSED'}")
        flat = out[2]["us_per_event"] / out[0]["us_per_event"]
        print(f"cost per event, 1M tiled / real 100k (same entries): {flat:.2f} (flat = 1.00)")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.platform(), "rows": out,
                                               "per_event_growth": flat}, indent=1))


if __name__ == "__main__":
    main()
