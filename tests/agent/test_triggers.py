"""The triggers alone (profiler/agent/triggers.py): step and epoch marks, the optimizer hook's steps,
periodic and signal-requested snapshots, the ticker and the OOM observer, each driving a stand-in
recorder that only notes what it was asked. No Redis, no transport."""

from __future__ import annotations

import sys
import threading
import time

from memq.agent.outcome import Outcome
from memq.agent.policy import RecordingPolicy
from memq.agent.steps import Position
from memq.agent.transport import Item
from memq.agent.triggers import MAX_OOM_FRAMES, OomObserver, Ticker, Triggers, python_stack
from memq.agent.watch import SourceWatch
from memq.config import AgentOptions, Settings

from .parts import GIB, Source, guard


class Recorder:
    """Notes every call the triggers make (RecorderPort); `fail` names the ones that raise."""

    def __init__(self, fail=()):
        self.calls: list[tuple] = []
        self.fail = set(fail)
        self.policy = RecordingPolicy()
        self.snapshots: list[tuple] = []

    def __getattr__(self, name):
        def call(*args, **kw):
            self.calls.append((name, *args))
            if name in self.fail:
                raise RuntimeError(name)
            if name == "take_snapshot":
                self.snapshots.append((args[0], kw))
                return True
            return None
        return call

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def build(armed=True, recorder=None, **options):
    g = guard()
    src = Source(ready=armed)
    watch = SourceWatch(src, g)
    watch.check()
    rec = recorder or Recorder()
    seen = []
    opts = AgentOptions(**{"snapshot_every_s": 0, "tick_s": 3600, **options}).resolve(Settings())
    t = Triggers(opts, recorder=rec, watch=watch, position=Position(), guard=g, on_optimizer=seen.append)
    return t, rec, g, seen


def test_marks_number_the_steps_and_hand_the_tokens_once():
    t, rec, _, _ = build()
    t.mark_step(tokens=128)
    t.mark_step()
    t.mark_step(10, 2)
    bounds = [c for c in rec.calls if c[0] == "boundary"]
    assert [(c[1], c[2], c[4]) for c in bounds] == [(0, None, 128), (1, None, None), (10, 2, None)]
    assert bounds[0][3] is None and bounds[1][3] > 0  # the first step has no duration
    assert t.position.step == 10 and t.position.epoch == 2 and t.position.source == "mark_step"


def test_the_optimizer_hook_marks_steps_until_the_job_does():
    t, rec, _, seen = build()
    opt, other = object(), object()
    t._on_optimizer_step(opt, (), {})
    t._on_optimizer_step(other, (), {})  # a second optimizer's steps are not the steps
    assert t.position.step == 0 and t.position.source == "optimizer_hook" and seen == [opt]
    t.mark_step(100, 1, tokens=7)  # the same boundary the hook closed, in the job's terms
    assert rec.calls[-1] == ("relabel_last", 0, 100, 1, 7) and rec.names().count("boundary") == 1
    t._on_optimizer_step(opt, (), {})  # the job marks now: the hook no longer does
    t.mark_step(101, 1)
    assert rec.names().count("boundary") == 2 and t.position.step == 101


def test_nothing_reaches_the_recorder_before_the_source_is_armed():
    t, rec, _, _ = build(armed=False)
    t.mark_step(0, 0)
    t.mark_epoch(0)
    assert rec.names() == ["flush_stats"] and t.position.step == 0  # the position still moves
    t.watch.source._ready = True
    t.mark_step(1, 0)
    assert rec.names()[-1] == "boundary" and t.watch.armed


def test_a_periodic_snapshot_is_due_once_per_period_at_the_boundaries():
    t, rec, _, _ = build(snapshot_every_s=3600)
    t.start(time.monotonic() - 3601)  # the first period is over
    try:
        for i in range(3):
            t.mark_step(i, 0)
    finally:
        t.close()
    assert rec.names().count("periodic_at_boundary") == 1


def test_the_epoch_end_goes_to_the_recorder_then_the_stats():
    t, rec, _, _ = build(snapshot_on_epoch=False)
    t.mark_epoch(4)
    assert rec.calls == [("epoch_end", False), ("flush_stats",)] and t.position.epoch == 4


