"""Byte sizes: parse what users type (`17.2GiB`, `40GB`, `123456`) and format for people, and the
one sparkline. Pure, stdlib only (the analysis passes import it)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from memq.errors import BadInput

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def parse_size(text: str | int) -> int:
    """Bytes from `text`. Bare numbers are bytes; GiB/MiB/KiB are binary, GB/MB/KB decimal,
    and a bare G/M/K is binary (as nvidia-smi and torch messages mean it)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise BadInput(f"cannot read size {text!r}", hint="use bytes or a unit, e.g. 17179869184 or 16GiB")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def fmt_bytes(n: int | float | None, unit: str = "auto", *, unknown: str = "n/a") -> str:
    """Bytes for people; the one byte formatter of memq (the web page's script mirrors "auto").

    unit="auto":  the largest of GiB, MiB, KiB that n reaches, 2 decimals (`1.50 GiB`, `512 B`): tables.
    unit="GiB":   always GiB, 2 decimals, so figures set against a limit line up: alerts, what-if lines.
    unit="brief": GiB down to a tenth of one, else MiB with 1 decimal (`0.25 GiB`, `12.5 MiB`): the
                  evidence sentences of the analysis, which stored diagnoses and tests quote verbatim.
    `unknown` is what None reads as.
    """
    if n is None:
        return unknown
    if unit == "GiB":
        return f"{n / GiB:.2f} GiB"
    if unit == "brief":
        return f"{n / GiB:.2f} GiB" if abs(n) >= GiB / 10 else f"{n / MiB:.1f} MiB"
    if unit != "auto":
        raise ValueError(f"unknown unit {unit!r}")
    sign = "-" if n < 0 else ""
    n = abs(n)
    for name, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return f"{sign}{n / div:.2f} {name}"
    return f"{sign}{int(n)} B"


def fmt_need(point: int | None, low: int | None, high: int | None) -> str:
    """A need with its interval, one unit when both ends share it: `~8.15 GiB (7.49-9.62 GiB)`."""
    if point is None:
        return f"at least {fmt_bytes(low, 'brief')}" if low else "unknown"
    if low is None or high is None:
        return f"~{fmt_bytes(point, 'brief')}"
    lo, hi = fmt_bytes(low, "brief"), fmt_bytes(high, "brief")
    if lo.split()[-1] == hi.split()[-1]:
        lo = lo.rsplit(" ", 1)[0]
    return f"~{fmt_bytes(point, 'brief')} ({lo}-{hi})"


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], *, width: int | None = None, base: float | None = None,
              top: float | None = None) -> str:
    """One bar per value (None counts as 0), scaled from `base` (default: the smallest) to `top`
    (default: the largest). Past `width` values, each bar is the largest of a run of neighbours, so
    a peak is never averaged away."""
    vals = [v or 0 for v in values]
    if not vals:
        return ""
    step = max(1, len(vals) // width) if width else 1
    pts = [max(vals[i:i + step]) for i in range(0, len(vals), step)] if step > 1 else vals
    lo = min(pts) if base is None else base
    hi = top if top else max(pts)
    span = (hi - lo) or 1
    return "".join(SPARK[min(7, max(0, int((v - lo) / span * 7.999)))] for v in pts)
