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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.alerts.summary import causes_line, runs_line

FORMATS = ("slack", "alertmanager")
ALERT_NAMES = {"oom": "MemqOOM", "leak": "MemqLeak", "near_miss": "MemqNearMiss", "forecast": "MemqOOMForecast"}
SEVERITY = {"oom": "critical", "leak": "warning", "near_miss": "warning", "forecast": "critical"}
ZERO_TIME = "0001-01-01T00:00:00Z"
SUMMARY_NAME = "MemqAlertsSummarised"


def slack(body: Mapping[str, Any]) -> dict[str, Any]:
    lines = [f"*{body['title']}*", f"cause: {body.get('cause') or '?'} (verdict {body['verdict']})",
             f"evidence: {body['evidence']}", f"recommendation: {body['recommendation']}"]
    if body.get("step_need"):
        lines.insert(2, f"step: {body['step_need']}")
    if body.get("forecast"):
        lines.insert(2, f"forecast: {body['forecast']}")
    if body.get("playbook"):
        lines.append(f"playbook: {body['playbook']}")
    if body.get("link"):
        lines.append(f"<{body['link']}|run {body['run']}>")
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
    alert = {"status": "firing", "labels": labels, "annotations": annotations, "startsAt": starts_at,
             "endsAt": ZERO_TIME, "generatorURL": body.get("link") or "", "fingerprint": key[:16]}
    return {"version": "4", "groupKey": f"memq:{key}", "truncatedAlerts": 0, "status": "firing",
            "receiver": "memq", "groupLabels": {"alertname": labels["alertname"], "run": labels["run"]},
            "commonLabels": labels, "commonAnnotations": annotations, "externalURL": body.get("link") or "",
            "alerts": [alert]}


def slack_summary(body: Mapping[str, Any]) -> dict[str, Any]:
    lines = [f"*{body['title']}*", f"causes: {causes_line(body)}", runs_line(body)]
    if body.get("link"):
        where = " / ".join(x for x in (body.get("cluster"), body.get("job")) if x) or "all jobs"
        lines.append(f"<{body['link']}|runs of {where}>")
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
