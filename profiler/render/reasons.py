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
