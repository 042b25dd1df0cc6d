"""Analyse-and-store on real fixtures, against real PostgreSQL and SQLite."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

import memq.analysis
from memq.pipeline import analyse, ingest
from memq.pipeline import history as queries
from memq.store import blob_snapshots
from memq.store import repository as repo
from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot
from tests.helpers import REAL, REAL_RUNS, meta, run_files


def _ingest(store, folder: str, name: str | None = None, **meta_kw):
    _, opts = REAL_RUNS[folder]
    m = meta(folder)
    inputs = [ingest.SnapshotInput(path=str(p)) for p in run_files(folder)]
    return ingest.ingest_files(store, repo.RunMeta(name=name or folder, **meta_kw), inputs,
                                limit_bytes=opts.get("limit"), device_total_bytes=opts.get("device_total")), m


def _count(store, model) -> int:
    with store.session() as s:
        return s.execute(select(func.count()).select_from(model)).scalar_one()


@pytest.mark.parametrize("folder", ["frag_synthetic", "capacity", "external", "seed_sgd"])
def test_ingest_gives_the_ground_truth_label_and_status(store, folder):
    report, m = _ingest(store, folder, job="j", cluster="c")
    assert report.diagnosis["diagnosis"]["primary_cause"] == m["label"]
    assert report.status == ("oom" if m["outcome"] == "oom" else "completed")
    with store.session() as s:
        run = queries.get_run(s, folder)
    assert run["primary_cause"] == m["label"] and run["snapshot_count"] == len(run_files(folder))
    assert run["peak_reserved_bytes"] >= report.diagnosis["metrics"]["reserved_bytes"]
    assert (run["oom_count"] > 0) == (m["outcome"] == "oom")


def test_same_bytes_under_two_runs_share_one_blob_and_one_analysis(store, tmp_path):
    _ingest(store, "frag_synthetic", name="a")
    n_results = _count(store, AnalysisResult)
    report, _ = _ingest(store, "frag_synthetic", name="b")
    assert all(s.created and not s.analysed for s in report.snapshots)  # new rows, old analysis
    assert _count(store, AnalysisResult) == n_results
    assert _count(store, Snapshot) == 4
    blobs = sorted(p.name for p in (tmp_path / "blobs").rglob("*.zst"))
    assert len(blobs) == 2
    again, _ = _ingest(store, "frag_synthetic", name="b")  # identical re-ingest: nothing new at all
    assert all(not s.created and not s.analysed for s in again.snapshots)
    assert _count(store, Snapshot) == 4 and _count(store, AnalysisResult) == n_results


def test_history_orders_snapshots_in_time_and_reports_changes(store):
    _ingest(store, "seed_sgd", optimizer="SGD")
    n = ingest.ingest_stats(store, "seed_sgd", ingest.iter_stats_jsonl(REAL / "seed_sgd" / "stats.jsonl"))
    assert n == 45
    with store.session() as s:
        h = queries.run_history(s, "seed_sgd")
    assert [x["trigger"] for x in h["snapshots"]] == ["manual", "epoch_end", "epoch_end", "epoch_end"]
    assert [x["epoch"] for x in h["snapshots"]] == [None, 0, 1, 2]  # from file names
    assert h["diagnosis"]["primary_cause"] == "healthy"
    first = h["changes"][0]
    assert first["composition_delta"]["optimizer_state"] > 400 * 2**20  # SGD momentum appears after step 1
    assert "optimizer state" in first["summary"] and "optimizer_state" not in first["summary"]  # in words
    assert h["stats"]["count"] == 45 and h["stats"]["series"]
    assert all(isinstance(x["reserved_bytes"], int) for x in h["snapshots"])


def test_compare_finds_the_optimizer_behind_the_gap(store):
    _ingest(store, "seed_sgd", optimizer="SGD")
    _ingest(store, "seed_adamw", optimizer="AdamW")
    with store.session() as s:
        c = queries.compare_runs(s, "seed_sgd", "seed_adamw")
    delta = c["composition_delta"]["optimizer_state"]
    assert 0.40 * 2**30 < delta < 0.50 * 2**30  # README: 0.45 GiB more optimizer state with AdamW
    assert c["explanation"]["category"] == "optimizer_state"
    assert c["explanation"]["settings"][0]["field"] == "optimizer"
    assert {"field": "optimizer", "a": "SGD", "b": "AdamW"} in c["differences"]
    assert c["peaks"]["peak_allocated_bytes"]["delta"] > 0


def test_versions_flags_a_regression(store):
    _ingest(store, "seed_sgd", name="old", job="train", torch_version="2.10.0")
    _ingest(store, "capacity", name="new", job="train", torch_version="2.11.0+cu130")
    with store.session() as s:
        v = queries.torch_versions(s, "train")
    assert [x["torch_version"] for x in v["versions"]] == ["2.10.0", "2.11.0+cu130"]
    new = v["versions"][1]
    assert new["oom_rate"] == 1.0 and new["regression"]
    assert any("OOM rate" in r for r in new["regressions"])


def test_reanalyze_recomputes_from_blobs_once_per_version(store, monkeypatch):
    _ingest(store, "frag_synthetic")
    _ingest(store, "frag_synthetic", name="copy")
    rep = analyse.reanalyze(store)
    assert rep.snapshots_considered == 0 and rep.runs_recomputed == 0  # all current
    monkeypatch.setattr(memq.analysis, "ANALYZER_VERSION", "99.0-test")
    rep = analyse.reanalyze(store)
    assert rep.snapshots_considered == 4
    assert rep.analysed == 2 and rep.reused == 2  # the copy reuses the new results: same bytes, same context
    assert rep.runs_recomputed == 2
    with store.session() as s:
        versions = set(s.execute(select(Snapshot.analyzer_version)).scalars())
        diag_versions = set(s.execute(select(RunDiagnosis.analyzer_version)).scalars())
        assert s.execute(select(Run.primary_cause).where(Run.name == "copy")).scalar_one() == "fragmentation"
    assert versions == {"99.0-test"} and diag_versions == {"99.0-test"}
    assert analyse.reanalyze(store, "copy").snapshots_considered == 0


def test_reanalyze_analyses_each_snapshot_with_its_runs_optimizer(store, monkeypatch):
    """A stored result is keyed by bytes, version and context, not by who asked: `memq reanalyze` reads the
    run's optimizer as ingest and the worker do, so the path that runs first does not decide the advice."""
    _ingest(store, "seed_sgd", optimizer="SGD")
    monkeypatch.setattr(memq.analysis, "ANALYZER_VERSION", "99.2-test")
    asked: list = []
    real = memq.analysis.analyze

    def analyze(*a, **kw):
        asked.append(kw.get("optimizer"))
        return real(*a, **kw)

    monkeypatch.setattr(memq.analysis, "analyze", analyze)
    rep = analyse.reanalyze(store)
    assert rep.analysed == 4 and asked and set(asked) == {"SGD"}, asked  # the snapshots and the run diagnosis


