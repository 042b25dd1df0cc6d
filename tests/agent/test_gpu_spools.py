"""The spools the agent wrote on the H200 machines (tests/fixtures/agent_gpu), replayed here into
real Redis (the GPU machines reach none): a real OOM caught by the one-line agent, two DDP ranks
started by `memq run`, Lightning, cudaMallocAsync. The end-to-end test pushes them through the real
dispatcher, Celery worker and database (the workers' test stack) and reads `memq history`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from memq import codec
from memq.agent.replay import replay_dir

from .conftest import blob_of, entries

GPU = Path(__file__).resolve().parents[1] / "fixtures" / "agent_gpu"


@pytest.fixture
def spools(tmp_path):
    dst = tmp_path / "agent_gpu"
    shutil.copytree(GPU, dst)
    return dst


def test_oom_spool(shared, spools):
    r, prefix, stream = shared
    n = replay_dir(spools / "spool_oom", r, stream=stream, key_prefix=prefix)
    got = entries(r, stream)
    assert n == len(got) == 8
    assert [e.kind for e in got][0] == "run_start" and got[-1].kind == "run_end"
    snaps = [e for e in got if e.kind == "snapshot"]
    assert [(s.trigger, s.step) for s in snaps] == [("periodic", 2), ("epoch_end", 7), ("epoch_end", 15), ("oom", 16)]
    for s in snaps:
        assert s.codec == "gzip"  # no zstandard on the GPU machine
        snap = codec.decode(blob_of(r, s, prefix))
        assert snap["segments"]
    warm = codec.decode(blob_of(r, snaps[0], prefix))
    assert snaps[0].payload["reason"] == "warmup" and len(warm["device_traces"][0]) > 10_000
    oom = snaps[-1]
    assert oom.oom["alloc"] == 5_899_288_576
    assert oom.oom["device_alloc"] == int(0.12 * oom.oom["device_total"])  # the per-process cap
    assert oom.oom["message"].startswith("CUDA out of memory. Tried to allocate 5.49 GiB")
    # default settings: no trace of the failing step, but parameters and optimizer state keep frames
    snap = codec.decode(blob_of(r, oom, prefix))
    framed = sum(b["size"] for sg in snap["segments"] for b in sg["blocks"]
                 if b["state"] == "active_allocated" and b["frames"])
    assert framed >= 1_450_000_000 and not any(snap["device_traces"])
    end = got[-1].payload
    assert end["status"] == "oom" and "CUDA out of memory" in end["exception"]
    assert end["counters"]["dropped"] == 0 and end["counters"]["errors"] == 0
    start = got[0].payload
    assert start["torch"] == "2.11.0+cu130" and start["gpu"] == "NVIDIA H200"


def test_ddp_spool_two_ranks_one_run(shared, spools):
    r, prefix, stream = shared
    replay_dir(spools / "spool_ddp", r, stream=stream, key_prefix=prefix)
    got = entries(r, stream)
    assert {e.run for e in got} == {"gpu-ddp"} and {e.cluster for e in got} == {"h200x2"}
    assert sorted(e.rank for e in got if e.kind == "run_start") == [0, 1]
    for rank in (0, 1):
        mine = [e for e in got if e.rank == rank]
        assert [e.kind for e in mine][0] == "run_start" and mine[-1].kind == "run_end"
        assert mine[0].payload["world_size"] == 2 and mine[0].payload["device"] == rank
        snaps = [e for e in mine if e.kind == "snapshot"]
        assert [s.trigger for s in snaps] == ["periodic", "epoch_end", "epoch_end"]
        warm = codec.decode(blob_of(r, snaps[0], prefix))
        # each rank recorded on its own device
        assert len(warm["device_traces"][rank]) > 10_000 and len(warm["device_traces"][1 - rank]) < 5


def test_lightning_and_async_spools(shared, spools):
    r, prefix, stream = shared
    replay_dir(spools / "spool_lightning", r, stream=stream, key_prefix=prefix)
    replay_dir(spools / "spool_async", r, stream=stream, key_prefix=prefix)
    got = entries(r, stream)
    light = [e for e in got if e.run == "gpu-lightning"]
    assert [e.trigger for e in light if e.kind == "snapshot"] == ["periodic", "epoch_end", "epoch_end"]
    assert light[0].payload["optimizer"] == "AdamW" and light[0].payload["params"] == 4_202_497
    asy = [e for e in got if e.run == "gpu-async"]
    assert [e.kind for e in asy] == ["run_start", "stats", "run_end"]  # no snapshots under that backend
    assert asy[0].payload["allocator_backend"] == "cudaMallocAsync"


def test_replay_cli_removes_sent_files(shared, spools, monkeypatch):
    from memq.agent import replay

    r, prefix, stream = shared
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis://127.0.0.1:6379/0")
    assert replay.main([str(spools / "spool_ddp"), "--stream", stream, "--key-prefix", prefix]) == 0
    assert r.xlen(stream) == 12 and not list((spools / "spool_ddp").rglob("*.mqs"))
    for e in entries(r, stream):
        if e.kind == "snapshot":
            assert r.exists(e.blob_key(prefix))


@pytest.mark.postgres
@pytest.mark.slow
def test_gpu_spools_end_to_end_history(spools, tmp_path, pg_server):
    """Replayed into the stack's stream: `memq history` shows both ranks of the DDP run, and the
    OOM run's diagnosis names the cause."""
    from tests.agent.conftest import SHARED_URL
    from tests.conftest import temp_pg_database
    from tests.workers.stack import Stack, wait_for

    with temp_pg_database("agentgpu") as url:
        (tmp_path / "e2e").mkdir()
        s = Stack(tmp_path / "e2e", SHARED_URL, url)
        try:
            s.upgrade()
            s.start_worker(concurrency=2)
            s.start_dispatcher()
            st = s.settings
            for folder in ("spool_ddp", "spool_oom"):
                replay_dir(spools / folder, s.redis, stream=st.stream_key, key_prefix=st.key_prefix)

            def settled(run, n, status):
                rows = s.rows("SELECT r.status, count(s.id), sum(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END) "
                              "FROM runs r LEFT JOIN snapshots s ON s.run_id = r.id WHERE r.name = :name "
                              "GROUP BY r.id, r.status", name=run)
                return bool(rows) and tuple(rows[0]) == (status, n, n)

            try:
                # rows are unique on (run, rank, sha256): these spools predate the agent's per-snapshot
                # `memq_agent` key, and a rank's two epoch-end snapshots were byte-identical (paused
                # recording, same state), so they are one row each
                wait_for(lambda: settled("gpu-ddp", 4, "completed"), 120, 0.5, "ddp run")
                wait_for(lambda: settled("gpu-oom", 3, "oom"), 120, 0.5, "oom run")
            except AssertionError:
                rows = s.rows("SELECT r.name, r.status, s.rank, s.trigger, s.state FROM runs r "
                              "LEFT JOIN snapshots s ON s.run_id = r.id ORDER BY r.name, s.id")
                raise AssertionError(f"{rows}\n{s.log_tail('dispatcher')}\n{s.dead()}") from None
            ddp = s.memq_json("history", "--run", "gpu-ddp")
            assert sorted({snap["rank"] for snap in ddp["snapshots"]}) == [0, 1]
            assert ddp["run"]["job"] is None  # the envelopes carry torchrun's placeholder run id "none"
            ranks = ddp["ranks"]  # a balanced run that did not fail: both ranks, nobody singled out
            assert [r["rank"] for r in ranks["ranks"]] == [0, 1] and ranks["failed_rank"] is None
            assert ranks["imbalance"] == "none", ranks
            oom = s.memq_json("history", "--run", "gpu-oom")
            assert oom["snapshots"][-1]["trigger"] == "oom"
            # the doubled batch's step, cut off early, projects past the cap (tests/analysis/test_agent_defaults.py)
            assert oom["diagnosis"]["primary_cause"] == "activation_spike"
        finally:
            s.close()
