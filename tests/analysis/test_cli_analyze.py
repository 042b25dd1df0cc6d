"""`memq analyze` / `memq explain` as a user runs them: a subprocess, the JSON contract, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.helpers import REAL, meta, run_files

CONTRACT_KEYS = {"schema", "snapshots", "metrics", "oom", "composition", "diagnosis"}
METRIC_KEYS = {"reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes", "reserved_unallocated_bytes",
               "largest_free_block_bytes", "fragmentation_ratio", "stranded_bytes"}
COMPOSITION_KEYS = {"parameters", "gradients", "optimizer_state", "activations", "workspace", "other", "unknown"}


def memq(*args):
    return subprocess.run([sys.executable, "-m", "memq", *map(str, args)], capture_output=True, text=True,
                          timeout=120)


def test_analyze_json_contract_for_a_run():
    files = run_files("frag_synthetic")
    p = memq("analyze", *files, "--limit", "8GiB", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert CONTRACT_KEYS <= set(doc) and doc["schema"] == 1
    assert [s["file"] for s in doc["snapshots"]] == [str(f) for f in files]
    snap = doc["snapshots"][-1]
    assert snap == {"file": str(files[-1]), "torch_format": "2.3+", "segments": 28, "trace_entries": 100,
                    "expandable_segments": False}
    assert set(doc["metrics"]) == METRIC_KEYS
    assert all(isinstance(doc["metrics"][k], int) for k in METRIC_KEYS - {"fragmentation_ratio"})
    assert isinstance(doc["metrics"]["fragmentation_ratio"], float)
    assert set(doc["composition"]) == COMPOSITION_KEYS
    assert doc["oom"]["limit_bytes"] == 8 * 1024**3
    assert doc["oom"]["requested_bytes"] == 1536 * 1024**2
    assert doc["diagnosis"]["primary_cause"] == "fragmentation"


def test_analyze_terminal_report_is_readable():
    p = memq("analyze", REAL / "capacity" / "oom.pickle.gz", "--limit", "17179869184")
    assert p.returncode == 0, p.stderr
    for text in ("capacity", "Memory picture", "OOM fit test", "Composition", "Recommendations", "activations"):
        assert text in p.stdout


def test_oom_message_option_matches_limit_verdict():
    m = meta("capacity")
    p = memq("analyze", REAL / "capacity" / "oom.pickle.gz", "--oom-message", m["oom_message"], "--json")
    doc = json.loads(p.stdout)
    assert doc["diagnosis"]["primary_cause"] == "capacity"
    assert doc["oom"]["limit_bytes"] == 16 * 1024**3


def test_explain_from_message_alone():
    m = meta("external")
    p = memq("explain", m["oom_message"], "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert CONTRACT_KEYS <= set(doc)
    assert doc["diagnosis"]["primary_cause"] == "external_memory"
    assert doc["metrics"]["largest_free_block_bytes"] is None
    assert doc["composition"]["parameters"] is None
    assert doc["oom"]["fits_largest_free_block"] is None


def test_explain_capacity_message_and_rejects_other_text():
    p = memq("explain", meta("capacity")["oom_message"], "--json")
    assert json.loads(p.stdout)["diagnosis"]["primary_cause"] == "capacity"
    p = memq("explain", "segmentation fault")
    assert p.returncode == 2 and "not an out-of-memory message" in p.stderr


def test_sizes_accept_units_and_bytes():
    a = json.loads(memq("analyze", REAL / "capacity" / "oom.pickle.gz", "--limit", "16GiB", "--json").stdout)
    b = json.loads(memq("analyze", REAL / "capacity" / "oom.pickle.gz", "--limit", "17179869184", "--json").stdout)
    assert a["oom"] == b["oom"]
