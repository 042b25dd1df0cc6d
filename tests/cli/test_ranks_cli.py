"""`memq ingest --rank` of two ranks of one run, then `memq history --run R` (JSON and terminal) and
`memq compare`, on SQLite and PostgreSQL. The two ranks are real recordings of the same model (no
multi-rank OOM was captured yet): rank 1 = tests/fixtures/real/capacity/oom.pickle.gz (its first step
runs out of memory under the 16 GiB cap), rank 0 = seed_adamw/epoch1.pickle.gz (small inputs, healthy)."""

from __future__ import annotations

import json

from tests.cli.test_history_cli import memq
from tests.helpers import REAL


def _two_ranks(run: str) -> None:
    memq("ingest", REAL / "seed_adamw" / "epoch1.pickle.gz", "--run", run, "--rank", "0",
         "--device-total", "150109880320", "--json")
    memq("ingest", REAL / "capacity" / "oom.pickle.gz", "--run", run, "--rank", "1", "--limit", "17179869184",
         "--json")


def test_history_names_the_failing_rank_and_why(memq_env):
    _two_ranks("ddp-two")
    doc = json.loads(memq("history", "--run", "ddp-two", "--json").output)
    ranks = doc["ranks"]
    assert ranks["world"] == 2 and ranks["failed_rank"] == 1 and ranks["cause"] == "capacity"
    assert ranks["imbalance"] == "data"
    rows = {r["rank"]: r for r in ranks["ranks"]}
    assert rows[1]["status"] is None and rows[0]["cause"] == "healthy"  # files: no agent exit figures
    assert rows[0]["parameters_bytes"] == rows[1]["parameters_bytes"]
    assert rows[1]["need_bytes"] > 17179869184 > rows[0]["need_bytes"]
    # the run's verdict is rank 1's, with the rank-specific advice first
    assert doc["diagnosis"]["primary_cause"] == "capacity" and doc["diagnosis"]["failed_rank"] == 1
    assert doc["diagnosis"]["recommendations"][0]["action"].startswith("Rebalance the data across ranks")
    text = memq("history", "--run", "ddp-two").output
    assert "ranks side by side" in text and "rank 1 ran out of memory first" in text
    cmp = json.loads(memq("compare", "ddp-two", "ddp-two", "--json").output)
    assert [r["rank"] for r in cmp["ranks"]["a"]] == [0, 1]
    assert "ddp-two: ranks side by side" in memq("compare", "ddp-two", "ddp-two").output


def test_one_rank_run_has_nothing_to_compare(memq_env):
    memq("ingest", REAL / "capacity" / "oom.pickle.gz", "--run", "solo", "--limit", "17179869184", "--json")
    doc = json.loads(memq("history", "--run", "solo", "--json").output)
    assert doc["ranks"]["world"] == 1 and doc["ranks"]["failed_rank"] is None
    assert "ranks side by side" not in memq("history", "--run", "solo").output
