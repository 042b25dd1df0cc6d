"""Growth of live memory as a trend: the one model that decides growth (pure).

ARCHITECTURE.md cause 2 and "Forecast". The leak verdict (leak.py), the forecast (forecast.py), the
nightly report, the exporter, the alerts and `memq runs` all read what this module decides; none of
them restates a threshold.

The series is live bytes at comparable points, in order: every step boundary the agent reports (live
bytes after the optimizer step), else epoch ends, else comparable snapshots. Its position `x` is the
step where steps are known, else the epoch, else the point's index; `unit` says which.

- The trend: a Theil-Sen slope (the median of the pairwise slopes, robust to a spike or a one-off
  copy) with Sen's 95% interval. Growth needs the interval's lower bound above zero and a rise over
  the window larger than the run's own scatter about the line (NOISE_MULTIPLE x the median absolute
  residual, scaled to a standard deviation): the noise floor is measured from the run, not a constant.
- Regimes: one change point is looked for (the split that most reduces the squared residuals of two
  lines). Growth that stopped (a cache that filled, a warm-up ramp) is a plateau when the recent
  regime's upper bound is under PLATEAU_SHARE of the earlier slope; a leak that started late is
  judged on its recent regime only, and said to start there.
- It matters: the growth has already added more than MATTERS_LIMIT_SHARE of LIMIT (of the live bytes
  when LIMIT is unknown), or at its rate it would use the headroom left within HORIZON_MULTIPLE times
  the span the series already covers (a run's length is rarely known; a leak that needs a hundred
  times longer than the run has lived is not this run's problem).
- Few points: three points are enough when every interval grew steadily (a fast leak that kills in a
  few steps, three epoch-end files); the confidence says how many points there were.
- The projection: the floor (the line through the recent regime) plus the step's own excursion
  above it meets what the allocator can still reserve; the step, the epoch and the time of it, with
  the interval from the slope's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memq.analysis.rules import (
    GROWTH_CHANGE_GAIN,
    GROWTH_FEW_POINTS,
    GROWTH_HORIZON_MULTIPLE,
    GROWTH_MATTERS_SHARE,
    GROWTH_MIN_POINTS,
    GROWTH_MIN_SEGMENT,
    GROWTH_NOISE_MULTIPLE,
    GROWTH_PLATEAU_SHARE,
    GROWTH_STEADY_SHARE,
)
from memq.units import fmt_bytes

#: Sen's interval: the normal quantile of a two-sided 95% interval.
Z95 = 1.96
#: Points the pairwise slopes are taken over at most (every k-th point beyond): 256 points are
#: 32,640 pairs, a few ms; the scatter still uses every point.
MAX_PAIR_POINTS = 256
#: MAD to a standard deviation for normal noise.
MAD_SIGMA = 1.4826


@dataclass(frozen=True)
class Point:
    x: float            # step, epoch or index (Growth.unit)
    live: int           # live bytes at the point
    label: str          # how a screen names it: "step 120", "the end of epoch 4", a file
    step: int | None = None
    epoch: int | None = None
    t: float | None = None   # unix seconds, when known


@dataclass(frozen=True)
class Trend:
    slope: float        # bytes per unit
    low: float          # Sen's 95% interval
    high: float
    intercept: float
    n: int
    x0: float
    x1: float

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x

    @property
    def rise(self) -> float:
        return self.slope * (self.x1 - self.x0)


@dataclass(frozen=True)
class Growth:
    """What the series says. `state`: too_few | flat | small | plateau | growing; `growing` is a leak
    (a trend that matters and is still going), every other state is not."""
    state: str
    unit: str
    points: int
    trend: Trend | None = None          # the recent regime's (the whole series' when no change)
    earlier: Trend | None = None        # the regime before the change point, when there is one
    since: Point | None = None          # the first point of the recent regime
    first: Point | None = None
    last: Point | None = None
    scatter: float = 0.0
    added: int = 0                       # live bytes last - first over the whole series
    matters: bool = False
    why: str = ""                        # one sentence for every screen
    few: bool = False                    # decided on fewer than GROWTH_MIN_POINTS points (or rises)
    rises: int | None = None             # growth in steps between unmoved points: how many steps

    @property
    def leak(self) -> bool:
        return self.state == "growing"

    def as_json(self) -> dict:
        t = self.trend

        def num(v: float | None) -> float | None:  # JSON has no infinity: an unknown bound is null
            return round(v, 1) if v is not None and math.isfinite(v) else None
        return {"state": self.state, "unit": self.unit, "points": self.points, "few": self.few,
                "trend_points": None if t is None else t.n,
                "rate_bytes": None if t is None else num(t.slope),
                "rate_low_bytes": None if t is None else num(t.low),
                "rate_high_bytes": None if t is None else num(t.high),
                "since": None if self.since is None else self.since.label,
                "since_x": None if self.since is None else self.since.x,
                "first": None if self.first is None else self.first.label,
                "last": None if self.last is None else self.last.label,
                "scatter_bytes": int(self.scatter), "added_bytes": int(self.added),
                "matters": self.matters, "rises": self.rises, "summary": self.why}


# -- the trend -----------------------------------------------------------------------------------

def theil_sen(xs: list[float], ys: list[float]) -> Trend:
    """The median pairwise slope with Sen's 95% interval, and the median intercept."""
    n = len(xs)
    if n > MAX_PAIR_POINTS:
        k = math.ceil(n / MAX_PAIR_POINTS)
        idx = list(range(0, n, k))
        if idx[-1] != n - 1:
            idx.append(n - 1)
        sx, sy = [xs[i] for i in idx], [ys[i] for i in idx]
    else:
        sx, sy = xs, ys
    m = len(sx)
    slopes = sorted((sy[j] - sy[i]) / (sx[j] - sx[i]) for i in range(m) for j in range(i + 1, m)
                    if sx[j] != sx[i])
    if not slopes:
        return Trend(0.0, 0.0, 0.0, sum(ys) / n, n, xs[0], xs[-1])
    b = _median(slopes)
    N = len(slopes)
    c = Z95 * math.sqrt(m * (m - 1) * (2 * m + 5) / 18.0)
    lo_rank, hi_rank = math.floor((N - c) / 2), math.ceil((N + c) / 2)
    low = slopes[lo_rank] if lo_rank >= 0 else -math.inf
    high = slopes[hi_rank] if hi_rank < N else math.inf
    a = _median([y - b * x for x, y in zip(xs, ys, strict=True)])
    return Trend(b, low, high, a, n, xs[0], xs[-1])


