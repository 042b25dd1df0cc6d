"""When a running job will run out of memory, from the live bytes it keeps between steps (pure).

ARCHITECTURE.md "Forecast". Whether live bytes grow, and at what rate, is the growth model's
(growth.py), on the same series the leak verdict reads (leak.choose_series): the agent's figures at
every step boundary, else comparable snapshots (epoch-end files counted in epochs). A plateau, a
floor that moves only with input shapes, or growth too small to matter is no forecast. This module
adds what a date needs:

- Bounded growth: where the comparable snapshots say the growth is gradients and optimizer state and
  both stay within what every parameter training would need (3x the parameters: a gradient and two
  AdamW moments), it is parameters starting to train (progressive unfreezing): its ceiling is
  projected, not a line.
- The need of a coming step: its floor (the growth model's line) plus the step's own excursion above
  the floor (the median of the recent steps: peak - floor before it).
- What the allocator can still reserve: the cache grows in segments; the largest one (the biggest
  input-sized block, rounded) is what a step needs whole. The reserve ceiling is the reserved bytes
  now plus as many such segments as still fit under LIMIT; the step whose need passes that ceiling is
  the one that fails. Without a segment size the ceiling is LIMIT itself.
- Epoch-end growth (the floor moves only between epochs) fails in the first step of an epoch; growth
  inside epochs fails at the step the line reaches. The interval comes from the slope's 95% interval
  and from the two ceilings (segments, LIMIT).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from memq.analysis import growth as gm
from memq.analysis.confidence import forecast_confidence
from memq.analysis.leak import figure_series, snapshot_series
from memq.analysis.rules import (
    FORECAST_EARLY_WARNING_SHARE,
    FORECAST_STATE_SHARE,
    FORECAST_TRAINED_MULTIPLE,
    GROWTH_FEW_POINTS,
    GROWTH_HORIZON_MULTIPLE,
)
from memq.analysis.series import compact
from memq.units import fmt_bytes

#: Figures kept as a forecast's inputs (the run diagnosis stores them, stats batches add to them):
#: older ones are merged pairwise (series.compact), so a long run keeps its whole shape.
MAX_FIGURES = 512
#: Recent steps whose excursion above the floor (their median) sets the coming step's.
RECENT_STEPS = 16


def forecast(figures: list[dict], limit: int | None, *, largest_segment: int | None = None,
             seconds_per_step: float | None = None, composition: list[dict] | None = None,
             as_of_time: float | None = None, comparable: list[dict] | None = None) -> dict | None:
    """`figures`: the agent's per-step figures, oldest first ({step, epoch, allocated, peak_allocated,
    peak_reserved, t, ...}). `comparable`: comparable snapshots ({step, epoch, epoch_end, active,
    reserved}) used when there are no figures. `composition`: per comparable snapshot, its composition
    by category (oldest first). Returns the contract's object, or None when there is no data at all."""
    figs = _usable(figures)
    comparable = comparable or []
    if not figs and not comparable and not figures:
        return None
    pts, unit, basis_pts = _series(figs, comparable)
    if not pts and not figs and not comparable:
        return None
    live_now = pts[-1].live if pts else 0
    peaks = [int(f["peak_allocated"]) for f in figs[-RECENT_STEPS:]] or \
        [int(c.get("peak") or c.get("active") or 0) for c in comparable[-2:]] or [live_now]
    peak_now = max(peaks)
    out = {"oom_expected": None, "step": None, "epoch": None, "eta_s": None, "rate_bytes_per_step": None,
           "headroom_bytes": None, "confidence": forecast_confidence("none"), "basis": "",
           "limit_bytes": limit, "as_of_step": pts[-1].step if pts else None, "as_of_time": as_of_time,
           "rate_bytes_per_epoch": None, "step_low": None, "step_high": None, "eta_low_s": None,
           "eta_high_s": None, "points": len(pts), "series": basis_pts, "near_miss": None,
           "unit": unit, "growth": None}
    if limit:
        out["headroom_bytes"] = int(limit - peak_now)
        # kept under the forecast document's field `near_miss`: the early warning, not headroom.near_miss
        out["near_miss"] = _early_warning(figs, comparable, limit)
    g = gm.assess(pts, unit, limit=limit, headroom=(limit - peak_now) if limit else None)
    out["growth"] = g.as_json()
    if g.state == "too_few":
        out["basis"] = f"{g.why} ({basis_pts})"
        return out
    epoch_len = _epoch_length(pts) if unit == "step" else None  # epochs marked, growth inside them
    t = g.trend
    if t is not None and g.leak:
        if unit == "step":
            out["rate_bytes_per_step"] = round(t.slope, 1)
            if epoch_len:
                out["rate_bytes_per_epoch"] = round(t.slope * epoch_len, 1)
        elif unit == "epoch":
            out["rate_bytes_per_epoch"] = round(t.slope, 1)
    if not g.leak:
        out.update(oom_expected=False, confidence=forecast_confidence("no_growth", len(pts)),
                   basis=f"{g.why} ({basis_pts})")
        return out
    bounded = _bounded_by_parameters(composition or [])
    if bounded is not None:
        ceiling = live_now + bounded["room"]
        need = ceiling + _excursion(figs, pts)
        fits = limit is None or need <= limit
        out.update(oom_expected=False if fits else None, confidence=forecast_confidence("bounded"),
                   basis=(f"the growth is gradients and optimizer state of parameters that started training "
                          f"(progressive unfreezing): they stop at {_g(bounded['ceiling'])} for "
                          f"{_g(bounded['params'])} of parameters"
                          + (f"; the step's need then, {_g(need)}, fits the limit" if fits and limit else "")))
        return out
    if not limit:
        out["basis"] = (f"{g.why}, but the limit is not known: give it (`--limit` for files, "
                        "`memq reanalyze --run RUN --limit SIZE` for a stored run) to know when it runs out")
        return out
    exc = _excursion(figs, pts) or _snapshot_excursion(comparable)
    reserved_now = max([int(f.get("peak_reserved") or f.get("reserved") or 0) for f in figs[-2:]]
                       + [int(c.get("reserved") or 0) for c in comparable[-1:]] + [0])
    ceilings = _ceilings(reserved_now, limit, largest_segment)
    cr = gm.crossing(g, exc, ceilings)
    cr = _reserve_first(cr, _reserved_series(figs, comparable, pts, unit), limit, pts)
    if cr is None or not math.isfinite(cr.x):
        out.update(oom_expected=False, confidence=forecast_confidence("undated"), basis=f"{g.why} ({basis_pts})")
        return out
    at, early, late = int(cr.x), int(cr.early), int(cr.late) if math.isfinite(cr.late) else None
    lived = max(1.0, pts[-1].x - pts[0].x)
    ahead = at - pts[-1].x
    if ahead > GROWTH_HORIZON_MULTIPLE * lived:
        # the growth model's horizon: a date further out than that is no forecast (the growth may stop)
        out.update(oom_expected=False, confidence=forecast_confidence("undated"),
                   basis=f"{g.why}; at this rate the limit is {_ahead(ahead, unit)} away, beyond "
                         f"{GROWTH_HORIZON_MULTIPLE:g}x what the series covers ({basis_pts})")
        return out
    if g.few:
        # three points grow steadily: said, with the date it points to, but not claimed (a cache that
        # fills for two epochs looks the same until the fourth point)
        settle = (f"{g.rises} step(s) cannot tell a leak from a cache filling in bursts (new shapes): "
                  f"one step more, or a long flat stretch, settles it"
                  if g.rises is not None else
                  f"{g.points} points cannot tell a leak from a cache that is still filling: "
                  f"one more point settles it")
        out["basis"] = (f"{g.why}; at this rate the limit is reached {_ahead(ahead, unit)} on, "
                        f"but {settle} ({basis_pts})")
        return out
    if unit == "step":
        out.update(oom_expected=True, step=at, step_low=early, step_high=late)
        if epoch_len:
            clock = _epoch_clock(figs, pts)
            out["epoch"] = clock.epoch_of(at) if clock is not None else _epoch_at(pts[-1], at, epoch_len)
        sps = _seconds_per_step(figs) or seconds_per_step
        if sps:
            last_step = pts[-1].x
            out["eta_s"] = round(max(0.0, (at - last_step) * sps), 1)
            out["eta_low_s"] = round(max(0.0, (early - last_step) * sps), 1)
            out["eta_high_s"] = None if late is None else round(max(0.0, (late - last_step) * sps), 1)
        when = f"step {at:,}" + (f" (epoch {out['epoch']})" if out["epoch"] is not None else "")
        between = f"between steps {early:,} and {late:,}" if late is not None else f"from step {early:,} on"
    elif unit == "epoch":
        if not figs and _kept_once_an_epoch(comparable):
            # an epoch-end snapshot is the state the next epoch starts from: growth that comes as one
            # block an epoch is kept at the epoch's end (a validation, a metric) and fails in the next
            # epoch; growth inside the epoch (blocks at every step) fails in the epoch itself
            at, late = at + 1, None if late is None else late + 1
        out.update(oom_expected=True, epoch=at)
        clock = _epoch_clock(figs, pts)
        if clock is not None:  # the points know their steps: the failing epoch's first step
            # the interval in steps covers whole epochs: from the early epoch's first step to the late one's last
            out.update(step=clock.first_step(at), step_low=clock.first_step(early),
                       step_high=None if late is None else clock.first_step(late + 1) - 1)
        sps = _seconds_per_step(figs) or seconds_per_step
        spe = _seconds_per_point(pts)
        if out["step"] is not None and sps and pts[-1].step is not None:
            last_step = pts[-1].step
            out["eta_s"] = round(max(0.0, (out["step"] - last_step) * sps), 1)
            out["eta_low_s"] = round(max(0.0, (out["step_low"] - last_step) * sps), 1)
            if out["step_high"] is not None:
                out["eta_high_s"] = round(max(0.0, (out["step_high"] - last_step) * sps), 1)
        elif spe:
            out["eta_s"] = round(max(0.0, (at - pts[-1].x) * spe), 1)
        when = f"epoch {at}"
        between = f"between epochs {early} and {late}" if late is not None else f"from epoch {early} on"
    else:
        out.update(oom_expected=True)
        when = f"{at - int(pts[-1].x)} more snapshot(s) at this spacing"
        between = f"between {early - int(pts[-1].x)} and {late - int(pts[-1].x) if late else '?'}"
    out["confidence"] = _confidence(g)
    per = gm._rate(t.slope, unit)
    out["basis"] = (f"live bytes grow {per} ({g.trend.n} points, {basis_pts}"
                    + (f", since {g.since.label}" if g.earlier is not None and g.since is not None else "")
                    + f"); a step needs {_g(exc)} above them, and the allocator can reserve up to "
                    f"{_g(ceilings[0])} of the {_g(limit)} limit"
                    + (f" in segments of {_g(largest_segment)}" if largest_segment else "")
                    + f": it runs out in {when}, {between}")
    return out


