"""One truth per screen, second pass (issue 42 items 1-3), on the real fixtures: a headline says what
the body settles, a reason is said once, one figure has one number and one definition."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from memq.cli import cli
from tests.helpers import FIXTURES, REAL, run_files

CAPTURED = FIXTURES / "captured"


def memq(*args) -> str:
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def screen(*args) -> str:
    """The terminal text with rich's wrapping undone: one line per paragraph's words."""
    return re.sub(r"\s+", " ", memq("analyze", *args))


def lines(*args) -> list[str]:
    return memq("analyze", *args).splitlines()


CAP = [REAL / "capacity" / "oom.pickle.gz"]


# ------------------------------------------------------------------------------ 1. headlines and bodies
def test_an_undetermined_verdict_reads_undetermined():
    # no limit: no deciding test could run; the JSON still names the best candidate (verdicts unchanged)
    doc = json.loads(memq("analyze", *CAP, "--json"))
    d = doc["diagnosis"]
    assert d["primary_cause"] == "capacity" and d["confidence"] == 0.30
    assert d["causes"][0]["evidence"][0].startswith("no deciding test could be settled")
    head = lines(*CAP)[1]
    assert "undetermined (best candidate capacity, confidence 0.30)" in head, head
    assert "capacity (confidence" not in screen(*CAP)


def test_a_settled_does_not_fit_names_nothing_that_would_settle_it():
    text = lines(*CAP, "--limit", "17179869184")
    need = " ".join(x.strip() for x in text[3:5])
    assert need.startswith("the failing step needed more than the 16.00 GiB limit: its live bytes and the request "
                           "alone (16.08 GiB) exceed it"), need
    assert "would settle it" not in need and "16.08 GiB" in screen(*CAP, "--limit", "17179869184")


def test_an_unsettled_cause_is_listed_apart_not_as_a_finding():
    text = screen(*CAP, "--limit", "17179869184")
    assert "cannot be a spike" not in text
    found, _, unsettled = text.partition("Not settled (what would settle each)")
    assert "activation spike: earlier training steps" in unsettled
    assert "activation_spike (0.10)" not in found and "leak: not settled: leak" not in text


def test_allocator_config_headline_agrees_with_would_fit_without_it():
    oom = CAPTURED / "dynamic_settings" / "roundup_4" / "oom.pickle.gz"
    text = lines(oom, "--limit", "18484297728")
    assert "allocator settings (confidence 0.76)" in text[1]
    assert text[3].strip().startswith("with the allocator settings in effect, the failing step needed more than")
    assert "would fit the limit" in screen(oom, "--limit", "18484297728")


def test_no_reference_to_a_table_that_is_not_printed():
    text = screen(REAL / "frag_dynamic_1.15" / "oom.pickle.gz", "--limit", "20244645632")
    assert "cannot assess expandable_segments:True" in text
    assert "the what-if table says why" not in text and "`memq whatif` says why" in text


def test_one_need_one_number_on_one_screen():
    text = screen(REAL / "external" / "oom.pickle.gz", "--device-total", "150109880320")
    assert "11.10 GiB + 2.75 GiB" in text or "11.10 GiB live + 2.75 GiB requested = 13.85 GiB" in text
    assert "the failing step held 13.85 GiB with the request" in text
    assert "13.78" not in text


# ------------------------------------------------------------------------------ 2. said once
BASIS = "no complete earlier training step of this run was recorded"


def test_the_unsettled_reason_is_said_once_on_analyze():
    args = [*run_files("frag_synthetic"), "--limit", "8589934592"]
    assert screen(*args).count(BASIS) == 1
    text = screen(*CAP)  # no limit: the missing limit is named once, the spike points to it
    # the lead says the limit is missing and points to the recommendation, which alone names the flags
    assert "the limit is not known (the recommendation says how to give it)" in text
    assert text.count("--oom-message") == 1 and text.count("--limit SIZE") == 1, text
    assert "activation spike: the input named above" in text


def test_the_demo_panel_says_the_reason_once(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMQ_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("MEMQ_DATABASE_URL", raising=False)
    monkeypatch.setenv("MEMQ_CONFIG", str(tmp_path / "none.toml"))
    out = memq("demo")
    panel = out[out.index("demo-fragmentation (oom)"): out.index("demo-capacity (oom)")]
    assert re.sub(r"[\s│]+", " ", panel).count(BASIS) == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_what_changed_says_no_change_once(memq_env):
    memq("db", "upgrade")
    files = run_files("kept_loss_no_leak")
    memq("ingest", *files, "--run", "kept", "--limit", "21474836480")
    hist = json.loads(memq("history", "--run", "kept", "--json"))
    quiet = [c for c in hist["changes"] if c["summary"] == "no significant change"]
    assert len(quiet) >= 10  # the JSON keeps every interval
    out = memq("history", "--run", "kept")
    changed = out[out.index("what changed"):].splitlines()
    assert sum("no significant change" in x for x in changed) < len(quiet)
    assert any(f"({len(quiet)} intervals): no significant change" in x for x in changed) or \
        sum("no significant change" in x for x in changed) == len({c["rank"] for c in quiet}) + 0


def test_the_playbook_section_does_not_restate_a_recommendation():
    from tests.helpers import meta

    doc = json.loads(memq("explain", meta("frag_dynamic_1.15")["oom_message"], "--json"))
    recs = [r["playbook"] for r in doc["diagnosis"]["recommendations"]]
    assert "empty-cache" in recs and "empty-cache" in {e["id"] for e in doc["playbook"]}
    text = re.sub(r"\s+", " ", memq("explain", meta("frag_dynamic_1.15")["oom_message"]))
    assert text.count("docs/playbook.md#empty-cache") == 1
    assert text.count("empty_cache() cannot release") + text.count("empty_cache() releases only whole") == 1


# ------------------------------------------------------------------------------ 3. one figure, one meaning
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_in_pieces_ranks_the_fragmentation_oom_first_in_runs_history_and_compare(memq_env):
    memq("db", "upgrade")
    for folder, run, extra in (("seed_sgd", "sgd", []), ("seed_adamw", "adamw", []),
                               ("capacity", "cap", ["--limit", "17179869184"]),
                               ("frag_dynamic_1.15", "frag", ["--limit", "20244645632"])):
        memq("ingest", *run_files(folder), "--run", run, *extra)
    runs = {r["run"]: r for r in json.loads(memq("runs", "--json"))["runs"]}
    # the old column: healthy 0.76-0.79 and the capacity OOM 0.88 above the fragmentation OOM 0.55
    assert runs["frag"]["fragmentation_ratio"] < min(runs[r]["fragmentation_ratio"] for r in ("sgd", "adamw", "cap"))
    assert runs["frag"]["pieces_share"] > runs["cap"]["pieces_share"] >= 0
    assert runs["sgd"]["pieces_share"] is None and runs["adamw"]["pieces_share"] is None
    head = next(x for x in memq("runs").splitlines() if "peak reserved" in x)
    assert "pieces" in head and "frag" not in head
    cmp = json.loads(memq("compare", "cap", "frag", "--json"))
    assert cmp["pieces"]["a"] == runs["cap"]["pieces_share"] and cmp["pieces"]["b"] == runs["frag"]["pieces_share"]
    assert "in pieces" in memq("compare", "cap", "frag")
    snap = json.loads(memq("history", "--run", "frag", "--json"))["snapshots"][-1]
    # free in pieces: the same number as `memq analyze` of that snapshot
    doc = json.loads(memq("analyze", *run_files("frag_dynamic_1.15"), "--limit", "20244645632", "--json"))
    m = doc["metrics"]
    assert snap["free_in_pieces_bytes"] == m["reserved_unallocated_bytes"] - m["largest_free_block_bytes"]
    assert runs["frag"]["pieces_share"] == round(snap["free_in_pieces_bytes"] / m["reserved_bytes"], 4)


def test_analyze_says_the_free_in_pieces_the_report_says():
    from memq.units import fmt_bytes

    args = [*run_files("frag_dynamic_1.15"), "--limit", "20244645632"]
    m = json.loads(memq("analyze", *args, "--json"))["metrics"]
    pieces = m["reserved_unallocated_bytes"] - m["largest_free_block_bytes"]
    text = screen(*args)
    assert f"{fmt_bytes(pieces, 'brief')} is in pieces outside that block" in text  # 2.53 GiB
    assert "4.60 GiB of cached free memory in the request's pool is in pieces" not in text