def scatter(trend: Trend, xs: list[float], ys: list[float]) -> float:
    """The run's own scatter about the line: the median absolute residual as a standard deviation."""
    res = [abs(y - trend.at(x)) for x, y in zip(xs, ys, strict=True)]
    return MAD_SIGMA * _median(res) if res else 0.0


def change_point(xs: list[float], ys: list[float]) -> int | None:
    """The index where a second line starts, when two lines fit the series much better than one
    (their squared residuals under GROWTH_CHANGE_GAIN of one line's); None otherwise."""
    n = len(xs)
    if n < 2 * GROWTH_MIN_SEGMENT:
        return None
    # prefix sums: the least-squares residual of any stretch in O(1)
    px, py, pxx, pxy, pyy = [0.0], [0.0], [0.0], [0.0], [0.0]
    for x, y in zip(xs, ys, strict=True):
        px.append(px[-1] + x)
        py.append(py[-1] + y)
        pxx.append(pxx[-1] + x * x)
        pxy.append(pxy[-1] + x * y)
        pyy.append(pyy[-1] + y * y)

    def sse(i: int, j: int) -> float:
        k = j - i
        sx, sy = px[j] - px[i], py[j] - py[i]
        sxx = pxx[j] - pxx[i] - sx * sx / k
        syy = pyy[j] - pyy[i] - sy * sy / k
        sxy = pxy[j] - pxy[i] - sx * sy / k
        return max(0.0, syy - (sxy * sxy / sxx if sxx > 0 else 0.0))

    whole = sse(0, n)
    if whole <= 0:
        return None
    best, at = whole, None
    for b in range(GROWTH_MIN_SEGMENT, n - GROWTH_MIN_SEGMENT + 1):
        s = sse(0, b) + sse(b, n)
        if s < best:
            best, at = s, b
    return at if at is not None and best < GROWTH_CHANGE_GAIN * whole else None


