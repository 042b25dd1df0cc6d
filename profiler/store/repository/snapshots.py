"""Snapshots, the analysis work queue: insert idempotently, claim with a lease, complete, fail, reap."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.orm import Session

from memq.errors import BadInput, NotFound
from memq.model import TRIGGERS
from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot
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
    """A leased snapshot with what its analysis reads of the row (the claim's RETURNING: the row is not
    read again on the way down)."""

    id: int
    run_id: int
    rank: int
    sha256: str
    blob_ref: str | None
    context: dict
    attempts: int
    lease_until: dt.datetime
    trigger: str | None = None
    source: str | None = None
    step: int | None = None
    epoch: int | None = None


_CLAIMED = (Snapshot.id, Snapshot.run_id, Snapshot.rank, Snapshot.sha256, Snapshot.blob_ref, Snapshot.context,
            Snapshot.attempts, Snapshot.trigger, Snapshot.source, Snapshot.step, Snapshot.epoch)


def _claimed(row, until: dt.datetime) -> ClaimedSnapshot:
    return ClaimedSnapshot(id=row.id, run_id=row.run_id, rank=row.rank, sha256=row.sha256,
                           blob_ref=row.blob_ref, context=dict(row.context or {}), attempts=row.attempts,
                           lease_until=to_utc(until), trigger=row.trigger, source=row.source, step=row.step,
                           epoch=row.epoch)


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
            .returning(*_CLAIMED))
    row = session.execute(stmt).first()
    return None if row is None else _claimed(row, until)


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


# ----------------------------------------------------------------------------------- reads for the work


def snapshot_row(session: Session, snapshot_id: int):
    """One snapshot's row as the workers and the analysis read it (id, run_id, rank, sha256, context,
    trigger, source, step, epoch, state, attempts, size_bytes), or None."""
    return session.execute(select(Snapshot.id, Snapshot.run_id, Snapshot.rank, Snapshot.sha256, Snapshot.context,
                                  Snapshot.trigger, Snapshot.source, Snapshot.step, Snapshot.epoch, Snapshot.state,
                                  Snapshot.attempts, Snapshot.size_bytes)
                           .where(Snapshot.id == snapshot_id)).one_or_none()


def take_over_lease(session: Session, snapshot_id: int, lease_s: float,
                    max_attempts: int) -> ClaimedSnapshot | None:
    """The same task back for a snapshot it holds (running): a fresh lease and one more attempt, while
    attempts remain. Returns the claim, or None."""
    until = _db_time(session, utcnow()) + dt.timedelta(seconds=lease_s)
    got = session.execute(update(Snapshot).where(Snapshot.id == snapshot_id, Snapshot.state == "running",
                                                 Snapshot.attempts < max_attempts)
                          .values(lease_until=until, attempts=Snapshot.attempts + 1)
                          .returning(*_CLAIMED)).first()
    return None if got is None else _claimed(got, until)


def known_blob_size(session: Session, sha256: str) -> int | None:
    """The size a snapshot row already records for these bytes (any run), or None."""
    return session.execute(select(Snapshot.size_bytes).where(Snapshot.sha256 == sha256).limit(1)).scalar()


def snapshot_outcome(session: Session, snapshot_id: int):
    """(run_id, rank, trigger, oom_requested_bytes, oom) of an analysed snapshot: what marks its run."""
    return session.execute(select(Snapshot.run_id, Snapshot.rank, Snapshot.trigger,
                                  AnalysisResult.oom_requested_bytes, AnalysisResult.result["oom"].label("oom"))
                           .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
                           .where(Snapshot.id == snapshot_id)).one()


def dead_letter_row(session: Session, snapshot_id: int):
    """What a dead letter of the snapshot carries (run_id, rank, sha256, trigger, step, epoch, source,
    name, cluster), or None."""
    return session.execute(select(Snapshot.run_id, Snapshot.rank, Snapshot.sha256, Snapshot.trigger, Snapshot.step,
                                  Snapshot.epoch, Snapshot.source, Run.name, Run.cluster)
                           .join(Run, Run.id == Snapshot.run_id).where(Snapshot.id == snapshot_id)).one_or_none()


def pending_since(session: Session, since: dt.datetime) -> bool:
    """Whether a snapshot row created at or after `since` waits for its analysis."""
    return session.execute(select(Snapshot.id).where(Snapshot.state == "pending",
                                                     Snapshot.created_at >= _db_time(session, since))
                           .limit(1)).first() is not None


def pending_snapshots(session: Session, *, created_before: dt.datetime | None = None,
                      ids: list[int] | None = None, limit: int = 1000) -> list:
    """(id, attempts) of pending snapshots: created before a moment (the oldest first, at most `limit`),
    or among `ids`."""
    q = select(Snapshot.id, Snapshot.attempts).where(Snapshot.state == "pending")
    if created_before is not None:
        q = q.where(Snapshot.created_at < _db_time(session, created_before)).order_by(Snapshot.id).limit(limit)
    if ids is not None:
        q = q.where(Snapshot.id.in_(sorted(ids) or [-1]))
    return session.execute(q).all()


def set_snapshot_time(session: Session, snapshot_id: int, taken_at: dt.datetime) -> None:
    session.execute(update(Snapshot).where(Snapshot.id == snapshot_id).values(taken_at=_db_time(session, taken_at)))


def rank_snapshots(session: Session, run_id: int, rank: int, limit: int) -> list:
    """A rank's newest `limit` snapshots, the newest first, with their analyses' figures and digest (id,
    sha256, trigger, source, context, step, epoch, size_bytes, analysis_id, allocated_bytes,
    reserved_bytes, analyzer_version, digest): what a run diagnosis reads."""
    return session.execute(
        select(Snapshot.id, Snapshot.sha256, Snapshot.trigger, Snapshot.source, Snapshot.context,
               Snapshot.step, Snapshot.epoch, Snapshot.size_bytes, AnalysisResult.id.label("analysis_id"),
               AnalysisResult.allocated_bytes,
               AnalysisResult.reserved_bytes, AnalysisResult.analyzer_version, AnalysisResult.digest)
        .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.run_id == run_id, Snapshot.rank == rank)
        .order_by(Snapshot.taken_at.desc(), Snapshot.id.desc()).limit(limit)).all()


def reanalyze_targets(session: Session, version: str, run_id: int | None = None):
    """What `memq reanalyze` brings up to `version`: (snapshots analysed by another version or not done:
    id, run_id, rank, sha256; every (run, rank) with snapshots; the (run, rank) whose diagnosis is of
    `version`), of one run or all."""
    q = select(Snapshot.id, Snapshot.run_id, Snapshot.rank, Snapshot.sha256)
    dq = select(Snapshot.run_id, Snapshot.rank).distinct()
    if run_id is not None:
        q = q.where(Snapshot.run_id == run_id)
        dq = dq.where(Snapshot.run_id == run_id)
    snaps = session.execute(q.where((Snapshot.analyzer_version.is_(None)) | (Snapshot.analyzer_version != version)
                                    | (Snapshot.state != "done")).order_by(Snapshot.id)).all()
    pairs = set(session.execute(dq).all())
    current = set(session.execute(select(RunDiagnosis.run_id, RunDiagnosis.rank)
                                  .where(RunDiagnosis.analyzer_version == version)).all())
    return snaps, pairs, current
