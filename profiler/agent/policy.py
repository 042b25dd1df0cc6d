"""When to record allocator history (ARCHITECTURE.md, "Agent defaults: recording without the cost").

History recording with Python stacks costs ~12% of a 54 ms step on an H200, so at `history="auto"`:

1. warm-up: record (stacks="python") during the first `warmup_steps` marked steps (or the first
   `warmup_s` seconds when the job marks no steps). Parameters, gradients and optimizer state are
   allocated then, and their blocks keep those frames after recording is paused.
2. duty cycle: afterwards record one marked step in `duty_every` (time-based without marked steps:
   `duty_on_s` every `duty_period_s`), so the ring buffer holds a recent whole step.
3. continuous: switch recording on for good when a stats sample shows headroom under
   `headroom_frac` of the limit or new allocator retries (a near miss ahead of an OOM), and after an
   OOM; go back to the duty cycle when headroom is above twice the threshold again.

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
    duty_every: int = 50
    duty_on_s: float = 1.0
    duty_period_s: float = 120.0
    headroom_frac: float = 0.10

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"history must be one of {', '.join(MODES)}, got {self.mode!r}")
        self.steps_seen = 0
        self.continuous = False
        self.reason = "warmup" if self.mode == "auto" else self.mode
        self._last_retries: int | None = None

    def initial(self) -> bool:
        return self.mode != "off"

    def on_step(self) -> bool:
        """Called at each marked step boundary (before the next step runs): record the next step?"""
        self.steps_seen += 1
        if self.mode != "auto":
            return self.mode == "on"
        if self.continuous:
            self.reason = "continuous"
            return True
        if self.steps_seen < self.warmup_steps:
            self.reason = "warmup"
            return True
        self.reason = "duty"
        return self.duty_every > 0 and (self.steps_seen - self.warmup_steps) % self.duty_every == self.duty_every - 1

    def on_time(self, elapsed_s: float) -> bool:
        """For jobs that mark no steps: the decision by time since start."""
        if self.mode != "auto":
            return self.mode == "on"
        if self.continuous:
            return True
        if elapsed_s < self.warmup_s:
            return True
        return self.duty_period_s > 0 and (elapsed_s - self.warmup_s) % self.duty_period_s < self.duty_on_s

    def on_stats(self, sample: dict, limit: int | None) -> None:
        """Update the near-miss state from a stats sample."""
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
