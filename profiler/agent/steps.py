"""Per-step figures and the decisions they drive at each step boundary (pure logic: no torch, no I/O).

At every step boundary (a `mark_step`, or torch's global optimizer step hook when the job marks no
steps) the agent reads five counters of the caching allocator, microseconds: live and reserved bytes
now, the step's peak live and reserved bytes (the peak counters are reset at each boundary) and the
allocator's retry count. `StepTracker` keeps them in a ring buffer (sent with the stats and embedded
in every snapshot) and decides:

- comparable points: the agent takes a snapshot at the same point of a step (trigger `periodic`,
  payload `comparable: true`) at the end of warm-up ("baseline"), every `comparable_every` steps but
  at most one per `comparable_min_s` seconds ("every_n": a job of 5 ms steps must not send one every
  half second), and whenever live bytes at a boundary exceed those of the last comparable point by
  more than max(64 MiB, 1% of the limit), at least `growth_min_steps` boundaries after the last one
  ("growth"). A leak then shows between comparable points without `mark_epoch`, which is what the
  analysis' leak test compares.
- a recording window on growth: the blocks that grew were allocated while recording was paused, so
  they carry no frames; recording Python stacks until the next comparable point makes the NEXT
  increment carry its allocating line. At most `max_growth_windows` windows of at most
  `window_steps` steps: a leak costs a bounded stretch of recording, a healthy job nothing.
- a step much larger than the earlier ones (peak live bytes over `large_factor` x their median and a
  new maximum) records the next `large_window_steps` steps: inputs of varying size often come back.
- `mark_epoch` makes epoch ends the comparable points instead (growth between two epoch ends records
  the next epoch).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

MIB = 1 << 20
#: analysis/rules.py GROWTH_MATTERS_SHARE, restated because the agent must not import the analysis
#: package (its start-up cost lands in the training job); tests/agent pins the two equal.
GROWTH_MATTERS_SHARE = 0.01
#: The least growth since the last comparable snapshot that takes another one (with a recording window
#: for its stacks): snapshots are costly, the per-step figures carry the series the growth model reads.
GROWTH_MIN_BYTES = 64 * MIB
# Unsent step figures kept between two stats flushes. A flush goes out every FLUSH_FIGURES figures
# (or stats_flush_s), so this only fills when the transport is stalled; ~200 bytes a figure as JSON.
PENDING_MAX = 8192
FLUSH_FIGURES = 512
# Most boundaries one reading may cover: a 1 ms step still gets a figure every 0.1 s.
MAX_STRIDE = 100
#: Boundaries read at the start of a run whatever the stride (`Stride`): a leak of 126 MiB a step
#: runs out in about 13 steps, and the growth model needs its points (GROWTH_FEW_POINTS and more); at
#: ~25 us a reading on the H200 this costs under 2 ms once per run.
FULL_READ_BOUNDARIES = 64


@dataclass
class Decision:
    comparable: str | None = None   # take a comparable snapshot now, for this reason
    record: str | None = None       # start a recording window, for this reason
    window_steps: int = 0
    end_window: bool = False        # the recording window ends at this point (after the snapshot)


@dataclass
class Position:
    """Where the run is: the last completed step, the epoch, and what marks the steps ("mark_step" or
    "optimizer_hook"). Written only by the triggers (agent/triggers.py), read by the recorder."""

    step: int | None = None
    epoch: int | None = None
    source: str | None = None


def growth_threshold(limit: int | None, live: int) -> int:
    """When growth is worth a snapshot with stacks: the growth model's "it matters" share of LIMIT (or
    of the live bytes), at least GROWTH_MIN_BYTES. It decides no verdict: the figures at every
    boundary go to the growth model (analysis/growth.py) whatever this says."""
    return max(GROWTH_MIN_BYTES, int(GROWTH_MATTERS_SHARE * (limit or live or 0)))


class StepTracker:
    def __init__(self, *, warmup_steps: int = 3, comparable_every: int = 100, comparable_min_s: float = 300.0,
                 growth_min_steps: int = 10, window_steps: int = 500, max_growth_windows: int = 2,
                 large_factor: float = 1.5, large_window_steps: int = 10, maxlen: int = 512):
        self.comparable_min_s = float(comparable_min_s)
        self.growth_min_steps = int(growth_min_steps)
        self._last_comparable_t = float("-inf")
        self._last_comparable_b = 0
        self.warmup_steps = max(1, int(warmup_steps))
        self.comparable_every = int(comparable_every)
        self.window_steps = int(window_steps)
        self.max_growth_windows = int(max_growth_windows)
        self.large_factor = float(large_factor)
        self.large_window_steps = int(large_window_steps)
        self.figures: deque[dict] = deque(maxlen=maxlen)
        # figures not yet handed to a stats batch, kept apart from the ring: a burst of fast steps
        # between two flushes must not push unsent figures out (the ring keeps only the recent ones)
        self._pending: deque[dict] = deque(maxlen=PENDING_MAX)
        self.dropped = 0
        self.boundaries = 0
        self.base_live: int | None = None       # live bytes at the last comparable point
        self.epoch_live: int | None = None      # live bytes at the last epoch end
        self.growth_windows = 0
        self.window: str | None = None          # reason of the open window, None when none
        self._peaks: deque[int] = deque(maxlen=64)
        self._max_peak = 0

    # -- figures ---------------------------------------------------------------------------------
    def figure(self, step: int | None, epoch: int | None, sig: tuple | None, ms: float | None,
               span: int = 1, t: float | None = None) -> dict | None:
        if sig is None:
            return None
        alloc, reserved, peak_alloc, peak_reserved, retries = (int(x) for x in sig)
        fig = {"step": step, "epoch": epoch, "peak_allocated": max(peak_alloc, alloc),
               "peak_reserved": max(peak_reserved, reserved), "allocated": alloc, "reserved": reserved,
               "retries": retries, "ms": None if ms is None else round(ms, 3)}
        if t is not None:
            fig["t"] = round(float(t), 3)  # unix seconds: lets a forecast name a time
        if span > 1:
            fig["span"] = span  # the figures cover this many steps (boundary reads were thinned)
        self.figures.append(fig)
        if len(self._pending) == self._pending.maxlen:
            self.dropped += 1
        self._pending.append(fig)
        return fig

    def pending(self) -> int:
        return len(self._pending)

    def unsent(self) -> list[dict]:
        """Figures added since the last call (for the next stats batch), oldest first."""
        out = list(self._pending)
        self._pending.clear()
        return out

    def last(self) -> dict | None:
        return self.figures[-1] if self.figures else None

    # -- decisions -------------------------------------------------------------------------------
    def on_boundary(self, fig: dict | None, limit: int | None, *, recording: bool,
                    epochs_marked: bool = False, now: float = 0.0) -> Decision:
        """Called once per step boundary, after `figure()`. `fig` None: no reading this time."""
        self.boundaries += 1
        d = Decision()
        if fig is None:
            return d
        live = fig["allocated"]
        if self.boundaries < self.warmup_steps:
            return d  # gradients and optimizer state are created now: growth here is no leak
        if self.base_live is None:
            self.base_live = live
            d.comparable = "baseline"
            self._last_comparable_t, self._last_comparable_b = now, self.boundaries
            return d
        peak = fig["peak_allocated"]
        if len(self._peaks) >= 3 and peak > self.large_factor * statistics.median(self._peaks) \
                and peak > self._max_peak and not recording:
            d.record, d.window_steps = "large_step", self.large_window_steps
        self._peaks.append(peak)
        self._max_peak = max(self._max_peak, peak)
        since = self.boundaries - self._last_comparable_b
        if live - self.base_live > growth_threshold(limit, live) and since >= self.growth_min_steps:
            d.comparable = "growth"
            if self.window == "growth":
                d.end_window = True
            elif self.growth_windows < self.max_growth_windows and not recording:
                d.record, d.window_steps = "growth", self.window_steps
        elif not epochs_marked and self.comparable_every > 0 and since >= self.comparable_every \
                and now - self._last_comparable_t >= self.comparable_min_s:
            d.comparable = "every_n"
        if d.comparable:
            self.base_live = live
            self._last_comparable_t, self._last_comparable_b = now, self.boundaries
        return d

    def on_epoch_end(self, live: int | None, limit: int | None, *, recording: bool) -> Decision:
        """Epoch ends are the comparable points of a job that marks them."""
        d = Decision()
        if live is None:
            return d
        prev, self.epoch_live = self.epoch_live, live
        self.base_live = live
        self._last_comparable_b = self.boundaries
        if self.window == "growth":
            d.end_window = True  # this epoch-end snapshot holds the frames of the window's growth
        elif prev is not None and live - prev > growth_threshold(limit, live) \
                and self.growth_windows < self.max_growth_windows and not recording:
            d.record, d.window_steps = "growth", 1 << 30  # until the next epoch end
        return d

    def opened(self, reason: str) -> None:
        self.window = reason
        if reason == "growth":
            self.growth_windows += 1

    def closed(self) -> None:
        self.window = None


def stride_for(cost_s: float, step_s: float | None, budget_frac: float = 0.002) -> int:
    """How many boundaries share one reading so that reading costs at most `budget_frac` of step time."""
    if not step_s or step_s <= 0 or cost_s <= 0:
        return 1
    return max(1, min(MAX_STRIDE, math.ceil(cost_s / (budget_frac * step_s))))


class Stride:
    """Which step boundaries are read: every `stride`-th, so that reading costs at most `budget_frac` of
    step time (measured on the H200: ~0.15 ms a boundary inside a training loop, which a 10 ms step would
    otherwise pay 1.5% for), except the first FULL_READ_BOUNDARIES, which are all read: a fast leak that
    kills in a dozen steps has its points. Pure: the caller times steps and readings."""

    def __init__(self, budget_frac: float = 0.002):
        self.budget_frac = float(budget_frac)
        self.stride = 1
        self._cost = 0.0
        self._step_s: float | None = None
        self._since = 0

    def due(self, ms: float | None, boundaries: int) -> int | None:
        """At a boundary `ms` after the previous one (None: the first), `boundaries` counted before it:
        how many steps this reading covers, or None when it is not read. A thinned boundary reads
        nothing: the live bytes alone cost as much as the whole reading (H200, torch 2.11: 16.5 us
        through the stats dict, 112 us through memory_allocated(), 14 us for dict and peak reset), and
        the next reading's peak counters still cover the steps between (they are reset only there)."""
        if ms is not None:
            s = ms / 1000
            self._step_s = s if self._step_s is None else 0.9 * self._step_s + 0.1 * s
        self._since += 1
        if self._since < self.stride and boundaries >= FULL_READ_BOUNDARIES:
            return None
        span, self._since = self._since, 0
        return span

    def cost(self, seconds: float) -> None:
        """What a reading cost: sets the stride."""
        self._cost = seconds if not self._cost else 0.9 * self._cost + 0.1 * seconds
        self.stride = stride_for(self._cost, self._step_s, self.budget_frac)