def test_multi_rank_runs_keep_ranks_apart(store):
    files = [str(p) for p in run_files("frag_synthetic")]
    meta_ = repo.RunMeta(name="ddp", world_size=2)
    ingest.ingest_files(store, meta_, [ingest.SnapshotInput(files[0])], rank=0, limit_bytes=8589934592)
    ingest.ingest_files(store, meta_, [ingest.SnapshotInput(p) for p in files], rank=1, limit_bytes=8589934592)
    with store.session() as s:
        all_ranks = queries.run_history(s, "ddp")
        r1 = queries.run_history(s, "ddp", rank=1)
        run = queries.get_run(s, "ddp")
    assert {x["rank"] for x in all_ranks["snapshots"]} == {0, 1}
    assert [x["rank"] for x in r1["snapshots"]] == [1, 1]
    assert run["primary_cause"] == "fragmentation"  # the rank that hit the OOM decides
    assert all(c["rank"] == 1 for c in all_ranks["changes"])


def test_blobs_left_missing_are_reported_not_fatal(store, tmp_path, monkeypatch):
    _ingest(store, "capacity")
    for p in (tmp_path / "blobs").rglob("*.zst"):
        p.unlink()
    monkeypatch.setattr(memq.analysis, "ANALYZER_VERSION", "99.1-test")
    rep = analyse.reanalyze(store)
    assert rep.missing_blobs == 1 and rep.failed == 0


