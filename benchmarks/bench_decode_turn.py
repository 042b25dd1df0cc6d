"""The decode turn turned against another reader: how long a small snapshot's decode waits while other
threads of the same process (the request threads of `memq serve`) decode large snapshots back to back.

Decodes in one process take turns (profiler/codec.py `decode_turn`: the address-space cap is the
process's, so one decode builds objects at a time). A reader who opens many large snapshots at once
makes every other reader's snapshot page wait for the decodes ahead of it. This measures that wait,
in units of one large decode, against the number of concurrent large decodes: a fair turn keeps it at
most about that number (no decode starves).

    python benchmarks/bench_decode_turn.py [--attackers 6] [--seconds 15]"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.load import decode_snapshot_bytes  # noqa: E402

REAL = ROOT / "tests" / "fixtures" / "real"
MAX = 256 * 1024 * 1024


def measure(attackers: int, seconds: float) -> dict:
    big = (REAL / "seed_sgd" / "epoch0.pickle.gz").read_bytes()
    small = (REAL / "capacity" / "oom.pickle.gz").read_bytes()
    alone = []
    for _ in range(3):
        t = time.perf_counter()
        decode_snapshot_bytes(big, MAX)
        alone.append(time.perf_counter() - t)
    big_s = min(alone)
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            decode_snapshot_bytes(big, MAX)

    threads = [threading.Thread(target=attacker, daemon=True) for _ in range(attackers)]
    for th in threads:
        th.start()
    waits: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        t = time.perf_counter()
        decode_snapshot_bytes(small, MAX)
        waits.append(time.perf_counter() - t)
        time.sleep(0.2)
    stop.set()
    for th in threads:
        th.join(60)
    waits.sort()
    return {"attackers": attackers, "large_decode_s": round(big_s, 3), "victim_decodes": len(waits),
            "victim_wait_median_s": round(waits[len(waits) // 2], 3), "victim_wait_max_s": round(waits[-1], 3),
            "victim_wait_max_in_large_decodes": round(waits[-1] / big_s, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--attackers", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=15.0)
    args = ap.parse_args()
    print(json.dumps(measure(args.attackers, args.seconds)))


if __name__ == "__main__":
    main()
