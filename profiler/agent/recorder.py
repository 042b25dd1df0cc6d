"""What the agent records and sends: history recording switched on and off by the policy
(profiler/agent/policy.py), the per-step figures and the decisions they drive (steps.py), stat samples
and their batches, the rank's peak figures and limit, snapshots with their metadata, and the run's
announcement.

The recorder acts on the events the triggers hand it (a step boundary, an epoch end, a periodic
snapshot due, a tick) and reads where the run is (`Position`, written by the triggers) and whether the
source is armed (`SourceWatch`); it never calls back into them.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from memq.agent.guard import Guard
from memq.agent.job import JobObjects
from memq.agent.policy import RecordingPolicy
from memq.agent.source import scheduler_ids
from memq.agent.steps import FLUSH_FIGURES, Position, StepTracker, Stride
from memq.agent.transport import Item
from memq.agent.watch import SourceWatch
from memq.config import AgentOptions

MAX_SAMPLES = 1000  # stat samples kept between two flushes; the oldest are dropped (and counted) beyond


class Recorder:
    def __init__(self, options: AgentOptions, *, source: Any, transport: Any, job: JobObjects, position: Position,
                 watch: SourceWatch, guard: Guard, end_reason: Callable[[], str | None],
                 run: str, rank: int, world_size: int):
        o = options
        self.source, self.transport, self.job, self.position = source, transport, job, position
        self._watch, self._guard, self._end_reason = watch, guard, end_reason
        self.run, self.rank, self.world_size = run, rank, world_size
        self.options = o
        self.policy = RecordingPolicy(mode=o.history, warmup_steps=o.warmup_steps, warmup_s=o.warmup_s,
                                      headroom_frac=o.headroom)
        self.tracker = StepTracker(warmup_steps=o.warmup_steps, comparable_every=o.comparable_every_steps,
                                   comparable_min_s=o.comparable_min_s, window_steps=o.growth_window_steps)
        self.recording: bool | None = None
        self.rec_since: int | None = None  # the first step recorded since recording was switched on
        self.announced = False
        self.limit: int | None = None
        self.peak_alloc: int | None = None  # the run's peaks: per-step figures live in a bounded ring
        self.peak_reserved: int | None = None
        self.reading = Stride(o.step_budget)  # which boundaries are read
        self._samples: list[dict] = []
        self._next_stats = 0.0
        self._next_flush = 0.0
        self._closed = False
        self._lock = threading.RLock()
        self._in_snapshot = threading.local()

    def start(self, now: float) -> None:
        self._next_stats = now + self.options.stats_interval_s
        self._next_flush = now + self.options.stats_flush_s

    def close(self) -> None:
        """No snapshot from now on (the agent is stopping)."""
        self._closed = True

    # -- recording ----------------------------------------------------------------------------------
    def auto_paused(self) -> bool:
        return self.policy.mode == "auto" and not self.policy.continuous and not self.recording

    def set_recording(self, want: bool, at_boundary: bool = False) -> None:
        """Apply a policy decision. Pausing empties the trace, so a recorded stretch that ends
        (warm-up, a periodic recorded step, a recording window, low headroom that passed) is
        snapshotted first."""
        if self.recording and not want and self.policy.mode == "auto":
            self.take_snapshot("periodic", payload={"reason": self.policy.reason}, at_boundary=at_boundary)
        self.apply_history(want)

    def apply_history(self, want: bool, force: bool = False) -> None:
        if want == self.recording and not force:
            return
        o = self.options
        ok = self._guard.call(lambda: self.source.set_history(want, stacks=o.stacks, context=o.context,
                                                              max_entries=o.max_entries), default=False)
        if ok and want and not self.recording:
            step = self.position.step
            self.rec_since = step + 1 if step is not None else 0
        self.recording = want if ok else self.recording

    def on_present(self) -> None:
        """The source is there (torch with CUDA): recording switched on before CUDA initialises catches
        the parameters' frames; it is applied again once CUDA is initialised (older torch ignores it
        before that)."""
        self.apply_history(self.policy.initial(), force=True)

    def on_armed(self) -> None:
        """CUDA is initialised: history applied again, the device's metadata and limit read."""
        want = self.recording if self.recording is not None else self.policy.initial()
        self.apply_history(want, force=True)
        md = self._guard.call(self.source.metadata, default={}) or {}
        with self._lock:
            self._samples.append({"t": time.time(), "device_metadata": md})
        self.limit = md.get("limit_bytes")
        if self.limit is None:
            self.limit = self._guard.call(self.source.limit_bytes)

    def on_oom(self) -> None:
        """The OOM observer fired: record from now on."""
        self.policy.on_oom()

    def set_limit(self, cap: int) -> None:
        """The process's cap, as the OOM observer reads it."""
        self.limit = cap

    def after_oom_snapshot(self) -> None:
        if not self.recording:
            self.apply_history(True)

    def pause_at_exit(self, exiting: bool) -> None:
        """On stop: recording off, unless the process is exiting anyway."""
        if self.recording and self._watch.available and not exiting:
            self._guard.call(lambda: self.source.set_history(False))

    # -- events the triggers hand over --------------------------------------------------------------
    def periodic_at_boundary(self) -> None:
        """A periodic snapshot is due at a step boundary: paused, record the next step and snapshot it
        at its end; else now."""
        if self.auto_paused():
            self.policy.request_step()
        else:
            self.take_snapshot("periodic")

    def periodic_on_tick(self, no_steps: bool, elapsed_s: float) -> None:
        if no_steps and self.auto_paused():
            self.policy.request_time(elapsed_s + self.options.periodic_record_s)
        else:
            self.take_snapshot("periodic")

    def on_time(self, elapsed_s: float) -> None:
        """For jobs that mark no steps: the policy's decision by time."""
        self.set_recording(self.policy.on_time(elapsed_s))

    def boundary(self, step: int | None, epoch: int | None, ms: float | None, tokens: int | None,
                 epochs_marked: bool, now: float) -> None:
        """One step ended: cheap readings, then what to record and whether to snapshot."""
        if self.tracker.boundaries <= self.tracker.warmup_steps:  # the cap is usually set by now
            self.limit = self._guard.call(self.source.limit_bytes) or self.limit
        t_read = time.perf_counter()
        fig = self._read_boundary(step, epoch, ms)
        if fig is not None and tokens is not None:
            fig["tokens"] = tokens
        if fig is not None:
            self.note_peaks(fig["peak_allocated"], fig["peak_reserved"])
        dec = self.tracker.on_boundary(fig, self.limit, recording=bool(self.recording),
                                       epochs_marked=epochs_marked, now=now)
        if fig is not None:
            self.policy.on_stats({"reserved_bytes.all.current": fig["peak_reserved"],
                                  "num_alloc_retries": fig["retries"]}, self.limit)
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
            self.reading.cost(time.perf_counter() - t_read)
        if dec.comparable:
            reason = "warmup" if was_warmup and not want else dec.comparable
            self.take_snapshot("periodic", payload={"reason": reason}, comparable=True, at_boundary=True)
            self.apply_history(want)  # the snapshot just taken keeps what recording collected
        else:
            self.set_recording(want, at_boundary=True)
        self.sample_if_due(now)

    def _read_boundary(self, step: int | None, epoch: int | None, ms: float | None) -> dict | None:
        """The step's figures, when this boundary is read (steps.Stride: a boundary's work stays under
        `step_budget` of step time)."""
        span = self.reading.due(ms, self.tracker.boundaries)
        if span is None:
            return None
        read = getattr(self.source, "step_signals", None)
        if read is None:
            return None
        sig = self._guard.call(read)
        with self._lock:
            fig = self.tracker.figure(step, epoch, sig, ms, span, t=time.time())
            full = self.tracker.pending() >= FLUSH_FIGURES
        if full:
            self.flush_stats()
        return fig

    def relabel_last(self, hook_step: int | None, step: int | None, epoch: int | None,
                     tokens: int | None) -> None:
        """The optimizer hook closed a step that the job's first mark_step then names: the last sample
        and figure of `hook_step` take the job's step and epoch, and the figure its tokens."""
        with self._lock:
            for rec in (self._samples[-1] if self._samples else None, self.tracker.last()):
                if rec is not None and rec.get("step") == hook_step:
                    rec["step"], rec["epoch"] = step, epoch
            fig = self.tracker.last()
            if fig is not None and tokens is not None and fig.get("step") == step:
                fig["tokens"] = tokens  # this step's input, not the next one's

    def epoch_end(self, snapshot_on_epoch: bool) -> None:
        """An epoch ended (armed): its snapshot, a comparable point; growth since the last epoch end
        records the next epoch."""
        read = getattr(self.source, "step_signals", None)
        sig = self._guard.call(lambda: read(reset=False)) if read is not None else None
        dec = self.tracker.on_epoch_end(sig[0] if sig else None, self.limit, recording=bool(self.recording))
        if snapshot_on_epoch:
            self.take_snapshot("epoch_end", comparable=True, at_boundary=True)
        if dec.end_window:
            self.policy.end_window()
            self.tracker.closed()
            if not self.policy.continuous:
                self.apply_history(self.policy.mode == "on")
        if dec.record:  # live bytes grew since the last epoch end: record the next epoch
            self.policy.start_window(dec.record, dec.window_steps)
            self.tracker.opened(dec.record)
            self.policy.reason = dec.record
            self.apply_history(True)

    # -- stats --------------------------------------------------------------------------------------
    def sample_if_due(self, now: float) -> None:
        if now >= self._next_stats:
            self.sample_stats(now)

    def flush_if_due(self, now: float) -> None:
        if now >= self._next_flush:
            self.flush_stats()

    def sample_stats(self, now: float) -> None:
        self._next_stats = now + self.options.stats_interval_s
        sample = self._guard.call(self.source.stats)
        if not sample:
            return
        pos = self.position
        sample = dict(sample, t=time.time(), step=pos.step, epoch=pos.epoch, recording=bool(self.recording))
        # re-read: a job may set its memory fraction after CUDA is initialised (and the agent armed)
        limit = self._guard.call(self.source.limit_bytes) or self.limit
        self.limit = limit
        self.note_peaks(sample.get("allocated_bytes.all.peak"), sample.get("reserved_bytes.all.peak"))
        self.policy.on_stats(sample, limit)
        with self._lock:
            self._samples.append(sample)
            if len(self._samples) > MAX_SAMPLES:
                del self._samples[:-MAX_SAMPLES]
                self._guard.counters.add("dropped")

    def flush_stats(self, rank_figures: dict | None = None) -> None:
        with self._lock:
            samples, self._samples = self._samples, []
            figures = self.tracker.unsent()
            self._next_flush = time.monotonic() + self.options.stats_flush_s
        if samples or figures or rank_figures:
            payload: dict[str, Any] = {"samples": samples}
            if figures:
                payload["step_figures"] = figures
            if rank_figures:
                payload["rank_figures"] = rank_figures
            self.transport.submit(Item("stats", payload=payload))

    def note_peaks(self, alloc: Any, reserved: Any) -> None:
        if isinstance(alloc, int):
            self.peak_alloc = max(alloc, self.peak_alloc or 0)
        if isinstance(reserved, int):
            self.peak_reserved = max(reserved, self.peak_reserved or 0)

    def rank_figures(self) -> dict:
        """This rank's own figures for the cross-rank diagnosis: the run's peaks (the step in progress
        included: its peak counters were not reset yet), the last step, the limit, the per-step
        peaks' summary. Cheap: one counters read, no snapshot."""
        if self._watch.armed:
            read = getattr(self.source, "step_signals", None)
            sig = self._guard.call(lambda: read(reset=False)) if read is not None else None
            if sig:
                self.note_peaks(int(max(sig[0], sig[2])), int(max(sig[1], sig[3])))
            # A rank that fails or is torn down in its first step never reached a boundary: its cap
            # (set_per_process_memory_fraction after start) is read here, not left at the device total.
            self.limit = self._guard.call(self.source.limit_bytes) or self.limit
        with self._lock:
            figs = [f for f in self.tracker.figures if f.get("peak_allocated") is not None]
        summary = None
        if figs:
            top = max(figs, key=lambda f: f["peak_allocated"])
            peaks = sorted(f["peak_allocated"] for f in figs)
            summary = {"count": len(figs), "median_peak_allocated": peaks[len(peaks) // 2],
                       "max_peak_allocated": top["peak_allocated"],
                       "max_peak_reserved": max(f["peak_reserved"] for f in figs),
                       "max_step": top.get("step"), "last_peak_allocated": figs[-1]["peak_allocated"]}
        return {"peak_allocated_bytes": self.peak_alloc, "peak_reserved_bytes": self.peak_reserved,
                "limit_bytes": self.limit, "last_step": self.position.step, "steps": self.policy.steps_seen,
                "end_reason": self._end_reason(), "step_peaks": summary}

    # -- snapshots ----------------------------------------------------------------------------------
    def take_snapshot(self, trigger: str, payload: dict | None = None, wait: threading.Event | None = None,
                      finish=None, comparable: bool = False, at_boundary: bool = False,
                      oom_frames: list | None = None) -> bool:
        if not self._watch.armed or self._closed:
            return False
        if getattr(self._in_snapshot, "on", False):
            return False
        self._in_snapshot.on = True
        try:
            t0 = time.perf_counter()
            obj = self.source.snapshot()
            took = time.perf_counter() - t0
        finally:
            self._in_snapshot.on = False
        if obj is None:
            return False
        roles = self.job.roles() if isinstance(obj, dict) else None
        pos = self.position
        # Between boundaries a step is running: the last completed one + 1 (an OOM's failing step).
        in_progress = None if at_boundary else (pos.step + 1 if pos.step is not None else 0)
        step = in_progress if trigger == "oom" else pos.step
        if isinstance(obj, dict):
            # Self-describing and distinct: two snapshots of an unchanged state (epoch ends with
            # recording paused) would otherwise be the same bytes, hence one row in the history.
            with self._lock:
                figures = list(self.tracker.figures)
            obj["memq_agent"] = {
                "run": self.run, "rank": self.rank, "trigger": trigger, "step": step, "epoch": pos.epoch,
                "time": time.time(), "step_figures": figures, "step_in_progress": in_progress,
                "step_completed": pos.step, "steps_source": pos.source,
                "recording": {"on": bool(self.recording), "since_step": self.rec_since if self.recording else None,
                              "reason": self.policy.reason},
                "comparable": bool(comparable), "optimizer": self.job.optimizer_label(),
                "oom_frames": oom_frames if trigger == "oom" else None,
                "limit_bytes": self.limit, "roles": roles,
                "first_input": self.job.first_input,
                "model": self.job.model_label()}
        pl = dict(payload or {})
        if comparable:
            pl["comparable"] = True
        pl.setdefault("took_ms", round(took * 1000, 3))
        pl.setdefault("recording", bool(self.recording))
        pl.setdefault("policy", self.policy.reason)
        item = Item("snapshot", payload=pl, obj=obj, trigger=trigger, step=step, epoch=pos.epoch,
                    wait=wait, wait_s=self.options.oom_message_wait_s if wait is not None else 0.0, finish=finish)
        return self.transport.submit(item)

    # -- the run's announcement ---------------------------------------------------------------------
    def announce(self) -> None:
        if not self.announced:
            self.announced = True
            self.transport.submit(Item("run_start", payload=self.run_metadata()))

    def run_metadata(self) -> dict:
        md: dict[str, Any] = {"world_size": self.world_size, "pid": os.getpid(),
                              "argv": [str(a)[:200] for a in sys.argv[:20]], "scheduler": scheduler_ids(),
                              "agent": {"history": self.policy.mode, "stacks": self.options.stacks,
                                        "max_entries": self.options.max_entries,
                                        "warmup_steps": self.policy.warmup_steps,
                                        "stats_interval_s": self.options.stats_interval_s,
                                        "snapshot_every_s": self.options.snapshot_every_s,
                                        "codec": self.transport.codec}}
        md.update(self._guard.call(self.source.metadata, default={}) or {})
        md.update(self.job.metadata())
        md.update(self.options.metadata or {})
        return md
