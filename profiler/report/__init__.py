"""Nightly and on-demand reports, and run timeline plots.

- `data.build_report(source, date, scope)`: gathers the figures from a source of plain dicts
  (`memq.pipeline.report_source.SqlReportSource(session)`: the report's queries).
- `html.render_html(doc)`, `markdown.render_markdown(doc)`, `render(doc, fmt)`: format them.
- `plots`: matplotlib (Agg) figures, embedded as inline SVG in HTML.
- `generate(store, date, scope, ...)`: build, store in the reports table (one row per date and
  scope: a rerun replaces it) and write `<report_dir>/<scope>/<date>.{html,md,json}`.
Nothing here is imported by `import memq`; matplotlib loads only when a plot is drawn.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from memq.analysis import ANALYZER_VERSION
from memq.pipeline.report_source import SqlReportSource
from memq.pipeline.sweeps import whatif_simulator
from memq.report.data import build_report, stored_summary
from memq.report.html import render_html
from memq.report.markdown import render_markdown
from memq.store import repository as repo

FORMATS = ("html", "md", "json")


def render(doc: dict[str, Any], fmt: str) -> str:
    if fmt == "json":
        return json.dumps(doc, indent=2, sort_keys=False, default=str) + "\n"
    if fmt == "md":
        return render_markdown(doc)
    if fmt == "html":
        return render_html(doc)
    raise ValueError(f"unknown report format {fmt!r}")


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file in the same folder and rename, so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def generate(store, day: dt.date, scope, *, write_dir: str | Path | None = None, save: bool = True,
             now: dt.datetime | None = None, formats: tuple[str, ...] = FORMATS,
             simulate: bool = True) -> tuple[dict[str, Any], dict[str, str]]:
    """Build the report of (day, scope); when `save`, write the three formats under
    `write_dir/<scope slug>/` (default: settings.report_dir) and upsert the reports row.
    Returns (document, {format: rendered text}): every format when saving, else `formats`.
    `simulate`: replay the top fragmented runs under the proposed setting (needs their blobs)."""
    with store.session() as s:
        doc = build_report(SqlReportSource(s), day, scope, now=now,
                           simulate=whatif_simulator(store, s) if simulate else None)
    texts = {fmt: render(doc, fmt) for fmt in (FORMATS if save else formats)}
    if save:
        base = Path(write_dir or store.settings.report_dir).expanduser() / scope.slug()
        paths = {fmt: base / f"{day.isoformat()}.{fmt}" for fmt in FORMATS}
        for fmt, p in paths.items():
            write_atomic(p, texts[fmt])
        doc["files"] = {fmt: str(p) for fmt, p in paths.items()}
        with store.session() as s:
            doc["report_id"] = repo.upsert_report(s, day, scope.key, stored_summary(doc), path=str(paths["html"]),
                                                  analyzer_version=ANALYZER_VERSION)
    return doc, texts
