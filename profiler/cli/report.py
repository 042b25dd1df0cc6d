"""`memq report` (the nightly report on demand) and `memq plot` (one run's memory timeline).

    memq report --date 2026-11-29 --scope cluster=a --format html --out report.html
    memq plot --run R --out run.png        # or run.html (self-contained, inline SVG)

Without --date the report covers the latest UTC day with run activity in the scope (today on a
live system). The report is also stored in the database (one row per date and scope: a rerun
replaces it) and written to MEMQ_REPORT_DIR/<scope>/<date>.{html,md,json}, unless --no-store.
--out writes regular files only (memq.render.outfile): a device, FIFO or directory, a missing
parent directory or an unwritable place is one error line and exit 2, checked before any work.
"""

from __future__ import annotations

import datetime as dt
import sys
from pathlib import Path

import click

from memq.cli._listing import open_cli_store
from memq.errors import BadInput, NotFound
from memq.pipeline.report_source import SqlReportSource
from memq.render.outfile import check_output, write_output
from memq.render.safe import safe_text
from memq.render.words import plural
from memq.report import generate, plots
from memq.report.data import run_timeline
from memq.report.html import render_timeline_html
from memq.store.report_queries import Scope, latest_activity_date


def _date(ctx, param, value):
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not a date (YYYY-MM-DD)") from exc


def _format_for(fmt: str | None, out: str | None) -> str:
    if fmt:
        return fmt
    suffix = Path(out).suffix.lower().lstrip(".") if out else ""
    return {"htm": "html", "html": "html", "markdown": "md", "md": "md", "json": "json"}.get(suffix, "md")


@click.command()
@click.option("--date", "day", callback=_date, metavar="YYYY-MM-DD",
              help="UTC day to report on (default: the latest day with run activity).")
@click.option("--scope", default="all", show_default=True, metavar="all|cluster=C|job=J")
@click.option("--format", "fmt", type=click.Choice(["html", "md", "json"]),
              help="Output format (default: from --out's suffix, else md).")
@click.option("--out", metavar="PATH", help="Write here (a regular file) instead of stdout.")
@click.option("--store/--no-store", "save", default=True, show_default=True,
              help="Also keep it in the database and MEMQ_REPORT_DIR.")
def report(day, scope, fmt, out, save):
    """OOMs and near misses by cause, regressions, fragmentation and growth for one UTC day."""
    sc = Scope.parse(scope)
    fmt = _format_for(fmt, out)
    if out:
        check_output(out)  # fail before the report is computed (and stored)
    store = open_cli_store()
    if day is None:
        with store.session() as s:
            day = latest_activity_date(s, sc) or dt.datetime.now(dt.UTC).date()
        click.echo(f"memq: report for {day.isoformat()} (the latest day with runs in scope {sc.key})", err=True)
    doc, texts = generate(store, day, sc, save=save, formats=(fmt,))
    text = texts[fmt]
    if out:
        write_output(out, text)
        totals = doc["totals"]
        click.echo(f"memq: wrote {safe_text(out)} ({fmt}, {plural(totals['runs'], 'run')}, {totals['oom_runs']} OOM, "
                   f"{plural(totals['near_misses'], 'near miss')})", err=True)
    else:
        sys.stdout.write(text)


@click.command()
@click.option("--run", "run_name", required=True)
@click.option("--out", metavar="PATH", help="run.png (default <run>.png) or run.html.")
@click.option("--points", type=click.IntRange(10, 5000), default=400, show_default=True,
              help="Buckets of the stat-sample timeline (max per bucket).")
def plot(run_name, out, points):
    """A run's memory timeline: reserved, allocated, the limit, snapshots and the OOM."""
    out = out or f"{''.join(c if c.isalnum() or c in '._-' else '_' for c in run_name)}.png"
    suffix = Path(out).suffix.lower()
    if suffix not in (".png", ".html", ".htm", ".svg"):
        raise BadInput(f"cannot tell the format of {out!r}", hint="end --out with .png, .svg or .html")
    check_output(out)
    store = open_cli_store()
    with store.session() as s:
        tl = run_timeline(SqlReportSource(s), run_name, points=points)
    if not tl["series"] and not any(x["reserved_bytes"] is not None for x in tl["snapshots"]):
        raise NotFound(f"run {run_name!r} has no stat samples and no analysed snapshot to plot",
                       hint="ingest snapshots or --stats for it first")
    if suffix == ".png":
        write_output(out, plots.to_png(plots.timeline_figure(tl)))
    elif suffix == ".svg":
        write_output(out, plots.to_svg(plots.timeline_figure(tl)))
    else:
        write_output(out, render_timeline_html(tl))
    click.echo(f"memq: wrote {safe_text(out)} ({plural(len(tl['series']), 'timeline point')}, "
               f"{plural(len(tl['snapshots']), 'snapshot')}"
               f"{', OOM marked' if tl['oom'] else ''})", err=True)
