"""The worker's own path for one snapshot id (workers/jobs.py `analyze` and `recompute`), on real
fixtures, a real database (SQLite file and the shared PostgreSQL) and a private redis-server, no Celery:
the tasks only call these functions with their senders, which the tests record.

The walk goes down once and back once: the lease's UPDATE returns the row the analysis reads, the use
case (memq.pipeline.analyse.analyse_claimed) is called once, and the snapshot row is never SELECTed
again on the way."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import event, select

from memq.config import load_settings
from memq.load import load_snapshot_file
from memq.store import repository as repo
from memq.store.connection import open_store
from memq.store.orm import Run, Snapshot
from memq.workers import jobs
from tests.conftest import memq_environ
from tests.helpers import FIXTURES, run_files

pytestmark = pytest.mark.redis

LEAK = FIXTURES / "captured" / "leak_epochs"
STEMS = ["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"]


@pytest.fixture
def world(db_url, tmp_path, private_redis):
    srv = private_redis(aof=False)
    env = memq_environ(db_url, tmp_path) | {"MEMQ_REDIS_URL": srv.url, "MEMQ_RUN_DIAGNOSIS_DELAY_MS": "0"}
    st = load_settings(env)
    open_store(st, auto_migrate=True).close()
    jobs.forget_cache()
    sent: dict[str, list] = {"analysis": [], "recompute": [], "sweep": []}
    senders = jobs.Senders(analysis=lambda sid, cd: sent["analysis"].append(sid),
                           recompute=lambda rid, rank, cd: sent["recompute"].append((rid, rank)),
                           sweep=lambda sid: sent["sweep"].append(sid))
    yield st, jobs._store(st), senders, sent
    jobs.forget_cache()


def _snapshot(store, run_id: int, path, **kw) -> int:
    ld = load_snapshot_file(path, keep_raw=True)
    ref = store.blobs.put(ld.sha256, ld.raw)
    with store.session() as s:
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=run_id, sha256=ld.sha256, size_bytes=ld.raw_size,
                                                          blob_ref=ref, **kw))
    return sid


def test_the_worker_path_claims_analyses_diagnoses_and_skips_a_duplicate(world):
    st, store, senders, sent = world
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="agent-run", memory_limit_bytes=8589934592))
    ids = [_snapshot(store, rid, p, step=i, trigger="oom" if i else "periodic", context={"limit_bytes": 8589934592})
           for i, p in enumerate(run_files("frag_synthetic"))]
    assert jobs.analyze(st, ids[0], senders=senders) == "analysed"
    with store.session() as s:
        assert repo.run_status(s, rid) == "running"  # a periodic snapshot moves nothing
    assert jobs.analyze(st, ids[1], senders=senders) == "analysed"
    with store.session() as s:
        assert repo.run_status(s, rid) == "oom"  # the OOM snapshot, in the transaction that completed it
    assert sent["recompute"] == [(rid, 0)]  # debounced: one pending diagnosis for both
    assert jobs.recompute(st, rid, 0, senders) == "fragmentation"
    assert sent["sweep"] == [ids[1]]  # the OOM snapshot's what-if sweep comes after the diagnosis
    assert jobs.analyze(st, ids[1], senders=senders) == "done"  # a duplicate delivery
    with store.session() as s:
        assert s.execute(select(Run.primary_cause).where(Run.id == rid)).scalar_one() == "fragmentation"

    bad = b"\x80\x04K\x01."  # a pickle of the int 1: decodes, but is not a snapshot
    sha = hashlib.sha256(bad).hexdigest()
    store.blobs.put(sha, bad)
    with store.session() as s:
        sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=sha, size_bytes=len(bad)))
    assert jobs.analyze(st, sid, senders=senders) == "quarantined"
    with store.session() as s:
        state, err = s.execute(select(Snapshot.state, Snapshot.last_error).where(Snapshot.id == sid)).one()
    assert state == "failed" and "bad snapshot" in err


def test_one_walk_down_and_back_reads_the_snapshot_row_once(world):
    """The claim (UPDATE ... RETURNING) is the only statement that reads the snapshot row; the use case
    completes it once. Before, the row was read four times (claim, the job, the use case, the OOM mark)."""
    st, store, senders, _ = world
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="walk", memory_limit_bytes=8589934592))
    sid = _snapshot(store, rid, run_files("frag_synthetic")[-1], trigger="oom", context={"limit_bytes": 8589934592})
    seen: list[str] = []

    def record(conn, cursor, statement, *_a):
        seen.append(" ".join(statement.split()).lower())

    event.listen(store.engine, "before_cursor_execute", record)
    try:
        assert jobs.analyze(st, sid, senders=senders) == "analysed"
    finally:
        event.remove(store.engine, "before_cursor_execute", record)
    reads = [q for q in seen if q.startswith("select") and "from snapshots" in q]
    writes = [q for q in seen if q.startswith("update snapshots")]
    assert reads == [], reads
    assert len(writes) == 2, writes  # the lease, then done


def test_run_diagnosis_speaks_of_epochs_and_steps_not_stream_ids(world):
    """What the dispatcher stores for an agent's snapshots names them by stream id (`source`); the run
    diagnosis the worker computes names them by where in the run they were taken (leak_epochs capture)."""
    st, store, senders, _ = world
    with store.session() as s:
        run_id = repo.upsert_run(s, repo.RunMeta(name="leak-agent", memory_limit_bytes=7516192768))
    ids = []
    for i, stem in enumerate(STEMS):
        oom = stem == "oom"
        ids.append(_snapshot(store, run_id, LEAK / f"{stem}.pickle.gz", step=44 if oom else 8 * i + 7,
                             epoch=5 if oom else i, trigger="oom" if oom else "epoch_end",
                             source=f"memq:ingest/17961315759{i:02d}-0",
                             context={"requested_bytes": 262144000} if oom else {}))
    for sid in ids:
        assert jobs.analyze(st, sid, senders=senders) == "analysed"
    assert jobs.recompute(st, run_id, 0, senders) == "leak"
    with store.session() as s:
        result = repo.run_result(s, run_id, 0)
    diag = result["diagnosis"]
    text = " ".join(e for c in diag["causes"] for e in c["evidence"])
    text += " ".join(" ".join(r.values()) for r in diag["recommendations"])
    assert "memq:ingest" not in text
    assert "end of epoch 0 (step 7)" in text and "end of epoch 4 (step 39)" in text
    assert [x["file"] for x in result["snapshots"]][0] == "memq:ingest/1796131575900-0"