def _kept_once_an_epoch(comparable: list[dict]) -> bool:
    """Epoch-end snapshots whose live blocks grow by one from each to the next (the median): the growth
    is one allocation an epoch, not one at every step."""
    ends = [c["n_blocks"] for c in comparable if c.get("epoch_end") and isinstance(c.get("n_blocks"), int)]
    ups = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return bool(ups) and statistics.median(ups) == 1


def _ahead(x: float, unit: str) -> str:
    n = int(round(x))
    word = {"step": "step", "epoch": "epoch"}.get(unit, "snapshot")
    return f"{n:,} {word}{'s' if n != 1 else ''}"


def _confidence(g: gm.Growth) -> float:
    """More points and a tighter interval, more confidence (confidence.forecast_confidence)."""
    t = g.trend
    width = (t.high - t.low) / (2 * t.slope) if t and t.slope > 0 and math.isfinite(t.high - t.low) else 1.0
    return forecast_confidence("dated", g.points, interval_width=width, few=g.few)


def _series(figs: list[dict], comparable: list[dict]) -> tuple[list[gm.Point], str, str]:
    pts, unit = figure_series(figs)
    if len(pts) >= GROWTH_FEW_POINTS:
        kind = "epochs' last step boundaries" if unit == "epoch" else "step boundaries"
        return pts, unit, f"{len(pts)} {kind}"
    comp = [{"name": _comp_label(c, i), "active": int(c.get("active") or 0), "step": c.get("step"),
             "epoch": c.get("epoch"), "epoch_end": bool(c.get("epoch_end")), "t": c.get("t")}
            for i, c in enumerate(comparable)]
    spts, unit = snapshot_series(comp)
    if unit == "step":
        spts = [p for p in spts if p.step is not None and p.step >= 1]
    kind = "epoch-end snapshots" if unit == "epoch" else "comparable snapshots"
    return spts, unit, f"{len(spts)} {kind}"


