"""The timeline overview's lowest total per column (`timeline.low`) on what the agent sends at its
defaults: a warm-up trace of some thousands of events, then snapshots with no trace at all."""

from __future__ import annotations

import dataclasses

from memq.web.snapshot_view import MAX_POINTS, _Stacks, category_timeline
from tests.analysis.agent_data import rank_folder, spool_run


def test_agent_default_snapshots_give_a_low_per_point_and_none_without_a_trace():
    snaps, _ctx, _trig = spool_run(rank_folder("accum", "defaults"))
    traced = [s for s in snaps if s.trace]
    bare = [s for s in snaps if not s.trace]
    assert traced and bare  # the agent's defaults: the warm-up traced, the later snapshots not
    for snap in bare:
        tl = category_timeline(snap, _Stacks(), 0)
        assert tl["low"] == [] and tl["levels"] == []  # nothing to fold, nothing drawn
    tl = category_timeline(traced[0], _Stacks(), 0)
    n = tl["events"]
    assert n > MAX_POINTS  # 16,826 events: folded, 17 a column
    assert len(tl["low"]) == len(tl["idx"]) == len(tl["levels"])
    assert all(lo <= sum(row) for lo, row in zip(tl["low"], tl["levels"], strict=True))
    assert any(lo < sum(row) for lo, row in zip(tl["low"], tl["levels"], strict=True))


def test_a_short_trace_is_not_folded_and_its_low_is_its_total():
    snaps, _ctx, _trig = spool_run(rank_folder("accum", "defaults"))
    snap = next(s for s in snaps if s.trace)
    traces = [list(t) for t in snap.traces]
    traces[snap.trace_device] = traces[snap.trace_device][:MAX_POINTS]  # one event a column
    short = dataclasses.replace(snap, traces=traces)
    assert len(short.trace) == MAX_POINTS
    tl = category_timeline(short, _Stacks(), 0)
    assert tl["low"] == [sum(row) for row in tl["levels"]]
