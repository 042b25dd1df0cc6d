"""HTML of the pages: Jinja2 templates (autoescaped) shipped in profiler/web/templates, with the
page's data embedded as JSON for the small script in profiler/web/static/memq.js to draw.

`inline=True` (used by `memq view`) puts the CSS and the script into the page itself, so the file
works offline with nothing beside it."""

from __future__ import annotations

import functools
import json
import time
from importlib import resources
from typing import Any
from urllib.parse import quote

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from markupsafe import Markup

from memq.analysis.compare import fmt_delta
from memq.analysis.recommend import stated_effect
from memq.playbook_doc import doc_link, web_href
from memq.render.forecast_text import forecast_line
from memq.render.reasons import change_groups, said_once, split_unsettled, unsettled_lines, whatif_here
from memq.render.step_need_text import step_need_headline
from memq.render.words import labelled, pieces_text, plural, said, verdict_head
from memq.units import fmt_bytes


def json_for_script(doc: Any) -> str:
    """JSON safe inside <script type="application/json">: `<`, `>` and `&` escaped, so a frame or a
    run name can never close the element."""
    s = json.dumps(doc, separators=(",", ":"), default=str)
    return s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


@functools.lru_cache(maxsize=4)
def static_text(name: str) -> str:
    return resources.files("memq.web").joinpath("static", name).read_text(encoding="utf-8")


def _ratio(v: Any) -> str:
    return "-" if v is None else f"{v:.2f}"


def _delta(v: Any) -> str:
    """A signed size, as `memq compare` prints it ("+465.25 MiB", "-896.00 KiB", "+0 B")."""
    return "-" if v is None else fmt_delta(int(v))


def _time(v: Any) -> str:
    return "-" if not v else str(v).replace("T", " ")[:19]


def _bytes(v: Any) -> str:
    return fmt_bytes(v, unknown="-")


#: What a snapshot without a diagnosis is doing, in words (the states of store/repository/snapshots.py).
SNAPSHOT_STATES = {"pending": "waiting for analysis", "running": "being analysed",
                   "failed": "quarantined (could not be analysed)", "done": "analysed, no diagnosis"}


def _snapshot_state(state: Any) -> str:
    return SNAPSHOT_STATES.get(str(state), f"state {state}" if state else "not analysed yet")


@functools.lru_cache(maxsize=1)
def _env():
    env = Environment(loader=PackageLoader("memq.web", "templates"), autoescape=select_autoescape(["html"]),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(said_once=said_once, step_need_headline=step_need_headline, bytes=_bytes,
                       forecast_line=lambda fc: forecast_line(fc, time.time()), ratio=_ratio, time=_time,
                       q=lambda v: quote(str(v), safe=""), snapshot_state=_snapshot_state,
                       playbook_doc=doc_link, playbook_href=web_href, effect=stated_effect,
                       said=said, plural=plural, labelled=labelled, verdict_head=verdict_head,
                       split_unsettled=split_unsettled, unsettled_lines=unsettled_lines, whatif_here=whatif_here,
                       change_groups=change_groups, pieces=pieces_text, delta=_delta)
    return env


def render_page(template: str, *, data: Any = None, inline: bool = False, **ctx: Any) -> str:
    extra = {"data_json": Markup(json_for_script(data)) if data is not None else None, "inline": inline}
    if inline:
        js = static_text("memq.js")
        if "</script" in js.lower():
            raise ValueError("memq.js must not contain '</script' to be inlined")
        extra |= {"inline_css": Markup(static_text("memq.css")), "inline_js": Markup(js)}
    return _env().get_template(template).render(**ctx, **extra)
