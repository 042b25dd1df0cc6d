"""Shared output of the history commands: rich tables by default, `--json`, `--csv`.

JSON keeps every figure with byte counts as integers; tables format bytes for people. The store is
opened lazily inside a command (so `--help` never touches a database) and closed with the command.
Names come from other people's jobs: tables and CSV show control characters as escapes
(memq.render.safe), JSON as \\u escapes.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import click

from memq.errors import BadInput
from memq.render.safe import rich_text, safe_console, safe_text
from memq.units import fmt_bytes


def output_options(csv_ok: bool = True):
    def deco(f):
        if csv_ok:
            f = click.option("--csv", "as_csv", is_flag=True, help="Comma-separated values instead of a table.")(f)
        f = click.option("--json", "as_json", is_flag=True, help="One JSON document (byte counts as integers).")(f)
        return f

    return deco


def out_format(as_json: bool, as_csv: bool = False) -> str:
    if as_json and as_csv:
        raise click.UsageError("--json and --csv are exclusive")
    return "json" if as_json else "csv" if as_csv else "table"


def open_cli_store():
    """The configured store, closed when the click command ends."""
    from memq.store.connection import open_store  # sqlalchemy: never on fit/whatif's FILE path (pinned)

    store = open_store()
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(store.close)
    return store


def console(stderr: bool = False):
    return safe_console(file=sys.stderr if stderr else sys.stdout, highlight=False, soft_wrap=False,
                        width=None if (sys.stderr if stderr else sys.stdout).isatty() else 200)


def write_json(doc: Any) -> None:
    json.dump(doc, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


@dataclass(frozen=True)
class Col:
    key: str
    header: str
    kind: str = "text"  # text | bytes | ratio | time | conf | int
    justify: str = "left"


def cell(value: Any, kind: str) -> str:
    if value is None:
        return "-"
    if kind == "bytes":
        return fmt_bytes(value)
    if kind == "delta":
        return ("+" if value >= 0 else "-") + fmt_bytes(abs(value))
    if kind == "ratio":
        return f"{value:.2f}"
    if kind == "conf":
        return f"{value:.2f}"
    if kind == "time":
        return str(value).replace("T", " ")[:19]
    if isinstance(value, dict):
        return rich_text(",".join(f"{k}={v}" for k, v in value.items()))
    return rich_text(value)


def write_csv(rows: Iterable[dict[str, Any]], keys: Sequence[str]) -> None:
    """CSV with control characters in cells escaped (`\\x1b`, `\\r`), not stripped (memq.render.safe)."""
    w = csv.writer(sys.stdout, lineterminator="\n")
    w.writerow([safe_text(k) for k in keys])
    for r in rows:
        w.writerow(["" if r.get(k) is None else (json.dumps(r[k]) if isinstance(r.get(k), (dict, list))
                                                 else safe_text(r[k]) if isinstance(r[k], str) else r[k])
                    for k in keys])


def table(title: str | None, cols: Sequence[Col], rows: Iterable[dict[str, Any]], caption: str | None = None):
    from rich.table import Table  # rich: never for --json (pinned)

    t = Table(title=title, caption=caption, show_lines=False, header_style="bold")
    for c in cols:
        t.add_column(c.header, justify="right" if c.kind in ("bytes", "ratio", "conf", "int", "delta") else c.justify,
                     overflow="fold")
    for r in rows:
        t.add_row(*(cell(r.get(c.key), c.kind) for c in cols))
    return t


def emit(fmt: str, doc: Any, rows: list[dict[str, Any]], cols: Sequence[Col], title: str | None = None,
         csv_keys: Sequence[str] | None = None, empty: str = "nothing to show") -> None:
    if fmt == "json":
        write_json(doc)
    elif fmt == "csv":
        write_csv(rows, csv_keys or [c.key for c in cols])
    else:
        con = console()
        if not rows:
            con.print(empty)
        else:
            con.print(table(title, cols, rows))


def parse_labels(items: Iterable[str]) -> dict[str, str]:
    out = {}
    for it in items:
        k, sep, v = it.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"{it!r}: a label is KEY=VALUE", param_hint="--label")
        out[k.strip()] = v.strip()
    return out


_SINCE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*$", re.I)
_SECONDS = {"s": 1, "m": 60, "min": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str | None, now: Callable[[], dt.datetime] | None = None) -> dt.datetime | None:
    """`7d`, `24h`, `90m`, `2w`, or an ISO date/time (UTC when no offset)."""
    if text is None:
        return None
    now_ = (now or (lambda: dt.datetime.now(dt.UTC)))()
    m = _SINCE.match(text)
    if m:
        return now_ - dt.timedelta(seconds=float(m.group(1)) * _SECONDS[m.group(2).lower()])
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError as exc:
        raise BadInput(f"cannot read --since {text!r}", hint="use e.g. 7d, 24h, 30m, 2w or 2026-11-01") from exc
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t
