"""The alert loop over a Store: record new verdicts, then send what is due. Used by the Celery
tasks (workers/alerts.py) and by tests; no Celery here.

`sweep(store, st, run_ids=None)`: record verdicts (all recently updated runs, or the given ones).
`deliver_due(store, st, limit)`: claim, POST, record, one alert at a time: each claim and each
outcome is its own committed transaction, so a sender killed between them leaves a `sending` row
whose lease expires (outbox.py says what that means for duplicates).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable

from profiler.alerts import outbox, send
from profiler.config import Settings

log = logging.getLogger("memq.alerts")


def sweep(store, st: Settings, run_ids: Iterable[int] | None = None) -> list[str]:
    with store.session() as s:
        new = outbox.record_verdicts(s, st, run_ids)
    if new:
        log.info("alerts: %d new verdict(s) recorded", len(new))
    return new


def deliver_due(store, st: Settings, limit: int = 100,
                post: Callable[..., send.Outcome] = send.post) -> dict[str, int]:
    """Send up to `limit` due alerts; returns how many ended in each state."""
    out: Counter[str] = Counter()
    if not st.alert_webhook_url:
        return dict(out)
    outbox.check_settings(st)
    tried: set[int] = set()
    while sum(out.values()) < limit:
        with store.session() as s:
            ids = [i for i in outbox.due_ids(s, 20) if i not in tried]
        if not ids:
            break
        for alert_id in ids:
            tried.add(alert_id)
            with store.session() as s:
                c = outbox.claim(s, st, alert_id)
            if c is None:
                out["skipped"] += 1
                continue
            outcome = post(st.alert_webhook_url, outbox.document(st, c), c.idem_key, st.alert_timeout_s)
            with store.session() as s:
                state = outbox.finish(s, st, c, outcome)
            out[state or "lost_lease"] += 1
            level = logging.INFO if state == "sent" else logging.WARNING
            log.log(level, "alert %s (%s, run %s): %s -> %s", c.id, c.body.get("verdict"), c.body.get("run"),
                    outcome.detail, state or "lease lost")
    return dict(out)
