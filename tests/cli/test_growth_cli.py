"""The growth model through the CLI on real captures, against SQLite and PostgreSQL (`memq_env`):
epoch-end files ingested by hand are counted in epochs, and a limit given after the fact to a stored
run (`memq reanalyze --run R --limit SIZE`) turns "not known yet" into a forecast of the epoch."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from memq.cli import cli

LEAK = Path(__file__).resolve().parents[1] / "fixtures" / "captured" / "leak_epochs"
CAP = 7516192768  # the job's cap (meta.json); it ran out in epoch 5, step 44


def memq(*args, code=0):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert res.exit_code == code, f"memq {' '.join(map(str, args))} exited {res.exit_code}: {res.output}"
    return res


def forecast(run: str) -> dict:
    return json.loads(memq("history", "--run", run, "--json").output)["forecast"]


def test_hand_ingested_epoch_ends_then_a_limit_given_later(memq_env):
    files = [LEAK / f"epoch{i}.pickle.gz" for i in range(4)]
    memq("ingest", *files, "--run", "by-hand", "--trigger", "epoch_end", "--json")
    fc = forecast("by-hand")
    # no limit known: the growth is said, and what would make it a date, with a command that exists
    assert fc["oom_expected"] is None and fc["unit"] == "epoch"
    assert "memq reanalyze --run RUN --limit SIZE" in fc["basis"] and "+0.98 GiB an epoch" in fc["basis"]
    memq("reanalyze", "--run", "by-hand", "--limit", str(CAP), "--json")
    fc = forecast("by-hand")
    assert fc["oom_expected"] is True and fc["epoch"] == 5 and fc["step"] is None, fc["basis"]
    assert fc["limit_bytes"] == CAP


def test_a_limit_needs_a_run_and_must_be_positive(memq_env):
    res = memq("reanalyze", "--limit", "8GiB", code=2)
    assert "--run RUN --limit SIZE" in res.output
    memq("ingest", LEAK / "epoch0.pickle.gz", "--run", "one", "--json")
    res = memq("reanalyze", "--run", "one", "--limit", "0", code=2)
    assert "must be positive" in res.output
