"""What the dispatcher stores for an agent's snapshots names them by stream id (`source`); the run
diagnosis a worker computes must name them by where in the run they were taken. Real database
(SQLite file and the shared PostgreSQL), real blobs, the leak_epochs capture."""

from __future__ import annotations

from memq.load import load_snapshot_file
from memq.pipeline import analyse
from memq.store import repository as repo
from tests.helpers import FIXTURES

LEAK = FIXTURES / "captured" / "leak_epochs"
STEMS = ["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"]


def test_run_diagnosis_speaks_of_epochs_and_steps_not_stream_ids(store):
    with store.session() as s:
        run_id = repo.upsert_run(s, repo.RunMeta(name="leak-agent", memory_limit_bytes=7516192768))
    ids = []
    for i, stem in enumerate(STEMS):
        ld = load_snapshot_file(LEAK / f"{stem}.pickle.gz", keep_raw=True)
        ref = store.blobs.put(ld.sha256, ld.raw)
        oom = stem == "oom"
        with store.session() as s:
            sid, _ = repo.insert_snapshot(s, repo.NewSnapshot(
                run_id=run_id, sha256=ld.sha256, size_bytes=ld.raw_size, step=44 if oom else 8 * i + 7,
                epoch=5 if oom else i, trigger="oom" if oom else "epoch_end", blob_ref=ref,
                source=f"memq:ingest/17961315759{i:02d}-0",
                context={"requested_bytes": 262144000} if oom else {}))
        ids.append(sid)
    for sid in ids:
        out = analyse.process_snapshot(store, sid)
        assert out.state == "done"
    diag = out.run_diagnosis["diagnosis"]
    assert diag["primary_cause"] == "leak"
    text = " ".join(e for c in diag["causes"] for e in c["evidence"])
    text += " ".join(" ".join(r.values()) for r in diag["recommendations"])
    assert "memq:ingest" not in text
    assert "end of epoch 0 (step 7)" in text and "end of epoch 4 (step 39)" in text
    assert [x["file"] for x in out.run_diagnosis["snapshots"]][0] == "memq:ingest/1796131575900-0"
