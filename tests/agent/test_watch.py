"""When the agent's source can be used (profiler/agent/watch.py SourceWatch), alone: each stage's
callables run in order and once, readiness is retried until CUDA is initialised, failures are counted."""

from __future__ import annotations

from memq.agent.watch import SourceWatch

from .parts import Source, guard


def watch(src):
    calls = []
    g = guard()
    w = SourceWatch(src, g, each_check=[lambda: calls.append("each")], on_present=[lambda: calls.append("present")],
                    on_ready=[lambda: calls.append("ready1"), lambda: calls.append("ready2")])
    return w, calls, g


def test_present_then_ready_each_once_in_order():
    src = Source(ready=False)
    w, calls, _ = watch(src)
    w.check()
    assert (w.available, w.armed) == (True, False) and calls == ["each", "present"]
    w.check()
    src._ready = True
    w.check()
    w.check()
    assert w.armed and calls == ["each", "present", "each", "each", "ready1", "ready2", "each"]


def test_a_failing_readiness_check_is_counted_and_retried():
    src = Source(fail={"ready"})
    w, calls, g = watch(src)
    w.check()
    assert not w.armed and g.counters.snapshot()["errors"] == 1
    src.fail.clear()
    w.check()
    assert w.armed and calls.count("ready1") == 1


def test_a_failing_stage_is_counted_not_raised():
    src = Source(fail={"present"})
    w, calls, g = watch(src)
    w.check()
    assert not w.available and calls == ["each"] and g.counters.snapshot()["errors"] == 1
