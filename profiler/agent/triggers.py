"""What makes the agent act: step and epoch marks (mark_step, mark_epoch, torch's optimizer step hook),
a manual or signal-requested snapshot, periodic snapshots, the ticker thread, and the OOM observer.

The triggers own where the run is (`Position`: step, epoch, what marks the steps) and when things are
due; what to record and send at each event is the recorder's (agent/recorder.py), reached through the
narrow `RecorderPort` below. Every entry point catches every exception: the training loop never sees
one from here.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from memq.agent.guard import Guard
from memq.agent.outcome import Outcome
from memq.agent.steps import Position
from memq.agent.watch import SourceWatch
from memq.config import AgentOptions


class RecorderPort(Protocol):
    """What the triggers ask of the recorder (agent/recorder.py `Recorder`)."""

    policy: Any

    def start(self, now: float) -> None: ...
    def boundary(self, step: int | None, epoch: int | None, ms: float | None, tokens: int | None,
                 epochs_marked: bool, now: float) -> None: ...
    def relabel_last(self, hook_step: int | None, step: int | None, epoch: int | None,
                     tokens: int | None) -> None: ...
    def epoch_end(self, snapshot_on_epoch: bool) -> None: ...
    def periodic_at_boundary(self) -> None: ...
    def periodic_on_tick(self, no_steps: bool, elapsed_s: float) -> None: ...
    def on_time(self, elapsed_s: float) -> None: ...
    def sample_if_due(self, now: float) -> None: ...
    def flush_if_due(self, now: float) -> None: ...
    def flush_stats(self) -> None: ...
    def take_snapshot(self, trigger: str, **kw: Any) -> bool: ...


class Ticker:
    """A daemon thread that calls `work` every `tick_s` seconds (every 0.1 s at most while `hurry()`
    says so), and at once when woken. A failing `work` is counted, never fatal."""

    def __init__(self, tick_s: float, work: Callable[[], None], hurry: Callable[[], bool], guard: Guard):
        self.tick_s, self._work, self._hurry, self._guard = tick_s, work, hurry, guard
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="memq-agent-ticker", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(min(self.tick_s, 0.1) if self._hurry() else self.tick_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._work()
            except Exception:  # noqa: BLE001
                self._guard.error()


class Triggers:
    def __init__(self, options: AgentOptions, *, recorder: RecorderPort, watch: SourceWatch, position: Position,
                 guard: Guard, on_optimizer: Callable[[Any], None] = lambda opt: None):
        self.recorder, self.watch, self.position, self._guard = recorder, watch, position, guard
        self._on_optimizer = on_optimizer
        self.step_hook = options.step_hook
        self.snapshot_every_s = options.snapshot_every_s
        self.snapshot_on_epoch = options.snapshot_on_epoch
        self.stats_interval_s = options.stats_interval_s
        self.hook_handle: Any = None  # torch's global optimizer step post-hook, once installed
        self._hook_opt: int | None = None  # id() of the optimizer whose steps are the steps
        self._user_marks = False
        self._tokens: int | None = None  # input size of the step that just ended (mark_step(tokens=))
        self._epochs_marked = False
        self._last_step_t = 0.0
        self._t0 = time.monotonic()
        self._next_periodic = 0.0
        self._signal_evt = threading.Event()
        self._closed = False
        # poll faster until CUDA is initialised, so that the observer is attached early
        self.ticker = Ticker(options.tick_s, self.tick, lambda: not (watch.armed or not watch.available), guard)

    def start(self, now: float) -> None:
        self._next_periodic = now + self.snapshot_every_s if self.snapshot_every_s > 0 else float("inf")
        self.ticker.start()

    def close(self) -> None:
        """No trigger acts from now on (the agent is stopping); the ticker ends."""
        self._closed = True
        self.ticker.stop()
        if self.hook_handle is not None:
            self._guard.call(self.hook_handle.remove)
            self.hook_handle = None

    # -- the training loop's marks --------------------------------------------------------------------
    def mark_step(self, step: int | None = None, epoch: int | None = None, tokens: int | None = None) -> None:
        if self._closed:
            return
        try:
            if tokens is not None:
                self._tokens = int(tokens)
            if not self._user_marks:
                self._user_marks = True  # from now on the job's marks are the boundaries, not the hook
                pos = self.position
                if pos.source == "optimizer_hook":
                    # the hook already closed this step: this call is the same boundary, in the job's terms
                    pos.source = "mark_step"
                    hook_step = pos.step
                    if step is not None:
                        pos.step = int(step)
                    if epoch is not None:
                        pos.epoch = int(epoch)
                    self.recorder.relabel_last(hook_step, pos.step, pos.epoch, self._tokens)
                    self._tokens = None
                    return
            self._boundary("mark_step", step, epoch)
        except Exception:  # noqa: BLE001
            self._guard.error()

    def mark_epoch(self, epoch: int | None = None) -> None:
        if self._closed:
            return
        try:
            self._epochs_marked = True
            if epoch is not None:
                self.position.epoch = int(epoch)
            if not self.watch.armed:
                self.watch.check()
            if self.watch.armed:
                self.recorder.epoch_end(self.snapshot_on_epoch)
            self.recorder.flush_stats()
        except Exception:  # noqa: BLE001
            self._guard.error()

    def snapshot(self, trigger: str = "manual") -> bool:
        try:
            return self.recorder.take_snapshot(trigger)
        except Exception:  # noqa: BLE001
            self._guard.error()
            return False

    def request_signal_snapshot(self) -> None:
        """From a signal handler: the ticker takes the snapshot (a handler must not)."""
        self._signal_evt.set()
        self.ticker.wake()

    # -- torch's optimizer step hook ----------------------------------------------------------------
    def install_step_hook(self) -> None:
        if not self.step_hook or self.hook_handle is not None or "torch" not in sys.modules:
            return
        optim = sys.modules.get("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            self.hook_handle = register(self._on_optimizer_step)

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        """torch's global optimizer step post-hook: a step boundary when the job marks none."""
        if self._closed:
            return
        try:
            if self._hook_opt is None:
                self._hook_opt = id(optimizer)
                self._on_optimizer(optimizer)
            elif id(optimizer) != self._hook_opt:
                return  # a second optimizer (GAN, several models): the first one's steps are the steps
            if not self._user_marks:
                self._boundary("optimizer_hook", None, None)
        except Exception:  # noqa: BLE001
            self._guard.error()

    def _boundary(self, source: str, step: int | None, epoch: int | None) -> None:
        now = time.monotonic()
        pos = self.position
        pos.source = source
        pos.step = (pos.step + 1 if pos.step is not None else 0) if step is None else int(step)
        if epoch is not None:
            pos.epoch = int(epoch)
        ms = (now - self._last_step_t) * 1000 if self._last_step_t else None
        self._last_step_t = now
        if not self.watch.armed:
            self.watch.check()
            if not self.watch.armed:
                return
        if now >= self._next_periodic:
            self._next_periodic = now + self.snapshot_every_s
            self.recorder.periodic_at_boundary()
        tokens, self._tokens = self._tokens, None
        self.recorder.boundary(pos.step, pos.epoch, ms, tokens, self._epochs_marked, now)

    # -- the ticker -----------------------------------------------------------------------------------
    def tick(self) -> None:
        """What needs no step boundary: signal-requested snapshots, and for jobs that mark no steps (or
        stopped marking them), periodic snapshots, the time-based policy and stats; stats flushes."""
        now = time.monotonic()
        if not self.watch.armed:
            self.watch.check()
        if self._signal_evt.is_set():
            self._signal_evt.clear()
            self.recorder.take_snapshot("signal")
        stepping = self._last_step_t and now - self._last_step_t < max(5.0, self.stats_interval_s)
        if self.watch.armed and not stepping:
            no_steps = self.recorder.policy.steps_seen == 0
            if now >= self._next_periodic:
                self._next_periodic = now + self.snapshot_every_s
                self.recorder.periodic_on_tick(no_steps, now - self._t0)
            if no_steps:
                self.recorder.on_time(now - self._t0)
            self.recorder.sample_if_due(now)
        self.recorder.flush_if_due(now)


