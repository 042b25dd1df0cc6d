"""A history filled through `memq ingest` of real fixtures (SQLite in a temporary directory), a
stored nightly report, one snapshot whose blob is then corrupted on disk, and `memq serve` started
as a real subprocess on a free port (one server without a token, one with).

Runs (all from tests/fixtures/real): seed_adamw (4 epoch snapshots + stat samples, healthy),
seed_sgd (same, another job, and rank 1 with three of the same files), frag_synthetic (fragmented + OOM, limit 8 GiB),
capacity (one OOM snapshot, limit 16 GiB, the OOM message), frag_dyn (one OOM snapshot whose blob
is corrupted after ingest)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import memq_environ
from tests.helpers import REAL, meta
from tests.workers.stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "t0ken-for-the-tests"


def _ingest_args() -> list[list[str]]:
    sa, sg = REAL / "seed_adamw", REAL / "seed_sgd"
    return [
        [*(str(sa / f"{s}.pickle.gz") for s in ("before_training", "epoch0", "epoch1", "epoch2")),
         "--run", "seed_adamw", "--cluster", "a", "--job", "gpt", "--torch-version", "2.10.0",
         "--stats", str(sa / "stats.jsonl")],
        [*(str(sg / f"{s}.pickle.gz") for s in ("before_training", "epoch0", "epoch1", "epoch2")),
         "--run", "seed_sgd", "--cluster", "a", "--job", "gpt-sgd", "--torch-version", "2.11.0",
         "--stats", str(sg / "stats.jsonl")],
        # rank 1 of the same run (the same files: rows are unique per run, rank and bytes)
        [*(str(sg / f"{s}.pickle.gz") for s in ("epoch0", "epoch1", "epoch2")),
         "--run", "seed_sgd", "--rank", "1", "--stats", str(sg / "stats.jsonl")],
        [str(REAL / "frag_synthetic" / "fragmented.pickle.gz"), str(REAL / "frag_synthetic" / "oom.pickle.gz"),
         "--run", "frag_synthetic", "--cluster", "b", "--job", "synth", "--torch-version", "2.11.0",
         "--limit", "8589934592"],
        [str(REAL / "capacity" / "oom.pickle.gz"), "--run", "capacity", "--cluster", "b", "--job", "gpt",
         "--torch-version", "2.11.0", "--limit", "17179869184", "--oom-message", meta("capacity")["oom_message"]],
        [str(REAL / "frag_dynamic_1.15" / "oom.pickle.gz"), "--run", "frag_dyn", "--cluster", "b", "--job", "dyn",
         "--torch-version", "2.11.1", "--limit", "20244645632"],
    ]


@dataclass
class History:
    env: dict[str, str]
    root: Path

    def cli(self, *args: str):
        from memq.cli import cli

        res = CliRunner().invoke(cli, list(args), env=self.env, catch_exceptions=False)
        assert res.exit_code == 0, res.output
        return res.output

    def sql(self, query: str, *params):
        import sqlite3

        with sqlite3.connect(self.root / "memq.db") as c:
            rows = c.execute(query, params).fetchall()
            c.commit()
            return rows

    def snapshot_id(self, run: str, trigger: str | None = None) -> int:
        rows = self.sql("SELECT s.id, s.trigger FROM snapshots s JOIN runs r ON r.id = s.run_id WHERE r.name = ? "
                        "ORDER BY s.taken_at, s.id", run)
        return [i for i, t in rows if trigger is None or t == trigger][-1]


@pytest.fixture(scope="session")
def web_history(tmp_path_factory) -> History:
    root = tmp_path_factory.mktemp("web_history")
    env = memq_environ(f"sqlite:///{root / 'memq.db'}", root) | {"MEMQ_REPORT_DIR": str(root / "reports")}
    h = History(env, root)
    for args in _ingest_args():
        h.cli("ingest", *args, "--json")
    h.cli("report", "--date", "2026-11-29", "--format", "html", "--out", str(root / "report.html"))
    # A second report whose stored path points outside the report directory: never read, redrawn.
    h.cli("report", "--date", "2026-11-30", "--format", "html", "--out", str(root / "report2.html"))
    h.sql("UPDATE reports SET path = '/etc/passwd' WHERE report_date = '2026-11-30'")
    # Corrupt the blob of frag_dyn's snapshot on disk (the database still points at it).
    sha = h.sql("SELECT s.sha256 FROM snapshots s JOIN runs r ON r.id = s.run_id WHERE r.name = 'frag_dyn'")[0][0]
    blob = next((root / "blobs" / sha[:2]).glob(f"{sha}.*"))
    blob.write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(4096))  # a zstd magic, then garbage
    return h


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log: Path
    history: History | None = None  # what it serves, for a test that asks the CLI the same question

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET"):
        """(status, headers, body bytes); never raises on HTTP errors and never follows redirects."""
        req = urllib.request.Request(self.url + path, headers=headers or {}, method=method)
        opener = urllib.request.build_opener(_NoRedirect)
        try:
            with opener.open(req, timeout=60) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()

    def json(self, path: str, headers: dict[str, str] | None = None, status: int = 200):
        code, _, body = self.get(path, headers)
        assert code == status, (path, code, body[:300])
        return json.loads(body)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *a, **k):
        return None


def _start(history: History, tmp: Path, token: str | None) -> Server:
    port = free_port()
    env = {**os.environ, **history.env, "MEMQ_SERVE_TOKEN": token or ""}
    log = tmp / f"serve-{port}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "memq", "serve", "--port", str(port), "--log-level", "warning"],
                            cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", proc, log, history)

    def up():
        if proc.poll() is not None:
            raise AssertionError(f"memq serve exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            return server.get("/healthz", {"Authorization": f"Bearer {token}"} if token else None)[0] == 200
        except OSError:
            return False

    wait_for(up, 90, 0.2, "memq serve to answer")
    return server


def _stop(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(20)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait(5)


@pytest.fixture(scope="session")
def server(web_history, tmp_path_factory) -> Server:
    s = _start(web_history, tmp_path_factory.mktemp("serve"), None)
    yield s
    _stop(s)


@pytest.fixture(scope="session")
def token_server(web_history, tmp_path_factory) -> Server:
    s = _start(web_history, tmp_path_factory.mktemp("serve_token"), TOKEN)
    yield s
    _stop(s)


@pytest.fixture(scope="session")
def forecast_server(tmp_path_factory) -> Server:
    """Its own history: a leak run still running, as far as its snapshots go (the H200 val_logits run
    before its OOM), with its cap, so that its run page draws the forecast."""
    from tests.analysis.agent_data import FORECAST, spool_files

    root = tmp_path_factory.mktemp("forecast_history")
    h = History(memq_environ(f"sqlite:///{root / 'memq.db'}", root), root)
    leak = spool_files(next((FORECAST / "val_logits" / "defaults").iterdir()), root / "fc_leak")
    cap = json.loads((FORECAST / "truth.json").read_text())["val_logits"]["defaults"]["cap_bytes"]
    h.cli("ingest", *map(str, leak), "--run", "fc_leak", "--cluster", "b", "--job", "leak", "--limit", str(cap),
          "--status", "running", "--json")
    # and a finished run measured at batch 2 (the H200 fit set's gpt_m), under the cap its bisection used
    from tests.analysis.agent_data import spool_files as fit_files

    fit_dir = Path(__file__).resolve().parents[1] / "fixtures" / "fit"
    gpt_m = fit_files(next((fit_dir / "gpt_m" / "defaults").iterdir()), root / "fit_m")
    fit_cap = json.loads((fit_dir / "truth.json").read_text())["gpt_m"]["cap"]["cap_bytes"]
    h.cli("ingest", *map(str, gpt_m), "--run", "fit_m", "--cluster", "b", "--job", "gpt", "--limit", str(fit_cap),
          "--json")
    # and a run whose only snapshot is a dump after the first backward (the H200 one-step set's lora_gpt)
    dump = Path(__file__).resolve().parents[1] / "fixtures/fit_one_step/dumps/lora_gpt-dump.backward.pickle.gz"
    h.cli("ingest", str(dump), "--run", "fit_partial", "--cluster", "b", "--job", "lora", "--limit", "4GiB", "--json")
    s = _start(h, tmp_path_factory.mktemp("serve_forecast"), None)
    yield s
    _stop(s)