def _comp_label(c: dict, i: int) -> str:
    if c.get("epoch_end"):
        return f"the end of epoch {c['epoch'] if isinstance(c.get('epoch'), int) else i}"
    if isinstance(c.get("step"), int):
        return f"step {c['step']}"
    return f"snapshot {i + 1}"


def _seconds_per_step(figs: list[dict]) -> float | None:
    timed = [(f["t"], f["step"]) for f in figs if isinstance(f.get("t"), (int, float))]
    if len(timed) >= 2 and timed[-1][1] > timed[0][1] and timed[-1][0] > timed[0][0]:
        return (timed[-1][0] - timed[0][0]) / (timed[-1][1] - timed[0][1])
    ms = [f["ms"] for f in figs if isinstance(f.get("ms"), (int, float)) and f["ms"] > 0]
    return statistics.median(ms) / 1000.0 if ms else None


@dataclass(frozen=True)
class EpochClock:
    """Epochs and steps of one run: epoch `e` starts at end + (e - e0 - 1) x per + 1, where `end` is the
    last step of epoch `e0`."""

    e0: float
    end: float
    per: float

    def first_step(self, epoch: float) -> int:
        return int(round(self.end + (epoch - self.e0 - 1) * self.per + 1))

    def epoch_of(self, step: float) -> int:
        return int(self.e0 + 1 + math.floor((step - (self.end + 1)) / self.per))


