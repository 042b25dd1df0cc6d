"""A reason said once: what-if tables list one row per setting, and when several settings share the same
(often long) reason, the first row says it and the others point to it. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memq.render.words import said


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


def change_groups(changes: Sequence[Mapping[str, Any]], quiet: str = "no significant change") -> list[dict]:
    """"What changed", a change per entry: a stretch of one rank's consecutive intervals in which nothing
    changed is one entry (from its first snapshot to its last, `intervals` counting them), not one
    identical line per interval. `memq history` and the web run page read it."""
    out: list[dict] = []
    last: dict[Any, dict] = {}  # rank -> its latest entry (ranks' intervals interleave in time order)
    for ch in changes:
        prev = last.get(ch.get("rank"))
        if prev is not None and ch.get("summary") == quiet and prev["summary"] == quiet:
            prev.update(to=ch.get("to"), to_id=ch.get("to_id"), intervals=prev["intervals"] + 1)
        else:
            last[ch.get("rank")] = entry = dict(ch) | {"intervals": 1}
            out.append(entry)
    return out


def changes_once(changes: Sequence[Mapping[str, Any]], quiet: str = "no significant change") -> list[str]:
    """`memq history`'s "what changed" lines ("rank 0 A -> D (3 intervals): no significant change")."""
    return [f"rank {g.get('rank')} {g.get('from')} -> {g.get('to')}"
            + (f" ({g['intervals']} intervals)" if g["intervals"] > 1 else "") + f": {g.get('summary')}"
            for g in change_groups(changes, quiet)]


NOT_SETTLED = "not settled: "


def split_unsettled(causes: list[dict]) -> tuple[list[dict], list[dict]]:
    """(causes whose test says something, causes whose test could not run for a missing input): an
    unsettled cause is listed apart, never read as a finding."""
    found, open_ = [], []
    for c in causes:
        ev = c.get("evidence") or []
        (open_ if any(isinstance(e, str) and e.startswith(NOT_SETTLED) for e in ev) else found).append(c)
    return found, open_


def unsettled_lines(causes: list[dict], said_above: list[str]) -> list[str]:
    """One line per missing input, naming every cause it would settle; an input the lines above already
    named is pointed to, not said again."""
    by_reason: dict[str, list[str]] = {}
    for c in causes:
        for e in c.get("evidence") or []:
            if isinstance(e, str) and e.startswith(NOT_SETTLED):
                by_reason.setdefault(e[len(NOT_SETTLED):], []).append(said(c["cause"]))
    above = " ".join(str(e) for e in said_above)
    return [f"{', '.join(names)}: " + ("the input named above" if reason in above else reason)
            for reason, names in by_reason.items()]