class OomObserver:
    """The allocator's OOM observer: runs in the allocating thread just before the OOM is raised. It
    takes the snapshot while the failing state is still there, then returns: the error then reaches
    the user unchanged."""

    def __init__(self, *, source: Any, recorder: Any, outcome: Outcome, position: Position, guard: Guard,
                 max_snapshots: int = 4):
        self.source, self.recorder, self.outcome, self.position = source, recorder, outcome, position
        self._guard = guard
        self.max_snapshots = max_snapshots
        self.snapshots = 0
        self._closed = False

    def close(self) -> None:
        self._closed = True

    def on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        if self._closed:
            return
        try:
            self.outcome.oom()
            self.recorder.on_oom()
            if self.snapshots >= self.max_snapshots:
                return
            self.snapshots += 1
            total = self._guard.call(lambda: self.source.device_total(device))
            if isinstance(total, int) and 0 < int(device_alloc) < total:
                self.recorder.set_limit(int(device_alloc))  # the observer's device_alloc is the process's cap
            oom = {"alloc": int(alloc), "device_alloc": int(device_alloc), "device_free": int(device_free),
                   "device_total": total, "message": None}
            # The observer runs in the allocating thread: its Python stack is the failing allocation's
            # line, which a snapshot taken with recording paused has no other way to show (once per OOM).
            frames = python_stack(sys._getframe(0).f_back)
            evt = self.outcome.message_wait()
            outcome = self.outcome

            def finish(item) -> None:
                item.payload["oom"]["message"] = outcome.exception_text

            self.recorder.take_snapshot("oom", payload={"oom": oom, "device": int(device),
                                                        "step_completed": self.position.step},
                                        wait=evt, finish=finish, oom_frames=frames)
            self.recorder.after_oom_snapshot()
        except Exception:  # noqa: BLE001 - never replace the user's OOM with ours
            self._guard.error()


MAX_OOM_FRAMES = 48  # innermost frames kept: enough to reach the training script from inside torch


def python_stack(frame) -> list[dict]:
    """The Python frames of `frame` and its callers, innermost first, as the snapshot's own frames are
    ({filename, line, name}); no source lines are read (linecache would touch the disk). `frame` is None
    when the allocation came from a thread with no Python code (autograd's backward thread): no frames."""
    out = []
    while frame is not None and len(out) < MAX_OOM_FRAMES:
        code = frame.f_code
        out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out
