"""What makes the agent act: step and epoch boundaries (mark_step, mark_epoch, the optimizer's step
hook), a manual snapshot, the OOM observer, and the ticker thread (signal requests, periodic
snapshots, stats when no step is marked). A mixin of `Agent` (core.py).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import weakref

from memq.agent.steps import FLUSH_FIGURES, FULL_READ_BOUNDARIES, stride_for
from memq.agent.transport import Item

log = logging.getLogger("memq.agent")


class AgentTriggers:
    """Methods of `Agent` (core.py): the triggers."""

    # -- training-loop API -------------------------------------------------------------------------
    def mark_step(self, step: int | None = None, epoch: int | None = None, tokens: int | None = None) -> None:
        """`tokens`: optional input size of the step just ended (tokens, samples x length, pixels): kept
        with the step's figures, so the analysis can compare a failing step's input with earlier ones."""
        if self.stopped:
            return
        try:
            if tokens is not None:
                self._tokens = int(tokens)
            if not self._user_marks:
                self._user_marks = True  # from now on the job's marks are the boundaries, not the hook
                if self.steps_source == "optimizer_hook":
                    # the hook already closed this step: this call is the same boundary, in the job's terms
                    self.steps_source = "mark_step"
                    hook_step = self.step
                    if step is not None:
                        self.step = int(step)
                    if epoch is not None:
                        self.epoch = int(epoch)
                    with self._lock:
                        for rec in (self._samples[-1] if self._samples else None, self.tracker.last()):
                            if rec is not None and rec.get("step") == hook_step:
                                rec["step"], rec["epoch"] = self.step, self.epoch
                        fig = self.tracker.last()
                        if fig is not None and self._tokens is not None and fig.get("step") == self.step:
                            fig["tokens"] = self._tokens  # this step's input, not the next one's
                    self._tokens = None
                    return
            self._boundary("mark_step", step, epoch)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        """torch's global optimizer step post-hook: a step boundary when the job marks none."""
        if self.stopped:
            return
        try:
            if self._hook_opt is None:
                self._hook_opt = id(optimizer)
                self._optimizer_name = type(optimizer).__name__
                if self._optimizer is None:  # its tensors' roles go with each snapshot (agent/roles.py)
                    try:
                        self._hook_opt_ref = weakref.ref(optimizer)
                    except TypeError:
                        self._hook_opt_ref = None
            elif id(optimizer) != self._hook_opt:
                return  # a second optimizer (GAN, several models): the first one's steps are the steps
            if not self._user_marks:
                self._boundary("optimizer_hook", None, None)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _install_step_hook(self) -> None:
        if not self.step_hook or self._hook_handle is not None or "torch" not in sys.modules:
            return
        optim = sys.modules.get("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            self._hook_handle = register(self._on_optimizer_step)

    def _boundary(self, source: str, step: int | None, epoch: int | None) -> None:
        """One step ended: cheap readings, then what to record and whether to snapshot."""
        now = time.monotonic()
        self.steps_source = source
        self.step = (self.step + 1 if self.step is not None else 0) if step is None else int(step)
        if epoch is not None:
            self.epoch = int(epoch)
        ms = (now - self._last_step_t) * 1000 if self._last_step_t else None
        self._last_step_t = now
        if not self.armed:
            self._check_source()
            if not self.armed:
                return
        if now >= self._next_periodic:
            self._next_periodic = now + self.snapshot_every_s
            if self._auto_paused():
                self.policy.request_step()  # record the next step; the snapshot comes at its end
            else:
                self.take_snapshot("periodic")
        if self.tracker.boundaries <= self.tracker.warmup_steps:  # the cap is usually set by now
            self._limit = self._safe_call(self.source.limit_bytes) or self._limit
        t_read = time.perf_counter()
        fig = self._read_boundary(ms)
        if fig is not None and self._tokens is not None:
            fig["tokens"] = self._tokens
        self._tokens = None
        if fig is not None:
            self._note_peaks(fig["peak_allocated"], fig["peak_reserved"])
        dec = self.tracker.on_boundary(fig, self._limit, recording=bool(self.recording),
                                       epochs_marked=self._epochs_marked, now=now)
        if fig is not None:
            self.policy.on_stats({"reserved_bytes.all.current": fig["peak_reserved"],
                                  "num_alloc_retries": fig["retries"]}, self._limit)
        if dec.end_window:
            self.policy.end_window()
            self.tracker.closed()
        if dec.record:
            self.policy.start_window(dec.record, dec.window_steps)
            self.tracker.opened(dec.record)
        was_warmup = bool(self.recording) and self.policy.reason == "warmup"
        want = self.policy.on_step()
        if self.tracker.window and not self.policy.in_window and not dec.record:
            self.tracker.closed()
        if fig is not None:  # what a boundary with a reading costs (snapshots excluded): sets the stride
            # Timed from the reading on: a periodic snapshot taken above (100 ms) counted here once
            # made the stride jump to its maximum and stay there, so a 1,000-step run sent nothing
            # after its first hundred steps.
            cost = time.perf_counter() - t_read
            self._sig_cost = cost if not self._sig_cost else 0.9 * self._sig_cost + 0.1 * cost
            self._stride = stride_for(self._sig_cost, self._step_s, self.step_budget)
        if dec.comparable:
            reason = "warmup" if was_warmup and not want else dec.comparable
            self.take_snapshot("periodic", payload={"reason": reason}, comparable=True, at_boundary=True)
            self._apply_history(want)  # the snapshot just taken keeps what recording collected
        else:
            self._set_recording(want, at_boundary=True)
        if now >= self._next_stats:
            self._sample_stats(now)

    def _read_boundary(self, ms: float | None) -> dict | None:
        """The step's figures; read every `_stride` boundaries so that a boundary's work stays under
        `step_budget` of step time (measured on the H200: ~0.15 ms a boundary inside a training loop,
        which a 10 ms step would otherwise pay 1.5% for)."""
        if ms is not None:
            s = ms / 1000
            self._step_s = s if self._step_s is None else 0.9 * self._step_s + 0.1 * s
        self._since_read += 1
        # The first FULL_READ_BOUNDARIES boundaries are all read, whatever the stride: a fast leak that
        # kills in a dozen steps has its points (64 readings of ~25 us, once a run)
        if self._since_read < self._stride and self.tracker.boundaries >= FULL_READ_BOUNDARIES:
            # A thinned boundary reads nothing: the live bytes alone cost as much as the whole reading
            # (H200, torch 2.11: 16.5 us through the stats dict, 112 us through memory_allocated(), 14 us
            # for dict and peak reset), so reading them here would undo the stride. The next reading's
            # peak counters still cover these steps (they are reset only at a reading).
            return None
        span, self._since_read = self._since_read, 0
        read = getattr(self.source, "step_signals", None)
        if read is None:
            return None
        sig = self._safe_call(read)
        with self._lock:
            fig = self.tracker.figure(self.step, self.epoch, sig, ms, span, t=time.time())
            full = self.tracker.pending() >= FLUSH_FIGURES
        if full:
            self._flush_stats()
        return fig

    def mark_epoch(self, epoch: int | None = None) -> None:
        """Call at the end of an epoch: takes the `epoch_end` snapshot (comparable points for leaks)."""
        if self.stopped:
            return
        try:
            self._epochs_marked = True
            if epoch is not None:
                self.epoch = int(epoch)
            if not self.armed:
                self._check_source()
            if self.armed:
                read = getattr(self.source, "step_signals", None)
                sig = self._safe_call(lambda: read(reset=False)) if read is not None else None
                dec = self.tracker.on_epoch_end(sig[0] if sig else None, self._limit,
                                                recording=bool(self.recording))
                if self.snapshot_on_epoch:
                    self.take_snapshot("epoch_end", comparable=True, at_boundary=True)
                if dec.end_window:
                    self.policy.end_window()
                    self.tracker.closed()
                    if not self.policy.continuous:
                        self._apply_history(self.policy.mode == "on")
                if dec.record:  # live bytes grew since the last epoch end: record the next epoch
                    self.policy.start_window(dec.record, dec.window_steps)
                    self.tracker.opened(dec.record)
                    self.policy.reason = dec.record
                    self._apply_history(True)
            self._flush_stats()
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def snapshot(self, trigger: str = "manual") -> bool:
        try:
            return self.take_snapshot(trigger)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")
            return False

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """The allocator's OOM observer: runs in the allocating thread just before the OOM is raised.
        It takes the snapshot while the failing state is still there, then returns: the error then
        reaches the user unchanged."""
        if self.stopped:
            return
        try:
            self.status = "oom"
            self.policy.on_oom()
            if self.oom_snapshots >= self.max_oom_snapshots:
                return
            self.oom_snapshots += 1
            total = self._safe_call(lambda: self.source.device_total(device))
            if isinstance(total, int) and 0 < int(device_alloc) < total:
                self._limit = int(device_alloc)  # the observer's device_alloc is the process's cap
            oom = {"alloc": int(alloc), "device_alloc": int(device_alloc), "device_free": int(device_free),
                   "device_total": total, "message": None}
            # The observer runs in the allocating thread: its Python stack is the failing allocation's
            # line, which a snapshot taken with recording paused has no other way to show (once per OOM).
            self._oom_frames = _python_stack(sys._getframe(0).f_back)
            evt = threading.Event()
            with self._lock:
                self._oom_waits.append(evt)

            def finish(item: Item) -> None:
                item.payload["oom"]["message"] = self.exception_text

            self.take_snapshot("oom", payload={"oom": oom, "device": int(device), "step_completed": self.step},
                               wait=evt, finish=finish)
            if not self.recording:
                self._apply_history(True)
        except Exception:  # noqa: BLE001 - never replace the user's OOM with ours
            self.counters_obj.add("errors")

    # ticker
    def _tick_loop(self) -> None:
        while not self._stop_evt.is_set():
            # poll faster until CUDA is initialised, so the observer is attached early
            self._wake.wait(self.tick_s if self.armed or not self.available else min(self.tick_s, 0.1))
            self._wake.clear()
            if self._stop_evt.is_set():
                return
            try:
                self._tick()
            except Exception:  # noqa: BLE001
                self.counters_obj.add("errors")

    def _tick(self) -> None:
        now = time.monotonic()
        if not self.armed:
            self._check_source()
        if self._signal_evt.is_set():
            self._signal_evt.clear()
            self.take_snapshot("signal")
        stepping = self._last_step_t and now - self._last_step_t < max(5.0, self.stats_interval_s)
        if self.armed and not stepping:
            no_steps = self.policy.steps_seen == 0
            if now >= self._next_periodic:
                self._next_periodic = now + self.snapshot_every_s
                if no_steps and self._auto_paused():
                    self.policy.request_time(now - self._t0 + self.periodic_record_s)
                else:
                    self.take_snapshot("periodic")
            if no_steps:
                self._set_recording(self.policy.on_time(now - self._t0))
            if now >= self._next_stats:
                self._sample_stats(now)
        if now >= self._next_flush:
            self._flush_stats()


MAX_OOM_FRAMES = 48  # innermost frames kept: enough to reach the training script from inside torch


def _python_stack(frame) -> list[dict]:
    """The Python frames of `frame` and its callers, innermost first, as the snapshot's own frames are
    ({filename, line, name}); no source lines are read (linecache would touch the disk). `frame` is None
    when the allocation came from a thread with no Python code (autograd's backward thread): no frames."""
    out = []
    while frame is not None and len(out) < MAX_OOM_FRAMES:
        code = frame.f_code
        out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out
