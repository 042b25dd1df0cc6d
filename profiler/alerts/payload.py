"""Webhook bodies for one alert. Pure. `render(fmt, body, key, starts_at)` -> the JSON document.

- `slack`: `{"text": ...}` (Slack incoming webhooks, Mattermost, Teams' Slack-compatible endpoints,
  most chat bridges); the link uses Slack's `<url|label>` markup.
- `alertmanager`: the document Alertmanager POSTs to a webhook receiver (version "4": receiver,
  status, alerts[] with labels, annotations, startsAt, endsAt, generatorURL, fingerprint; groupKey,
  groupLabels, commonLabels, commonAnnotations, externalURL), so receivers written for Alertmanager
  (PagerDuty bridges, incident bots) take memq's alerts unchanged. The label for the training job is
  `job_name`: `job` means the scrape job in Prometheus' world.
Every value that comes from a job (run, cluster and job names, frame names in the evidence) is escaped
for its target: in Slack text `&`, `<` and `>` become `&amp;`, `&lt;` and `&gt;` (Slack's own escaping:
a run named `<!channel>` or `<https://evil|re-authenticate>` is shown, never pings or links) and line
breaks become spaces; in Alertmanager's labels and annotations, control characters become spaces and a
label stops at MAX_LABEL_CHARS. memq's own markup (the bold title, its links) is added after escaping.
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
#: Alertmanager keeps labels for grouping and routing; a longer value is a name nobody types (and a
#: way to bloat every notification), so it is cut with a marker.
MAX_LABEL_CHARS = 128
SUMMARY_NAME = "MemqAlertsSummarised"


def slack_escape(value: Any) -> str:
    """Text Slack shows as it is: its three control characters escaped, no line breaks."""
    text = " ".join(str(value).splitlines())
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_link(url: str, label: Any) -> str:
    """memq's own link: the URL is memq's (public URL + a quoted run name), cleared of the characters
    that would end Slack's link markup; the label is escaped."""
    safe_url = "".join(ch for ch in str(url) if ch not in "<>| \n\r\t")
    return f"<{safe_url}|{slack_escape(label)}>"


def plain(value: Any, limit: int | None = None) -> str:
    """A label or annotation value: printable, one line, cut at `limit` with a marker."""
    text = "".join(ch if ch.isprintable() else " " for ch in str(value))
    if limit is not None and len(text) > limit:
        text = text[: limit - 1] + "…"
    return text


def slack(body: Mapping[str, Any]) -> dict[str, Any]:
    e = slack_escape
    lines = [f"*{e(body['title'])}*", f"cause: {e(body.get('cause') or '?')} (verdict {e(body['verdict'])})",
             f"evidence: {e(body['evidence'])}", f"recommendation: {e(body['recommendation'])}"]
    if body.get("step_need"):
        lines.insert(2, f"step: {e(body['step_need'])}")
    if body.get("forecast"):
        lines.insert(2, f"forecast: {e(body['forecast'])}")
    if body.get("playbook"):
        lines.append(f"playbook: {e(body['playbook'])}")
    if body.get("link"):
        lines.append(slack_link(body["link"], f"run {body['run']}"))
    return {"text": "\n".join(lines)}


def alertmanager(body: Mapping[str, Any], key: str, starts_at: str) -> dict[str, Any]:
    lab = lambda v: plain(v, MAX_LABEL_CHARS)  # noqa: E731
    labels = {"alertname": ALERT_NAMES[body["kind"]], "severity": SEVERITY[body["kind"]], "run": lab(body["run"]),
              "verdict": lab(body["verdict"]), "cause": lab(body.get("cause") or ""),
              "cluster": lab(body.get("cluster") or ""), "job_name": lab(body.get("job") or "")}
    annotations = {"summary": plain(body["title"]), "description": plain(body["evidence"]),
                   "recommendation": plain(body["recommendation"])}
    if body.get("step_need"):
        annotations["step_need"] = plain(body["step_need"])
    if body.get("forecast"):
        annotations["forecast"] = plain(body["forecast"])
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
    e = slack_escape
    lines = [f"*{e(body['title'])}*", f"causes: {e(causes_line(body))}", e(runs_line(body))]
    if body.get("link"):
        where = " / ".join(x for x in (body.get("cluster"), body.get("job")) if x) or "all jobs"
        lines.append(slack_link(body["link"], f"runs of {where}"))
    return {"text": "\n".join(lines)}


def alertmanager_summary(body: Mapping[str, Any], key: str, starts_at: str) -> dict[str, Any]:
    lab = lambda v: plain(v, MAX_LABEL_CHARS)  # noqa: E731
    labels = {"alertname": SUMMARY_NAME, "severity": SEVERITY.get(body["kind"], "warning"),
              "cluster": lab(body.get("cluster") or ""), "job_name": lab(body.get("job") or "")}
    annotations = {"summary": plain(body["title"]), "description": plain(f"{causes_line(body)}; {runs_line(body)}"),
                   "count": str(body["count"]),
                   "causes": plain(", ".join(f"{c['cause'] or c['kind']}={c['count']}" for c in body["causes"])),
                   "first_run": plain(body["first_run"]), "last_run": plain(body["last_run"]),
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
