"""Two ranks of one data-parallel run end to end: live agents -> shared Redis (unique prefix) ->
`memq dispatcher` -> a real Celery worker -> this module's own database -> `memq history --run R --json`
and `memq compare`.

The real DDP captures (tests/fixtures/ddp_ranks) go through the same stack in test_ddp_ranks_real.py.
This test stays for what they do not cover: its agents run in this process on recorded snapshots (not
a spool replayed), so it checks the live paths - torchrun's TORCHELASTIC_RUN_ID=none in the environment
not stored as the job id, and the SIGTERM handler (end_reason "sigterm"; in the captures both torn-down
ranks ended as "process_group_aborted" first) - and a data imbalance settled with both ranks'
compositions known (the captures' rank 0 was torn down before its first snapshot). The run is put
together from real single-rank recordings of the same model: rank 0 replays seed_adamw (small inputs,
healthy, torn down after rank 1 failed), rank 1 replays capacity (its first step's large input runs out
of memory under the 16 GiB cap).
"""

from __future__ import annotations

import json

import pytest

from memq.agent.source import ReplaySource
from tests.workers.stack import REAL, Stack, make_agent, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(300)]

RUN = "e2e-ddp-imbalance"


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_redis, pg_server):
    from tests.conftest import temp_pg_database

    with temp_pg_database("rk") as url:
        s = Stack(tmp_path_factory.mktemp("ranks"), shared_redis, url)
        try:
            s.upgrade()
            s.start_worker(concurrency=1, beat=False)
            s.start_dispatcher()
            yield s
        finally:
            s.close()


def _settled(stack: Stack, run: str, per_rank: dict[int, int]) -> None:
    """Every snapshot done, each rank's run diagnosis covering its snapshots, both ranks' figures in."""
    def ready():
        snaps = stack.rows("SELECT s.rank, count(*) AS n, sum(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END) AS done "
                           "FROM snapshots s JOIN runs r ON r.id = s.run_id WHERE r.name = :n GROUP BY s.rank",
                           n=run)
        diags = stack.rows("SELECT d.rank, d.snapshot_count FROM run_diagnoses d JOIN runs r ON r.id = d.run_id "
                           "WHERE r.name = :n", n=run)
        figs = stack.rows("SELECT f.rank FROM rank_figures f JOIN runs r ON r.id = f.run_id WHERE r.name = :n",
                          n=run)
        return ({r[0]: (r[1], r[2]) for r in snaps} == {k: (v, v) for k, v in per_rank.items()}
                and {r[0]: r[1] for r in diags} == per_rank and {r[0] for r in figs} == set(per_rank))

    try:
        wait_for(ready, 60, 0.25, f"run {run}: snapshots analysed and rank figures stored")
    except AssertionError:
        print(stack.rows("SELECT s.rank, s.state, s.trigger, s.last_error FROM snapshots s"),
              stack.rows("SELECT rank, snapshot_count FROM run_diagnoses"), stack.rows("SELECT * FROM rank_figures"),
              stack.dead(), stack.log_tail("dispatcher"), stack.log_tail("worker"))
        raise


def test_first_failing_rank_its_cause_and_advice(stack, monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's placeholder: not a job id
    monkeypatch.delenv("MEMQ_JOB", raising=False)
    meta = json.loads((REAL / "capacity" / "meta.json").read_text())
    stats = [json.loads(x) for x in (REAL / "seed_adamw" / "stats.jsonl").read_text().splitlines() if x.strip()]

    r0 = make_agent(stack, RUN, ReplaySource(REAL / "seed_adamw"), rank=0, world_size=2, step_budget=1.0)
    assert r0.snapshot("manual")  # before_training
    for step in range(15):
        r0.mark_step(step, 0)
    r0.mark_epoch(0)  # epoch0 snapshot

    src1 = ReplaySource(REAL / "capacity")
    r1 = make_agent(stack, RUN, src1, rank=1, world_size=2, oom_message_wait_s=5)
    err = RuntimeError(meta["oom_message"])
    with pytest.raises(RuntimeError):
        assert src1.fire_oom()  # its first step
        raise err
    r1.note_exception(err)
    r1.stop(15)
    r0._on_term()  # what the agent's SIGTERM handler does when torchrun tears rank 0 down

    _settled(stack, RUN, {0: 3, 1: 1})  # rank 0: before_training, the warm-up baseline, epoch0
    doc = stack.memq_json("history", "--run", RUN)
    assert doc["run"]["job"] is None and doc["run"]["status"] == "oom"
    ranks = doc["ranks"]
    assert ranks["failed_rank"] == 1 and ranks["cause"] == "capacity" and ranks["imbalance"] == "data"
    rows = {r["rank"]: r for r in ranks["ranks"]}
    assert rows[0]["status"] == "crashed" and rows[0]["end_reason"] == "sigterm"
    assert rows[0]["peak_allocated_bytes"] >= max(x["allocated_bytes.all.peak"] for x in stats[:16])
    assert rows[0]["last_step"] == 14
    assert rows[1]["status"] == "oom" and rows[1]["oom_step"] == 0
    assert rows[0]["parameters_bytes"] == rows[1]["parameters_bytes"] > 0
    # rank 0's step peaks come from its exit figures (the per-step peak counters), not its snapshots
    assert rows[0]["need_bytes"] == rows[0]["peak_allocated_bytes"] == rows[0]["step_peak_bytes"]
    assert rows[1]["activations_bytes"] > 2 * rows[0]["activations_bytes"]
    # the run's verdict is rank 1's, with advice that fits one rank's larger inputs first
    d = doc["diagnosis"]
    assert d["primary_cause"] == "capacity" and d["failed_rank"] == 1
    assert d["recommendations"][0]["action"].startswith("Rebalance the data across ranks: rank 1")
    assert any("rank 1 ran out of memory first" in ev for c in d["causes"] for ev in c["evidence"])

    text = stack.memq("history", "--run", RUN).stdout
    assert "ranks side by side" in text and "rank 1 ran out of memory first" in text
    cmp = stack.memq_json("compare", RUN, RUN)
    assert [r["rank"] for r in cmp["ranks"]["a"]] == [0, 1]
    assert "rank" in stack.memq("compare", RUN, RUN).stdout
