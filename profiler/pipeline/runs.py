"""A run's status as the use cases move it, each by the one rule (analysis/run_status.py) and the one
writer (store: `move_run_status`): the dispatcher's run_end and OOM snapshot, the worker's analysed
snapshot and run diagnosis, `memq ingest`. Each takes the caller's open session, so the move commits
with the rows that caused it."""

from __future__ import annotations

import datetime as dt

from memq.analysis import run_status
from memq.store import repository as repo


def ended(s, run_id: int, sent: str | None, ended_at: dt.datetime | None = None) -> None:
    """A rank's run_end: its status (a legacy one already mapped by the envelope)."""
    repo.move_run_status(s, run_id, run_status.from_run_end(sent), ended_at=ended_at)


def snapshot_seen(s, run_id: int, trigger: str | None, oom_requested_bytes: int | None = None,
                  oom: object = None) -> bool:
    """A snapshot stored or analysed: an OOM one moves its run to `oom`. Returns whether it is one."""
    status = run_status.after_snapshot(trigger, oom_requested_bytes, oom)
    if status is not None:
        repo.move_run_status(s, run_id, status)
    return status is not None


def diagnosed(s, run_id: int, result: dict | None) -> None:
    """A rank's run diagnosis: one that found an OOM moves its run to `oom`."""
    status = run_status.after_diagnosis(result)
    if status is not None:
        repo.move_run_status(s, run_id, status)


def ingested(s, run_id: int, given: str | None, oom: bool, created: bool, ended_at: dt.datetime) -> None:
    """`memq ingest`: the status given, else `oom` for an OOM diagnosis, else `completed` for a run the
    ingest created."""
    status = run_status.after_ingest(given, oom, created=created)
    if status is not None:
        repo.move_run_status(s, run_id, status, ended_at=ended_at, given=given is not None)
