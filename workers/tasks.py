"""Thin Celery tasks over ids. The work is in `memq.workers.jobs`; these only bind it to Celery.

- `analyze_snapshot(snapshot_id)`  (queue memq.analyze): lease, analyse or reuse, upsert, status.
- `recompute_run(run_id, rank)`    (queue memq.analyze): the run-level diagnosis (debounced).
- `whatif_sweep(snapshot_id)`      (queue memq.analyze): the what-if sweep of an OOM snapshot.
- `refresh_forecast(run_id, rank, figures, t)` (queue memq.analyze): a stats batch moves the forecast on.
- `reap()`                         (queue memq.ingest, beat): expired leases and lost messages.
Arguments are ids only; every task re-reads the state it needs from SQL.
"""

from __future__ import annotations

from memq.workers import jobs, runtime
from memq.workers.app import app, settings_of
from memq.workers.base import MemqTask
from memq.workers.queues import QUEUE_ANALYZE


def _st():
    return settings_of(app)


def enqueue_analysis(snapshot_id: int, countdown: float | None = None) -> None:
    analyze_snapshot.apply_async((int(snapshot_id),), countdown=countdown)


def send_recompute(run_id: int, rank: int, countdown: float) -> None:
    recompute_run.apply_async((int(run_id), int(rank)), countdown=countdown)


def send_sweep(snapshot_id: int) -> None:
    whatif_sweep.apply_async((int(snapshot_id),), queue=QUEUE_ANALYZE)


#: What the jobs send next, passed in (memq.workers.jobs never imports this module).
SENDERS = jobs.Senders(analysis=enqueue_analysis, recompute=send_recompute, sweep=send_sweep)


@app.task(base=MemqTask, bind=True, name="workers.tasks.analyze_snapshot")
def analyze_snapshot(self, snapshot_id: int) -> str:
    return jobs.analyze(_st(), int(snapshot_id), task_id=self.request.id, senders=SENDERS)


@app.task(base=MemqTask, bind=True, name="workers.tasks.recompute_run")
def recompute_run(self, run_id: int, rank: int = 0) -> str | None:
    return jobs.recompute(_st(), int(run_id), int(rank), SENDERS)


@app.task(base=MemqTask, bind=True, name="workers.tasks.refresh_forecast")
def refresh_forecast(self, run_id: int, rank: int, figures: list, as_of_time: float | None = None) -> str:
    return jobs.refresh_forecast(_st(), int(run_id), int(rank), figures, as_of_time, SENDERS)


@app.task(base=MemqTask, bind=True, name="workers.tasks.whatif_sweep")
def whatif_sweep(self, snapshot_id: int) -> str:
    return jobs.sweep(_st(), int(snapshot_id))


@app.task(base=MemqTask, bind=True, name="workers.tasks.reap", retry_on_outage=False)
def reap(self) -> dict:
    return jobs.reap(_st(), SENDERS)


__all__ = ["analyze_snapshot", "recompute_run", "refresh_forecast", "whatif_sweep", "reap", "enqueue_analysis",
           "send_recompute",
           "send_sweep", "SENDERS", "runtime"]
