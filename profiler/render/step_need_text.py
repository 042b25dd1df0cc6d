"""One sentence for the failing step's need (`diagnosis.step_need`), the same on every screen: analyze,
history, the web run page, the nightly report and alerts. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from profiler.units import fmt_bytes

_VERDICT = {True: "it fits in one piece", False: "it does not fit, whatever the allocator does",
            None: "too close to the limit to tell"}


def _b(n: Any) -> str:
    return fmt_bytes(n, "brief", unknown="?")


def step_need_line(diagnosis: Mapping[str, Any] | None) -> str | None:
    """"the failing step needed ~16.4 GiB (15.9-16.9 GiB) against 18.0 GiB: it fits in one piece", or
    None when no training step was cut off (no OOM, or an OOM outside a step)."""
    n = (diagnosis or {}).get("step_need")
    if not isinstance(n, Mapping):
        return None
    lim = n.get("limit_bytes")
    against = f" against {_b(lim)}" if lim else " (limit unknown)"
    if n.get("bytes") is None:
        least = f"at least {_b(n['low'])}" if n.get("low") else "an unknown amount"
        verdict = "it does not fit" if n.get("fits_limit") is False else "whether it fits is not known"
        return f"the failing step needed {least}{against}: {verdict} ({n.get('basis') or 'no projection'})"
    rng = f" ({_b(n.get('low'))}-{_b(n.get('high'))})" if n.get("low") is not None and n.get("high") is not None else ""
    return f"the failing step needed ~{_b(n['bytes'])}{rng}{against}: {_VERDICT[n.get('fits_limit')]}"
