"""The one rule a run's status moves by (analysis/run_status.py)."""

from __future__ import annotations

import pytest

from memq.analysis import run_status as rs
from memq.errors import BadInput


def test_a_status_moves_up_only():
    assert rs.moves(None, "running") and rs.moves("running", "completed") and rs.moves("completed", "crashed")
    assert rs.moves("crashed", "oom")  # a crash whose snapshots show an OOM is an OOM
    assert not rs.moves("oom", "completed") and not rs.moves("oom", "crashed") and not rs.moves("oom", "oom")
    assert not rs.moves("crashed", "completed") and not rs.moves("completed", "running")


def test_a_status_a_person_gives_is_set_as_given():
    assert rs.moves("oom", "completed", given=True) and rs.moves("crashed", "running", given=True)
    with pytest.raises(BadInput, match="not one of running, completed, crashed, oom"):
        rs.replaced_by("error")


def test_run_end_and_ingest():
    assert rs.from_run_end("crashed") == "crashed" and rs.from_run_end("weird") == "completed"
    assert rs.from_run_end(None) == "completed"
    assert rs.after_ingest(None, oom=True, created=False) == "oom"
    assert rs.after_ingest(None, oom=False, created=True) == "completed"
    assert rs.after_ingest(None, oom=False, created=False) is None
    assert rs.after_ingest("crashed", oom=True, created=True) == "crashed"
    with pytest.raises(BadInput):
        rs.after_ingest("error", oom=False, created=True)
