"""The statements of the alert outbox (tables alerts and alert_summaries): what profiler/alerts/outbox.py
decides with (rate limits, leases, summaries; the delivery guarantee is stated there) reads and writes
through these functions only. Every function takes an open Session and binds every value; times are
given as the caller's clock (`now`), written as the database takes them (repository.db_time).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import and_, func, or_, select, text, update
from sqlalchemy.orm import Session

from memq.store.orm import Alert, AlertSummary, Run
from memq.store.repository.common import _insert, db_time, to_utc


def _model(summary: bool):
    return AlertSummary if summary else Alert


# ----------------------------------------------------------------------------------- recording


def _limit_col():
    return func.coalesce(Run.memory_limit_bytes, Run.gpu_memory_bytes)


def verdict_candidates(session: Session, run_ids: Iterable[int] | None, since: dt.datetime,
                       near_share: float) -> list[Any]:
    """Rows of the runs that may have a verdict: the given runs (any age), else every run updated since
    `since` that has an OOM, a leak, a forecast OOM time or a peak within `near_share` of its limit (the
    index-friendly superset of alerts/verdict.verdict_of, which decides). Each row: id, name, cluster,
    job, status, primary_cause, oom_count, peak_reserved_bytes, limit, oom_forecast_at, owner."""
    q = select(Run.id, Run.name, Run.cluster, Run.job, Run.status, Run.primary_cause, Run.oom_count,
               Run.peak_reserved_bytes, _limit_col().label("limit"), Run.oom_forecast_at, Run.owner).where(
        Run.primary_cause.is_not(None))
    if run_ids is not None:
        ids = sorted({int(i) for i in run_ids})
        if not ids:
            return []
        q = q.where(Run.id.in_(ids))
    else:
        near = 1.0 - near_share
        q = q.where(Run.updated_at >= db_time(session, since),
                    or_(Run.oom_count > 0, Run.status == "oom", Run.primary_cause == "leak",
                        Run.oom_forecast_at.is_not(None),
                        and_(Run.peak_reserved_bytes.is_not(None), _limit_col() > 0,
                             Run.peak_reserved_bytes >= _limit_col() * near)))
    return list(session.execute(q))


def forecast_alert_rows(session: Session, run_ids: Sequence[int]) -> list[Any]:
    """(run_id, verdict, body, created_at) of the runs' forecast alerts."""
    return list(session.execute(select(Alert.run_id, Alert.verdict, Alert.body, Alert.created_at)
                                .where(Alert.run_id.in_(list(run_ids)), Alert.kind == "forecast")))


def recorded_verdicts(session: Session, run_ids: Iterable[int]) -> set[tuple[int, str]]:
    """(run id, verdict key) already recorded for the runs."""
    return {(int(r.run_id), r.verdict) for r in session.execute(select(Alert.run_id, Alert.verdict).where(
        Alert.run_id.in_(sorted({int(i) for i in run_ids}))))}


def insert_alert(session: Session, now: dt.datetime, **values: Any) -> bool:
    """One verdict row, unless (run, verdict) is recorded already; created and due at `now` (the
    caller's clock: summaries are timed from it). Returns whether it was inserted."""
    t = db_time(session, now)
    stmt = _insert(session, Alert).values(next_attempt_at=t, created_at=t, **values)
    res = session.execute(stmt.on_conflict_do_nothing(index_elements=["run_id", "verdict"]))
    return bool(res.rowcount)


# ------------------------------------------------------------------------------------- claiming


def _claimable(now: dt.datetime, model=Alert):
    return or_(and_(model.state == "pending", model.next_attempt_at <= now),
               and_(model.state == "sending", model.lease_until < now))


def due(session: Session, limit: int, now: dt.datetime, summary: bool = False) -> list[int]:
    """Ids of rows claimable at `now`, the earliest due first."""
    m = _model(summary)
    t = db_time(session, now)
    return [int(i) for i in session.execute(select(m.id).where(_claimable(t, m))
                                            .order_by(m.next_attempt_at, m.id).limit(limit)).scalars()]


def take(session: Session, row_id: int, now: dt.datetime, lease_s: float, token: str, summary: bool = False):
    """The conditional UPDATE a claim is: the row is taken (state sending, a fresh token and lease, one
    more attempt) only if it is claimable at `now`. Returns the row taken (id, owner, cluster, job,
    idem_key, body, attempts, created_at; run_id for an alert), or None."""
    m = _model(summary)
    t = db_time(session, now)
    cols = [m.id, m.owner, m.cluster, m.job, m.idem_key, m.body, m.attempts, m.created_at]
    if not summary:
        cols.insert(1, Alert.run_id)
    return session.execute(
        update(m).where(m.id == row_id, _claimable(t, m))
        .values(state="sending", claim_token=token, lease_until=t + dt.timedelta(seconds=lease_s),
                attempts=m.attempts + 1, claimed_at=t)
        .returning(*cols)).first()


def set_row(session: Session, row_id: int, summary: bool = False, **values: Any) -> None:
    m = _model(summary)
    session.execute(update(m).where(m.id == row_id).values(**values))


def last_claim_of_run(session: Session, run_id: int, other_than: int) -> dt.datetime | None:
    """When the run's latest other alert being sent or sent was claimed."""
    return to_utc(session.execute(select(func.max(Alert.claimed_at)).where(
        Alert.run_id == run_id, Alert.id != other_than, Alert.state.in_(("sending", "sent")))).scalar_one())


def finish_row(session: Session, row_id: int, token: str, summary: bool = False, **values: Any) -> bool:
    """Record the outcome if the row is still sending under `token`; whether it was."""
    m = _model(summary)
    res = session.execute(update(m).where(m.id == row_id, m.claim_token == token, m.state == "sending")
                          .values(lease_until=None, **values))
    return bool(res.rowcount)


