"""Snapshots, the analysis work queue: insert idempotently, claim with a lease, complete, fail, reap."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from memq.errors import BadInput, NotFound
from memq.store.orm import (
    TRIGGERS,
    Snapshot,
)
from memq.store.repository.common import _db_time, _insert, to_utc, utcnow

DEFAULT_LEASE_S = 600
DEFAULT_MAX_ATTEMPTS = 5



@dataclass(frozen=True)
class NewSnapshot:
    run_id: int
    sha256: str
    size_bytes: int
    rank: int = 0
    step: int | None = None
    epoch: int | None = None
    trigger: str = "manual"
    taken_at: dt.datetime | None = None
    blob_ref: str | None = None
    source: str | None = None
    #: outside facts: limit_bytes, device_total_bytes, device_free_bytes, requested_bytes, message
    context: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if self.trigger not in TRIGGERS:
            raise BadInput(f"trigger {self.trigger!r} is not one of {', '.join(TRIGGERS)}")


def insert_snapshot(session: Session, snap: NewSnapshot) -> tuple[int, bool]:
    """Idempotent insert; returns (snapshot id, whether this call created the row)."""
    values = asdict(snap)
    values["context"] = dict(snap.context)
    values["taken_at"] = _db_time(session, snap.taken_at) or _db_time(session, utcnow())
    values["source"] = (snap.source or "")[-500:] or None
    stmt = (_insert(session, Snapshot).values(**values)
            .on_conflict_do_nothing(index_elements=["run_id", "rank", "sha256"])
            .returning(Snapshot.id))
    new_id = session.execute(stmt).scalar_one_or_none()
    if new_id is not None:
        return int(new_id), True
    existing = session.execute(
        select(Snapshot.id).where(Snapshot.run_id == snap.run_id, Snapshot.rank == snap.rank,
                                  Snapshot.sha256 == snap.sha256)).scalar_one()
    if snap.blob_ref:  # a row first written before its blob was stored learns where it lives
        session.execute(update(Snapshot).where(Snapshot.id == existing, Snapshot.blob_ref.is_(None))
                        .values(blob_ref=snap.blob_ref))
    return int(existing), False


@dataclass(frozen=True)
class ClaimedSnapshot:
    id: int
    run_id: int
    rank: int
    sha256: str
    blob_ref: str | None
    context: dict
    attempts: int
    lease_until: dt.datetime


def _claimable(now: dt.datetime, max_attempts: int):
    return and_(
        or_(Snapshot.state == "pending",
            and_(Snapshot.state == "running", Snapshot.lease_until < now)),
        Snapshot.attempts < max_attempts,
    )


def claim_snapshot(session: Session, snapshot_id: int, lease_s: int = DEFAULT_LEASE_S,
                   max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> ClaimedSnapshot | None:
    """Lease one snapshot for analysis; None when done, failed, leased by someone else, or out of
    attempts. The single conditional UPDATE is the lock: of two concurrent callers one wins."""
    now = _db_time(session, utcnow())
    until = now + dt.timedelta(seconds=lease_s)
    stmt = (update(Snapshot)
            .where(Snapshot.id == snapshot_id, _claimable(now, max_attempts))
            .values(state="running", lease_until=until, attempts=Snapshot.attempts + 1)
            .returning(Snapshot.id, Snapshot.run_id, Snapshot.rank, Snapshot.sha256, Snapshot.blob_ref,
                       Snapshot.context, Snapshot.attempts))
    row = session.execute(stmt).first()
    if row is None:
        return None
    return ClaimedSnapshot(id=row.id, run_id=row.run_id, rank=row.rank, sha256=row.sha256,
                           blob_ref=row.blob_ref, context=dict(row.context or {}), attempts=row.attempts,
                           lease_until=to_utc(until))


def claim_next(session: Session, lease_s: int = DEFAULT_LEASE_S, limit: int = 1,
               max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> list[ClaimedSnapshot]:
    """Lease up to `limit` of the oldest claimable snapshots."""
    now = _db_time(session, utcnow())
    q = select(Snapshot.id).where(_claimable(now, max_attempts)).order_by(Snapshot.id).limit(limit)
    if session.get_bind().dialect.name == "postgresql":
        q = q.with_for_update(skip_locked=True)
    ids = list(session.execute(q).scalars())
    claimed = [claim_snapshot(session, i, lease_s, max_attempts) for i in ids]
    return [c for c in claimed if c is not None]


def requeue_expired(session: Session) -> list[int]:
    """Put snapshots whose lease expired back to pending; returns their ids."""
    now = _db_time(session, utcnow())
    stmt = (update(Snapshot).where(Snapshot.state == "running", Snapshot.lease_until < now)
            .values(state="pending", lease_until=None).returning(Snapshot.id))
    return [int(i) for i in session.execute(stmt).scalars()]


def complete_snapshot(session: Session, snapshot_id: int, analysis_id: int, analyzer_version: str) -> None:
    session.execute(update(Snapshot).where(Snapshot.id == snapshot_id).values(
        state="done", analysis_id=analysis_id, analyzer_version=analyzer_version, lease_until=None,
        last_error=None, analysed_at=func.coalesce(Snapshot.analysed_at, func.current_timestamp())))


def fail_snapshot(session: Session, snapshot_id: int, error: str, retry: bool = True,
                  max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> str:
    """Record a failed analysis; back to pending while attempts remain and `retry`, else failed.
    Returns the new state."""
    state = case((Snapshot.attempts < max_attempts, "pending"), else_="failed") if retry else "failed"
    stmt = (update(Snapshot).where(Snapshot.id == snapshot_id)
            .values(state=state, lease_until=None, last_error=error[:4000]).returning(Snapshot.state))
    new_state = session.execute(stmt).scalar_one_or_none()
    if new_state is None:
        raise NotFound(f"no snapshot with id {snapshot_id}")
    return str(new_state)
