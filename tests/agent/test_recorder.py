"""The recorder alone (profiler/agent/recorder.py): built from its options with a stand-in source and
transport, no triggers, no Redis, no thread. What it records, what it sends, and that a failing source
is counted, never raised."""

from __future__ import annotations

from memq.agent.job import JobObjects
from memq.agent.recorder import MAX_SAMPLES, Recorder
from memq.agent.steps import FULL_READ_BOUNDARIES, Position
from memq.agent.watch import SourceWatch
from memq.config import AgentOptions, Settings

from .parts import GIB, Source, Transport, guard


def build(source=None, armed=True, end_reason=None, **options):
    g = guard()
    src = source or Source()
    watch = SourceWatch(src, g)
    watch.available = watch.armed = armed
    opts = AgentOptions(stats_interval_s=0, snapshot_every_s=0, **options).resolve(Settings())
    pos = Position()
    rec = Recorder(opts, source=src, transport=Transport(), job=JobObjects(optimizer="AdamW", guard=g),
                   position=pos, watch=watch, guard=g, end_reason=lambda: end_reason, run="r", rank=3,
                   world_size=8)
    return rec, src, pos, g


def test_no_snapshot_before_the_source_is_armed_or_after_close():
    rec, src, _, _ = build(armed=False)
    assert rec.take_snapshot("manual") is False and src.snapshots == 0
    rec._watch.armed = True
    assert rec.take_snapshot("manual") is True
    rec.close()
    assert rec.take_snapshot("manual") is False and src.snapshots == 1


def test_an_oom_snapshot_is_of_the_step_in_progress_and_carries_its_frames():
    rec, _, pos, _ = build()
    pos.step, pos.epoch, pos.source = 41, 2, "mark_step"
    frames = [{"filename": "train.py", "line": 9, "name": "step"}]
    rec.take_snapshot("oom", payload={"oom": {}}, oom_frames=frames)
    rec.take_snapshot("manual", oom_frames=frames)
    oom, manual = rec.transport.items
    assert (oom.step, oom.epoch, manual.step) == (42, 2, 41)
    md = oom.obj["memq_agent"]
    assert md["step_in_progress"] == 42 and md["step_completed"] == 41 and md["steps_source"] == "mark_step"
    assert md["oom_frames"] == frames and manual.obj["memq_agent"]["oom_frames"] is None
    assert md["run"] == "r" and md["rank"] == 3 and md["optimizer"] == "AdamW" and md["limit_bytes"] is None


def test_a_recorded_stretch_is_snapshotted_before_pausing():
    """Pausing empties the trace: the warm-up's snapshot comes first, then the pause."""
    rec, src, _, _ = build(history="auto")
    rec.on_present()
    assert rec.recording is True and src.history == [True]
    rec.set_recording(False, at_boundary=True)
    assert rec.transport.kinds() == ["snapshot:periodic"] and rec.transport.items[0].payload["reason"] == "warmup"
    assert src.history == [True, False] and rec.recording is False
    rec.set_recording(False)  # already paused: nothing more
    assert len(rec.transport.items) == 1 and src.history == [True, False]


def test_warmup_boundaries_end_in_a_comparable_snapshot_then_pause():
    rec, src, pos, _ = build(history="auto", warmup_steps=3)
    rec.on_present()
    for i in range(3):
        pos.step = i
        rec.boundary(i, 0, 50.0, None, False, now=float(i))
    assert rec.transport.kinds().count("snapshot:periodic") == 1
    snap = next(i for i in rec.transport.items if i.kind == "snapshot")
    assert snap.payload == {"comparable": True, "reason": "warmup", "took_ms": snap.payload["took_ms"],
                            "recording": True, "policy": "warmup"}
    assert src.history[-1] is False and rec.recording is False and rec.policy.steps_seen == 3
    assert [f["step"] for f in rec.tracker.figures] == [0, 1, 2]


def test_samples_beyond_the_cap_drop_the_oldest_and_are_counted():
    rec, _, _, g = build(source=Source(stats={"allocated_bytes.all.current": 1}))
    for i in range(MAX_SAMPLES):
        rec.sample_stats(float(i))
    assert g.counters.snapshot()["dropped"] == 0  # just at the cap: nothing dropped
    rec.sample_stats(1e6)
    assert g.counters.snapshot()["dropped"] == 1  # one over
    rec.flush_stats()
    (batch,) = rec.transport.items
    assert batch.kind == "stats" and len(batch.payload["samples"]) == MAX_SAMPLES


def test_a_failing_source_is_counted_and_never_raised():
    src = Source(fail={"step_signals", "stats", "set_history"})
    rec, _, pos, g = build(source=src)
    rec.on_present()
    pos.step = 0
    rec.boundary(0, 0, 10.0, 5, False, now=0.0)
    rec.sample_stats(0.0)
    # history on at present and at the boundary, the reading, the boundary's sample and this one
    assert g.counters.snapshot()["errors"] == 5 and rec.recording is None
    assert rec.tracker.figures == type(rec.tracker.figures)() and rec.policy.steps_seen == 1


def test_the_first_boundaries_are_all_read_then_thinned():
    src = Source()
    rec, _, _, _ = build(source=src, step_budget=1e-9)  # every reading is over budget: the largest stride
    for i in range(FULL_READ_BOUNDARIES + 5):
        rec.boundary(i, 0, 1.0, None, False, now=float(i))
    assert len(rec.tracker.figures) == FULL_READ_BOUNDARIES  # just over: the stride holds
    assert rec.reading.stride > 1


def test_rank_figures_summarise_the_step_peaks_and_say_why_the_rank_ended():
    sigs = [(GIB, 2 * GIB, peak, 2 * GIB, 0) for peak in (3 * GIB, 5 * GIB, 4 * GIB)]
    rec, _, pos, _ = build(source=Source(signals=sigs + [(GIB, 2 * GIB, GIB, 2 * GIB, 0)]),
                           end_reason="sigterm")
    for i in range(3):
        pos.step = i
        rec.boundary(i, 0, 10.0, None, False, now=float(i))
    fig = rec.rank_figures()
    assert fig["step_peaks"] == {"count": 3, "median_peak_allocated": 4 * GIB, "max_peak_allocated": 5 * GIB,
                                 "max_peak_reserved": 2 * GIB, "max_step": 1, "last_peak_allocated": 4 * GIB}
    assert fig["peak_allocated_bytes"] == 5 * GIB and fig["limit_bytes"] == 10 * GIB
    assert fig["end_reason"] == "sigterm" and fig["last_step"] == 2 and fig["steps"] == 3


def test_the_announcement_goes_once_with_the_options_and_the_job():
    rec, _, _, _ = build(metadata={"team": "x"})
    rec.announce()
    rec.announce()
    (start,) = rec.transport.items
    md = start.payload
    assert start.kind == "run_start" and md["world_size"] == 8 and md["team"] == "x"
    assert md["optimizer"] == "AdamW" and md["agent"]["codec"] == "gzip" and md["source"] == "parts"
