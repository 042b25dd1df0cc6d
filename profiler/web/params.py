"""Query-string validation: every endpoint names the parameters it takes; anything else, or a value
that does not parse, is a `BadInput` whose message the server returns with status 400. Pure."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

from memq.errors import BadInput
from memq.model import CAUSE_NAMES as CAUSES
from memq.model import RUN_STATUSES

MAX_TEXT = 200  # longest name, job or cluster the schema stores
MAX_OFFSET = 100_000  # paging by offset is capped; narrow the filter to reach older runs
MAX_PAGE = 500


def check_known(query: Mapping[str, str], allowed: Iterable[str]) -> None:
    allowed = set(allowed)
    unknown = sorted(set(query) - allowed)
    if unknown:
        raise BadInput(f"unknown query parameter {unknown[0]!r}", hint="allowed: " + ", ".join(sorted(allowed)))


def text(query: Mapping[str, str], name: str) -> str | None:
    v = query.get(name)
    if v is None or v == "":
        return None
    if len(v) > MAX_TEXT or any(ord(c) < 32 for c in v):
        raise BadInput(f"{name}: at most {MAX_TEXT} printable characters")
    return v


def choice(query: Mapping[str, str], name: str, options: Iterable[str], default: str | None = None) -> str | None:
    v = query.get(name) or default
    options = list(options)
    if v is not None and v not in options:
        raise BadInput(f"{name}: {v[:40]!r} is not one of {', '.join(options)}")
    return v


def integer(query: Mapping[str, str], name: str, default: int | None, lo: int, hi: int) -> int | None:
    v = query.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise BadInput(f"{name}: {v[:40]!r} is not an integer") from None
    if not lo <= n <= hi:
        raise BadInput(f"{name}: {n} is outside {lo}..{hi}")
    return n


def date(query: Mapping[str, str], name: str) -> dt.datetime | None:
    """An ISO date or date-time (UTC when it has no offset)."""
    v = query.get(name)
    if v is None or v == "":
        return None
    try:
        t = dt.datetime.fromisoformat(v.strip())
    except ValueError:
        raise BadInput(f"{name}: {v[:40]!r} is not a date (YYYY-MM-DD or an ISO date-time)") from None
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t


RUN_PARAMS = ("cluster", "job", "status", "cause", "torch", "since", "until", "sort", "order", "limit", "offset",
              "after", "before")


def cursor(query: Mapping[str, str], name: str) -> tuple[dt.datetime, int] | None:
    """A keyset cursor `ISO-time~run-id`, as the runs listing hands them out."""
    v = query.get(name)
    if v is None or v == "":
        return None
    t, sep, rid = v.rpartition("~")
    try:
        if not sep or not rid.isdigit() or len(rid) > 18:
            raise ValueError
        when = dt.datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError:
        raise BadInput(f"{name}: {v[:60]!r} is not a cursor (TIME~ID, from next_cursor/prev_cursor)") from None
    return (when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when), int(rid)


def run_page(query: Mapping[str, str], sorts: Iterable[str]) -> dict[str, Any]:
    """The runs listing's parameters, checked: filters, sort, order, limit, offset."""
    check_known(query, RUN_PARAMS)
    since, until = date(query, "since"), date(query, "until")
    if since and until and until <= since:
        raise BadInput("until must be later than since")
    after, before = cursor(query, "after"), cursor(query, "before")
    if after and before:
        raise BadInput("give after or before, not both")
    sort = choice(query, "sort", sorts, "started")
    if (after or before) and sort != "started":
        raise BadInput("cursors page the listing sorted by start time only (sort=started)")
    return {
        "after": after, "before": before,
        "cluster": text(query, "cluster"), "job": text(query, "job"),
        "status": choice(query, "status", RUN_STATUSES), "cause": choice(query, "cause", CAUSES),
        "torch_version": text(query, "torch"), "since": since, "until": until,
        "sort": sort, "order": choice(query, "order", ("asc", "desc"), "desc"),
        "limit": integer(query, "limit", 50, 1, MAX_PAGE),
        # with a cursor the offset only numbers the rows shown, so it is not capped
        "offset": integer(query, "offset", 0, 0, 10**12 if after or before else MAX_OFFSET),
    }
