"""A run's per-step figures kept at bounded size with their whole shape (pure).

The growth model reads live bytes at every step boundary from the first optimizer step to now. A long
run sends thousands; what is kept with its diagnosis is at most `max_points` figures: the recent ones
as they came, the older ones merged pairwise, oldest first (bucket doubling), each merged figure
keeping its last boundary (the comparable point), the lowest and highest live bytes it covered, the
highest peaks and how many steps it spans. A 5,000-step run keeps its start, its plateau or its leak,
and its last steps at full resolution.
"""

from __future__ import annotations

from collections.abc import Sequence


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def merge(a: dict, b: dict) -> dict:
    """Two consecutive figures as one: `b`'s boundary is the bucket's comparable point."""
    out = dict(b)
    out["step_first"] = a.get("step_first", a.get("step"))
    lows = [x for x in (a.get("allocated_min", a.get("allocated")), b.get("allocated_min", b.get("allocated")))
            if _int(x)]
    highs = [x for x in (a.get("allocated_max", a.get("allocated")), b.get("allocated_max", b.get("allocated")))
             if _int(x)]
    if lows:
        out["allocated_min"] = min(lows)
    if highs:
        out["allocated_max"] = max(highs)
    for k in ("peak_allocated", "peak_reserved"):
        vals = [x for x in (a.get(k), b.get(k)) if _int(x)]
        if vals:
            out[k] = max(vals)
    out["span"] = int(a.get("span") or 1) + int(b.get("span") or 1)
    return out


def compact(figures: Sequence[dict], max_points: int) -> list[dict]:
    """`figures` (oldest first) in at most `max_points` figures: unchanged while they fit; else the
    newest half as they came, and everything older merged pairwise until it fits the other half (so a
    series compacted again and again loses resolution with age, never at its recent end)."""
    if max_points < 2:
        raise ValueError("compact needs room for at least two figures")
    figs = [dict(f) for f in figures]
    if len(figs) <= max_points:
        return figs
    keep = max_points // 2
    older, recent = figs[:-keep], figs[-keep:]
    room = max_points - keep
    while len(older) > room:
        older = [merge(older[i], older[i + 1]) if i + 1 < len(older) else older[i]
                 for i in range(0, len(older), 2)]
    return older + recent