# -- the decision ----------------------------------------------------------------------------------

def assess(points: list[Point], unit: str, *, limit: int | None, headroom: int | None = None,
           at_oom: bool = False) -> Growth:
    """The growth model on `points` (after warm-up, in order). `headroom`: what the growth has to use
    up before the need meets LIMIT (None: LIMIT - the last live bytes); `at_oom`: the series ends in an
    out-of-memory error, and `headroom` is the room the series started with."""
    pts = [p for p in points if isinstance(p.live, int)]
    n = len(pts)
    if n < GROWTH_FEW_POINTS:
        return Growth("too_few", unit, n, first=pts[0] if pts else None, last=pts[-1] if pts else None,
                      why=f"{n} comparable point(s): a trend needs at least {GROWTH_FEW_POINTS}")
    xs, ys = [float(p.x) for p in pts], [float(p.live) for p in pts]
    added = pts[-1].live - pts[0].live
    if headroom is None and limit:
        headroom = limit - (pts[0].live if at_oom else pts[-1].live)
    base = dict(unit=unit, points=n, first=pts[0], last=pts[-1], added=added)
    if n < GROWTH_MIN_POINTS:
        return _few(pts, base, limit, headroom, at_oom)
    cut = change_point(xs, ys)
    earlier = None
    if cut is not None:
        earlier = theil_sen(xs[:cut], ys[:cut])
        recent = theil_sen(xs[cut:], ys[cut:])
        sc = scatter(recent, xs[cut:], ys[cut:])
        since = pts[cut]
        # growth before the change (a rise beyond the recent regime's scatter; a short early rise of two
        # or three intervals has no Sen's bound of its own), then a recent regime bounded well below it
        rose = recent.at(recent.x0) - ys[0] > GROWTH_NOISE_MULTIPLE * sc
        if earlier.slope > 0 and rose and recent.high < GROWTH_PLATEAU_SHARE * earlier.slope:
            # where the growth reached the flat level (the split can fall a point early on a bend)
            level = recent.at(recent.x0)
            top = next((p for p in pts if p.live >= level - 0.05 * max(1.0, level - pts[0].live)), since)
            why = (f"grew {_g(level - pts[0].live)} from {pts[0].label} to {top.label}, then flat for "
                   f"{_span(pts[-1].x - top.x, unit)} ({_rate(recent.slope, unit)}, {recent.n} points): "
                   "growth that stopped (a cache that filled, a warm-up) is a plateau, not a leak")
            return Growth("plateau", trend=recent, earlier=earlier, since=since, scatter=sc, why=why, **base)
        trend = recent
    else:
        trend = theil_sen(xs, ys)
        sc = scatter(trend, xs, ys)
        since = pts[0]
    if not (trend.low > 0 and trend.rise > GROWTH_NOISE_MULTIPLE * sc):
        moved = f"live bytes moved by {_g(added)} over {_span(xs[-1] - xs[0], unit)} ({n} points)"
        if trend.low <= 0:
            why = (f"no sustained growth: {moved}; the trend {_rate(trend.slope, unit)} has a 95% interval "
                   f"that reaches zero ({_rate(trend.low, unit)} to {_rate(trend.high, unit)})")
        else:
            why = (f"no sustained growth: {moved}; the rise of {_g(trend.rise)} is within the run's own "
                   f"scatter ({_g(sc)} about the line)")
        return Growth("flat", trend=trend, earlier=earlier, since=since, scatter=sc, why=why, **base)
    matters, reason = _matters(trend, pts, unit, limit, headroom, at_oom)
    desc = _describe(trend, since, pts, unit, sc, cut is not None)
    if not matters:
        return Growth("small", trend=trend, earlier=earlier, since=since, scatter=sc, matters=False,
                      why=f"{desc}, but {reason}", **base)
    rises = _stepwise_rises(pts[pts.index(since):])
    if rises is not None and rises < GROWTH_MIN_POINTS:
        # growth in a few steps between points that did not move at all (a cache filling in bursts, new
        # shapes) is judged by its steps, not its points: under four in order it is not yet a trend
        return Growth("growing", trend=trend, earlier=earlier, since=since, scatter=sc, matters=True,
                      few=True, rises=rises,
                      why=f"{desc}; {reason}; it came in {rises} step(s) between points that did not move",
                      **base)
    return Growth("growing", trend=trend, earlier=earlier, since=since, scatter=sc, matters=True,
                  rises=rises, why=f"{desc}; {reason}", **base)


