"""One sentence for the failing step's need (`diagnosis.step_need`), the same on every screen: analyze,
history, the web run page, the nightly report and alerts. The sentence itself is the analysis' own
(analysis/step_need.py `need_sentence`, which the evidence lines use too), so a screen never shows two
figures for one need. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.analysis.step_need import need_sentence


def step_need_line(diagnosis: Mapping[str, Any] | None, with_basis: bool = True) -> str | None:
    """"the failing step needed ~16.4 GiB (15.9-16.9 GiB) against 18.0 GiB: it fits in one piece", or
    None when no training step was cut off (no OOM, or an OOM outside a step). Where the need could not
    be projected the sentence says why (its basis); a projected one leaves the method to the evidence."""
    d = diagnosis or {}
    n = d.get("step_need")
    if not isinstance(n, Mapping):
        return None
    line = need_sentence(n, with_basis=with_basis and n.get("bytes") is None)
    if d.get("primary_cause") == "allocator_config" and n.get("fits_limit") is False:
        # the need is measured as the allocator rounded it: without the setting it would fit (the evidence)
        line = "with the allocator settings in effect, " + line
    return line


def step_need_headline(diagnosis: Mapping[str, Any] | None) -> str | None:
    """The sentence for a screen that also shows the primary cause's evidence: None when that evidence
    already says it (a spike's or a fragmentation's lines do), so no screen says it twice."""
    line = step_need_line(diagnosis)
    causes = (diagnosis or {}).get("causes") or []
    evidence = (causes[0].get("evidence") or []) if causes and isinstance(causes[0], Mapping) else []
    if line is None or any(isinstance(e, str) and line in e for e in evidence):
        return None
    return line
