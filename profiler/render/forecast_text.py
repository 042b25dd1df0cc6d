"""One sentence for a run's OOM forecast (`forecast` in `memq history --json`), the same on every screen:
history, runs, the web run page, the nightly report and alerts. Pure text from plain data; the time left
is counted from the forecast's own moment (`as_of_time`) to `now`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from memq.units import fmt_bytes


def remaining_s(fc: Mapping[str, Any] | None, now: float | None) -> float | None:
    """Seconds from `now` to the forecast OOM (never below 0); None when no OOM is expected or no time
    is known."""
    if not isinstance(fc, Mapping) or not fc.get("oom_expected") or fc.get("eta_s") is None:
        return None
    at = fc.get("as_of_time")
    passed = (now - at) if isinstance(at, (int, float)) and now is not None else 0.0
    return max(0.0, float(fc["eta_s"]) - max(0.0, passed))


def fmt_duration(s: float | None) -> str:
    """'about 2 h 10 min', 'about 4 min', 'under a minute'."""
    if s is None or not math.isfinite(s):
        return "at an unknown time"
    if s < 60:
        return "within a minute"
    m = round(s / 60)
    if m < 60:
        return f"in about {m} min"
    h, m = divmod(m, 60)
    if h < 48:
        return f"in about {h} h {m} min" if m else f"in about {h} h"
    return f"in about {round(h / 24)} days"


def forecast_line(fc: Mapping[str, Any] | None, now: float | None = None) -> str | None:
    """"will run out of memory in epoch 7 (step 84, in about 2 h 10 min) at +1.26 GiB per epoch: the growth
    is allocated at train.py:98 in validate", "no OOM expected: ...", or None (no forecast)."""
    if not isinstance(fc, Mapping):
        return None
    if fc.get("oom_expected") is None:
        return f"OOM forecast: not known yet ({fc.get('basis') or 'too little data'})"
    if fc.get("oom_expected") is False:
        near = fc.get("near_miss")
        tail = ""
        if isinstance(near, Mapping):
            tail = (f"; but the steps' peak is within {fmt_bytes(near.get('headroom_bytes'), 'brief')} of the limit"
                    + (" and rising" if near.get("rising") else ""))
        return f"no OOM expected: {fc.get('basis')}{tail}"
    left = remaining_s(fc, now)
    when = fmt_duration(left) if left is not None else "time unknown"
    if fc.get("epoch") is not None and fc.get("step") is not None:
        where = f"epoch {fc['epoch']} (step {fc['step']:,}, {when})"
    elif fc.get("epoch") is not None:
        where = f"epoch {fc['epoch']} ({when})"
    else:
        where = f"step {fc.get('step'):,} ({when})" if fc.get("step") is not None else f"the coming snapshots ({when})"
    per_epoch = fc.get("rate_bytes_per_epoch")
    rate = (f"+{fmt_bytes(per_epoch, 'brief')} per epoch" if per_epoch else
            f"+{fmt_bytes(fc.get('rate_bytes_per_step'), 'brief')} per step")
    rate += _trend_tail(fc.get("growth"))
    site = f": the growth is allocated at {fc['site']}" if fc.get("site") else ""
    return f"will run out of memory in {where} at {rate}{site}"


def _trend_tail(g: Any) -> str:
    """ "(95%: +1.1 to +1.4 GiB per step, 12 points since step 40)": what the rate stands on."""
    if not isinstance(g, Mapping) or g.get("rate_low_bytes") is None:
        return ""
    unit = {"step": "step", "epoch": "epoch"}.get(g.get("unit"), "point")
    lo, hi = g.get("rate_low_bytes"), g.get("rate_high_bytes")
    if isinstance(hi, (int, float)) and math.isfinite(hi):
        rng = f"95%: {fmt_bytes(lo, 'brief')} to {fmt_bytes(hi, 'brief')} per {unit}"
    else:
        rng = f"at least {fmt_bytes(lo, 'brief')} per {unit} at 95%"
    since = f" since {g['since']}" if g.get("since") else ""
    return f" ({rng}, {g.get('trend_points') or g.get('points')} points{since})"
