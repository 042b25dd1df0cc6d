"""The report as one self-contained HTML file: inline CSS, plots as inline SVG, no script, no
request to any other file or host (it opens from a mail attachment or a file share)."""

from __future__ import annotations

from typing import Any

from memq.report import plots
from memq.units import fmt_bytes

TEMPLATE = r"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>memq report {{ d.date }} ({{ d.scope }})</title>
<style>
 body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1f2328; background: #f6f8fa; }
 main { max-width: 1100px; margin: 0 auto; padding: 20px 24px 48px; background: #fff; }
 h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #d0d7de; padding-bottom: 4px; }
 .meta { color: #59636e; font-size: 12px; }
 .cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 14px 0; }
 .card { border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
 .card b { display: block; font-size: 22px; } .card.bad b { color: #cf222e; } .card.warn b { color: #bc4c00; }
 table { border-collapse: collapse; width: 100%; font-size: 13px; margin: 6px 0 10px; }
 th, td { border-bottom: 1px solid #eaeef2; padding: 4px 8px; text-align: left; vertical-align: top; }
 th { background: #f6f8fa; font-weight: 600; } td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
 .cause { display: inline-block; padding: 0 6px; border-radius: 10px; background: #eaeef2; font-size: 12px; }
 .new { color: #cf222e; font-weight: 600; } .muted { color: #59636e; }
 .plots { display: flex; flex-wrap: wrap; gap: 16px; } .plot svg { max-width: 100%; height: auto; }
 ul.summary li { margin: 2px 0; } .sim { font-size: 12px; color: #0a3069; } code { background: #f6f8fa; padding: 0 4px; border-radius: 4px; }
 .playbook { font-size: 12px; color: #59636e; }
</style>
</head>
<body><main>
<h1>memq nightly report: {{ d.date }}</h1>
<div class="meta">scope {{ d.scope_label }} &middot; window {{ d.window.start }} .. {{ d.window.end }} &middot; generated {{ d.generated_at }}</div>
<ul class="summary">{% for line in d.summary %}<li>{{ line }}</li>{% endfor %}</ul>
<div class="cards">
 <div class="card"><b id="total-runs">{{ d.totals.runs }}</b>runs</div>
 <div class="card {{ 'bad' if d.totals.oom_runs }}"><b id="total-ooms">{{ d.totals.oom_runs }}</b>OOM runs</div>
 <div class="card {{ 'warn' if d.totals.near_misses }}"><b id="total-near">{{ d.totals.near_misses }}</b>near misses</div>
 <div class="card"><b>{{ d.regressions|length }}</b>regressions</div>
 <div class="card"><b>{{ d.growing|length }}</b>growing runs</div>
 <div class="card"><b>{{ d.fragmented|length }}</b>fragmented runs</div>
</div>

<div class="plots">
 <div class="plot" id="plot-causes">{{ cause_svg|safe }}</div>
 <div class="plot" id="plot-trend">{{ trend_svg|safe }}</div>
</div>

<h2 id="ooms">OOMs and near misses</h2>
{% if d.breakdown.by_cause %}
<table><tr><th>root cause</th><th>OOM runs</th><th>near misses</th></tr>
{% for r in d.breakdown.by_cause %}<tr><td><span class="cause">{{ r.cause }}</span></td><td class="n">{{ r.ooms }}</td><td class="n">{{ r.near_misses }}</td></tr>{% endfor %}
</table>
<div class="plots">
<table style="width:auto"><tr><th>cluster</th><th>OOM</th><th>near</th></tr>
{% for r in d.breakdown.by_cluster %}<tr><td>{{ r.cluster }}</td><td class="n">{{ r.ooms }}</td><td class="n">{{ r.near_misses }}</td></tr>{% endfor %}</table>
<table style="width:auto"><tr><th>job</th><th>OOM</th><th>near</th></tr>
{% for r in d.breakdown.by_job %}<tr><td>{{ r.job }}</td><td class="n">{{ r.ooms }}</td><td class="n">{{ r.near_misses }}</td></tr>{% endfor %}</table>
</div>
{% else %}<p class="muted">No OOM and no near miss in this window.</p>{% endif %}
{% if d.ooms.runs %}
<table id="oom-runs"><tr><th>run</th><th>job / cluster</th><th>torch</th><th>cause</th><th>request</th><th>limit</th><th>peak reserved</th><th>first recommendation</th></tr>
{% for r in d.ooms.runs %}<tr><td>{{ r.run }}</td><td>{{ r.job or '-' }} / {{ r.cluster or '-' }}</td><td>{{ r.torch_version or '-' }}</td>
<td><span class="cause">{{ r.primary_cause or '-' }}</span> {{ '%.2f'|format(r.confidence) if r.confidence is not none }}{% if r.step_need %}<div class="muted step-need">{{ r.step_need }}</div>{% endif %}</td>
<td class="n">{{ b(r.requested_bytes) }}</td><td class="n">{{ b(r.limit_bytes) }}</td><td class="n">{{ b(r.peak_reserved_bytes) }}</td><td>{{ r.recommendation or '' }}{{ playbook(r.get('recommendation_playbook')) }}</td></tr>{% endfor %}
</table>{% if d.ooms.count > d.ooms.listed %}<p class="muted">{{ d.ooms.count - d.ooms.listed }} more not listed.</p>{% endif %}
{% endif %}
{% if d.near_misses.runs %}
<table id="near-runs"><tr><th>near miss</th><th>job / cluster</th><th>peak reserved</th><th>limit</th><th>headroom</th><th>cause</th><th>first recommendation</th></tr>
{% for r in d.near_misses.runs %}<tr><td>{{ r.run }}</td><td>{{ r.job or '-' }} / {{ r.cluster or '-' }}</td><td class="n">{{ b(r.peak_reserved_bytes) }}</td><td class="n">{{ b(r.limit_bytes) }} ({{ r.limit_kind }})</td>
<td class="n">{{ b(r.headroom_bytes) }} ({{ '%.1f'|format(100 * r.headroom_ratio) }}%)</td><td><span class="cause">{{ r.primary_cause or '-' }}</span></td><td>{{ r.recommendation or '' }}{{ playbook(r.get('recommendation_playbook')) }}</td></tr>{% endfor %}
</table>{% endif %}

<h2 id="regressions">Regressions by torch version</h2>
{% if d.regressions %}<table><tr><th>job</th><th>torch</th><th>runs</th><th>OOM rate</th><th>mean peak reserved</th><th>what got worse</th></tr>
{% for r in d.regressions %}<tr><td>{{ r.job }}</td><td>{{ r.previous_version }} &rarr; {{ r.torch_version }} {% if r.new %}<span class="new">new</span>{% endif %}</td>
<td class="n">{{ r.previous_runs }} &rarr; {{ r.runs }}</td><td class="n">{{ '%.0f'|format(100 * r.previous_oom_rate) }}% &rarr; {{ '%.0f'|format(100 * r.oom_rate) }}%</td>
<td class="n">{{ b(r.previous_mean_peak_reserved_bytes) }} &rarr; {{ b(r.mean_peak_reserved_bytes) }}</td><td>{{ r.reasons|join('; ') }}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">No job got worse on a newer torch version.</p>{% endif %}

<h2 id="fragmented">Most fragmented runs</h2>
{% if d.fragmented %}<table><tr><th>run</th><th>job / cluster</th><th>cause</th><th>fragmentation</th><th>free in pieces</th><th>reserved</th><th>setting that would help</th></tr>
{% for r in d.fragmented %}<tr><td>{{ r.run }}</td><td>{{ r.job or '-' }} / {{ r.cluster or '-' }}</td><td><span class="cause">{{ r.primary_cause or '-' }}</span></td>
<td class="n">{{ '%.2f'|format(r.fragmentation_ratio) }}</td><td class="n">{{ b(r.fragmented_free_bytes) }}</td><td class="n">{{ b(r.reserved_bytes) }}</td>
<td>{% if r.setting %}<code>PYTORCH_CUDA_ALLOC_CONF={{ r.setting }}</code>{% else %}-{% endif %}<div class="muted">{{ r.why or '' }}</div>{{ playbook(r.get('playbook')) }}
{% if r.simulated and r.simulated.predicted_oom is defined %}<div class="sim">allocator model on snapshot {{ r.simulated.snapshot }}: {{ 'recorded run not reproduced' if r.simulated.recorded_predicted_oom is none else ('OOM as recorded' if r.simulated.recorded_predicted_oom else 'no OOM as recorded') }}; with the setting
<b>{{ sim_outcome(r.simulated) }}</b>{% if r.simulated.predicted_oom is not none %}, peak reserved {{ b(r.simulated.recorded_peak_reserved_bytes) }} &rarr; {{ b(r.simulated.peak_reserved_bytes) }}{% endif %}{% if r.simulated.get('reason') %}<div class="muted">{{ r.simulated.get('reason') }}</div>{% endif %}</div>{% endif %}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">No run has much cached memory in pieces.</p>{% endif %}

<h2 id="growing">Memory that grows across epochs</h2>
{% if d.growing %}<table><tr><th>run</th><th>job / cluster</th><th>cause</th><th>growth</th><th>per epoch</th><th>evidence</th></tr>
{% for r in d.growing %}<tr><td>{{ r.run }}</td><td>{{ r.job or '-' }} / {{ r.cluster or '-' }}</td><td><span class="cause">{{ r.primary_cause or '-' }}</span></td>
<td class="n">+{{ b(r.growth_bytes) }}</td><td class="n">{{ b(r.mean_growth_per_epoch_bytes) if r.mean_growth_per_epoch_bytes else '-' }}</td>
<td>{{ r.source }}{% if r.floors %}: floor {{ r.floors|map('gib')|join(' &rarr; ')|safe }} GiB{% endif %}{% if r.leak_evidence %}<div class="muted">{{ r.leak_evidence }}</div>{% endif %}{% if r.forecast %}<div class="forecast">forecast: {{ r.forecast }}</div>{% endif %}</td></tr>{% endfor %}</table>
{% else %}<p class="muted">No run's memory grows across epochs.</p>{% endif %}

<h2 id="changes">Changes since the previous report</h2>
{% if d.changes %}<p class="muted">against {{ d.changes.previous_date }} ({{ d.changes.previous_source }})</p>
<ul>{% for line in d.changes.lines %}<li>{{ line }}</li>{% endfor %}</ul>
{% if d.changes.newly_flagged_runs %}<p>Newly flagged: {{ d.changes.newly_flagged_runs|join(', ') }}</p>{% endif %}
{% else %}<p class="muted">No earlier report to compare with.</p>{% endif %}

<h2 id="timelines">Memory timelines of flagged runs</h2>
{% for t in timelines %}<div class="plot timeline" data-run="{{ t.run }}">{{ t.svg|safe }}</div>{% else %}<p class="muted">No flagged run.</p>{% endfor %}
<p class="meta">memq report schema {{ d.schema }}; figures in bytes are binary units (GiB = 2^30).</p>
</main></body></html>
"""


def _env():
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    env.filters["gib"] = lambda v: f"{(v or 0) / 1024**3:.2f}"
    env.globals["b"] = lambda v: "-" if v is None else fmt_bytes(v)
    from memq.report.data import simulated_outcome

    env.globals["sim_outcome"] = simulated_outcome
    env.globals["playbook"] = _playbook_note
    return env


def _playbook_note(entry_id: object):
    """Where the advice is measured: the playbook entry as text, not a link, since this file is read
    from mail or a share with no docs/ beside it (`memq playbook ID` prints the entry). Nothing for a
    report stored before recommendations named an entry."""
    from markupsafe import Markup, escape

    from memq.playbook_doc import doc_link

    link = doc_link(entry_id)
    return Markup(f'<div class="playbook">playbook: <code>{escape(link)}</code></div>') if link else ""


def render_html(doc: dict[str, Any]) -> str:
    """The whole HTML document for a report dict from `memq.report.data.build_report`."""
    cause_svg = plots.to_svg(plots.cause_figure(doc["breakdown"]["by_cause"]))
    trend_svg = plots.to_svg(plots.trend_figure(doc["trend"])) if doc.get("trend") else ""
    timelines = [{"run": t["run"], "svg": plots.to_svg(plots.timeline_figure(t))} for t in doc.get("timelines") or []]
    return _env().from_string(TEMPLATE).render(d=doc, cause_svg=cause_svg, trend_svg=trend_svg, timelines=timelines)


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
