"""`memq whatif` through click's CliRunner: the --json contract and bad-input exits."""

from __future__ import annotations

import json

from click.testing import CliRunner

from memq.cli import cli
from tests.helpers import REAL

OOM = str(REAL / "frag_dynamic_1.15" / "oom.pickle.gz")
LIMIT = "20244645632"


def invoke(*args):
    return CliRunner().invoke(cli, ["whatif", *args])


def test_json_contract_shape():
    conf = "expandable_segments:True,max_split_size_mb:128"
    r = invoke(OOM, "--limit", LIMIT, "--conf", "expandable_segments:True", "--conf", conf, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert isinstance(out, list) and len(out) == 3
    assert [o["conf"] for o in out] == ["", "expandable_segments:True", conf]  # echoed unchanged
    for o in out:
        assert o["predicted_oom"] in (True, False, None)
        assert o["verdict"] in ("oom", "fits", "survives_window", "not_assessable")
        assert isinstance(o["peak_reserved_bytes"], int) and not isinstance(o["peak_reserved_bytes"], bool)
        assert o["limit_bytes"] == int(LIMIT)
        if o["predicted_oom"] is None:  # not assessable: says why, never a confidence
            assert o["verdict"] == "not_assessable" and o["confidence"] == "none" and o["reason"]
        else:
            assert o["headroom_bytes"] == o["limit_bytes"] - o["peak_reserved_bytes"]
    assert out[0]["predicted_oom"] is True and out[0]["verdict"] == "oom"  # the recorded run's OOM
    # this 8000-entry window starts mid-run and the OOM reproduces only from the recorded segments:
    # a success under another setting from a fresh start of the window says nothing
    assert out[1]["predicted_oom"] is None and "too short" in out[1]["reason"]
    assert out[0]["fidelity"]["segment_event_share"] == 1.0


def test_limit_accepts_units():
    r = invoke(OOM, "--limit", "18.85GiB", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)[0]["predicted_oom"] is True


def test_sweep_lists_the_standard_settings():
    r = invoke(OOM, "--limit", LIMIT, "--sweep", "--json")
    assert r.exit_code == 0, r.output
    confs = [o["conf"] for o in json.loads(r.output)]
    assert confs[0] == ""
    for c in ("expandable_segments:True", "max_split_size_mb:128", "garbage_collection_threshold:0.6",
              "roundup_power2_divisions:4"):
        assert c in confs


def test_text_output():
    r = invoke(OOM, "--limit", LIMIT, "--conf", "expandable_segments:True")
    assert r.exit_code == 0, r.output
    assert "(recorded)" in r.output and "OOM" in r.output


def test_bad_conf_exits_2_with_one_line():
    r = invoke(OOM, "--limit", LIMIT, "--conf", "max_split_size_mb:5")
    assert r.exit_code == 2
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert len(lines) == 1 and "max_split_size_mb" in lines[0]
    assert "Traceback" not in r.output


def test_unknown_option_exits_2():
    r = invoke(OOM, "--conf", "expandable:True")
    assert r.exit_code == 2
    assert "unrecognized allocator option 'expandable'" in r.output


def test_missing_file_exits_2():
    r = invoke(str(REAL / "nope.pickle.gz"), "--limit", LIMIT)
    assert r.exit_code == 2
    assert len([x for x in r.output.splitlines() if x.strip()]) == 1


def test_python_api_for_the_analysis():
    from memq.analysis.whatif import run_whatif_dicts, simulate_whatif
    from memq.load import load_snapshot_file

    snap = load_snapshot_file(OOM).snapshot
    out = simulate_whatif(snap, int(LIMIT), ["", "expandable_segments:True"])
    assert [o["conf"] for o in out] == ["", "expandable_segments:True"]
    assert out[0]["predicted_oom"] is True and out[0]["shortfall_bytes"] > 0
    swept = run_whatif_dicts(snap, int(LIMIT))
    assert swept[0]["conf"] == "" and len(swept) >= 6
    assert {"conf", "predicted_oom", "peak_reserved_bytes", "headroom_bytes"} <= set(swept[0])