def _eq(col, value):
    return col == value if value is not None else col.is_(None)


def _same_job(model, owner: str | None, cluster: str | None, job: str | None):
    """One budget: a (principal, cluster, job). Another principal's runs under the same job name
    (any key may write any job under the default `jobs: ["*"]`) spend their own budget, not this one."""
    return and_(_eq(model.owner, owner), _eq(model.cluster, cluster), _eq(model.job, job))


def job_recent(session: Session, owner: str | None, cluster: str | None, job: str | None, since: dt.datetime,
               other_than: int | None = None) -> int:
    """Pages of the job claimed after `since`: its alerts' (suppressed ones never are) and its
    summaries'."""
    t = db_time(session, since)
    q = select(func.count()).select_from(Alert).where(
        _same_job(Alert, owner, cluster, job), Alert.state != "suppressed", Alert.claimed_at > t)
    if other_than is not None:
        q = q.where(Alert.id != other_than)
    n = session.execute(q).scalar_one()
    n += session.execute(select(func.count()).select_from(AlertSummary).where(
        _same_job(AlertSummary, owner, cluster, job), AlertSummary.claimed_at > t)).scalar_one()
    return int(n)


def pages_since(session: Session, since: dt.datetime, *, owner: Any = ..., alert: int | None = None,
                summary: int | None = None) -> int:
    """Pages claimed after `since` (alerts not suppressed, and summaries), of one principal when `owner`
    is given (None is a principal too), the row being claimed left out."""
    t = db_time(session, since)
    qa = select(func.count()).select_from(Alert).where(Alert.state != "suppressed", Alert.claimed_at > t)
    qs = select(func.count()).select_from(AlertSummary).where(AlertSummary.claimed_at > t)
    if owner is not ...:
        qa = qa.where(_eq(Alert.owner, owner))
        qs = qs.where(_eq(AlertSummary.owner, owner))
    if alert is not None:
        qa = qa.where(Alert.id != alert)
    if summary is not None:
        qs = qs.where(AlertSummary.id != summary)
    return int(session.execute(qa).scalar_one()) + int(session.execute(qs).scalar_one())


def principals_since(session: Session, since: dt.datetime) -> int:
    """Principals with a verdict recorded after `since` (sent, held back or suppressed)."""
    t = db_time(session, since)
    return int(session.execute(select(func.count(func.distinct(func.coalesce(Alert.owner, ""))))
                               .where(Alert.created_at > t)).scalar_one())


def lock_global(session: Session) -> None:
    """Claims of every job count against one window: taken one at a time (PostgreSQL; SQLite writes
    one transaction at a time anyway)."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext('memq-alerts:global'))"))


def lock_job(session: Session, owner: str | None, cluster: str | None, job: str | None) -> None:
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtext(:k))"),
                        {"k": "memq-alerts:" + json.dumps([owner, cluster, job])})


# ------------------------------------------------------------------------------------ summaries


def summary_candidates(session: Session) -> list[tuple[str | None, str | None, str | None]]:
    """(cluster, job, principal) with suppressed verdicts no summary covers yet (an index on
    (state, summarised_by))."""
    return [(r.cluster, r.job, r.owner) for r in session.execute(
        select(Alert.cluster, Alert.job, Alert.owner).where(Alert.state == "suppressed", Alert.summarised_by.is_(None))
        .group_by(Alert.cluster, Alert.job, Alert.owner).order_by(Alert.cluster, Alert.job, Alert.owner))]


def _uncovered(owner: str | None, cluster: str | None, job: str | None):
    return (_same_job(Alert, owner, cluster, job), Alert.state == "suppressed", Alert.summarised_by.is_(None))


def oldest_uncovered(session: Session, owner: str | None, cluster: str | None, job: str | None) -> dt.datetime | None:
    """When the job's oldest suppressed verdict that no summary covers was recorded (one aggregate)."""
    return to_utc(session.execute(select(func.min(Alert.created_at))
                                  .where(*_uncovered(owner, cluster, job))).scalar_one())


def uncovered_rows(session: Session, owner: str | None, cluster: str | None, job: str | None) -> list[Any]:
    """(id, verdict, kind, cause, created_at, name) of those verdicts, the oldest first."""
    return session.execute(
        select(Alert.id, Alert.verdict, Alert.kind, Alert.cause, Alert.created_at, Run.name)
        .join(Run, Run.id == Alert.run_id).where(*_uncovered(owner, cluster, job))
        .order_by(Alert.created_at, Alert.id)).all()


def insert_summary(session: Session, now: dt.datetime, **values: Any) -> int | None:
    """The summary row (pending, due at `now`); None when a summary of the same key exists."""
    t = db_time(session, now)
    res = session.execute(
        _insert(session, AlertSummary).values(state="pending", next_attempt_at=t, created_at=t, **values)
        .on_conflict_do_nothing(index_elements=["idem_key"]).returning(AlertSummary.id)).first()
    return None if res is None else int(res.id)


def cover(session: Session, alert_ids: Sequence[int], summary_id: int) -> int:
    """Mark the suppressed, uncovered rows among `alert_ids` as covered by the summary; how many were."""
    return int(session.execute(update(Alert).where(Alert.id.in_(list(alert_ids)), Alert.state == "suppressed",
                                                   Alert.summarised_by.is_(None))
                               .values(summarised_by=summary_id)).rowcount)


def counts(session: Session, summary: bool = False) -> dict[str, int]:
    m = _model(summary)
    return {k: int(v) for k, v in session.execute(select(m.state, func.count()).group_by(m.state))}