def _epoch_clock(figs: list[dict], pts: list[gm.Point]) -> EpochClock | None:
    """From the step figures (each epoch's end taken midway between its last read step and the next
    epoch's first: thinned reads hide the true end), else from epoch points that know their steps;
    None when steps are unknown."""
    steps = [gm.Point(x=float(f["step"]), live=0, label="", step=f["step"], epoch=f.get("epoch")) for f in figs
             if isinstance(f.get("epoch"), int)]
    per = _epoch_length(steps) if steps else None
    if per:
        lo: dict[int, int] = {}
        hi: dict[int, int] = {}
        for p in steps:
            lo[p.epoch] = min(p.step, lo.get(p.epoch, p.step))
            hi[p.epoch] = max(p.step, hi.get(p.epoch, p.step))
        done = [e for e in sorted(hi) if e + 1 in lo]
        if done:
            return EpochClock(done[-1], (hi[done[-1]] + lo[done[-1] + 1] - 1) / 2, per)
    known = [(p.x, p.step) for p in pts if p.step is not None]
    if len(known) >= 2 and known[-1][0] > known[0][0]:
        spe = (known[-1][1] - known[0][1]) / (known[-1][0] - known[0][0])
        return EpochClock(known[-1][0], known[-1][1], spe)
    return None


def _seconds_per_point(pts: list[gm.Point]) -> float | None:
    timed = [(p.t, p.x) for p in pts if p.t is not None]
    if len(timed) >= 2 and timed[-1][1] > timed[0][1] and timed[-1][0] > timed[0][0]:
        return (timed[-1][0] - timed[0][0]) / (timed[-1][1] - timed[0][1])
    return None


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


def _epoch_length(pts: list[gm.Point]) -> int | None:
    """Steps per epoch. Thinned boundary reads hide an epoch's true last step: it lies between the last
    step read in the epoch and the step before the first one read in the next, so each epoch's end is
    taken midway, and the length is the mean over every epoch that has a successor."""
    lo: dict[int, int] = {}
    hi: dict[int, int] = {}
    for p in pts:
        if p.epoch is not None and p.step is not None:
            lo[p.epoch] = min(p.step, lo.get(p.epoch, p.step))
            hi[p.epoch] = max(p.step, hi.get(p.epoch, p.step))
    ep = sorted(hi)
    ends = [(e, (hi[e] + lo[n] - 1) / 2) for e, n in zip(ep, ep[1:], strict=False) if n == e + 1]
    if len(ends) >= 2:
        return max(1, round((ends[-1][1] - ends[0][1]) / (ends[-1][0] - ends[0][0])))
    if len(ep) >= 2:
        return max(1, round((hi[ep[-1]] - hi[ep[0]]) / (ep[-1] - ep[0])))
    return None


