"""Which verdict a run has, and what its alert says. Pure: plain values in, plain values out.

A verdict is the part of a run's state that is worth a page:
- `oom:<cause>`: the run hit an out-of-memory error; `<cause>` is its run-level primary cause
  (a later diagnosis that names another cause is a new verdict: `oom:capacity` -> `oom:leak`);
- `leak`: no OOM (yet), and the run-level diagnosis is a leak;
- `near_miss`: no OOM and no leak, and a near miss (analysis/headroom.near_miss): the run's peak
  reserved bytes left less than MEMQ_ALERT_HEADROOM_PCT of its limit (the per-process cap, else the
  device's memory).
- `forecast:<n>`: the run is still running and its OOM forecast (analysis/forecast.py) comes sooner
  than MEMQ_FORECAST_ALERT_S; `n` counts the forecast alerts of the run: a later one only when the
  forecast OOM moved much earlier (to under FORECAST_EARLIER_SHARE of the time the last alert gave),
  and no sooner than FORECAST_MIN_INTERVAL_S after the last one.
"Once per verdict change" is once per distinct verdict of a run: a run that goes back to an
earlier verdict (A -> B -> A) is not alerted for A a second time (the outbox key is (run, verdict)).
Anything else (healthy with headroom, no diagnosis yet) is no verdict. A run with an OOM but no
diagnosis yet, or one still saying `healthy` (made before the OOM snapshot was analysed: the run's
status is promoted first), waits for it: the alert is worth sending only with its cause.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from memq.analysis.headroom import headroom_ratio, near_miss
from memq.playbook_doc import doc_link, web_href
from memq.render.forecast_text import fmt_duration, forecast_line
from memq.render.step_need_text import step_need_line
from memq.units import fmt_bytes

KINDS = ("oom", "leak", "near_miss", "forecast")
#: Every kind, most severe first: a summary is as severe as the worst verdict it covers. A forecast
#: is an OOM on its way (paged as critical, payload.SEVERITY), so it ranks above a leak with none due.
SEVERITY_ORDER = ("oom", "forecast", "leak", "near_miss")


def severity_rank(kind: str) -> int:
    """Position of `kind` in SEVERITY_ORDER; a kind this version does not know (a row written by a
    newer one) ranks last instead of failing the summary that covers it."""
    return SEVERITY_ORDER.index(kind) if kind in SEVERITY_ORDER else len(SEVERITY_ORDER)
#: A forecast alert again only when the OOM now comes in under this share of the time the previous
#: forecast alert gave (2 h -> under 1 h): a forecast that drifts by minutes is no news.
FORECAST_EARLIER_SHARE = 0.5
#: ... and never sooner than this after the previous forecast alert of the run was recorded. Without
#: a floor a forecast that flaps (out to hours, back to minutes, or past due) re-pages at every
#: MEMQ_ALERT_RUN_INTERVAL_S (10 min) for hours. One hour is JOB_WINDOW_S, the period every page
#: budget is counted over: a run's forecast takes at most one of its job's slots per window. An OOM
#: that comes sooner is paged as an OOM anyway.
FORECAST_MIN_INTERVAL_S = 3600


@dataclass(frozen=True)
class RunFacts:
    run_id: int
    name: str
    cluster: str | None
    job: str | None
    status: str
    primary_cause: str | None
    oom_count: int
    peak_reserved_bytes: int | None
    limit_bytes: int | None
    oom_forecast_at: dt.datetime | None = None


@dataclass(frozen=True)
class Verdict:
    key: str  # unique per run: `oom:<cause>`, `leak`, `near_miss`
    kind: str
    cause: str | None


def verdict_of(f: RunFacts, headroom_pct: float) -> Verdict | None:
    if f.primary_cause is None:
        return None
    if f.oom_count > 0 or f.status == "oom":
        if f.primary_cause == "healthy":
            return None  # the diagnosis predates the OOM snapshot (the status moves first): wait for it
        return Verdict(f"oom:{f.primary_cause}", "oom", f.primary_cause)
    if f.primary_cause == "leak":
        return Verdict("leak", "leak", "leak")
    if near_miss(f.peak_reserved_bytes, f.limit_bytes, share=headroom_pct / 100.0):
        return Verdict("near_miss", "near_miss", f.primary_cause)
    return None


def forecast_verdict(status: str, oom_at: dt.datetime | None, now: dt.datetime, alert_s: float,
                     last: tuple[int, dt.datetime, dt.datetime] | None) -> Verdict | None:
    """The forecast verdict of a running run whose forecast OOM is at `oom_at`. `last`: the previous
    forecast alert's (n, the OOM moment it gave, when it was recorded), None when there was none."""
    if status != "running" or oom_at is None or alert_s <= 0:
        return None
    left = (oom_at - now).total_seconds()
    if left > alert_s:
        return None
    if last is None:
        return Verdict("forecast:1", "forecast", "leak")
    n, was_at, recorded = last
    if (now - recorded).total_seconds() < FORECAST_MIN_INTERVAL_S:
        return None
    said = (was_at - recorded).total_seconds()  # what the previous alert gave; <= 0: it said "due now"
    if said > 0 and left < FORECAST_EARLIER_SHARE * said:
        return Verdict(f"forecast:{n + 1}", "forecast", "leak")
    return None