def test_a_signal_request_is_taken_by_the_ticker_not_the_handler():
    t, rec, _, _ = build()
    t.request_signal_snapshot()
    assert rec.snapshots == []
    t.tick()
    assert rec.snapshots == [("signal", {})]
    t.tick()
    assert len(rec.snapshots) == 1


def test_a_failing_recorder_is_counted_and_never_raised():
    t, rec, g, _ = build(recorder=Recorder(fail={"boundary", "epoch_end", "take_snapshot"}))
    t.mark_step(0, 0)
    t.mark_epoch(0)
    assert t.snapshot() is False
    assert g.counters.snapshot()["errors"] == 3


def test_closed_triggers_do_nothing():
    t, rec, _, _ = build()
    t.close()
    t.mark_step(0, 0)
    t.mark_epoch(0)
    t._on_optimizer_step(object(), (), {})
    assert rec.calls == [] and t.position.step is None


def test_the_ticker_works_until_stopped_and_survives_its_work_failing():
    g = guard()
    runs = []

    def work():
        runs.append(1)
        raise RuntimeError("tick")

    tk = Ticker(3600, work, lambda: False, g)
    tk.start()
    for _ in range(3):
        tk.wake()
        deadline = time.monotonic() + 5
        n = len(runs)
        while len(runs) == n and time.monotonic() < deadline:
            time.sleep(0.01)
    tk.stop()
    tk.thread.join(5)
    assert not tk.thread.is_alive() and len(runs) == 3 and g.counters.snapshot()["errors"] == 3


# -- the OOM observer ------------------------------------------------------------------------------------
class OomRecorder:
    def __init__(self):
        self.limit = None
        self.oom_calls = 0
        self.snaps: list[tuple] = []
        self.after = 0

    def on_oom(self):
        self.oom_calls += 1

    def set_limit(self, cap):
        self.limit = cap

    def take_snapshot(self, trigger, **kw):
        self.snaps.append((trigger, kw))
        return True

    def after_oom_snapshot(self):
        self.after += 1


def observer(max_snapshots=2):
    rec, out, pos = OomRecorder(), Outcome(), Position(step=6)
    return OomObserver(source=Source(), recorder=rec, outcome=out, position=pos, guard=guard(),
                       max_snapshots=max_snapshots), rec, out


def _allocating_line(obs):
    obs.on_oom(0, 2 * GIB, 20 * GIB, GIB)


def test_the_observer_snapshots_up_to_its_cap_with_the_failing_line():
    obs, rec, out = observer(max_snapshots=2)
    for _ in range(3):
        _allocating_line(obs)
    assert out.status == "oom" and rec.oom_calls == 3 and obs.snapshots == 2 and len(rec.snaps) == 2  # just over
    trigger, kw = rec.snaps[0]
    assert trigger == "oom" and kw["payload"]["step_completed"] == 6
    assert kw["payload"]["oom"] == {"alloc": 2 * GIB, "device_alloc": 20 * GIB, "device_free": GIB,
                                    "device_total": 80 * GIB, "message": None}
    assert kw["oom_frames"][0]["name"] == "_allocating_line"  # the caller's frame, not the observer's
    assert rec.limit == 20 * GIB and rec.after == 2  # under the device's total: the process's cap


def test_the_oom_message_waits_for_the_exception_text():
    obs, rec, out = observer()
    _allocating_line(obs)
    kw = rec.snaps[0][1]
    assert not kw["wait"].is_set()
    out.note_exception(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert kw["wait"].is_set()
    item = Item("snapshot", payload=kw["payload"])
    kw["finish"](item)
    assert item.payload["oom"]["message"] == "CUDA out of memory. Tried to allocate 2.00 GiB"


def test_a_device_alloc_of_the_whole_card_is_no_cap():
    obs, rec, _ = observer()
    obs.on_oom(0, GIB, 80 * GIB, 0)
    assert rec.limit is None


def test_python_stack_is_bounded_and_innermost_first():
    def deep(n):
        return deep(n - 1) if n else python_stack(sys._getframe(0))

    frames = deep(MAX_OOM_FRAMES + 10)
    assert len(frames) == MAX_OOM_FRAMES and all(f["name"] == "deep" for f in frames)
    assert python_stack(None) == []
    assert threading.current_thread() is threading.main_thread()
