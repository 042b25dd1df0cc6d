"""A run history filled through the real ingestion path (`memq ingest ... --run --cluster --job`)
from real snapshots: day 1 (2026-11-29) is tests/fixtures/real, day 2 (2026-11-30) is
tests/fixtures/captured. A run's day comes from its snapshots' own trace times.

The torch versions are labels given at ingest (every capture ran torch 2.11.0+cu130): they put
the day-1 seed runs of job `gpt` on an older version, and the day-2 dynamic_settings runs of job
`dyn` on a newer one, so that the report has a regression to find on each day. Every byte count
the tests check comes from the snapshots and stats.jsonl files themselves.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import memq_environ
from tests.helpers import FIXTURES, REAL
from tests.workers.conftest import shared_redis  # noqa: F401 - the shared Redis fixture, reused

CAPTURED = FIXTURES / "captured"
DAY1, DAY2 = "2026-11-29", "2026-11-30"


@dataclass(frozen=True)
class Ingest:
    run: str
    folder: Path
    stems: tuple[str, ...]
    job: str
    cluster: str
    torch: str
    limit: int | None = None
    device_total: int | None = None
    stats: bool = True
    alloc_conf: str | None = None
    oom_message: bool = False

    def args(self) -> list[str]:
        a = [str(self.folder / f"{s}.pickle.gz") for s in self.stems]
        a += ["--run", self.run, "--cluster", self.cluster, "--job", self.job, "--torch-version", self.torch]
        if self.limit:
            a += ["--limit", str(self.limit)]
        if self.device_total:
            a += ["--device-total", str(self.device_total)]
        if self.stats and (self.folder / "stats.jsonl").stat().st_size > 0:
            a += ["--stats", str(self.folder / "stats.jsonl")]
        if self.alloc_conf:
            a += ["--alloc-conf", self.alloc_conf]
        if self.oom_message:
            msg = json.loads((self.folder / "meta.json").read_text()).get("oom_message")
            if msg:
                a += ["--oom-message", msg]
        return a


DAY1_RUNS = (
    Ingest("seed_adamw", REAL / "seed_adamw", ("before_training", "epoch0", "epoch1", "epoch2"), "gpt", "a", "2.10.0"),
    Ingest("seed_sgd", REAL / "seed_sgd", ("before_training", "epoch0", "epoch1", "epoch2"), "gpt", "a", "2.10.0"),
    Ingest("capacity", REAL / "capacity", ("oom",), "gpt", "b", "2.11.0", limit=17179869184, oom_message=True),
    Ingest("frag_synthetic", REAL / "frag_synthetic", ("fragmented", "oom"), "synth", "b", "2.11.0",
           limit=8589934592),
    Ingest("external", REAL / "external", ("oom",), "ext", "a", "2.11.0", device_total=150109880320),
    Ingest("frag_dyn", REAL / "frag_dynamic_1.15", ("oom",), "dyn", "b", "2.11.0", limit=20244645632),
    Ingest("frag_dyn_expandable", REAL / "frag_dynamic_expandable_1.15", ("epoch0", "epoch1", "epoch2"), "dyn", "b",
           "2.11.0", limit=20244645632, alloc_conf="expandable_segments:True"),
    Ingest("kept_loss", REAL / "kept_loss_no_leak", tuple(f"step{i:04d}" for i in range(20, 401, 20)), "kl", "a",
           "2.11.0", limit=21474836480),
)
DS = CAPTURED / "dynamic_settings"
DAY2_RUNS = (
    Ingest("leak_epochs", CAPTURED / "leak_epochs", ("epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"), "gpt",
           "a", "2.11.0", limit=7516192768),
    Ingest("dyn_gc", DS / "gc_0.6", ("epoch0", "epoch1", "oom"), "dyn", "b", "2.12.0", limit=18484297728,
           alloc_conf="garbage_collection_threshold:0.6"),
    Ingest("dyn_roundup", DS / "roundup_4", ("oom",), "dyn", "b", "2.12.0", limit=18484297728,
           alloc_conf="roundup_power2_divisions:4"),
    Ingest("dyn_max_split", DS / "max_split_128", ("epoch0", "epoch1", "epoch2"), "dyn", "b", "2.12.0",
           limit=18484297728, alloc_conf="max_split_size_mb:128"),
)


def ingest(env: dict[str, str], runs) -> None:
    from memq.cli import cli

    runner = CliRunner()
    for r in runs:
        res = runner.invoke(cli, ["ingest", *r.args(), "--json"], env=env, catch_exceptions=False)
        assert res.exit_code == 0, res.output


def invoke(env: dict[str, str], args: list[str]):
    from memq.cli import cli

    return CliRunner().invoke(cli, args, env=env, catch_exceptions=False)


@dataclass
class History:
    env: dict[str, str]
    root: Path

    def store(self):
        from memq.config import load_settings
        from memq.store.connection import open_store

        return open_store(load_settings(self.env))

    def settings(self, **changes):
        from memq.config import load_settings

        return load_settings(self.env).replace(**changes)


@pytest.fixture(scope="session")
def history_sqlite(tmp_path_factory) -> History:
    """Both days ingested once into a SQLite file (the reports table starts empty)."""
    root = tmp_path_factory.mktemp("report_history")
    env = memq_environ(f"sqlite:///{root / 'memq.db'}", root) | {"MEMQ_REPORT_DIR": str(root / "reports")}
    ingest(env, DAY1_RUNS + DAY2_RUNS)
    return History(env, root)


@pytest.fixture
def history(history_sqlite, tmp_path) -> History:
    """A private copy of the filled SQLite history (so tests that store reports do not meet)."""
    import sqlite3

    src = history_sqlite.root / "memq.db"
    dst = tmp_path / "memq.db"
    with sqlite3.connect(src) as a, sqlite3.connect(dst) as b:
        a.backup(b)
    env = memq_environ(f"sqlite:///{dst}", tmp_path) | {"MEMQ_REPORT_DIR": str(tmp_path / "reports"),
                                                         "MEMQ_BLOB_DIR": history_sqlite.env["MEMQ_BLOB_DIR"]}
    return History(env, tmp_path)


def chromium_path() -> str:
    return os.environ.get("MEMQ_TEST_CHROMIUM", "/usr/bin/chromium")


def exit_code(env: dict[str, str], args: list[str]) -> int:
    """Exit status of `memq ARGS` run the way the console script runs it (errors -> codes)."""
    from memq.cli import main

    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        main(args)
        return 0
    except SystemExit as exc:
        return int(exc.code or 0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
