"""Webhook bodies for one alert. Pure. `render(fmt, body, key, starts_at)` -> the JSON document.

- `slack`: `{"text": ...}` (Slack incoming webhooks, Mattermost, Teams' Slack-compatible endpoints,
  most chat bridges); the link uses Slack's `<url|label>` markup.
- `alertmanager`: the document Alertmanager POSTs to a webhook receiver (version "4": receiver,
  status, alerts[] with labels, annotations, startsAt, endsAt, generatorURL, fingerprint; groupKey,
  groupLabels, commonLabels, commonAnnotations, externalURL), so receivers written for Alertmanager
  (PagerDuty bridges, incident bots) take memq's alerts unchanged. The label for the training job is
  `job_name`: `job` means the scrape job in Prometheus' world.
A summary (a body with `summary: true`, made by summary.py) has its own wording in both formats:
alertname MemqAlertsSummarised, the count, the causes with counts, the first and last run and the
link to the job's runs list.

Every string of a body that a job chose (run, cluster and job names, and whatever quotes them: the
title, the evidence) is escaped for its target, so a name cannot speak the target's markup:
- Slack: `&`, `<`, `>` become `&amp;`, `&lt;`, `&gt;` (the three characters Slack's message
  formatting reserves), so `<!channel>`, `<@U123>` or `<https://evil|label>` in a run name shows as
  text, pings nobody and links nowhere. The only markup in the text is memq's own: `*title*` and the
  `<link|label>` built here from the public URL and a percent-encoded run name.
- Alertmanager: labels and annotations are plain strings; control characters (C0, DEL, C1) and
  bidirectional overrides become U+FFFD and each value is cut to its cap (LABEL_MAX, ANNOTATION_MAX),
  so a receiver's template sees one bounded line of text.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping
from typing import Any

from memq.alerts.summary import causes_line, runs_line

FORMATS = ("slack", "alertmanager")
ALERT_NAMES = {"oom": "MemqOOM", "leak": "MemqLeak", "near_miss": "MemqNearMiss", "forecast": "MemqOOMForecast"}
SEVERITY = {"oom": "critical", "leak": "warning", "near_miss": "warning", "forecast": "critical"}
ZERO_TIME = "0001-01-01T00:00:00Z"
SUMMARY_NAME = "MemqAlertsSummarised"
#: Longest label value sent: PagerDuty's Events API v2 caps `summary` at 1,024 characters, the
#: tightest of the common Alertmanager receivers that copy a label or annotation into a title.
LABEL_MAX = 1024
#: Longest annotation sent: Opsgenie's alert description limit (15,000 characters).
ANNOTATION_MAX = 15000
_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029")
_SLACK_ESCAPES = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def slack_text(value: Any) -> str:
    """`value` as Slack shows it literally: no mention, no link, no channel ping can be made of it, and
    no line of its own (a name's line break becomes a space)."""
    return " ".join(str(value).splitlines()).translate(_SLACK_ESCAPES)


def slack_url(url: str) -> str:
    """memq's own link target: built from the public URL and percent-encoded names, so it holds none
    of `<`, `>`, `|` (which would end the link or start a forged label); encoded again here so an
    odd MEMQ_PUBLIC_URL cannot either."""
    return url.replace("<", "%3C").replace(">", "%3E").replace("|", "%7C").replace(" ", "%20")


def plain(value: Any, max_len: int) -> str:
    """`value` as one line of plain text for an Alertmanager label or annotation, at most `max_len`."""
    out = "".join("\ufffd" if c in _BIDI or unicodedata.category(c) == "Cc" else c for c in str(value))
    return out if len(out) <= max_len else out[: max_len - 1] + "\u2026"


def _plain_map(values: Mapping[str, Any], max_len: int) -> dict[str, str]:
    return {k: plain(v, max_len) for k, v in values.items()}


def slack(body: Mapping[str, Any]) -> dict[str, Any]:
    e = slack_text
    lines = [f"*{e(body['title'])}*", f"cause: {e(body.get('cause') or '?')} (verdict {e(body['verdict'])})",
             f"evidence: {e(body['evidence'])}", f"recommendation: {e(body['recommendation'])}"]
    if body.get("step_need"):
        lines.insert(2, f"step: {e(body['step_need'])}")
    if body.get("forecast"):
        lines.insert(2, f"forecast: {e(body['forecast'])}")
    if body.get("playbook"):
        lines.append(f"playbook: {e(body['playbook'])}")
    if body.get("link"):
        lines.append(f"<{slack_url(body['link'])}|run {e(body['run'])}>")
    return {"text": "\n".join(lines)}


def alertmanager(body: Mapping[str, Any], key: str, starts_at: str) -> dict[str, Any]:
    labels = {"alertname": ALERT_NAMES[body["kind"]], "severity": SEVERITY[body["kind"]], "run": body["run"],
              "verdict": body["verdict"], "cause": body.get("cause") or "",
              "cluster": body.get("cluster") or "", "job_name": body.get("job") or ""}
    annotations = {"summary": body["title"], "description": body["evidence"],
                   "recommendation": body["recommendation"]}
    if body.get("step_need"):
        annotations["step_need"] = body["step_need"]
    if body.get("forecast"):
        annotations["forecast"] = body["forecast"]
    if body.get("oom_at"):  # when the forecast OOM comes, and how far off it was when this was sent
        annotations["oom_at"] = body["oom_at"]
        annotations["eta"] = body.get("eta") or ""
    if body.get("link"):
        annotations["run_url"] = body["link"]
    if body.get("playbook"):
        annotations["playbook"] = body["playbook"]
    labels, annotations = _plain_map(labels, LABEL_MAX), _plain_map(annotations, ANNOTATION_MAX)
    alert = {"status": "firing", "labels": labels, "annotations": annotations, "startsAt": starts_at,
             "endsAt": ZERO_TIME, "generatorURL": body.get("link") or "", "fingerprint": key[:16]}
    return {"version": "4", "groupKey": f"memq:{key}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "memq", "groupLabels": {"alertname": labels["alertname"], "run": labels["run"]},
            "commonLabels": labels, "commonAnnotations": annotations, "externalURL": body.get("link") or "",
            "alerts": [alert]}


def slack_summary(body: Mapping[str, Any]) -> dict[str, Any]:
    e = slack_text
    lines = [f"*{e(body['title'])}*", f"causes: {e(causes_line(body))}", e(runs_line(body))]
    if body.get("link"):
        where = " / ".join(x for x in (body.get("cluster"), body.get("job")) if x) or "all jobs"
        lines.append(f"<{slack_url(body['link'])}|runs of {e(where)}>")
    return {"text": "\n".join(lines)}


def alertmanager_summary(body: Mapping[str, Any], key: str, starts_at: str) -> dict[str, Any]:
    labels = {"alertname": SUMMARY_NAME, "severity": SEVERITY[body["kind"]],
              "cluster": body.get("cluster") or "", "job_name": body.get("job") or ""}
    annotations = {"summary": body["title"], "description": f"{causes_line(body)}; {runs_line(body)}",
                   "count": str(body["count"]),
                   "causes": ", ".join(f"{c['cause'] or c['kind']}={c['count']}" for c in body["causes"]),
                   "first_run": body["first_run"], "last_run": body["last_run"],
                   "first_at": body["first_at"], "last_at": body["last_at"]}
    if body.get("link"):
        annotations["runs_url"] = body["link"]
    labels, annotations = _plain_map(labels, LABEL_MAX), _plain_map(annotations, ANNOTATION_MAX)
    alert = {"status": "firing", "labels": labels, "annotations": annotations, "startsAt": starts_at,
             "endsAt": ZERO_TIME, "generatorURL": body.get("link") or "", "fingerprint": key[:16]}
    return {"version": "4", "groupKey": f"memq:{key}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "memq", "groupLabels": {"alertname": SUMMARY_NAME, "cluster": labels["cluster"],
                                                "job_name": labels["job_name"]},
            "commonLabels": labels, "commonAnnotations": annotations, "externalURL": body.get("link") or "",
            "alerts": [alert]}


def render(fmt: str, body: Mapping[str, Any], key: str, starts_at: str) -> dict[str, Any]:
    summary = bool(body.get("summary"))
    if fmt == "slack":
        return slack_summary(body) if summary else slack(body)
    if fmt == "alertmanager":
        return alertmanager_summary(body, key, starts_at) if summary else alertmanager(body, key, starts_at)
    raise ValueError(f"unknown alert format {fmt!r} (one of {', '.join(FORMATS)})")
