"""When a running job will run out of memory, from the live bytes it keeps between steps (pure).

ARCHITECTURE.md "Forecast". The series is the agent's per-step figures: live bytes at each step
boundary (`memory_allocated()` after the step, the same point of every step) and the step's peak.
Comparable snapshots stand in where a run has no figures (files given to `memq analyze`).

- Points: one per epoch (its last boundary) when the run marks epochs, else one per window of
  steps. Boundaries up to and including the first optimizer step are warm-up and left out.
- Sustained growth: each of the last `MIN_INTERVALS` intervals grew by more than the leak threshold,
  max(64 MiB, 1% of LIMIT). Growth that stops (a cache filling up), a floor that moves with input
  shapes, or a one-off jump is not sustained.
- Bounded growth: where the comparable snapshots say the growth is gradients and optimizer state and
  both stay within what every parameter training would need (3x the parameters: a gradient and two
  AdamW moments), it is parameters starting to train (progressive unfreezing): its ceiling is
  projected, not a line.
- The need of a coming step: its floor (the line through the points) plus the step's own excursion
  above the floor (the largest of the recent steps: peak - floor before it).
- What the allocator can still reserve: the cache grows in segments; the largest one (the biggest
  input-sized block, rounded) is what a step needs whole. The reserve ceiling is the reserved bytes
  now plus as many such segments as still fit under LIMIT; the step whose need passes that ceiling is
  the one that fails. Without a segment size the ceiling is LIMIT itself.
- Epoch-end growth (the floor moves only between epochs) fails in the first step of an epoch;
  growth inside epochs fails at the step the line reaches. The interval comes from the slope's
  standard error (2 sigma) and from the two ceilings (segments, LIMIT).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from memq.units import fmt_bytes

MiB = 1 << 20
#: The leak test's threshold (ARCHITECTURE.md cause 2): growth must pass it to count.
LEAK_MIN_BYTES = 64 * MiB
LEAK_LIMIT_SHARE = 0.01
#: Consecutive growing intervals a forecast needs. Two is the leak test's (a fact about the past);
#: a projection needs one more, so a cache that fills in two steps of growth and stops is never
#: projected (the cache_fill control in tests/fixtures/forecast).
MIN_INTERVALS = 3
#: Points a run without epochs is cut into (windows of at least MIN_WINDOW steps); where live bytes
#: grow, windows in which the growth so far would pass the threshold WINDOW_MARGIN times. A window's
#: interval then counts as growing above half the threshold: the agent thins its boundary reads, so
#: windows hold uneven numbers of steps' growth.
WINDOWS = 8
MIN_WINDOW = 10
WINDOW_MARGIN = 1.2
#: Parameters' multiple that gradients + optimizer state reach when every parameter trains with
#: AdamW (1 gradient + 2 moments); a little over, for rounding.
TRAINED_MULTIPLE = 3.05
#: Growth that is at least this share gradients and optimizer state is parameters starting to train.
STATE_SHARE = 0.8
#: A near miss: the steps' peak within this share of LIMIT.
NEAR_MISS_SHARE = 0.10
#: The slope's uncertainty taken for the interval (standard errors).
SIGMAS = 2.0
#: Figures kept as a forecast's inputs (the run diagnosis stores them, stats batches add to them): the
#: agent's own ring holds as many, and the stored details stay far under MAX_DETAILS_CHARS.
MAX_FIGURES = 512
#: Recent steps whose excursion above the floor (their median) sets the coming step's.
RECENT_STEPS = 16


@dataclass(frozen=True)
class Point:
    step: int
    epoch: int | None
    live: int          # live bytes at the boundary
    peak: int          # the highest step peak in the point's window
    reserved: int      # the highest reserved bytes in the window


def forecast(figures: list[dict], limit: int | None, *, largest_segment: int | None = None,
             seconds_per_step: float | None = None, composition: list[dict] | None = None,
             as_of_time: float | None = None, comparable: list[dict] | None = None) -> dict | None:
    """`figures`: the agent's per-step figures, oldest first ({step, epoch, allocated, peak_allocated,
    peak_reserved, ...}). `comparable`: comparable snapshots ({step, epoch, active, reserved}) used
    when there are no figures. `composition`: per comparable snapshot, its composition by category
    (oldest first). Returns the contract's object, or None when there is no data at all."""
    figures = _usable(figures)
    usable = figures
    live = int(usable[-1]["allocated"]) if usable else max([int(c.get("active") or 0) for c in comparable or []] + [0])
    thresh = max(LEAK_MIN_BYTES, int(LEAK_LIMIT_SHARE * (limit or live)))
    pts, basis_pts = _points(figures, comparable or [], thresh)
    if pts is None:
        return None
    out = {"oom_expected": None, "step": None, "epoch": None, "eta_s": None, "rate_bytes_per_step": None,
           "headroom_bytes": None, "confidence": 0.0, "basis": "",
           "limit_bytes": limit, "as_of_step": pts[-1].step if pts else None, "as_of_time": as_of_time,
           "rate_bytes_per_epoch": None, "step_low": None, "step_high": None, "eta_low_s": None,
           "eta_high_s": None, "points": len(pts), "series": basis_pts, "near_miss": None}
    if len(pts) < MIN_INTERVALS + 1:
        out["basis"] = (f"{len(pts)} point(s) after warm-up ({basis_pts}); a forecast needs "
                        f"{MIN_INTERVALS + 1} to tell a steady growth from a one-off")
        return out
    peak_now = max(p.peak for p in pts[-2:])
    if limit:
        out["headroom_bytes"] = int(limit - peak_now)
        out["near_miss"] = _near_miss(pts, limit)
    windows = basis_pts.startswith("step boundaries every")
    stretch = _growth_stretch(pts, thresh // 2 if windows else thresh)
    if stretch < MIN_INTERVALS:
        span = pts[-1].step - pts[0].step
        moved = pts[-1].live - pts[0].live
        tail = (f"; it moved by {_g(moved)} in all, but not in each of the last {MIN_INTERVALS} intervals by "
                f"more than the leak threshold of {_g(thresh)}" if moved > thresh else "")
        out.update(oom_expected=False, confidence=round(min(0.9, 0.5 + 0.05 * len(pts)), 2),
                   basis=f"no sustained growth: live bytes at step boundaries moved by {_g(moved)} over {span} "
                         f"steps ({basis_pts}){tail}")
        return out
    seg = pts[-1 - stretch:]
    # The slope of every boundary in the stretch, not of the points: windows of steps that do not line
    # up with a growth that comes every N steps would alias it.
    raw = [f for f in _usable(figures) if seg[0].step <= f["step"] <= seg[-1].step] or \
        [{"step": p.step, "allocated": p.live} for p in seg]
    rate, se = _slope([f["step"] for f in raw], [int(f["allocated"]) for f in raw])
    out["rate_bytes_per_step"] = round(rate, 1)
    epochs = _epoch_length(pts)
    if epochs:
        out["rate_bytes_per_epoch"] = round(rate * epochs, 1)
    bounded = _bounded_by_parameters(composition or [])
    if bounded is not None:
        ceiling = pts[-1].live + bounded["room"]
        need = ceiling + _excursion(figures, pts)
        fits = limit is None or need <= limit
        out.update(oom_expected=False if fits else None, confidence=0.7,
                   basis=(f"the growth is gradients and optimizer state of parameters that started training "
                          f"(progressive unfreezing): they stop at {_g(bounded['ceiling'])} for "
                          f"{_g(bounded['params'])} of parameters"
                          + (f"; the step's need then, {_g(need)}, fits the limit" if fits and limit else "")))
        return out
    if not limit:
        out["basis"] = (f"live bytes grow by {_g(rate)} a step ({stretch} intervals in a row), but the limit is "
                        "not known: pass --limit (or let the agent report its cap) to know when it runs out")
        return out
    exc = _excursion(figures, pts)
    ceilings = _ceilings(pts[-1].reserved, limit, largest_segment)
    staircase = epochs is not None and basis_pts.startswith("the last step boundary")
    at = [_crossing(pts[-1], r, exc, c, epochs if staircase else None)
          for r, c in ((rate, ceilings[0]), (rate + SIGMAS * se, ceilings[0]), (max(rate - SIGMAS * se, rate / 2),
                                                                               ceilings[1]))]
    step, early, late = at[0], min(at[1], at[0]), max(at[2], at[0])
    out.update(oom_expected=True, step=step, step_low=early, step_high=late)
    if epochs:
        out["epoch"] = _epoch_at(pts[-1], step, epochs)
    if seconds_per_step:
        out["eta_s"] = round(max(0.0, (step - pts[-1].step) * seconds_per_step), 1)
        out["eta_low_s"] = round(max(0.0, (early - pts[-1].step) * seconds_per_step), 1)
        out["eta_high_s"] = round(max(0.0, (late - pts[-1].step) * seconds_per_step), 1)
    r2 = _r2([p.step for p in seg], [p.live for p in seg],
             (seg[-1].live - seg[0].live) / max(1, seg[-1].step - seg[0].step))
    out["confidence"] = round(min(0.95, (0.55 + 0.07 * (stretch - MIN_INTERVALS + 1)) * max(0.0, r2)), 2)
    when = f"step {step}" + (f" (epoch {out['epoch']})" if out["epoch"] is not None else "")
    per = (f"{_g(rate * epochs)} an epoch" if staircase and epochs else f"{_g(rate)} a step")
    out["basis"] = (f"live bytes at step boundaries grow by {per} ({stretch} intervals in a row, {basis_pts}); "
                    f"a step needs {_g(exc)} above them, and the allocator can reserve up to {_g(ceilings[0])} "
                    f"of the {_g(limit)} limit" + (f" in segments of {_g(largest_segment)}" if largest_segment else "")
                    + f": it runs out in {when}, between steps {early} and {late}")
    return out


# -- the series ------------------------------------------------------------------------------------

def _usable(figures: list[dict]) -> list[dict]:
    """Figures after warm-up (the first optimizer step is in step 0) with the bytes the series needs,
    as ints (a figure with a field of another type is dropped: figures come from other people's jobs)."""
    out = []
    for f in figures:
        step, alloc = f.get("step"), f.get("allocated")
        if not (_int(step) and _int(alloc)) or step < 1 or alloc < 0:
            continue
        g = dict(f)
        for k in ("peak_allocated", "peak_reserved", "reserved"):
            if not _int(g.get(k)):
                g[k] = alloc
        g["epoch"] = g.get("epoch") if _int(g.get("epoch")) else None
        out.append(g)
    return out


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _points(figures: list[dict], comparable: list[dict], thresh: int) -> tuple[list[Point] | None, str]:
    """Epoch points where the run marks epochs and its live bytes move between them; else windows."""
    figs = _usable(figures)
    if not figs:
        comp = [c for c in comparable if isinstance(c.get("step"), int) and c["step"] >= 1]
        if not comp and not figures and not comparable:
            return None, ""
        pts = [Point(c["step"], c.get("epoch"), int(c["active"]), int(c.get("peak") or c["active"]),
                     int(c.get("reserved") or c["active"])) for c in comp]
        return pts, f"{len(pts)} comparable snapshots"
    marked = [f for f in figs if f.get("epoch") is not None]
    if len(marked) >= 0.5 * len(figs) and len({f["epoch"] for f in marked}) >= 2 and _grows_between_epochs(figs):
        groups: dict = {}
        for f in marked:
            groups.setdefault(f["epoch"], []).append(f)
        pts = [_window_point(groups[e]) for e in sorted(groups)]
        return pts, f"the last step boundary of each of {len(pts)} epochs"
    first, last = figs[0]["step"], figs[-1]["step"]
    width = max(MIN_WINDOW, math.ceil((last - first + 1) / WINDOWS))
    rate = _slope([f["step"] for f in figs], [int(f["allocated"]) for f in figs])[0]
    if rate > 0 and figs[-1]["allocated"] - figs[0]["allocated"] > thresh:
        # Windows long enough that a steady growth passes the threshold in each (WINDOW_MARGIN).
        width = max(MIN_WINDOW, math.ceil(WINDOW_MARGIN * thresh / rate))
    groups = {}
    for f in figs:  # aligned on the last boundary: the newest point is the newest reading
        groups.setdefault((last - f["step"]) // width, []).append(f)
    pts = [_window_point(groups[k]) for k in sorted(groups, reverse=True)]
    return pts, f"step boundaries every {width} steps"


def _window_point(fs: list[dict]) -> Point:
    last = fs[-1]
    return Point(last["step"], last.get("epoch"), int(last["allocated"]),
                 max(int(f.get("peak_allocated") or f["allocated"]) for f in fs),
                 max(int(f.get("peak_reserved") or f.get("reserved") or 0) for f in fs))


def _growth_stretch(pts: list[Point], thresh: int) -> int:
    """How many of the last intervals each grew by more than the leak threshold."""
    n = 0
    for a, b in zip(reversed(pts[:-1]), reversed(pts[1:]), strict=False):
        if b.live - a.live <= thresh:
            break
        n += 1
    return n


def _slope(xs: list[int], ys: list[int]) -> tuple[float, float]:
    """Least-squares slope and its standard error."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0, 0.0
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    if n <= 2:
        return b, 0.0
    rss = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True))
    return b, math.sqrt(rss / (n - 2) / sxx)


def _r2(xs: list[int], ys: list[int], b: float) -> float:
    my, mx = sum(ys) / len(ys), sum(xs) / len(xs)
    tot = sum((y - my) ** 2 for y in ys)
    if tot == 0:
        return 0.0
    a = my - b * mx
    return 1.0 - sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True)) / tot


def _epoch_length(pts: list[Point]) -> int | None:
    """Steps per epoch, from the points' steps where epochs are marked."""
    ep = [(p.epoch, p.step) for p in pts if p.epoch is not None]
    gaps = [(s2 - s1) / (e2 - e1) for (e1, s1), (e2, s2) in zip(ep, ep[1:], strict=False) if e2 > e1]
    return round(statistics.median(gaps)) if gaps else None


def _grows_between_epochs(figures: list[dict]) -> bool:
    """True when live bytes move only from one epoch to the next (validation, a checkpoint copy, a new
    optimizer), not from step to step inside an epoch."""
    within = between = 0
    for a, b in zip(figures, figures[1:], strict=False):
        if a.get("epoch") is None or b.get("epoch") is None or a.get("step", 0) < 1:
            continue
        d = abs(int(b["allocated"]) - int(a["allocated"]))
        if a["epoch"] == b["epoch"]:
            within += d
        else:
            between += d
    return between > 4 * within


def _excursion(figures: list[dict], pts: list[Point]) -> int:
    """How far a step goes above the live bytes it starts from (the largest of the recent steps)."""
    figs = [f for f in figures if isinstance(f.get("allocated"), int) and isinstance(f.get("peak_allocated"), int)]
    ups = [int(b["peak_allocated"]) - int(a["allocated"]) for a, b in zip(figs, figs[1:], strict=False)
           if b.get("step", 0) >= 1][-RECENT_STEPS:]
    if ups:
        # The median: the first step of an epoch that creates a new optimizer's state (or runs right
        # after validation) goes higher once; the floor after it already holds what it added.
        return max(0, int(statistics.median(ups)))
    return max(0, max(p.peak - p.live for p in pts[-3:]))


def _ceilings(reserved_now: int, limit: int, segment: int | None) -> tuple[int, int]:
    """What the allocator can reserve: now plus whole segments that still fit (the first), and the
    limit itself (the second, the later bound: segments split and merge more than this assumes)."""
    if not segment or segment <= 0 or reserved_now >= limit:
        return limit, limit
    n = (limit - reserved_now) // segment
    return int(reserved_now + n * segment), limit


def _crossing(last: Point, rate: float, exc: int, ceiling: int, epoch_len: int | None) -> int:
    """The first step whose need (floor + excursion) passes the ceiling."""
    gap = ceiling - exc - last.live
    if gap < 0:
        return last.step + 1
    if rate <= 0:
        return 1 << 40
    if epoch_len:
        per_epoch = rate * epoch_len
        k = math.floor(gap / per_epoch) + 1  # the floor moves once per epoch; the next epoch's first step fails
        start = last.step - (last.step % epoch_len) if last.epoch is not None else last.step
        return int(start + k * epoch_len)
    return int(last.step + math.floor(gap / rate) + 1)


def _epoch_at(last: Point, step: int, epoch_len: int) -> int | None:
    if last.epoch is None:
        return None
    start = last.step - (last.step % epoch_len)
    return int(last.epoch + (step - start) // epoch_len)


def _bounded_by_parameters(comps: list[dict]) -> dict | None:
    """Gradients and optimizer state of parameters that start training stop at 3x the parameters."""
    if len(comps) < 2:
        return None
    a, b = comps[0], comps[-1]
    keys = ("gradients", "optimizer_state")
    grown = sum(b.get(k, 0) for k in (*keys, "activations", "other", "unknown", "workspace", "parameters")) - \
        sum(a.get(k, 0) for k in (*keys, "activations", "other", "unknown", "workspace", "parameters"))
    state = sum(b.get(k, 0) - a.get(k, 0) for k in keys)
    params = b.get("parameters", 0)
    held = sum(b.get(k, 0) for k in keys)
    if grown <= 0 or params <= 0 or state < STATE_SHARE * grown or held > TRAINED_MULTIPLE * params:
        return None
    ceiling = int(3 * params)
    return {"room": max(0, ceiling - held), "ceiling": ceiling, "params": params}


def _near_miss(pts: list[Point], limit: int) -> dict | None:
    """The steps' peak close to the limit: said even when nothing grows (one more token of context, a
    larger batch, a torch upgrade is then an OOM)."""
    peak = max(p.peak for p in pts)
    head = limit - peak
    if head > NEAR_MISS_SHARE * limit:
        return None
    recent = [p.peak for p in pts[-(MIN_INTERVALS + 1):]]
    rising = all(b > a for a, b in zip(recent, recent[1:], strict=False))
    return {"peak_bytes": int(peak), "headroom_bytes": int(head), "headroom_share": round(head / limit, 4),
            "rising": rising}


def _g(n: float) -> str:
    return fmt_bytes(n, "brief")


# -- inputs kept with the run diagnosis, refreshed by stats batches -------------------------------

_FIG_KEYS = ("step", "epoch", "allocated", "peak_allocated", "peak_reserved", "reserved", "ms")


def inputs(figures: list[dict], limit: int | None, *, largest_segment: int | None, seconds_per_step: float | None,
           composition: list[dict], comparable: list[dict], as_of_time: float | None) -> dict:
    """What `forecast` was given, as plain data: the run diagnosis keeps it so that the agent's stats
    batches (per-step figures between snapshots) can move the forecast on without a snapshot."""
    return {"figures": [{k: f.get(k) for k in _FIG_KEYS} for f in _usable(figures)][-MAX_FIGURES:],
            "limit": limit, "largest_segment": largest_segment, "seconds_per_step": seconds_per_step,
            "composition": composition[-8:], "comparable": comparable[-64:], "as_of_time": as_of_time}


def refresh(kept: dict, new_figures: list[dict], as_of_time: float | None) -> tuple[dict | None, dict] | None:
    """The forecast again with the figures of a stats batch added (those past the kept ones' last step):
    (forecast, the inputs to keep), or None when the batch adds nothing."""
    old = kept.get("figures") or []
    last = max((f["step"] for f in old if _int(f.get("step"))), default=-1)
    add = [f for f in _usable(new_figures) if f["step"] > last]
    if not add:
        return None
    figs = (old + sorted(({k: f.get(k) for k in _FIG_KEYS} for f in add), key=lambda f: f["step"]))[-MAX_FIGURES:]
    t = as_of_time if isinstance(as_of_time, (int, float)) else kept.get("as_of_time")
    nxt = dict(kept, figures=figs, as_of_time=t)
    fc = forecast(figs, kept.get("limit"), largest_segment=kept.get("largest_segment"),
                  seconds_per_step=kept.get("seconds_per_step"), composition=kept.get("composition") or [],
                  as_of_time=t, comparable=kept.get("comparable") or [])
    return fc, nxt
