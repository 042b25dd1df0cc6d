"""What the replay the advice cites costs a stored run's diagnosis: `recompute_run` on an OOM run of three
snapshots (tests/fixtures/captured/dynamic_settings/gc_0.6, its cap), its snapshots already decoded, with
the replay (pipeline/offline.advice_replay, as `memq analyze` gives the same files) and without it.

    python benchmarks/advice_replay_cost.py [--repeat N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq.config import load_settings  # noqa: E402
from memq.load import load_snapshot_file  # noqa: E402
from memq.pipeline import analyse, ingest, offline  # noqa: E402
from memq.store import repository as repo  # noqa: E402
from memq.store.connection import open_store  # noqa: E402
from tests.conftest import memq_environ  # noqa: E402
from tests.helpers import FIXTURES  # noqa: E402

GC = FIXTURES / "captured" / "dynamic_settings" / "gc_0.6"
CAP = 18484297728


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        store = open_store(load_settings(memq_environ(f"sqlite:///{tmp}/m.db", tmp)), auto_migrate=True)
        files = sorted(GC.glob("epoch*.pickle.gz")) + [GC / "oom.pickle.gz"]
        rep = ingest.ingest_files(store, repo.RunMeta(name="gc"), [ingest.SnapshotInput(str(p)) for p in files],
                                  limit_bytes=CAP)
        cache = {ld.sha256: ld for ld in (load_snapshot_file(p) for p in files)}

        def timed() -> float:
            xs = []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                analyse.recompute_run(store, rep.run_id, 0, cache=cache)
                xs.append(time.perf_counter() - t0)
            return statistics.median(xs)

        with_replay = timed()
        real = offline.advice_replay
        offline.advice_replay = lambda *a, **k: None
        try:
            without = timed()
        finally:
            offline.advice_replay = real
        store.close()
    print(f"recompute_run, OOM run of 3 snapshots (gc_0.6): median {with_replay:.2f} s with the advice replay, "
          f"{without:.2f} s without (x{with_replay / without:.1f}, n={args.repeat})")


if __name__ == "__main__":
    main()