def _excursion(figures: list[dict], pts: list[gm.Point]) -> int:
    """How far a step goes above the live bytes it starts from (the largest of the recent steps)."""
    figs = [f for f in figures if isinstance(f.get("allocated"), int) and isinstance(f.get("peak_allocated"), int)]
    # a figure of one step: its peak above the floor it started from (the figure before); a figure of
    # thinned reads (span > 1): its peak above its own floor, since the floor it started from is
    # several steps and the growth between them older
    ups = [int(b["peak_allocated"]) - int(b["allocated"] if int(b.get("span") or 1) > 1 else a["allocated"])
           for a, b in zip(figs, figs[1:], strict=False) if b.get("step", 0) >= 1][-RECENT_STEPS:]
    if ups:
        # The median: the first step of an epoch that creates a new optimizer's state (or runs right
        # after validation) goes higher once; the floor after it already holds what it added.
        return max(0, int(statistics.median(ups)))
    return 0


def _reserved_series(figs: list[dict], comparable: list[dict], pts: list[gm.Point], unit: str) -> list[tuple]:
    """(x, reserved bytes, reserved less live bytes) at the growth series' points: the figures' peak
    reserved and peak live (each epoch's highest where the points are epochs), else the comparable
    snapshots' reserved and live bytes."""
    if figs:
        if unit == "epoch":
            by: dict[int, tuple[int, int]] = {}
            for f in figs:
                if isinstance(f.get("epoch"), int):
                    r0, a0 = by.get(f["epoch"], (0, 0))
                    by[f["epoch"]] = (max(r0, int(f.get("peak_reserved") or 0)),
                                      max(a0, int(f.get("peak_allocated") or 0)))
            return sorted((float(e), r, r - a) for e, (r, a) in by.items() if r)
        return [(float(f["step"]), int(f["peak_reserved"]), int(f["peak_reserved"]) - int(f.get("peak_allocated") or 0))
                for f in figs if f.get("peak_reserved")]
    xs = [p.x for p in pts]
    rows = comparable[-len(xs):] if xs else []
    return [(x, int(c["reserved"]), int(c["reserved"]) - int(c.get("active") or 0))
            for x, c in zip(xs, rows, strict=False) if c.get("reserved")]


