"""A reason said once: what-if tables list one row per setting, and when several settings share the same
(often long) reason, the first row says it and the others point to it. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def label(row: Mapping[str, Any]) -> str:
    return row.get("conf") or "(recorded)"


def said_once(rows: Sequence[Mapping[str, Any]], key: str = "reason") -> list[str | None]:
    """Per row: its reason the first time that text appears, "as for <first setting>" after that, None
    where it has none."""
    first: dict[str, str] = {}
    out: list[str | None] = []
    for r in rows:
        text = r.get(key)
        if not text:
            out.append(None)
        elif text in first:
            out.append(f"as for {first[text]}")
        else:
            first[text] = label(r)
            out.append(str(text))
    return out


def changes_once(changes: Sequence[Mapping[str, Any]], quiet: str = "no significant change") -> list[str]:
    """`memq history`'s "what changed", one line per change: a stretch of consecutive intervals of one
    rank in which nothing changed is one line ("rank 0 A -> D (3 intervals): no significant change"),
    not one identical line per interval."""
    out: list[str] = []
    i = 0
    while i < len(changes):
        ch = changes[i]
        j = i
        if ch.get("summary") == quiet:
            while (j + 1 < len(changes) and changes[j + 1].get("summary") == quiet
                   and changes[j + 1].get("rank") == ch.get("rank")):
                j += 1
        span = f" ({j - i + 1} intervals)" if j > i else ""
        out.append(f"rank {ch.get('rank')} {ch.get('from')} -> {changes[j].get('to')}{span}: {ch.get('summary')}")
        i = j + 1
    return out