def idempotency_key(run_name: str, verdict_key: str) -> str:
    """Stable for (run, verdict): every resend of one alert carries the same key."""
    return hashlib.sha256(f"memq-alert\0{run_name}\0{verdict_key}".encode()).hexdigest()[:40]


def run_link(public_url: str, run_name: str) -> str | None:
    if not public_url:
        return None
    return f"{public_url.rstrip('/')}/runs/{quote(run_name, safe='')}"


def _gib(n: int | None) -> str:
    return fmt_bytes(n, "GiB", unknown="?")


def _evidence(diagnosis: Mapping[str, Any], cause: str | None) -> str | None:
    causes = diagnosis.get("causes") or []
    for c in sorted(causes, key=lambda c: c.get("cause") != cause):  # the verdict's cause first
        for line in c.get("evidence") or []:
            if line:
                return str(line)
    return None


def _recommendation(diagnosis: Mapping[str, Any]) -> str | None:
    recs = diagnosis.get("recommendations") or []
    if not recs:
        return None
    r = recs[0]
    parts = [str(r.get("action") or "").strip(), str(r.get("why") or "").strip()]
    return ": ".join(p for p in parts if p) or None


def playbook_link(diagnosis: Mapping[str, Any], public_url: str) -> str | None:
    """The playbook entry of the first recommendation: on `memq serve` when its public URL is set,
    else the path in the repository; None for a diagnosis stored before recommendations named one."""
    recs = diagnosis.get("recommendations") or []
    entry = recs[0].get("playbook") if recs and isinstance(recs[0], Mapping) else None
    if not doc_link(entry):
        return None
    return f"{public_url.rstrip('/')}{web_href(entry)}" if public_url else doc_link(entry)


TITLES = {"oom": "CUDA out of memory", "leak": "memory leak", "near_miss": "near miss (memory almost full)",
          "forecast": "out of memory forecast"}


def alert_body(f: RunFacts, v: Verdict, result: Mapping[str, Any] | None, public_url: str,
               headroom_pct: float, now: dt.datetime | None = None) -> dict[str, Any]:
    """What the alert says, independent of the webhook format (payload.py renders it)."""
    diagnosis = (result or {}).get("diagnosis") or {}
    h = headroom_ratio(f.peak_reserved_bytes, f.limit_bytes)
    evidence = _evidence(diagnosis, v.cause)
    if v.kind == "near_miss":
        near = (f"peak reserved {_gib(f.peak_reserved_bytes)} of a {_gib(f.limit_bytes)} limit: "
                f"{(h or 0) * 100:.1f}% headroom, under the {headroom_pct:g}% threshold")
        evidence = near if evidence is None else f"{near}; {evidence}"
    fc = (result or {}).get("forecast")
    fc_line = forecast_line(fc, now.timestamp() if now else None) if isinstance(fc, Mapping) and \
        fc.get("oom_expected") else None
    if v.kind == "forecast" and fc_line:
        advice = fc.get("advice")
        evidence = f"run {f.name} {fc_line}" + (f"; fix: {advice}" if advice else "")
    need = step_need_line(diagnosis)  # said once: not when the evidence line already is it
    where = " / ".join(x for x in (f.cluster, f.job) if x)
    title = f"memq: {TITLES[v.kind]} in run {f.name}" + (f" ({where})" if where else "")
    return {
        "title": title, "run": f.name, "cluster": f.cluster, "job": f.job, "verdict": v.key, "kind": v.kind,
        "cause": v.cause, "confidence": diagnosis.get("confidence"),
        "evidence": evidence or "no evidence line in the diagnosis",
        "recommendation": _recommendation(diagnosis) or "see the run's page",
        "step_need": None if need and evidence and evidence.startswith(need) else need,
        "playbook": playbook_link(diagnosis, public_url),
        "link": run_link(public_url, f.name),
        "peak_reserved_bytes": f.peak_reserved_bytes, "limit_bytes": f.limit_bytes,
        "headroom_ratio": None if h is None else round(h, 4), "oom_count": f.oom_count,
        # the forecast's figures where it expects an OOM (a leak alert says it too: the page says when)
        "forecast": fc_line if v.kind != "forecast" else None,
        "oom_at": (f.oom_forecast_at.isoformat() if f.oom_forecast_at else None),
        "eta": fmt_duration((f.oom_forecast_at - now).total_seconds()) if f.oom_forecast_at and now else None,
        "oom_step": fc.get("step") if fc_line else None, "oom_epoch": fc.get("epoch") if fc_line else None,
    }
