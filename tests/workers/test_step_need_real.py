"""The calibration set's real H200 spools (tests/fixtures/step_need, agent defaults and full history) end to
end: each spool replayed into the shared Redis (unique prefix) -> `memq dispatcher` -> a real Celery
worker -> this module's own PostgreSQL database -> `memq history --run R --json`.

What the service stores and shows must be what the pure analysis measured against the ground truth
(tests/analysis/test_step_need.py): the run's primary cause and its `diagnosis.step_need`, an interval
containing the need measured on the uncapped twin, and the same sentence on `memq history`.
"""

from __future__ import annotations

import sys

import pytest

from tests.analysis.agent_data import STEP_NEED, step_need_truth
from tests.workers.stack import ROOT, Stack, spools_stack, wait_for

sys.path.insert(0, str(ROOT))
from benchmarks.step_need_calibration import expected_cause  # noqa: E402

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.slow, pytest.mark.timeout(400)]

TRUTH = step_need_truth()
RUNS = [(sc, v) for sc in sorted(TRUTH) for v in ("defaults", "full")]


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_redis, pg_server):
    tmp = tmp_path_factory.mktemp("step_need_real")
    with spools_stack(tmp, shared_redis, "stepneed", {f"{sc}-{v}": STEP_NEED / sc / v for sc, v in RUNS}) as s:
        for sc, v in RUNS:
            _settled(s, f"sn-{sc}-{v}")
        yield s


def _settled(stack: Stack, run: str) -> None:
    def ready():
        rows = stack.rows("SELECT count(*), sum(CASE WHEN s.state = 'done' THEN 1 ELSE 0 END), "
                          "max(CASE WHEN s.trigger = 'oom' THEN 1 ELSE 0 END) FROM snapshots s "
                          "JOIN runs r ON r.id = s.run_id WHERE r.name = :n", n=run)
        n, done, oom = rows[0]
        diag = stack.rows("SELECT d.snapshot_count FROM run_diagnoses d JOIN runs r ON r.id = d.run_id "
                          "WHERE r.name = :n", n=run)  # one row per rank that sent snapshots
        return n and n == done and oom and diag and sum(d[0] for d in diag) == n

    try:
        wait_for(ready, 240, 0.25, f"run {run}: every snapshot analysed and the run diagnosed")
    except AssertionError:
        print(stack.rows("SELECT r.name, s.state, s.trigger, s.last_error FROM snapshots s JOIN runs r "
                         "ON r.id = s.run_id WHERE r.name = :n", n=run), stack.dead(),
              stack.log_tail("dispatcher"), stack.log_tail("worker"))
        raise


@pytest.mark.parametrize(("sc", "variant"), RUNS)
def test_the_service_stores_the_measured_verdict(stack, sc, variant):
    row = TRUTH[sc]
    doc = stack.memq_json("history", "--run", f"sn-{sc}-{variant}")
    d = doc["diagnosis"]
    assert doc["run"]["status"] == "oom"
    if row.get("rank") is not None:  # two ranks: the run's verdict is its failing rank's
        assert doc["ranks"]["failed_rank"] == row["rank"], doc["ranks"]
    assert d["primary_cause"] == expected_cause(row), d["causes"][0]
    n = d["step_need"]
    truth = row["measured_need_bytes"]
    if row["kind"] == "resume":
        assert n is None
        assert 'map_location="cpu"' in d["recommendations"][0]["action"]
        return
    if n["bytes"] is None:
        assert n["basis"] and n["low"] <= truth
    else:
        assert n["low"] <= truth <= n["high"] and n["fits_limit"] == (truth <= row["cap_bytes"])


def test_history_prints_the_failing_steps_need(stack):
    """The terminal view says it in one sentence, as the web page and the report do."""
    text = " ".join(stack.memq("history", "--run", "sn-dyn-defaults").stdout.split())
    assert "the failing step needed ~6.47 GiB" in text and "it fits in one piece" in text
    text = " ".join(stack.memq("history", "--run", "sn-long_batch-defaults").stdout.split())
    assert "it does not fit, whatever the allocator does" in text
