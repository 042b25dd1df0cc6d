"""One sentence for the failing step's need (`diagnosis.step_need`), the same on every screen: analyze,
history, the web run page, the nightly report and alerts. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.units import fmt_bytes, fmt_need

_VERDICT = {True: "it fits in one piece", False: "it does not fit, whatever the allocator does",
            None: "too close to the limit to tell"}


def step_need_line(diagnosis: Mapping[str, Any] | None) -> str | None:
    """"the failing step needed ~16.4 GiB (15.9-16.9 GiB) against 18.0 GiB: it fits in one piece", or
    None when no training step was cut off (no OOM, or an OOM outside a step)."""
    n = (diagnosis or {}).get("step_need")
    if not isinstance(n, Mapping):
        return None
    lim = n.get("limit_bytes")
    against = f" against {fmt_bytes(lim, 'brief')}" if lim else " (limit unknown)"
    if n.get("bytes") is None:
        why = n.get("basis") or "no projection"
        if n.get("fits_limit") is False and lim:
            return f"the failing step needed more than the {fmt_bytes(lim, 'brief')} limit: it does not fit ({why})"
        return (f"the failing step needed {fmt_need(None, n.get('low'), None)}{against}: whether it fits is "
                f"not known ({why})")
    return (f"the failing step needed {fmt_need(n['bytes'], n.get('low'), n.get('high'))}{against}: "
            f"{_VERDICT[n.get('fits_limit')]}")


def step_need_headline(diagnosis: Mapping[str, Any] | None) -> str | None:
    """The sentence for a screen that also shows the primary cause's evidence: None when that evidence
    already says it (a spike's or a fragmentation's first lines do), so no screen says it twice."""
    line = step_need_line(diagnosis)
    causes = (diagnosis or {}).get("causes") or []
    evidence = (causes[0].get("evidence") or []) if causes and isinstance(causes[0], Mapping) else []
    if line is None or any(isinstance(e, str) and e.startswith(line) for e in evidence):
        return None
    return line
