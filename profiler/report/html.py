"""The report as one self-contained HTML file: inline CSS, plots as inline SVG, no script, no
request to any other file or host (it opens from a mail attachment or a file share)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup, escape

from memq.playbook_doc import doc_link
from memq.render.words import noun, plural, said
from memq.report import plots
from memq.report.data import simulated_outcome
from memq.units import fmt_bytes

# The page's template is a package file: HTML lines keep their natural length there.
TEMPLATE_FILE = Path(__file__).with_name("templates") / "report.html"


@functools.cache
def _template_text() -> str:
    return TEMPLATE_FILE.read_text()  # once per process, not once per report rendered


def _env():
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["gib"] = lambda v: f"{(v or 0) / 1024**3:.2f}"
    env.globals["b"] = lambda v: "-" if v is None else fmt_bytes(v)
    env.filters.update(said=said, plural=plural)
    env.globals["noun"] = noun
    env.globals["sim_outcome"] = simulated_outcome
    env.globals["playbook"] = _playbook_note
    return env


def _playbook_note(entry_id: object):
    """Where the advice is measured: the playbook entry as text, not a link, since this file is read
    from mail or a share with no docs/ beside it (`memq playbook ID` prints the entry). Nothing for a
    report stored before recommendations named an entry."""
    link = doc_link(entry_id)
    return Markup(f'<div class="playbook">playbook: <code>{escape(link)}</code></div>') if link else ""


def render_html(doc: dict[str, Any]) -> str:
    """The whole HTML document for a report dict from `memq.report.data.build_report`."""
    cause_svg = plots.to_svg(plots.cause_figure(doc["breakdown"]["by_cause"]))
    trend_svg = plots.to_svg(plots.trend_figure(doc["trend"])) if doc.get("trend") else ""
    timelines = [{"run": t["run"], "svg": plots.to_svg(plots.timeline_figure(t))} for t in doc.get("timelines") or []]
    return _env().from_string(_template_text()).render(d=doc, cause_svg=cause_svg, trend_svg=trend_svg,
                                                                timelines=timelines)


def render_timeline_html(tl: dict[str, Any]) -> str:
    """`memq plot --out run.html`: one run's timeline as a self-contained page."""
    env = _env()
    page = env.from_string(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>memq plot {{ t.run }}</title>"
        "<style>body{font:14px system-ui,sans-serif;margin:20px} svg{max-width:100%;height:auto}</style></head>"
        "<body><h1 style=\"font-size:18px\">{{ t.run }}</h1><div class=\"plot\">{{ svg|safe }}</div>"
        "<p>limit {{ b(t.limit_bytes) }}{% if t.limit_kind %} ({{ t.limit_kind }}){% endif %}; peak reserved "
        "{{ b(t.peak_reserved_bytes) }}; {{ t.snapshots|length }} snapshots; {{ t.series|length }} timeline points"
        "{% if t.oom %}; OOM at {{ t.oom.t }} requesting {{ b(t.oom.requested_bytes) }}{% endif %}</p></body></html>")
    return page.render(t=tl, svg=plots.to_svg(plots.timeline_figure(tl)))
