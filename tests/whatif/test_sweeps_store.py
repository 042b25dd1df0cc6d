"""Stored what-if sweeps through `memq ingest` (inline, no worker), on SQLite and PostgreSQL: one sweep per
OOM snapshot keyed by its bytes + version + inputs, shown by `memq history`, replayed by `memq whatif --run`.
The worker path is tests/workers/test_worker_whatif.py."""

from __future__ import annotations

import json

from click.testing import CliRunner
from sqlalchemy import func, select

from memq.cli import cli
from memq.pipeline import analyse, ingest
from memq.store import repository as repo
from memq.store.orm import WhatIfSweep
from tests.helpers import FIXTURES

GC = FIXTURES / "captured" / "dynamic_settings" / "gc_0.6"
CAP = 18484297728


def _ingest(store, name="gc"):
    inputs = [ingest.SnapshotInput(path=str(GC / f)) for f in ("epoch0.pickle.gz", "epoch1.pickle.gz",
                                                                  "oom.pickle.gz")]
    return ingest.ingest_files(store, repo.RunMeta(name=name), inputs, limit_bytes=CAP)


def _sweeps(store) -> int:
    with store.session() as s:
        return s.execute(select(func.count()).select_from(WhatIfSweep)).scalar_one()


def test_ingest_stores_one_sweep_per_oom_snapshot_and_history_shows_it(store, memq_env):
    _ingest(store)
    assert _sweeps(store) == 1
    _ingest(store)  # the same files again: the stored sweep is found, nothing added
    _ingest(store, name="gc-again")  # the same bytes under another run: the same sweep is shared
    assert _sweeps(store) == 1
    analyse.reanalyze(store, "gc", force=True)
    assert _sweeps(store) == 1

    r = CliRunner().invoke(cli, ["history", "--run", "gc", "--json"])
    assert r.exit_code == 0, r.output
    snaps = json.loads(r.output)["snapshots"]
    assert [s["whatif"] is None for s in snaps] == [True, True, False]
    w = snaps[-1]["whatif"]
    assert w["limit_bytes"] == CAP and [s["epoch"] for s in w["seeds"]] == [0, 1]
    by = {x["conf"]: x for x in w["results"]}
    assert by[""]["verdict"] == "oom" and by[""]["confidence"] == "high"
    assert by["expandable_segments:True"]["verdict"] == "survives_window" and by["expandable_segments:True"]["reason"]
    na = [x for x in w["results"] if x["predicted_oom"] is None]
    assert na and all(x["reason"] and x["confidence"] == "none" for x in na)

    text = CliRunner().invoke(cli, ["history", "--run", "gc"]).output
    assert "what-if at the oom snapshot" in text and "not assessable" in text


def test_whatif_run_takes_snapshot_and_limit_from_the_history(store, memq_env):
    _ingest(store)
    r = CliRunner().invoke(cli, ["whatif", "--run", "gc", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [x["conf"] for x in out] == [""]
    assert out[0]["limit_bytes"] == CAP and out[0]["predicted_oom"] is True
    assert out[0]["snapshot"]["trigger"] == "oom" and out[0]["inputs"]["seeds"][0]["epoch"] == 0
    r = CliRunner().invoke(cli, ["whatif", "--run", "gc", "--sweep", "--conf", "max_split_size_mb:256", "--json"])
    confs = [x["conf"] for x in json.loads(r.output)]
    assert confs[0] == "" and "max_split_size_mb:256" in confs and "expandable_segments:True" in confs
    text = CliRunner().invoke(cli, ["whatif", "--run", "gc", "--rank", "0", "--sweep"]).output
    assert "run gc rank 0, oom snapshot" in text and "survives the window" in text


def test_whatif_run_errors(store, memq_env):
    r = CliRunner().invoke(cli, ["whatif", "--run", "nope", "--json"])
    assert r.exit_code == 4 and "no run named 'nope'" in r.output and "Traceback" not in r.output
    with store.session() as s:
        repo.upsert_run(s, repo.RunMeta(name="empty"))
    r = CliRunner().invoke(cli, ["whatif", "--run", "empty"])
    assert r.exit_code == 4 and "has no snapshot" in r.output
    _ingest(store)
    r = CliRunner().invoke(cli, ["whatif", "--run", "gc", "--rank", "3"])
    assert r.exit_code == 4 and "rank 3" in r.output
    r = CliRunner().invoke(cli, ["whatif"])
    assert r.exit_code == 2 and "--run" in r.output


def test_agent_default_oom_without_trace_is_stored_as_not_assessable(store, memq_env, tmp_path):
    """The agent's real OOM snapshot (tests/fixtures/agent_gpu/spool_oom: recording was off at the OOM),
    written out as a file here (decoded with the restricted decoder, pickled again) and ingested."""
    import pickle

    from memq import codec
    from memq.agent.spool import decode as decode_spool

    spool = FIXTURES / "agent_gpu" / "spool_oom" / "gpu-oom" / "rank0-vm-560"
    msgs = [decode_spool(f.read_bytes()) for f in sorted(spool.glob("*.mqs"))]
    oom = [m for m in msgs if m.fields.get("trigger") == "oom"][-1]
    path = tmp_path / "oom.pickle"
    path.write_bytes(pickle.dumps(codec.decode(oom.blob), protocol=4))
    payload = json.loads(oom.fields["payload"])["oom"]
    ingest.ingest_files(store, repo.RunMeta(name="agent-oom"), [ingest.SnapshotInput(
        path=str(path), oom_message=payload["message"], requested_bytes=payload["alloc"])],
        limit_bytes=payload["device_alloc"])
    doc = json.loads(CliRunner().invoke(cli, ["history", "--run", "agent-oom", "--json"]).output)
    w = doc["snapshots"][-1]["whatif"]
    assert w and len(w["results"]) >= 8
    for r in w["results"]:  # never "(recorded) fits, confidence high" for a run that ran out of memory
        assert r["predicted_oom"] is None and r["confidence"] == "none" and "no trace" in r["reason"]
    text = CliRunner().invoke(cli, ["history", "--run", "agent-oom"]).output
    assert "every setting: not assessable (no trace" in text