def _stepwise_rises(pts: list[Point]) -> int | None:
    """The rises of a series that grows in steps: None unless at least half of its intervals left the
    live bytes exactly where they were (a steady or noisy leak moves them at every point)."""
    deltas = [b.live - a.live for a, b in zip(pts, pts[1:], strict=False)]
    if not deltas or 2 * sum(d == 0 for d in deltas) < len(deltas):
        return None
    return sum(d > 0 for d in deltas)


def _few(pts: list[Point], base: dict, limit: int | None, headroom: int | None, at_oom: bool) -> Growth:
    """Three points: growth only when every interval grew, steadily (no interval under
    GROWTH_STEADY_SHARE of the largest): a one-off jump or a slowing cache is not steady."""
    unit = base["unit"]
    steps = [b.live - a.live for a, b in zip(pts, pts[1:], strict=False)]
    xs = [float(p.x) for p in pts]
    trend = theil_sen(xs, [float(p.live) for p in pts])
    steady = all(d > 0 for d in steps) and min(steps) >= GROWTH_STEADY_SHARE * max(steps)
    if not steady:
        return Growth("too_few", trend=trend, few=True, since=pts[0],
                      why=f"{len(pts)} comparable points without a steady rise: a trend needs at least "
                          f"{GROWTH_MIN_POINTS} (or every interval growing steadily)", **base)
    # Sen's interval is undefined on so few points: the smallest interval's rate stands for its low.
    span = [b.x - a.x for a, b in zip(pts, pts[1:], strict=False)]
    low = min(d / s for d, s in zip(steps, span, strict=True) if s > 0)
    high = max(d / s for d, s in zip(steps, span, strict=True) if s > 0)
    trend = Trend(trend.slope, low, high, trend.intercept, trend.n, trend.x0, trend.x1)
    matters, reason = _matters(trend, pts, unit, limit, headroom, at_oom)
    desc = _describe(trend, pts[0], pts, unit, 0.0, False)
    state = "growing" if matters else "small"
    return Growth(state, trend=trend, few=True, since=pts[0], matters=matters,
                  why=f"{desc} (only {len(pts)} points)" + (f"; {reason}" if matters
                                                                                     else f", but {reason}"),
                  **base)


def _matters(trend: Trend, pts: list[Point], unit: str, limit: int | None, headroom: int | None,
             at_oom: bool) -> tuple[bool, str]:
    added = trend.rise
    lived = max(pts[-1].x - pts[0].x, trend.x1 - trend.x0, 1.0)
    horizon = GROWTH_HORIZON_MULTIPLE * lived
    if limit:
        if added > GROWTH_MATTERS_SHARE * limit:
            return True, f"it has added {_g(added)}, more than {GROWTH_MATTERS_SHARE:.0%} of the {_g(limit)} limit"
        if headroom is None or trend.slope <= 0:
            return False, "it is too small to matter under the limit"
        need = max(0.0, headroom) / trend.slope
        room = (f"the {_g(headroom)} of room under the {_g(limit)} limit that the run started with"
                if at_oom else f"the {_g(headroom)} left under the {_g(limit)} limit")
        if need <= horizon:
            return True, f"at this rate it uses {room} in {_span(need, unit)}"
        return False, (f"at this rate it would take {_span(need, unit)} to use {room}, over "
                       f"{GROWTH_HORIZON_MULTIPLE:g}x what the run has lived ({_span(lived, unit)})")
    ref = max(1, pts[-1].live)
    if added > GROWTH_MATTERS_SHARE * ref:
        return True, (f"it has added {_g(added)}, more than {GROWTH_MATTERS_SHARE:.0%} of the live bytes "
                      "(the limit is not known)")
    return False, (f"it has added only {_g(added)}, under {GROWTH_MATTERS_SHARE:.0%} of the live bytes (the "
                   "limit is not known)")


