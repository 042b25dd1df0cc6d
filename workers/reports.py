"""The nightly report: a Celery task on the memq.report queue, started by beat at a UTC time.

- `nightly_report(date=None, scope=None)`: for every configured scope (MEMQ_REPORT_SCOPES), build
  the report of `date` (default: yesterday, UTC), store it keyed by (date, scope) and write it to
  MEMQ_REPORT_DIR. A rerun replaces the stored row and the files; it never adds a second one.
  Missed days are caught up: every day of the last MEMQ_REPORT_CATCHUP_DAYS without a stored
  report is built too, oldest first, so each report's "changes" compare with the day before it.
  Two ticks at once (two beats by mistake) write the same rows twice: harmless.
- Optional webhook (MEMQ_REPORT_WEBHOOK_URL): the Markdown summary of the newest report per scope
  is POSTed as JSON `{"text": ...}` with a timeout, to that URL only: no proxy from the
  environment, no redirect followed (a 3xx is a failure), http(s) only. A failed POST is logged
  and returned in the task's result; the report itself is already stored.
- `beat_entries(settings)`: what `memq.workers.app.beat_schedule` adds: one crontab entry at
  MEMQ_REPORT_HOUR_UTC:MEMQ_REPORT_MINUTE_UTC (the app runs with enable_utc and timezone UTC).
The work is `run_nightly(store, settings, ...)`, a plain function (no Celery) that tests and
`memq report` share; the task binds it to the app.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from celery.schedules import crontab

from memq.config import Settings
from memq.errors import BadInput, ConfigError
from memq.report import generate
from memq.report.markdown import render_markdown
from memq.store.report_queries import Scope, report_dates
from memq.workers import runtime
from memq.workers.app import app, settings_of
from memq.workers.base import MemqTask

log = logging.getLogger("memq.workers.reports")

TASK_NAME = "workers.reports.nightly_report"


def configured_scopes(st: Settings):
    scopes = [Scope.parse(s) for s in (st.report_scopes or "all").split(",") if s.strip()]
    return scopes or [Scope.parse("all")]


def dates_to_build(store, scope, target: dt.date, catchup_days: int) -> list[dt.date]:
    """`target` always (a rerun replaces it), plus the days of the catch-up window before it that
    have no stored report, oldest first."""
    first = target - dt.timedelta(days=max(0, catchup_days - 1))
    with store.session() as s:
        have = report_dates(s, scope, first, target)
    days = [first + dt.timedelta(days=i) for i in range((target - first).days)]
    return [d for d in days if d not in have] + [target]


def run_nightly(store, st: Settings, *, date: dt.date | None = None, scopes: list | None = None,
                today: dt.date | None = None, catch_up: bool = True, webhook: bool = True) -> dict[str, Any]:
    """Build, store and write the reports; post the webhook. Returns what was done, per scope."""
    today = today or dt.datetime.now(dt.UTC).date()
    target = date or today - dt.timedelta(days=1)
    out: dict[str, Any] = {"date": target.isoformat(), "scopes": []}
    for scope in scopes or configured_scopes(st):
        days = dates_to_build(store, scope, target, st.report_catchup_days) if catch_up else [target]
        done = []
        doc = None
        for day in days:
            doc, _ = generate(store, day, scope)
            done.append({"date": day.isoformat(), "report_id": doc["report_id"], "runs": doc["totals"]["runs"],
                         "oom_runs": doc["totals"]["oom_runs"], "path": doc["files"]["html"]})
            log.info("report %s %s: %d runs, %d OOM", day, scope.key, doc["totals"]["runs"], doc["totals"]["oom_runs"])
        entry: dict[str, Any] = {"scope": scope.key, "built": done, "webhook": None}
        if webhook and st.report_webhook_url and doc is not None:
            text = render_markdown(doc, summary_only=True)
            if len(done) > 1:
                text += f"\n(also caught up: {', '.join(d['date'] for d in done[:-1])})\n"
            try:
                entry["webhook"] = {"status": post_webhook(st.report_webhook_url, text, st.report_webhook_timeout_s)}
            except (OSError, BadInput, ConfigError) as exc:
                log.warning("report webhook failed: %s", exc)
                entry["webhook"] = {"error": f"{type(exc).__name__}: {exc}"}
        out["scopes"].append(entry)
    return out


# ------------------------------------------------------------------------------------------ webhook


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect could send the summary to a host nobody configured: refuse it."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        raise urllib.error.HTTPError(req.full_url, code, f"redirect to {newurl!r} refused (webhook posts only to "
                                     "the configured URL)", headers, fp)


def post_webhook(url: str, text: str, timeout_s: float = 10.0) -> int:
    """POST {"text": text} as JSON to `url` (the configured webhook, nothing else); returns the
    HTTP status. Raises ConfigError for a URL that is not http(s) with a host, OSError (URLError,
    HTTPError, timeouts) when the POST fails."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"MEMQ_REPORT_WEBHOOK_URL must be an http(s) URL with a host, got {parts.scheme!r}",
                          hint="e.g. https://hooks.example.com/services/...")
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())
    body = json.dumps({"text": text}).encode("utf-8")
    req = urllib.request.Request(url, data=body, method="POST",  # noqa: S310 - scheme checked above
                                 headers={"Content-Type": "application/json", "User-Agent": "memq-report"})
    with opener.open(req, timeout=timeout_s) as resp:
        return int(resp.status)


# ------------------------------------------------------------------------------------- Celery glue


def beat_entries(st: Settings) -> dict[str, dict]:
    """The nightly report's beat entry (UTC; memq.workers.app sets enable_utc and timezone UTC)."""
    if not (0 <= st.report_hour_utc <= 23 and 0 <= st.report_minute_utc <= 59):
        raise ConfigError("MEMQ_REPORT_HOUR_UTC must be 0..23 and MEMQ_REPORT_MINUTE_UTC 0..59")
    return {"memq-nightly-report": {
        "task": TASK_NAME,
        "schedule": crontab(minute=st.report_minute_utc, hour=st.report_hour_utc),
        "options": {"queue": "memq.report", "expires": 12 * 3600},
    }}


def _bind():
    @app.task(base=MemqTask, bind=True, name=TASK_NAME)
    def nightly_report(self, date: str | None = None, scope: str | None = None) -> dict:
        """Beat calls it with no arguments (yesterday, every configured scope, catch-up);
        `date`/`scope` rebuild one report by hand: `celery call workers.reports.nightly_report
        --kwargs '{"date": "2026-11-29"}'`."""
        st = settings_of(app)
        day = dt.date.fromisoformat(date) if date else None
        scopes = [Scope.parse(scope)] if scope else None
        return run_nightly(runtime.store(st), st, date=day, scopes=scopes)

    return nightly_report


nightly_report = _bind()
