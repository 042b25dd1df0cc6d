"""`memq db / ingest / runs / history / compare / versions / reanalyze / demo` on real fixtures,
against real PostgreSQL and SQLite (the `memq_env` fixture points the commands at them)."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from memq.cli import cli
from memq.errors import NotFound, SchemaOutOfDate
from tests.helpers import REAL, meta, run_files

LIMITS = {"frag_synthetic": ["--limit", "8589934592"], "capacity": ["--limit", "17179869184"],
          "external": ["--device-total", "150109880320"]}


def memq(*args, ok=True):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    if ok and res.exit_code != 0:
        raise AssertionError(f"memq {' '.join(map(str, args))} exited {res.exit_code}: {res.output}\n"
                             f"{res.exception!r}")
    return res


def ingest(folder, run=None, *extra):
    files = [str(p) for p in run_files(folder)]
    return json.loads(memq("ingest", *files, "--run", run or folder, *LIMITS.get(folder, []), *extra, "--json").output)


@pytest.fixture
def history_db(memq_env):
    """Four real runs: two healthy (SGD, AdamW), a fragmentation OOM and a capacity OOM."""
    memq("db", "upgrade")
    ingest("seed_sgd", "sgd", "--cluster", "east", "--job", "gpt", "--optimizer", "SGD", "--torch-version", "2.10.0",
           "--label", "team=nlp", "--stats", str(REAL / "seed_sgd" / "stats.jsonl"))
    ingest("seed_adamw", "adamw", "--cluster", "east", "--job", "gpt", "--optimizer", "AdamW",
           "--torch-version", "2.11.0+cu130", "--label", "team=nlp")
    ingest("frag_synthetic", "frag", "--cluster", "west", "--job", "synthetic", "--label", "team=infra")
    ingest("capacity", "cap", "--cluster", "west", "--job", "gpt", "--torch-version", "2.11.0+cu130",
           "--oom-message", meta("capacity")["oom_message"])
    return memq_env


def test_db_upgrade_current_downgrade(memq_env):
    up = memq("db", "upgrade")
    assert "->" in up.output or "already at" in up.output
    cur = json.loads(memq("db", "current", "--json").output)
    assert cur["up_to_date"] and cur["current"] == cur["head"]
    memq("db", "downgrade", "base")
    res = memq("db", "current", ok=False)
    assert res.exit_code == SchemaOutOfDate.exit_code == 3 and res.stderr.startswith("memq: error: ")
    memq("db", "upgrade")


def test_credentials_never_printed(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMQ_DATABASE_URL", "postgresql://memq:hunter2-secret@127.0.0.1:1/memq")
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path))
    for args in (["db", "current"], ["runs"], ["db", "upgrade"]):
        res = memq(*args, ok=False)
        assert res.exit_code != 0
        text = res.output + res.stderr
        assert "hunter2-secret" not in text and "unavailable" in text


def test_ingest_json_output(history_db):
    doc = ingest("frag_synthetic", "frag2")
    assert doc["run"] == "frag2" and doc["status"] == "oom"
    assert [s["trigger"] for s in doc["snapshots"]] == ["manual", "oom"]
    assert doc["diagnosis"]["diagnosis"]["primary_cause"] == "fragmentation"
    assert isinstance(doc["diagnosis"]["metrics"]["reserved_bytes"], int)
    assert all(not s["analysed"] for s in doc["snapshots"])  # same bytes and context as run "frag"


def test_runs_filters(history_db):
    def names(*args):
        doc = json.loads(memq("runs", *args, "--json").output)
        return sorted(r["run"] for r in doc["runs"])

    assert names() == ["adamw", "cap", "frag", "sgd"]
    assert names("--cluster", "east") == ["adamw", "sgd"]
    assert names("--job", "gpt", "--status", "oom") == ["cap"]
    assert names("--cause", "fragmentation") == ["frag"]
    assert names("--label", "team=nlp") == ["adamw", "sgd"]
    assert names("--torch-version", "2.11") == ["adamw", "cap"]
    assert names("--rows", "1") and len(names("--rows", "1")) == 1
    started = dt.datetime(2026, 11, 29, 20, 34, tzinfo=dt.UTC)  # when the fixtures were captured
    recent = dt.datetime.now(dt.UTC) - dt.timedelta(days=7) <= started
    assert names("--cluster", "east", "--since", "7d") == (["adamw", "sgd"] if recent else [])
    assert names("--since", "2026-11-29T20:34:39") == ["cap", "frag", "sgd"]
    doc = json.loads(memq("runs", "--cluster", "west", "--json").output)
    cap = next(r for r in doc["runs"] if r["run"] == "cap")
    assert isinstance(cap["peak_reserved_bytes"], int) and cap["memory_limit_bytes"] == 17179869184
    rows = list(csv.DictReader(io.StringIO(memq("runs", "--csv").output)))
    assert {r["run"] for r in rows} == {"adamw", "cap", "frag", "sgd"} and "peak_reserved_bytes" in rows[0]
    table = memq("runs").output
    assert "fragmentation" in table and "capacity" in table
    assert memq("runs", "--json", "--csv", ok=False).exit_code == 2


def test_history_json_and_table(history_db):
    doc = json.loads(memq("history", "--run", "sgd", "--json").output)
    snaps = doc["snapshots"]
    assert len(snaps) == 4 and [s["epoch"] for s in snaps] == [None, 0, 1, 2]
    for s in snaps:
        for key in ("step", "epoch", "trigger", "reserved_bytes", "allocated_bytes", "fragmentation_ratio",
                    "largest_free_block_bytes", "diagnosis"):
            assert key in s
        assert isinstance(s["reserved_bytes"], int) and s["diagnosis"]["primary_cause"] == "healthy"
    assert doc["diagnosis"]["primary_cause"] == "healthy"
    assert doc["stats"]["count"] == 45 and len(doc["changes"]) == 3
    out = memq("history", "--run", "sgd").output
    assert "memory timeline" in out and "what changed" in out and "▁" in out or "█" in out
    frag = json.loads(memq("history", "--run", "frag", "--rank", "0", "--json").output)
    assert frag["diagnosis"]["primary_cause"] == "fragmentation"
    assert frag["snapshots"][-1]["oom"]["fits_if_compacted"] is True
    rows = list(csv.DictReader(io.StringIO(memq("history", "--run", "frag", "--csv").output)))
    assert [r["trigger"] for r in rows] == ["manual", "oom"]


def test_unknown_runs_are_clear_errors(history_db):
    def not_found(*args) -> str:  # one line on stderr and NotFound's exit code, no traceback
        res = memq(*args, ok=False)
        assert res.exit_code == NotFound.exit_code == 4 and res.stderr.count("\n") == 1, res.stderr
        assert res.stderr.startswith("memq: error: ") and "Traceback" not in res.output
        return res.stderr
    assert "no run named 'nope'" in not_found("history", "--run", "nope")
    assert "rank 3" in not_found("history", "--run", "sgd", "--rank", "3")
    assert "nope" in not_found("compare", "sgd", "nope")
    assert "nope" in not_found("versions", "--job", "nope")


def test_compare_json(history_db):
    doc = json.loads(memq("compare", "sgd", "adamw", "--json").output)
    for side in ("a", "b"):
        assert set(doc[side]["composition"]) >= {"parameters", "gradients", "optimizer_state", "activations"}
        assert all(isinstance(v, int) for v in doc[side]["composition"].values())
    assert doc["runs"] == ["sgd", "adamw"] and doc["composition"]["delta"] == doc["composition_delta"]
    delta = doc["composition_delta"]
    a, b = doc["a"]["composition"], doc["b"]["composition"]
    assert delta["optimizer_state"] == b["optimizer_state"] - a["optimizer_state"]
    assert 0.40 * 2**30 < delta["optimizer_state"] < 0.50 * 2**30
    fields = {d["field"] for d in doc["differences"]}
    assert {"optimizer", "torch_version"} <= fields
    assert doc["explanation"]["category"] == "optimizer_state"
    assert doc["explanation"]["settings"][0]["field"] == "optimizer"
    out = memq("compare", "sgd", "adamw").output
    assert "optimizer state" in out and "optimizer_state" not in out and "explanation" in out  # words, not keys
    rows = list(csv.DictReader(io.StringIO(memq("compare", "sgd", "adamw", "--csv").output)))
    assert {r["what"] for r in rows} >= {"optimizer_state", "peak reserved"}


def test_versions(history_db):
    doc = json.loads(memq("versions", "--job", "gpt", "--json").output)
    by = {v["torch_version"]: v for v in doc["versions"]}
    assert list(by) == ["2.10.0", "2.11.0+cu130"]
    assert by["2.10.0"]["runs"] == 1 and by["2.11.0+cu130"]["runs"] == 2
    assert by["2.11.0+cu130"]["oom_rate"] == 0.5 and by["2.11.0+cu130"]["regression"]
    assert isinstance(by["2.10.0"]["max_peak_reserved_bytes"], int)
    assert "OOM rate" in memq("versions", "--job", "gpt").output


def test_reanalyze(history_db):
    doc = json.loads(memq("reanalyze", "--json").output)
    assert doc["snapshots_considered"] == 0 and doc["failed"] == 0
    doc = json.loads(memq("reanalyze", "--run", "frag", "--force", "--json").output)
    assert doc["runs_recomputed"] == 1


def test_ingest_many_files_with_progress(memq_env):
    files = [str(p) for p in run_files("kept_loss_no_leak")]
    res = memq("ingest", *files, "--run", "kept", "--limit", "20GiB", "--job", "lm")
    assert "kept" in res.output and "healthy" in res.output
    doc = json.loads(memq("history", "--run", "kept", "--json").output)
    assert [s["step"] for s in doc["snapshots"]] == list(range(20, 401, 20))
    assert doc["diagnosis"]["primary_cause"] == "healthy"  # growth that is not a leak


def test_ingest_usage_errors(memq_env):
    files = [str(p) for p in run_files("seed_sgd")]
    assert memq("ingest", *files, "--run", "x", "--step", "3", ok=False).exit_code == 2
    assert memq("ingest", files[0], "--run", "x", "--label", "novalue", ok=False).exit_code == 2


@pytest.mark.postgres
def test_server_schema_out_of_date_refused_by_commands(pg_server, tmp_path, monkeypatch):
    from tests.conftest import memq_environ, temp_pg_database

    with temp_pg_database("c") as url:
        for k, v in memq_environ(url, tmp_path).items():
            monkeypatch.setenv(k, v)
        res = memq("runs", ok=False)
        assert res.exit_code == SchemaOutOfDate.exit_code and "memq db upgrade" in res.stderr
        memq("db", "upgrade")
        assert json.loads(memq("runs", "--json").output)["runs"] == []


def test_exit_codes_and_one_line_errors_in_a_real_process(history_db):
    env = dict(os.environ) | history_db
    proc = subprocess.run([sys.executable, "-m", "memq", "history", "--run", "ghost"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 4
    assert proc.stderr.strip().splitlines() == ["memq: error: no run named 'ghost' (list runs with `memq runs`)"]


def test_demo_works_without_services(tmp_path, monkeypatch):
    """Fresh machine: no database URL, no Redis (an unreachable URL), no worker."""
    for k in list(os.environ):
        if k.startswith("MEMQ_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis://127.0.0.1:1/0")
    out = memq("demo").output
    assert "fragmentation" in out and "capacity" in out and "optimizer" in out
    doc = json.loads(memq("demo", "--json").output)  # second run: nothing stored or analysed twice
    causes = {r["run"]: r["diagnosis"]["diagnosis"]["primary_cause"] for r in doc["runs"]}
    assert causes == {"demo-sgd": "healthy", "demo-adamw": "healthy", "demo-fragmentation": "fragmentation",
                      "demo-capacity": "capacity"}
    assert all(not s["created"] and not s["analysed"] for r in doc["runs"] for s in r["snapshots"])
    # the demo has its own store: the user's history (memq.db) gets no demo run
    assert doc["database"] == f"sqlite:///{tmp_path / 'data' / 'demo.db'}"
    assert f"stored apart from your history in sqlite:///{tmp_path / 'data' / 'demo.db'}" in " ".join(out.split())
    memq("db", "upgrade")
    assert json.loads(memq("runs", "--json").output)["runs"] == []
    monkeypatch.setenv("MEMQ_DATABASE_URL", doc["database"])  # as the demo's "next" line says
    hist = json.loads(memq("history", "--run", "demo-sgd", "--json").output)
    assert hist["stats"]["count"] == 45
    # no cap and no OOM: the header's limit is the device total the run recorded, never "limit -"
    assert hist["limit"] == {"bytes": 150109880320, "source": "the device total"}
    assert "limit -" not in memq("history", "--run", "demo-sgd").output


def test_demo_into_a_named_database(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path / "data"))
    url = f"sqlite:///{tmp_path / 'mine.db'}"
    doc = json.loads(memq("demo", "--json", "--database", url).output)
    assert doc["database"] == url and not (tmp_path / "data" / "demo.db").exists()


@pytest.mark.postgres
def test_demo_never_writes_into_a_server_database(pg_session_db, tmp_path, monkeypatch):
    from tests.conftest import _truncate, memq_environ

    _truncate(pg_session_db)
    for k, v in memq_environ(pg_session_db, tmp_path).items():
        monkeypatch.setenv(k, v)
    doc = json.loads(memq("demo", "--json").output)
    assert doc["database"].startswith("sqlite:///") and doc["database"].endswith("demo.db")
    assert json.loads(memq("runs", "--json").output)["runs"] == []


def test_bad_file_mid_ingest_exits_2_and_keeps_what_was_stored(memq_env, tmp_path):
    bad = tmp_path / "broken.pickle.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    good = [str(p) for p in run_files("frag_synthetic")]
    res = memq("ingest", good[0], str(bad), good[1], "--run", "partial", "--limit", "8GiB", ok=False)
    assert res.exit_code == 2 and "broken.pickle.gz" in res.stderr
    doc = json.loads(memq("history", "--run", "partial", "--json").output)
    assert len(doc["snapshots"]) == 1 and doc["diagnosis"] is not None
    doc = json.loads(memq("ingest", *good, "--run", "partial", "--limit", "8GiB", "--json").output)
    assert [s["created"] for s in doc["snapshots"]] == [False, True]
    assert doc["diagnosis"]["diagnosis"]["primary_cause"] == "fragmentation"


def test_the_header_shows_the_limit_the_verdict_used(memq_env):
    """Issue 23 item 6: "limit -" in the header while the verdict used a limit it derived (here the
    device total less the memory other processes held: no cap was given)."""
    memq("db", "upgrade")
    ingest("external", "ext")
    doc = json.loads(memq("history", "--run", "ext", "--json").output)
    assert doc["run"]["memory_limit_bytes"] is None
    used = doc["run_analysis"]["oom"]["limit_bytes"]
    assert used and doc["limit"] == {"bytes": used, "source": "the OOM analysis"}
    text = " ".join(memq("history", "--run", "ext").output.split())
    assert "(the OOM analysis)" in text and "limit -" not in text


def test_an_oom_run_never_reads_as_zero_ooms(memq_env):
    """Issue 23 item 6: "OOMs 0" on an OOM run (the samples' counter predates the OOM)."""
    memq("db", "upgrade")
    ingest("capacity", "cap-stats", "--stats", str(REAL / "seed_sgd" / "stats.jsonl"))
    text = " ".join(memq("history", "--run", "cap-stats").output.split())
    assert "OOMs 0" not in text and "ended in an OOM after its last stat sample" in text


def test_compare_reads_values_not_wording(memq_env):
    """Issue 42 item 4: the one limit (18.85 GiB, once the run's cap, once read from the OOM message)
    is no difference; expandable_segments True vs False, recorded in the snapshots, is one."""
    memq("db", "upgrade")
    ingest("frag_dynamic_1.15", "plain", "--oom-message", meta("frag_dynamic_1.15")["oom_message"])
    ingest("frag_dynamic_expandable_1.15", "expandable", "--limit", str(meta("frag_dynamic_1.15")["cap_bytes"]))
    doc = json.loads(memq("compare", "plain", "expandable", "--json").output)
    diffs = {d["field"]: d for d in doc["differences"]}
    assert doc["a"]["limit"]["source"] != doc["b"]["limit"]["source"]  # different words, one value
    assert "limit" not in diffs
    assert (diffs["allocator_settings"]["a"], diffs["allocator_settings"]["b"]) == ("defaults",
                                                                                   "expandable_segments:True")
    text = memq("compare", "plain", "expandable").output
    assert "allocator settings" in text and "allocator_settings" not in text
    assert "18.85 GiB" not in text.split("settings and versions that differ")[1]


def test_same_limit_just_under_and_over_the_message_precision():
    from memq.analysis.compare import SAME_LIMIT_WITHIN_BYTES, same_limit

    cap = 20244645632
    assert same_limit(cap, cap + SAME_LIMIT_WITHIN_BYTES) and same_limit(cap, cap - SAME_LIMIT_WITHIN_BYTES)
    assert not same_limit(cap, cap + SAME_LIMIT_WITHIN_BYTES + 1)
    assert same_limit(None, None) and not same_limit(cap, None)
