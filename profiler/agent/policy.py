"""When to record allocator history (ARCHITECTURE.md, "Agent defaults: recording without the cost").

History recording with Python stacks costs ~12% of a 54 ms step on an H200, and (measured on the
H200, torch 2.11) pausing recording with `_record_memory_history(None)` empties the trace: a snapshot
taken while paused has no trace entries. Blocks keep the frames they were allocated with, though
(parameters and optimizer state: 100% of their bytes still had frames after the pause). Hence, at
`history="auto"`:

1. warm-up: record (stacks="python") during the first `warmup_steps` marked steps (or the first
   `warmup_s` seconds when the job marks no steps). Parameters, gradients and optimizer state are
   allocated then and keep those frames. When the warm-up ends, the agent takes a snapshot (trigger
   `periodic`, payload reason `warmup`) BEFORE pausing, so the trace of the first optimizer step
   is kept.
2. periodic: when a periodic snapshot is due, the agent records the next marked step only and takes
   the snapshot at its end (before pausing again): each periodic snapshot holds the trace of one
   whole training step (its peak, with frames) at a cost of one recorded step per period.
3. windows: growth of live bytes between comparable points, or a step much larger than the earlier
   ones, records the next window of steps (profiler/agent/steps.py decides; the agent takes a
   snapshot when the window ends, before pausing).
4. continuous: recording stays on when a stats sample (or a step boundary's reading: peak reserved
   bytes of the step and retries) shows headroom under `headroom_frac` of the
   limit or new allocator retries (memory running low ahead of an OOM: an agent-side trigger, earlier than
   the analysis' near miss, analysis/headroom.py), and after an OOM; it goes back to
   paused when headroom is above twice the threshold again (not after an OOM).

`history="on"` records all the time; `history="off"` never (snapshots then hold segments and blocks
without frames, and no trace). Pure logic: no torch; the agent applies the decisions.
"""

from __future__ import annotations

from dataclasses import dataclass

MODES = ("auto", "on", "off")


@dataclass
class RecordingPolicy:
    mode: str = "auto"
    warmup_steps: int = 3
    warmup_s: float = 120.0
    headroom_frac: float = 0.10

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"history must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.steps_seen = 0
        self.continuous = False
        self.reason = "warmup" if self.mode == "auto" else self.mode
        self._requested = 0
        self._record_until = 0.0
        self._last_retries: int | None = None
        self._window_left = 0
        self._window_reason = ""

    def start_window(self, reason: str, steps: int) -> None:
        """Record the next `steps` boundaries (growth between comparable points, a large step)."""
        self._window_left, self._window_reason = max(self._window_left, int(steps)), reason

    def end_window(self) -> None:
        self._window_left = 0

    @property
    def in_window(self) -> bool:
        return self._window_left > 0

    def initial(self) -> bool:
        return self.mode != "off"

    def request_step(self) -> None:
        """Record the next marked step (a periodic snapshot is due)."""
        self._requested += 1

    def request_time(self, until_s: float) -> None:
        """Record until `until_s` seconds since start (a periodic snapshot of a job with no steps)."""
        self._record_until = max(self._record_until, until_s)

    def on_step(self) -> bool:
        """Called at each marked step boundary (before the next step runs): record the next step?"""
        self.steps_seen += 1
        if self.mode != "auto":
            return self.mode == "on"
        if self.continuous:
            return True
        if self.steps_seen < self.warmup_steps:
            self.reason = "warmup"
            return True
        if self._window_left:
            self._window_left -= 1
            self.reason = self._window_reason
            return True
        if self._requested:
            self._requested -= 1
            self.reason = "periodic"
            return True
        return False

    def on_time(self, elapsed_s: float) -> bool:
        """For jobs that mark no steps: the decision by time since start."""
        if self.mode != "auto":
            return self.mode == "on"
        if self.continuous:
            return True
        if elapsed_s < self.warmup_s:
            self.reason = "warmup"
            return True
        if elapsed_s < self._record_until:
            self.reason = "periodic"
            return True
        return False

    def on_stats(self, sample: dict, limit: int | None) -> None:
        """Update the low-headroom state from a stats sample."""
        if self.mode != "auto":
            return
        retries = sample.get("num_alloc_retries")
        new_retries = retries is not None and self._last_retries is not None and retries > self._last_retries
        if retries is not None:
            self._last_retries = retries
        reserved = sample.get("reserved_bytes.all.current")
        headroom = None
        if limit and reserved is not None:
            room = limit - reserved
            free = sample.get("device_free")
            if free is not None:  # another process may leave less than the cap allows
                room = min(room, free)
            headroom = room / limit
        if new_retries or (headroom is not None and headroom < self.headroom_frac):
            self.continuous = True
            self.reason = "retries" if new_retries else "low_headroom"
        elif self.continuous and headroom is not None and headroom > 2 * self.headroom_frac \
                and self.reason != "oom":
            self.continuous = False

    def on_oom(self) -> None:
        if self.mode == "auto":
            self.continuous = True
            self.reason = "oom"
