"""The words every screen uses for memq's enums and counts: one mapping, read by the terminal, the web
pages and the report, so `external_memory` or `not_assessable` never reaches a reader as an identifier
and "1 snapshots" is never printed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.analysis.memory import free_in_pieces
from memq.analysis.run_verdict import undetermined
from memq.model import WORDS, said  # noqa: F401 (the screens' words, read from here as from model)
from memq.units import fmt_bytes

# English plurals memq prints: the irregular ones; every other noun takes an "s".
PLURALS = {"near miss": "near misses", "this": "these", "entry": "entries", "is": "are"}


def noun(n: int | float | None, word: str, many: str | None = None) -> str:
    """The noun alone, as the count asks: a card shows the number apart from it."""
    return word if n == 1 else (many or PLURALS.get(word) or word + "s")


def plural(n: int | float | None, word: str, many: str | None = None) -> str:
    """"1 snapshot", "2 snapshots", "1 near miss", "3 near misses"."""
    count = 0 if n is None else n
    return f"{count} {noun(count, word, many)}"


def labelled(label: str, line: str) -> str:
    """`label: line`, once: a line that names itself ("OOM forecast: not known yet") keeps its own words
    after the caller's label ("forecast: not known yet"), never "forecast: OOM forecast: ..."."""
    head, sep, rest = line.partition(": ")
    if sep and head.lower().endswith(label.split()[0].lower()):
        line = rest
    return f"{label}: {line}"


def verdict_head(diagnosis: Mapping[str, Any] | None) -> tuple[str, str]:
    """(what the verdict is, its confidence in words) for a screen's headline: "capacity",
    "confidence 0.68"; an OOM that no deciding test settled reads "undetermined", its candidate named as
    such ("best candidate capacity, confidence 0.30"), never as a finding."""
    d = diagnosis or {}
    cause, conf = d.get("primary_cause"), d.get("confidence")
    c = f"{conf:.2f}" if isinstance(conf, (int, float)) else "-"
    if undetermined(d):
        return "undetermined", f"best candidate {said(cause)}, confidence {c}"
    return said(cause), f"confidence {c}"


def verdict_headline(diagnosis: Mapping[str, Any] | None) -> str:
    """"capacity (confidence 0.68)", or "undetermined (best candidate capacity, confidence 0.30)"."""
    what, conf = verdict_head(diagnosis)
    return f"{what} ({conf})"


def pieces_text(metrics: Mapping[str, Any] | None) -> str:
    """"2.53 GiB (0.15 of reserved)": cached free memory outside the largest free block, the figure every
    screen shows of a snapshot in place of the fragmentation ratio (0.7-0.9 in healthy caches and
    capacity OOMs alike, it read as a problem); "-" without the figures."""
    m = metrics or {}
    pieces = free_in_pieces(m.get("reserved_unallocated_bytes"), m.get("largest_free_block_bytes"))
    if pieces is None:
        return "-"
    share = f" ({pieces / m['reserved_bytes']:.2f} of reserved)" if m.get("reserved_bytes") else ""
    return fmt_bytes(pieces) + share
