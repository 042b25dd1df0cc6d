"""One truth per screen, the fresh tour (issue 42, "Done when"): what a new user still met after items
1-10, each on the screen where it showed, on the real fixtures."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from memq.cli import cli
from tests.helpers import run_files


def memq(*args) -> str:
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def flat(text: str) -> str:
    """rich's wrapping and panel borders undone: one line of words."""
    return re.sub(r"[\s│]+", " ", text)


# ------------------------------------------------------------------------------ versions: `pieces`
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_versions_compare_pieces_at_the_oom_not_the_fragmentation_ratio(memq_env):
    # 2.10: the real fragmentation OOM (ratio 0.55, 15% of reserved in pieces); 2.11: a healthy run (ratio
    # 0.76) and a capacity OOM (ratio 0.88, nothing in pieces). The old column flagged 2.11 for
    # "mean fragmentation 0.55 -> 0.82": a problem that is not one, where the lists say `pieces`.
    memq("db", "upgrade")
    memq("ingest", *run_files("frag_dynamic_1.15"), "--run", "frag", "--job", "j", "--torch-version", "2.10.0",
         "--limit", "20244645632")
    memq("ingest", *run_files("seed_sgd"), "--run", "sgd", "--job", "j", "--torch-version", "2.11.0")
    memq("ingest", *run_files("capacity"), "--run", "cap", "--job", "j", "--torch-version", "2.11.0",
         "--limit", "17179869184")
    runs = {r["run"]: r for r in json.loads(memq("runs", "--json"))["runs"]}
    doc = json.loads(memq("versions", "--job", "j", "--json"))
    old, new = doc["versions"]
    assert new["mean_fragmentation_ratio"] - old["mean_fragmentation_ratio"] > 0.1  # kept for older readers
    assert old["mean_pieces_share"] == runs["frag"]["pieces_share"]  # the lists' figure, averaged
    assert new["mean_pieces_share"] == runs["cap"]["pieces_share"]  # the healthy run has none
    assert not any("fragmentation" in r or "pieces" in r for r in new["regressions"]), new["regressions"]
    out = memq("versions", "--job", "j")
    head = next(x for x in out.splitlines() if "torch" in x and "runs" in x)
    assert "pieces" in head and "frag" not in head
    assert "0.82" not in out and "0.55" not in out


# ------------------------------------------------------------------------------ what-if: one limit
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_the_what_if_sweep_header_and_its_reason_name_one_limit(memq_env):
    # ingested without its cap: the header said "limit - from unknown" and the line under it "under the
    # limit of 139.04 GiB": two limits for one replay. The replay used the device-bound limit; say so.
    memq("db", "upgrade")
    memq("ingest", *run_files("frag_dynamic_1.15"), "--run", "frag")
    text = flat(memq("history", "--run", "frag"))
    head = text[text.index("what-if at the oom snapshot"):]
    assert head.startswith("what-if at the oom snapshot (rank 0; no limit known;"), head[:120]
    assert "limit - from unknown" not in text
    assert "the replay used the device-bound 139.04 GiB, under which the model serves every request" in head
    assert "under the limit of 139.04 GiB" not in text
    doc = json.loads(memq("history", "--run", "frag", "--json"))
    w = next(s["whatif"] for s in doc["snapshots"] if s.get("whatif"))
    assert w["limit_bytes"] is None and "device-bound" in w["results"][0]["reason"]
