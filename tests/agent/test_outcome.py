"""How the run ends (profiler/agent/outcome.py), alone: the status run_end carries, the exception text the
OOM snapshot waits for, and why a rank ended early."""

from __future__ import annotations

import pytest

from memq.agent.outcome import Outcome, end_reason


class OutOfMemoryError(RuntimeError):
    pass


class DistBackendError(RuntimeError):
    pass


def test_an_oom_ends_the_run_as_oom_and_releases_its_snapshot():
    o = Outcome()
    evt = o.message_wait()
    o.note_exception(OutOfMemoryError("Tried to allocate 2.00 GiB"))
    assert o.status == "oom" and o.exception_text == "Tried to allocate 2.00 GiB" and evt.is_set()
    assert o.end_reason is None  # an OOM is this rank's own end, said by its status


def test_another_error_crashes_the_run_and_keeps_the_first_text():
    o = Outcome()
    o.note_exception(ValueError("bad batch"))
    o.note_exception(KeyError("later"))
    assert o.status == "crashed" and o.exception_text == "ValueError: bad batch" and o.end_reason == "exception"


@pytest.mark.parametrize(("exc", "reason"), [
    (DistBackendError("x"), "process_group_aborted"),
    (RuntimeError("NCCL error: unhandled system error"), "process_group_aborted"),
    (RuntimeError("ProcessGroup abort after timeout"), "process_group_aborted"),
    (RuntimeError("process group is fine"), "exception"),  # neither abort nor timeout
    (type("SignalException", (Exception,), {})("stop"), "sigterm"),
    (ValueError("x"), "exception"),
])
def test_why_a_rank_ended(exc, reason):
    assert end_reason(exc) == reason


def test_sigterm_and_completion_do_not_overwrite_an_earlier_end():
    o = Outcome()
    o.terminated()
    o.completed()
    assert (o.status, o.end_reason) == ("crashed", "sigterm")
    o = Outcome()
    o.oom()
    o.terminated()
    o.completed()
    assert (o.status, o.end_reason) == ("oom", "sigterm")
    o = Outcome()
    o.note_exception(RuntimeError("NCCL communicator was aborted"))
    o.terminated()  # the launcher's kill after the collective failed: the first reason stays
    assert (o.status, o.end_reason) == ("crashed", "process_group_aborted")
    o = Outcome()
    o.completed()
    assert o.status == "completed"


def test_an_exception_whose_text_fails_is_swallowed():
    class Hostile(Exception):
        def __str__(self):
            raise RuntimeError("no text")

    o = Outcome()
    o.note_exception(Hostile())
    assert o.status == "running"
