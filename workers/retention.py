"""The daily retention run: a Celery task on the memq.report queue, started by beat at a UTC time.

- `gc(dry_run=False)`: `profiler.store.retention.collect` with the policy from the settings
  (MEMQ_RETENTION_DAYS, MEMQ_RETENTION_CLUSTERS): raw blobs and stat samples past retention go;
  blobs of OOM / diagnosed snapshots and every still-referenced blob stay. The same as `memq gc`.
  Idempotent: a second run (two beats by mistake, a redelivery) finds nothing more to remove.
- `beat_entries(settings)`: what `workers.app.beat_schedule` adds: one crontab entry at
  MEMQ_GC_HOUR_UTC:MEMQ_GC_MINUTE_UTC. An outage is not retried: the next day's tick is the retry.
"""

from __future__ import annotations

import logging

from profiler.config import Settings
from profiler.errors import ConfigError

log = logging.getLogger("memq.workers.retention")

TASK_NAME = "workers.retention.gc"


def run_gc(st: Settings, store=None, *, dry_run: bool = False, grace_s: float | None = None) -> dict:
    """The work, as a plain function (tests and the task share it)."""
    from profiler.store.retention import Policy, collect

    if store is None:
        from workers import runtime

        store = runtime.store(st)
    kw = {} if grace_s is None else {"grace_s": grace_s}
    summary = collect(store, Policy.from_settings(st), dry_run=dry_run, **kw)
    log.info("retention%s: %d stat samples, %d blobs (%d snapshots), %d orphans, %d bytes; kept %s",
             " (dry run)" if dry_run else "", summary["stat_samples_removed"], summary["blobs_removed"],
             summary["snapshots_unlinked"], summary["orphans_removed"], summary["bytes_freed"], summary["kept"])
    for err in summary["errors"]:
        log.warning("retention: %s", err)
    return summary


def beat_entries(st: Settings) -> dict[str, dict]:
    """The daily retention entry (UTC); none when everything is kept forever."""
    from celery.schedules import crontab

    if not (0 <= st.gc_hour_utc <= 23 and 0 <= st.gc_minute_utc <= 59):
        raise ConfigError("MEMQ_GC_HOUR_UTC must be 0..23 and MEMQ_GC_MINUTE_UTC 0..59")
    if st.retention_days <= 0 and "=" not in (st.retention_clusters or ""):
        return {}
    return {"memq-retention": {
        "task": TASK_NAME,
        "schedule": crontab(minute=st.gc_minute_utc, hour=st.gc_hour_utc),
        "options": {"queue": "memq.report", "expires": 12 * 3600},
    }}


def _bind():
    from workers.app import app, settings_of
    from workers.base import MemqTask

    @app.task(base=MemqTask, bind=True, name=TASK_NAME, retry_on_outage=False)
    def gc(self, dry_run: bool = False) -> dict:
        return run_gc(settings_of(app), dry_run=bool(dry_run))

    return gc


gc = _bind()
