"""What a summary alert says: the verdicts of one (cluster, job) that its rate limit held back. Pure.

The per-job limit (MEMQ_ALERT_JOB_MAX_PER_HOUR) keeps a job whose 200 runs fail from paging 200
times; the summary is what keeps the other 190 from being lost on the person paged: how many, of
which causes, which runs (first and last), over what time, and a link to the job's runs. The
outbox (outbox.py) decides when one is due and which rows it covers; this module only words it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from memq.alerts.verdict import TITLES, severity_rank


@dataclass(frozen=True)
class Covered:
    """One suppressed verdict a summary covers."""

    alert_id: int
    run: str
    verdict: str
    kind: str
    cause: str | None
    at: dt.datetime  # when the verdict was recorded (aware UTC)


def summary_key(cluster: str | None, job: str | None, alert_ids: Iterable[int]) -> str:
    """Stable for the set of rows covered: a resend after a crash carries the same key, and two
    senders that cover the same rows compute the same key (the unique index keeps one)."""
    ids = ",".join(str(i) for i in sorted(set(alert_ids)))
    return hashlib.sha256(f"memq-alert-summary\0{cluster or ''}\0{job or ''}\0{ids}".encode()).hexdigest()[:40]


def runs_link(public_url: str, cluster: str | None, job: str | None) -> str | None:
    """The runs list filtered to the job (`/runs?cluster=C&job=J`, the web listing's parameters)."""
    if not public_url:
        return None
    q = {k: v for k, v in (("cluster", cluster), ("job", job)) if v}
    return f"{public_url.rstrip('/')}/runs" + (f"?{urlencode(q)}" if q else "")


def iso_z(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fmt_span(seconds: float) -> str:
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s // 3600}h {s % 3600 // 60:02d}m"


def _cause_label(kind: str, cause: str | None) -> str:
    title = TITLES.get(kind, kind)
    if kind in ("leak", "forecast"):
        return title
    if kind == "near_miss":
        return f"{title}, cause {cause or '?'}"
    return f"{title} ({cause or '?'})"


def summary_body(cluster: str | None, job: str | None, covered: Sequence[Covered], public_url: str,
                 max_per_hour: int) -> dict[str, Any]:
    """The summary of `covered` (non-empty), independent of the webhook format (payload.py renders it)."""
    if not covered:
        raise ValueError("a summary covers at least one verdict")
    rows = sorted(covered, key=lambda c: (c.at, c.alert_id))
    per = Counter((c.kind, c.cause) for c in rows)
    causes = [{"kind": k, "cause": c, "count": n, "label": _cause_label(k, c)}
              for (k, c), n in sorted(per.items(), key=lambda kv: (-kv[1], severity_rank(kv[0][0]),
                                                                    kv[0][0], kv[0][1] or ""))]
    kinds = Counter(c.kind for c in rows)
    order = sorted(kinds, key=lambda k: (severity_rank(k), k))
    kind = order[0]
    first, last = rows[0], rows[-1]
    where = " / ".join(x for x in (cluster, job) if x) or "no job"
    n = len(rows)
    title = (f"memq: {n} more alert{'s' if n != 1 else ''} of job {where} held back by the rate limit "
             f"({max_per_hour} per hour)")
    return {
        "summary": True, "title": title, "cluster": cluster, "job": job, "kind": kind, "count": n,
        "causes": causes, "kinds": {k: kinds[k] for k in order},
        "first_run": first.run, "last_run": last.run, "first_at": iso_z(first.at), "last_at": iso_z(last.at),
        "span_s": int(round((last.at - first.at).total_seconds())),
        "link": runs_link(public_url, cluster, job), "max_per_hour": max_per_hour,
    }


def causes_line(body: dict[str, Any]) -> str:
    return ", ".join(f"{c['count']} x {c['label']}" for c in body["causes"])


def runs_line(body: dict[str, Any]) -> str:
    if body["count"] == 1:
        return f"run {body['first_run']} at {body['first_at']}"
    return (f"first run {body['first_run']} at {body['first_at']}, last run {body['last_run']} at "
            f"{body['last_at']} (over {fmt_span(body['span_s'])})")
