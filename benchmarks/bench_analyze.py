"""Speed of `memq analyze` against the cost of only reading the same file, measured in one run.

Goal (issue 2): analysing the real 100,000-entry H200 snapshot takes at most 2x the time to only
decompress and unpickle it, and the cost scales linearly to 1,000,000 entries (inputs made by
concatenating copies of the real trace, times shifted so they follow each other).

    python benchmarks/bench_analyze.py [--max-entries 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gc
import pickle
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memq import codec  # noqa: E402
from memq.analysis import analyze  # noqa: E402
from memq.load import decode_snapshot_bytes  # noqa: E402

BIG = Path(__file__).parent / "data" / "big.pickle.gz"


def best(fn, repeat: int) -> float:
    """Best of `repeat` runs, in CPU seconds of this process: on a shared 2-core machine wall time
    mostly measures the neighbours; CPU time measures the work."""
    times = []
    for _ in range(repeat):
        gc.collect()
        t = time.process_time()
        fn()
        times.append(time.process_time() - t)
    return min(times)


def load_only(data: bytes) -> None:
    codec.loads_restricted(codec.decompress(data))


def full_analyze(data: bytes) -> None:
    # What `memq analyze FILE` does after reading the file: decode, hash, parse, analyse.
    loaded = decode_snapshot_bytes(data)
    analyze([loaded])


def concatenated(raw: bytes, copies: int) -> bytes:
    """A snapshot whose trace is `copies` copies of the real trace, one after the other."""
    base = codec.loads_restricted(raw)
    trace = base["device_traces"][0]
    t0, t1 = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    span = (t1 - t0) + 1000
    out = list(trace)
    for k in range(1, copies):
        part = codec.loads_restricted(raw)["device_traces"][0]  # distinct objects, as a real file has
        for e in part:
            if "time_us" in e:
                e["time_us"] += k * span
        out.extend(part)
    base["device_traces"][0] = out
    return pickle.dumps(base, protocol=pickle.HIGHEST_PROTOCOL)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-entries", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    data = BIG.read_bytes()
    print(f"machine: {platform.processor() or platform.machine()}, {platform.python_implementation()} "
          f"{platform.python_version()}; times are CPU seconds of this process, best of {args.repeat}")
    t_load = best(lambda: load_only(data), args.repeat)
    t_an = best(lambda: full_analyze(data), args.repeat)
    ratio = t_an / t_load
    print(f"real 100k-entry snapshot ({BIG.name}, {len(data)} bytes gz): decompress+unpickle {t_load:.3f} s, "
          f"memq analyze {t_an:.3f} s, ratio {ratio:.2f} (goal <= 2.00) {'OK' if ratio <= 2 else 'MISSED'}")

    raw = codec.decompress(data)
    rows = []
    for copies in (1, 2, 5, 10):
        n = copies * 100_000
        if n > args.max_entries:
            break
        blob = concatenated(raw, copies) if copies > 1 else raw
        tl = best(lambda b=blob: codec.loads_restricted(b), min(2, args.repeat))
        ta = best(lambda b=blob: full_analyze(b), min(2, args.repeat))
        rows.append((n, tl, ta))
        print(f"  {n:>9,} entries: unpickle {tl:6.2f} s, analyze {ta:6.2f} s, ratio {ta / tl:.2f}, "
              f"{1e6 * ta / n:.2f} us/entry")
        del blob
        gc.collect()
    if len(rows) > 1:
        per = [ta / n for n, _, ta in rows]
        growth = per[-1] / per[0]
        print(f"scaling: time per entry at {rows[-1][0]:,} is {growth:.2f}x that at {rows[0][0]:,} "
              f"(linear = 1.00; goal <= 1.30) {'OK' if growth <= 1.3 else 'MISSED'}; "
              f"median ratio analyze/unpickle {statistics.median(ta / tl for _, tl, ta in rows):.2f}")


if __name__ == "__main__":
    main()
