"""The nightly report through the real services: a Celery worker process (`memq worker`) and its
beat (`celery beat`, a process of its own, as deployed) on the shared Redis under a unique key
prefix, the report history in its own SQLite file.

1. A message sent to the report queue is consumed by the worker: the report row and files appear.
2. Beat fires the crontab entry at the configured UTC minute: the worker builds yesterday's report
   (the real clock's yesterday), and a second tick replaces it rather than adding one. Rather than
   wait up to a minute of wall clock for that minute to come, the beat starts from the schedule file
   a beat that last ran the entry one minute BEFORE the configured minute would have left (celery's
   own PersistentScheduler writes it): the configured minute has passed since that run, so the
   crontab is due on beat's first tick; a beat restarted across the nightly minute does the same.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys

import pytest
from sqlalchemy import select

from memq.store.orm import Report
from tests.report.conftest import DAY2
from tests.workers.stack import ROOT, Stack, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]

SLOW_LIMITS = {  # a report takes seconds: give it the production-like limits, still < visibility
    "MEMQ_TASK_SOFT_TIME_LIMIT_S": "90", "MEMQ_TASK_TIME_LIMIT_S": "100", "MEMQ_ANALYSIS_LEASE_S": "110",
    "MEMQ_VISIBILITY_TIMEOUT_S": "240", "MEMQ_REPORT_CATCHUP_DAYS": "1",
}


def _stack(history, shared_redis, **extra) -> Stack:
    env = {"MEMQ_BLOB_DIR": history.env["MEMQ_BLOB_DIR"], "MEMQ_REPORT_DIR": history.env["MEMQ_REPORT_DIR"],
           **SLOW_LIMITS, **extra}
    return Stack(history.root / "stack", shared_redis, history.env["MEMQ_DATABASE_URL"], **env)


def _reports(history) -> list[tuple]:
    with history.store().session() as s:
        return [tuple(r) for r in s.execute(select(Report.report_date, Report.scope, Report.id,
                                                   Report.generated_at)).all()]


def test_worker_consumes_a_report_message(history, shared_redis):
    (history.root / "stack").mkdir()
    stack = _stack(history, shared_redis)
    try:
        stack.start_worker(concurrency=1, beat=False)
        code = ("from memq.workers.reports import nightly_report; "
                f"nightly_report.apply_async(kwargs={{'date': '{DAY2}'}})")
        subprocess.run([sys.executable, "-c", code], env=stack.env, check=True, timeout=60, cwd=ROOT)
        wait_for(lambda: any(r[0] == dt.date.fromisoformat(DAY2) for r in _reports(history)), 120, 0.5,
                 "the report row written by the worker")
        assert [(r[0], r[1]) for r in _reports(history)] == [(dt.date.fromisoformat(DAY2), "all")]
        assert (history.root / "reports" / "all" / f"{DAY2}.html").stat().st_size > 10_000
        assert "workers.reports.nightly_report" in stack.log_tail("worker", 200_000)
    finally:
        stack.close()


def _beat_last_ran_at(stack: Stack, schedule_file, when: dt.datetime) -> None:
    """The schedule file of a beat that last sent the nightly report at `when`: written by celery's own
    PersistentScheduler from the product's beat schedule (the settings of `stack`), as beat keeps it."""
    from celery.beat import PersistentScheduler

    from memq.workers.app import make_app

    sched = PersistentScheduler(app=make_app(stack.settings), schedule_filename=str(schedule_file))
    try:
        entry = sched.schedule["memq-nightly-report"]
        # the pure schedule first: due for a run before the configured minute, not for one after it
        assert not entry.schedule.is_due(when + dt.timedelta(minutes=1, seconds=1)).is_due
        assert entry.schedule.is_due(when).is_due
        entry.last_run_at = when
        sched.sync()
    finally:
        sched.close()


def test_beat_fires_at_the_configured_utc_minute_and_reruns_replace(history, shared_redis):
    now = dt.datetime.now(dt.UTC)
    if (now.hour, now.minute) == (23, 59):  # yesterday is taken when the task runs: not across midnight
        wait_for(lambda: dt.datetime.now(dt.UTC).minute == 0, 65, 0.5, "midnight UTC")
        now = dt.datetime.now(dt.UTC)
    fire = now.replace(second=0, microsecond=0) - dt.timedelta(minutes=1)  # the configured minute, just passed
    yesterday = (now - dt.timedelta(days=1)).date()
    (history.root / "stack").mkdir()
    stack = _stack(history, shared_redis, MEMQ_REPORT_HOUR_UTC=str(fire.hour), MEMQ_REPORT_MINUTE_UTC=str(fire.minute))
    try:
        _beat_last_ran_at(stack, stack.beat_schedule_file(), fire - dt.timedelta(minutes=1))
        stack.start_worker(concurrency=1, beat=True)
        wait_for(lambda: any(r[0] == yesterday for r in _reports(history)), 150, 0.5,
                 f"beat's report of {yesterday} at {fire:%H:%M} UTC")
        rows = _reports(history)
        assert [(r[0], r[1]) for r in rows] == [(yesterday, "all")]
        first_id, first_at = rows[0][2], rows[0][3]
        assert "Scheduler: Sending due task memq-nightly-report" in stack.log_tail("beat", 200_000)
    finally:
        stack.close()
    assert first_at is not None
    # the same tick delivered again (a second beat, a redelivery): the row is replaced, not added
    code = "from memq.workers.reports import nightly_report; print(nightly_report.apply().get())"
    subprocess.run([sys.executable, "-c", code], env=stack.env, check=True, timeout=120, cwd=ROOT,
                   capture_output=True)
    rows = _reports(history)
    assert [(r[0], r[1], r[2]) for r in rows] == [(yesterday, "all", first_id)]
    assert rows[0][3] >= first_at
