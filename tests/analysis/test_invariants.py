"""Conservation checks on every fixture, and the trace replay against the snapshot's own totals."""

from __future__ import annotations

import pytest

from memq.analysis.memory import memory_metrics
from memq.analysis.timeline import replay
from memq.load import load_snapshot_file
from memq.snapshot import check_invariants
from tests.helpers import REAL, all_snapshot_files

REAL_FILES = [p for p in all_snapshot_files() if REAL in p.parents]


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_blocks_sum_to_segments(path):
    snap = load_snapshot_file(path).snapshot
    assert check_invariants(snap) == []
    m = memory_metrics(snap)
    assert m["allocated_bytes"] + m["pending_free_bytes"] == m["active_bytes"]
    assert m["active_bytes"] + m["free_bytes"] == m["reserved_bytes"]
    assert 0 <= m["stranded_bytes"] <= m["free_bytes"]
    assert 0.0 <= m["fragmentation_ratio"] <= 1.0


def test_replay_from_empty_matches_snapshot_where_trace_covers_the_run():
    covered = []
    for path in REAL_FILES:
        snap = load_snapshot_file(path).snapshot
        m = memory_metrics(snap)
        tl = replay(snap, m["live_requested_bytes"], m["reserved_bytes"])
        if not tl["covers_whole_run"]:
            continue  # ring buffer wrapped or recording began late: nothing to compare from zero
        covered.append(f"{path.parent.name}/{path.name}")
        # Replaying every alloc/free_completed from zero must land on the snapshot's live bytes
        # (trace sizes are requested sizes, so compare with the live blocks' requested bytes), and
        # the live blocks must be exactly the trace's unfreed allocations.
        assert tl["replayed_end_from_zero"] == m["live_requested_bytes"], path
        live = {}
        for ev in snap.trace:
            if ev.action == "alloc":
                live[ev.addr] = ev.size
            elif ev.action == "free_completed":
                live.pop(ev.addr, None)
        assert live == {b.address: b.requested_size for s in snap.segments for b in s.blocks if b.is_live}
    assert {"capacity/oom.pickle.gz", "frag_synthetic/oom.pickle.gz"} <= set(covered), covered


def test_mosaic_external_snapshot_is_analysed_and_inconsistencies_named():
    from memq.analysis import analyze

    path = REAL.parent / "external" / "mosaic_test_output.pickle"
    snap = load_snapshot_file(path).snapshot
    problems = check_invariants(snap)
    assert problems and "blocks sum to" in problems[0]
    result = analyze([snap])
    assert result["snapshots"][0]["expandable_segments"] is True
    assert result["diagnosis"]["primary_cause"] in {"healthy", "fragmentation", "capacity"}