def _reserve_first(cr: gm.Crossing | None, reserved: list[tuple], limit: int,
                   pts: list[gm.Point]) -> gm.Crossing | None:
    """The reserve can run out before the need does: a leak whose blocks each take a segment of their
    own (large blocks are not split for others) strands free bytes beside them, and the cache grows
    faster than the live bytes. Where the reserved bytes above the live ones themselves trend up (their
    Theil-Sen lower bound over the recent half of the series above zero: bytes the allocator cannot give
    back), the OOM comes at the earlier of the two crossings: the reserved bytes' line meeting LIMIT. A
    cache that merely holds a step's freed blocks (released when the cap is reached) does not trend."""
    if cr is None or len(reserved) < 8:
        return cr
    recent = reserved[len(reserved) // 2:]
    gap = gm.theil_sen([x for x, _, _ in recent], [float(g) for _, _, g in recent])
    if gap.low <= 0:
        return cr
    t = gm.theil_sen([x for x, _, _ in recent], [float(r) for _, r, _ in recent])
    if t.slope <= 0 or t.low <= 0:
        return cr
    x_last = pts[-1].x if pts else recent[-1][0]
    at = x_last + max(0.0, (limit - t.at(x_last)) / t.slope)
    if at >= cr.x:
        return cr
    early = min(cr.early, x_last + max(0.0, (limit - t.at(x_last)) / t.high)) if math.isfinite(t.high) else cr.early
    return gm.Crossing(math.floor(at) + 1, min(early, math.floor(at) + 1), max(cr.late, math.floor(at) + 1))


def _snapshot_excursion(comparable: list[dict]) -> int:
    """Without step figures: how far the recorded traces of the comparable snapshots went above their
    live bytes (the median), else their reserved bytes above the live ones."""
    ups = [int(c["peak"]) - int(c.get("active") or 0) for c in comparable[-RECENT_STEPS:]
           if isinstance(c.get("peak"), int) and c["peak"] > int(c.get("active") or 0)]
    if not ups:
        # no trace: the cache the allocator keeps between steps holds the step's freed blocks, so the
        # reserved bytes above the live ones stand for what a step adds
        ups = [int(c["reserved"]) - int(c.get("active") or 0) for c in comparable[-RECENT_STEPS:]
               if isinstance(c.get("reserved"), int) and c["reserved"] > int(c.get("active") or 0)]
    return int(statistics.median(ups)) if ups else 0


def _ceilings(reserved_now: int, limit: int, segment: int | None) -> tuple[int, int]:
    """What the allocator can reserve: now plus whole segments that still fit (the first), and the
    limit itself (the second, the later bound: segments split and merge more than this assumes)."""
    if not segment or segment <= 0 or reserved_now >= limit:
        return limit, limit
    n = (limit - reserved_now) // segment
    return int(reserved_now + n * segment), limit


def _epoch_at(last: gm.Point, step: int, epoch_len: int) -> int | None:
    if last.epoch is None or last.step is None:
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
    if grown <= 0 or params <= 0 or state < FORECAST_STATE_SHARE * grown or held > FORECAST_TRAINED_MULTIPLE * params:
        return None
    ceiling = int(3 * params)
    return {"room": max(0, ceiling - held), "ceiling": ceiling, "params": params}


def _early_warning(figs: list[dict], comparable: list[dict], limit: int) -> dict | None:
    """The steps' peak within FORECAST_EARLY_WARNING_SHARE of the limit: said even when nothing grows (one
    more token of context, a larger batch, a torch upgrade is then an OOM). An earlier, wider margin than
    the near miss (analysis/headroom.py), on the steps' peak allocated bytes rather than the peak reserved."""
    peaks = [int(f["peak_allocated"]) for f in figs] or [int(c.get("peak") or c.get("active") or 0)
                                                        for c in comparable]
    if not peaks:
        return None
    peak = max(peaks)
    head = limit - peak
    if head > FORECAST_EARLY_WARNING_SHARE * limit:
        return None
    recent = peaks[-4:]
    rising = len(recent) > 1 and all(b > a for a, b in zip(recent, recent[1:], strict=False))
    return {"peak_bytes": int(peak), "headroom_bytes": int(head), "headroom_share": round(head / limit, 4),
            "rising": rising}


def _g(n: float) -> str:
    return fmt_bytes(n, "brief")


# -- inputs kept with the run diagnosis, refreshed by stats batches -------------------------------

_FIG_KEYS = ("step", "epoch", "allocated", "peak_allocated", "peak_reserved", "reserved", "ms", "t", "span",
             "step_first", "allocated_min", "allocated_max")


def inputs(figures: list[dict], limit: int | None, *, largest_segment: int | None, seconds_per_step: float | None,
           composition: list[dict], comparable: list[dict], as_of_time: float | None) -> dict:
    """What `forecast` was given, as plain data: the run diagnosis keeps it so that the agent's stats
    batches (per-step figures between snapshots) can move the forecast on without a snapshot."""
    return {"figures": compact([{k: f.get(k) for k in _FIG_KEYS if f.get(k) is not None} for f in _usable(figures)],
                               MAX_FIGURES),
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
    figs = compact(old + sorted(({k: f.get(k) for k in _FIG_KEYS if f.get(k) is not None} for f in add),
                                key=lambda f: f["step"]), MAX_FIGURES)
    t = as_of_time if isinstance(as_of_time, (int, float)) else kept.get("as_of_time")
    nxt = dict(kept, figures=figs, as_of_time=t)
    fc = forecast(figs, kept.get("limit"), largest_segment=kept.get("largest_segment"),
                  seconds_per_step=kept.get("seconds_per_step"), composition=kept.get("composition") or [],
                  as_of_time=t, comparable=kept.get("comparable") or [])
    return fc, nxt
