"""The alert loop over a Store: record new verdicts, then send what is due. Used by the Celery
tasks (workers/alerts.py) and by tests; no Celery here.

`sweep(store, st, run_ids=None)`: record verdicts (all recently updated runs, or the given ones).
`summarise(store, st)`: record the summaries that are due (one per job whose rate limit held
verdicts back; outbox.py says when), each job in its own transaction.
`deliver_due(store, st, limit)`: summarise, then claim, POST, record, one alert or summary at a
time: each claim and each outcome is its own committed transaction, so a sender killed between them
leaves a `sending` row whose lease expires (outbox.py says what that means for duplicates).
Every function takes `now=` (default: the clock) so that tests can move through the rate-limit hour.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import Counter
from collections.abc import Callable, Iterable

from memq.alerts import outbox, send
from memq.config import Settings

log = logging.getLogger("memq.alerts")


def sweep(store, st: Settings, run_ids: Iterable[int] | None = None, now: dt.datetime | None = None) -> list[str]:
    with store.session() as s:
        new = outbox.record_verdicts(s, st, run_ids, now=now)
    if new:
        log.info("alerts: %d new verdict(s) recorded", len(new))
    return new


def summarise(store, st: Settings, now: dt.datetime | None = None) -> list[str]:
    """Record the summaries due now; returns their keys."""
    if not st.alert_webhook_url:
        return []
    with store.session() as s:
        jobs = outbox.summary_candidates(s)
    keys = []
    for cluster, job, owner in jobs:
        try:
            with store.session() as s:
                key = outbox.summarise_job(s, st, cluster, job, now=now, owner=owner)
        except Exception:  # one job's rows must never stop another job's summary or any alert
            log.exception("alerts: the summary of %s / %s could not be built; the other jobs go on", cluster, job)
            continue
        if key:
            keys.append(key)
            log.info("alerts: summary %s recorded for %s / %s", key[:12], cluster, job)
    return keys


def deliver_due(store, st: Settings, limit: int = 100, post: Callable[..., send.Outcome] = send.post,
                now: dt.datetime | None = None) -> dict[str, int]:
    """Record due summaries, then send up to `limit` due alerts and summaries; returns how many
    ended in each state (a summary's as `summary_<state>`)."""
    out: Counter[str] = Counter()
    if not st.alert_webhook_url:
        return dict(out)
    outbox.check_settings(st)
    summarise(store, st, now=now)
    tried: set[tuple[bool, int]] = set()
    while sum(out.values()) < limit:
        with store.session() as s:
            due = [(True, i) for i in outbox.due_summary_ids(s, 20, now=now)]
            due += [(False, i) for i in outbox.due_ids(s, 20, now=now)]
        due = [d for d in due if d not in tried]
        if not due:
            break
        for is_summary, row_id in due:
            tried.add((is_summary, row_id))
            prefix = "summary_" if is_summary else ""
            try:
                with store.session() as s:
                    c = (outbox.claim_summary if is_summary else outbox.claim)(s, st, row_id, now=now)
            except Exception:  # a row that cannot be claimed waits for the next sweep; the others go out
                log.exception("alerts: %s %s could not be claimed; the other rows go on", prefix or "alert ", row_id)
                out[prefix + "error"] += 1
                continue
            if c is None:
                out[prefix + "skipped"] += 1
                continue
            try:
                doc = outbox.document(st, c)
            except Exception as e:  # a body that cannot be rendered will not render on a retry either
                log.exception("alerts: %s %s cannot be rendered", prefix or "alert ", row_id)
                outcome = send.Outcome("refused", f"cannot be rendered: {type(e).__name__}: {e}")
            else:
                outcome = post(st.alert_webhook_url, doc, c.idem_key, st.alert_timeout_s)
            with store.session() as s:
                state = outbox.finish(s, st, c, outcome, now=now)
            out[prefix + (state or "lost_lease")] += 1
            level = logging.INFO if state == "sent" else logging.WARNING
            if is_summary:
                log.log(level, "alert summary %s (%s / %s, %d verdicts): %s -> %s", c.id, c.body.get("cluster"),
                        c.body.get("job"), c.body.get("count"), outcome.detail, state or "lease lost")
            else:
                log.log(level, "alert %s (%s, run %s): %s -> %s", c.id, c.body.get("verdict"), c.body.get("run"),
                        outcome.detail, state or "lease lost")
    return dict(out)