def test_files_without_trace_times_keep_the_given_order(store, tmp_path):
    """A snapshot with no trace has no time of its own: it is placed by its position in the list."""
    import gzip
    import pickle

    from memq import codec

    src = run_files("seed_sgd")
    paths = []
    for i, name in ((0, "a_notime.pickle.gz"), (2, "c_notime.pickle.gz")):
        raw = codec.decode((src[i]).read_bytes())
        raw["device_traces"] = [[] for _ in raw.get("device_traces", [])]
        (tmp_path / name).write_bytes(gzip.compress(pickle.dumps(raw)))
        paths.append(str(tmp_path / name))
    order = [paths[0], str(src[1]), paths[1], str(src[3])]
    ingest.ingest_files(store, repo.RunMeta(name="mixed"), [ingest.SnapshotInput(p) for p in order])
    with store.session() as s:
        h = queries.run_history(s, "mixed")
    assert [x["source"] for x in h["snapshots"]] == order
    times = [x["taken_at"] for x in h["snapshots"]]
    assert times == sorted(times) and len(set(times)) == 4


def _run_diagnosis(store, name: str) -> dict:
    with store.session() as s:
        return s.execute(select(RunDiagnosis.result).join(Run, Run.id == RunDiagnosis.run_id)
                         .where(Run.name == name)).scalar_one()


def test_run_diagnosis_reads_earlier_snapshots_from_digests_not_blobs(store, tmp_path):
    report, _ = _ingest(store, "seed_sgd", optimizer="SGD")
    before = _run_diagnosis(store, "seed_sgd")
    newest = report.snapshots[-1].sha256
    removed = [p for p in (tmp_path / "blobs").rglob("*.zst") if not p.name.startswith(newest)]
    assert len(removed) == 3
    for p in removed:
        p.unlink()
    after = analyse.recompute_run(store, report.run_id, 0)
    assert after == before  # nothing lost with the blobs: the digests carry the earlier snapshots
    assert len(after["details"]["per_snapshot"]) == 4


def test_analyses_stored_without_digest_get_one_at_the_next_run_diagnosis(store):
    from sqlalchemy import null, update

    report, _ = _ingest(store, "seed_sgd", optimizer="SGD")
    before = _run_diagnosis(store, "seed_sgd")
    with store.session() as s:
        assert s.execute(select(func.count()).where(AnalysisResult.digest.is_(None))).scalar_one() == 0
        s.execute(update(AnalysisResult).values(digest=null()))  # as rows from before migration 0003
    calls = []

    def load(sha, src):
        calls.append(sha)
        return blob_snapshots.load_blob(store, sha, src)

    assert analyse.recompute_run(store, report.run_id, 0, load=load) == before
    assert len(calls) == 4  # every snapshot decoded once
    with store.session() as s:
        assert s.execute(select(func.count()).where(AnalysisResult.digest.is_(None))).scalar_one() == 0
    calls.clear()
    assert analyse.recompute_run(store, report.run_id, 0, load=load) == before
    assert len(calls) == 1  # now only the newest
    with store.session() as s:  # a digest of another format is replaced the same way
        s.execute(update(AnalysisResult).values(digest={"format": 0}))
    calls.clear()
    assert analyse.recompute_run(store, report.run_id, 0, load=load) == before
    assert len(calls) == 4
    calls.clear()
    assert analyse.recompute_run(store, report.run_id, 0, load=load) == before
    assert len(calls) == 1


def test_digests_outside_the_window_of_a_run_diagnosis_are_dropped(store, monkeypatch):
    monkeypatch.setattr(analyse, "MAX_RUN_SNAPSHOTS", 2)
    report, _ = _ingest(store, "seed_sgd", optimizer="SGD")
    ids = [x.snapshot_id for x in report.snapshots]  # time order
    with store.session() as s:
        has = dict(s.execute(select(Snapshot.id, AnalysisResult.digest.is_not(None))
                             .join(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)).all())
    assert [has[i] for i in ids] == [False, False, True, True]
    # the oldest bytes are also the newest snapshot of another run: that run's diagnosis fills the
    # digest in again (one decode), and the first run's diagnoses no longer drop it (shared)
    first = run_files("seed_sgd")[0]
    ingest.ingest_files(store, repo.RunMeta(name="other"), [ingest.SnapshotInput(path=str(first))])
    analyse.recompute_run(store, report.run_id, 0)
    with store.session() as s:
        has = dict(s.execute(select(Snapshot.id, AnalysisResult.digest.is_not(None))
                             .join(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)).all())
    assert [has[i] for i in ids] == [True, False, True, True]