def _describe(trend: Trend, since: Point, pts: list[Point], unit: str, sc: float, late: bool) -> str:
    start = f"since {since.label}" if late else f"from {pts[0].label} to {pts[-1].label}"
    noise = f", scatter {_g(sc)}" if sc > 0 else ""
    if math.isfinite(trend.high) and trend.high - trend.low <= 0.005 * abs(trend.slope):
        interval = "the same in every interval"
    elif math.isfinite(trend.high):
        interval = f"95% interval {_rate(trend.low, unit, sign=False)} to {_rate(trend.high, unit, sign=False)}"
    else:  # Sen's upper rank lies beyond the pairs on a few points: only the lower bound is known
        interval = f"at least {_rate(trend.low, unit, sign=False)} at 95%"
    return f"live bytes grow {_rate(trend.slope, unit)} ({interval}, {trend.n} points {start}{noise})"


# -- the projection --------------------------------------------------------------------------------

@dataclass(frozen=True)
class Crossing:
    x: float        # where the need first passes the ceiling, in the series' unit
    early: float
    late: float


def crossing(g: Growth, excursion: int, ceilings: tuple[int, int], *, per: float = 1.0) -> Crossing | None:
    """Where the floor (the recent regime's line, anchored at the last point) plus `excursion` passes
    the first ceiling (and, for the late end, the second): at the slope, at its high end (early) and its
    low end (late, never under half the slope). `per`: the floor moves once every `per` units (an
    epoch's steps, when the growth comes between epochs), else continuously."""
    t = g.trend
    if not g.leak or t is None or g.last is None:
        return None
    x_last = g.last.x
    floor = max(float(g.last.live), t.at(x_last)) if g.few else t.at(x_last)

    def at(rate: float, ceiling: int) -> float:
        gap = ceiling - excursion - floor
        if gap < 0:
            return x_last + min(1.0, per)
        if rate <= 0:
            return math.inf
        if per > 1:
            k = math.floor(gap / (rate * per)) + 1
            start = x_last - (x_last % per)
            return start + k * per
        return x_last + math.floor(gap / rate) + 1

    mid = at(t.slope, ceilings[0])
    early = min(mid, at(t.high if math.isfinite(t.high) else t.slope, ceilings[0]))
    late = max(mid, at(max(t.low, t.slope / 2), ceilings[1]))
    return Crossing(mid, early, late)


# -- words -----------------------------------------------------------------------------------------

def _median(v: list[float]) -> float:
    s = sorted(v)
    n = len(s)
    if not n:
        return 0.0
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def _g(n: float) -> str:
    return fmt_bytes(n, "brief")


def _rate(r: float, unit: str, sign: bool = True) -> str:
    if not math.isfinite(r):
        return "unbounded"
    word = {"step": "a step", "epoch": "an epoch"}.get(unit, "a point")
    s = ("+" if r >= 0 else "-") if sign else ("" if r >= 0 else "-")
    return f"{s}{_g(abs(r))} {word}"


def _span(x: float, unit: str) -> str:
    if not math.isfinite(x):
        return "forever"
    n = int(round(x))
    word = {"step": "step", "epoch": "epoch"}.get(unit, "interval")
    return f"{n:,} {word}{'s' if n != 1 else ''}"
