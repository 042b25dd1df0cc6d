"""A reason said once (issue 23 item 4): the same 40-word "not assessable" reason was printed for every
setting of a sweep in `memq whatif --sweep`, `memq history` and the web what-if table, and again inside
a recommendation's green "expected effect". Real snapshot: frag_dynamic_1.15, whose 8,000-entry window is
too short to rebuild the fragmentation that caused its OOM."""

from __future__ import annotations

import subprocess
import sys

from memq.render.reasons import said_once
from tests.helpers import REAL
from tests.workers.stack import ROOT

SNAP = REAL / "frag_dynamic_1.15" / "oom.pickle.gz"


def test_whatif_sweep_says_a_shared_reason_once():
    out = subprocess.run([sys.executable, "-m", "memq", "whatif", str(SNAP), "--limit", "20244645632", "--sweep"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert text.count("the trace is too short to rebuild the fragmentation") == 1, text
    assert "as for expandable_segments:True" in text


def test_said_once_points_later_rows_at_the_first():
    rows = [{"conf": "a", "reason": "long"}, {"conf": "b", "reason": None}, {"conf": "c", "reason": "long"},
            {"conf": "", "reason": "other"}]
    assert said_once(rows) == ["long", None, "as for a", "other"]


def test_a_recommendation_does_not_repeat_the_not_assessable_reason():
    from memq.analysis import analyze
    from memq.analysis.whatif import simulate_whatif
    from memq.load import load_snapshot_file
    from memq.model import OomContext

    snap = load_snapshot_file(SNAP).snapshot
    ctx = OomContext(limit_bytes=20244645632)
    sims = simulate_whatif(snap, 20244645632, ["", "expandable_segments:True", "max_split_size_mb:128"])
    assert all(s["predicted_oom"] is None for s in sims[1:])  # the window is too short: not assessable
    r = analyze([snap], ctx, whatif=sims)
    effects = " ".join(x["expected_effect"] for x in r["diagnosis"]["recommendations"])
    assert "too short to rebuild" not in effects
    assert "cannot assess" in effects


def _whatif(*args) -> str:
    out = subprocess.run([sys.executable, "-m", "memq", "whatif", *map(str, args)],
                         capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_short_is_said_beside_the_reasons_live_plus_request():
    # "short 600.00 MiB" sat beside "live 12.28 GiB + the request 4.12 GiB exceed the limit 16.00 GiB"
    # (0.40 GiB over) with nothing saying they measure two things
    text = _whatif(SNAP, "--limit", "17179869184", "--sweep")
    assert "short 600.00 MiB" in text and "exceed the limit 16.00 GiB" in text
    assert text.count("short: what the allocator lacked at the failure") == 1, text


def test_a_setting_not_assessable_shows_no_peak():
    # the replay under the device-bound limit does not reproduce the OOM: its 8.50 GiB peak answered nothing
    text = _whatif(REAL / "frag_synthetic" / "oom.pickle.gz")
    row = next(x for x in text.splitlines() if x.startswith("(recorded)"))
    assert "not assessable" in row and "GiB" not in row, row
    assert "short:" not in text
