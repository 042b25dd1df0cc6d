"""A reason said once: what-if tables list one row per setting, and when several settings share the same
(often long) reason, the first row says it and the others point to it. Pure text from plain data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memq.analysis.classify import LIMIT_LEAD, NEED_LIMIT
from memq.analysis.recommend import WHATIF_POINTER
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

    def named_above(reason: str) -> bool:
        return reason in above or (reason == NEED_LIMIT and LIMIT_LEAD in above)

    return [f"{', '.join(names)}: " + ("the input named above" if named_above(reason) else reason)
            for reason, names in by_reason.items()]


def panel_cause_lines(causes: Sequence[Mapping[str, Any]], skip: str | None = None, found_max: int = 3,
                      evidence_max: int = 1, open_max: int = 2) -> list[str]:
    """A run panel's cause lines (`memq history`, `memq ingest`): the causes whose test said something, by
    name in words ("external memory", never `external_memory`), then one "not settled" line per missing
    input, as `memq analyze` lists them apart: an unsettled cause is never shown as a finding. `skip`: a
    sentence the panel already says (the failing step's need), left out of the evidence."""
    causes = [c for c in causes if isinstance(c, Mapping)]
    found, open_ = split_unsettled(causes[1:])
    out = []
    for c in ([causes[0]] if causes else []) + found[: max(0, found_max - 1)]:
        for ev in [e for e in c.get("evidence") or [] if not (skip and skip in str(e))][:evidence_max]:
            out.append(f"{said(c['cause'])}: {ev}")
    said_above = [str(e) for c in causes[:1] for e in c.get("evidence") or []]
    lines = unsettled_lines(open_, said_above)
    out += [f"not settled: {line}" for line in lines[:open_max]]
    if len(lines) > open_max:  # a panel stays short: the rest by name (`--json` and the run page say why)
        out.append("not settled either: " + ", ".join(x.split(": ", 1)[0] for x in lines[open_max:]))
    return out


def whatif_here(text: str, table_below: bool) -> str:
    """A recommendation's effect on a page that shows the what-if table under the verdict: its pointer
    to `memq whatif` becomes a pointer to that table (the CLI screens, which print none, keep it)."""
    return text.replace(WHATIF_POINTER, "(the what-if table below says why)") if table_below else text
