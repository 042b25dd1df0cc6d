"""Celery side of the alerts (profiler/alerts/ has the logic and states the delivery guarantee).

- `workers.alerts.sweep` (beat, every MEMQ_ALERT_SWEEP_S, queue memq.ingest): record verdicts of
  recently updated runs, record the summaries due (the verdicts a job's rate limit held back, once
  its window opens), then send what is due (new alerts and summaries, retries whose back-off ended,
  those whose sender died and whose lease expired). It is what makes delivery survive any crash.
- `workers.alerts.deliver` (queue memq.ingest): record due summaries and send what is due now;
  enqueued by the hook below.
- The hook: after each run-level diagnosis (`workers.tasks.recompute_run`, in the same worker
  process) the run's verdict is recorded at once and a delivery enqueued, so an alert does not wait
  for the next sweep. The hook only shortens the delay: if it fails or its process dies, the sweep
  finds the same verdict (it reads the run rows, not the hook's work).
"""

from __future__ import annotations

import logging

from celery import signals

from memq.alerts import delivery
from memq.workers import runtime
from memq.workers.app import app, settings_of
from memq.workers.base import MemqTask
from memq.workers.queues import QUEUE_INGEST

log = logging.getLogger("memq.alerts")

RECOMPUTE_TASK = "workers.tasks.recompute_run"


def _st():
    return settings_of(app)


def beat_entries(st) -> dict:
    period = float(max(1, st.alert_sweep_s))
    return {"memq-alerts": {"task": "workers.alerts.sweep", "schedule": period,
                            "options": {"queue": QUEUE_INGEST, "expires": period}}}


@app.task(base=MemqTask, bind=True, name="workers.alerts.sweep", retry_on_outage=False)
def sweep(self) -> dict:
    st = _st()
    store = runtime.store(st)
    new = delivery.sweep(store, st)
    out = delivery.deliver_due(store, st)
    return {"recorded": len(new), **out}


@app.task(base=MemqTask, bind=True, name="workers.alerts.deliver", retry_on_outage=False)
def deliver(self) -> dict:
    st = _st()
    return delivery.deliver_due(runtime.store(st), st)


@signals.task_postrun.connect
def _after_recompute(sender=None, args=None, retval=None, state=None, **_):
    if getattr(sender, "name", None) != RECOMPUTE_TASK or state != "SUCCESS" or retval == "deferred" or not args:
        return
    try:
        st = _st()
        if delivery.sweep(runtime.store(st), st, [int(args[0])]) and st.alert_webhook_url:
            deliver.apply_async(queue=QUEUE_INGEST)
    except Exception:  # noqa: BLE001 - the beat sweep records it later
        log.warning("alerts: recording the verdict of run %s failed", args[0], exc_info=True)
