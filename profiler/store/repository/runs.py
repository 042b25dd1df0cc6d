"""Runs: create or update by name (`upsert_run`), status (`move_run_status`), id lookup, delete."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import case, func, or_, select, update
from sqlalchemy.orm import Session

from memq.analysis.run_status import check_status, replaced_by
from memq.errors import BadInput, NotFound
from memq.store.orm import (
    RankFigures,
    Run,
    RunDiagnosis,
    Snapshot,
    StatSample,
)
from memq.store.repository.common import _db_time, _insert, utcnow


@dataclass(frozen=True)
class RunMeta:
    """What is known about a run; None means "unknown here, keep what is stored"."""

    name: str
    job: str | None = None
    cluster: str | None = None
    host: str | None = None
    username: str | None = None
    project: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    torch_version: str | None = None
    cuda_version: str | None = None
    driver_version: str | None = None
    gpu_model: str | None = None
    gpu_memory_bytes: int | None = None
    memory_limit_bytes: int | None = None
    non_pytorch_bytes: int | None = None
    allocator_conf: str | None = None
    optimizer: str | None = None
    param_count: int | None = None
    world_size: int | None = None
    rank: int | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    status: str | None = None
    #: Set on the insert only (the creating envelope's principal); an upsert never changes it.
    owner: str | None = None

    def __post_init__(self):
        if not self.name or len(self.name) > 200:
            raise BadInput("a run needs a name of 1 to 200 characters", hint="pass --run NAME")
        if self.status is not None:
            check_status(self.status)


_KEEP_COLUMNS = ("job", "cluster", "host", "username", "project", "torch_version", "cuda_version",
                 "driver_version", "gpu_model", "gpu_memory_bytes", "memory_limit_bytes", "non_pytorch_bytes",
                 "allocator_conf", "optimizer", "param_count", "world_size", "rank", "status")


def upsert_run(session: Session, meta: RunMeta, *, first_wins: bool = False) -> int:
    """Create or update the run `meta.name`; returns its id (see module docstring).

    `first_wins`: what agents send (run_start, and the identity of any envelope): a column already set
    keeps its value and labels keep theirs, so a later `run_start` under the same run name (another
    rank, a restarted job, or someone else's agent) fills only what is still unknown and never moves
    the run to another cluster or job, shrinks its world or changes its device memory. A user's
    `memq ingest` of their own files updates as given."""
    values: dict[str, Any] = {k: v for k, v in asdict(meta).items() if v is not None and k != "labels"}
    values["labels"] = {str(k): str(v) for k, v in dict(meta.labels).items()}
    values["started_at"] = _db_time(session, meta.started_at) or _db_time(session, utcnow())
    if meta.ended_at is not None:
        values["ended_at"] = _db_time(session, meta.ended_at)
    stmt = _insert(session, Run).values(**values)
    ex = stmt.excluded
    t = Run.__table__.c
    dialect = session.get_bind().dialect.name
    old, new = (ex.labels, t.labels) if first_wins else (t.labels, ex.labels)
    merged_labels = old.op("||")(new) if dialect == "postgresql" else func.json_patch(old, new)
    if first_wins:
        set_: dict[str, Any] = {c: func.coalesce(t[c], ex[c]) for c in _KEEP_COLUMNS if c in values}
    else:
        set_ = {c: ex[c] for c in _KEEP_COLUMNS if c in values}
    set_["labels"] = merged_labels
    if meta.started_at is not None:
        set_["started_at"] = case((or_(t.started_at.is_(None), ex.started_at < t.started_at), ex.started_at),
                                  else_=t.started_at)
    if meta.ended_at is not None:
        set_["ended_at"] = case((or_(t.ended_at.is_(None), ex.ended_at > t.ended_at), ex.ended_at),
                                else_=t.ended_at)
    set_["updated_at"] = func.current_timestamp()
    stmt = stmt.on_conflict_do_update(index_elements=[t.name], set_=set_).returning(t.id)
    return int(session.execute(stmt).scalar_one())


def run_id_for(session: Session, run_name: str) -> int:
    rid = session.execute(select(Run.id).where(Run.name == run_name)).scalar_one_or_none()
    if rid is None:
        raise NotFound(f"no run named {run_name!r}", hint="list runs with `memq runs`")
    return int(rid)


def move_run_status(session: Session, run_id: int, status: str, *, ended_at: dt.datetime | None = None,
                    given: bool = False) -> bool:
    """Move the run's status by the one rule (analysis/run_status.py): up the order only, or as given by a
    person (`given`). `ended_at` is written with it. Returns whether the row changed."""
    values: dict[str, Any] = {"status": status, "updated_at": func.current_timestamp()}
    if ended_at is not None:
        values["ended_at"] = _db_time(session, ended_at)
    res = session.execute(update(Run).where(Run.id == run_id, or_(Run.status.is_(None),
                                                                  Run.status.in_(replaced_by(status, given=given))))
                          .values(**values))
    return bool(res.rowcount)


def set_run_limit(session: Session, run_id: int, limit_bytes: int) -> None:
    """What the allocator may reserve in this run, given after the fact (a cap the agent could not read,
    or the card of a job recorded before agents reported it): the next diagnosis and forecast use it."""
    if limit_bytes <= 0:
        raise BadInput(f"a run's limit must be positive, not {limit_bytes}")
    session.execute(update(Run).where(Run.id == run_id).values(memory_limit_bytes=int(limit_bytes),
                                                               updated_at=func.current_timestamp()))


def delete_run(session: Session, run_name: str) -> None:
    """Remove a run with its stat samples, snapshots and diagnoses (blobs and shared analysis
    results stay: other runs may hold the same bytes)."""
    run_id = run_id_for(session, run_name)
    session.execute(StatSample.__table__.delete().where(StatSample.run_id == run_id))
    session.execute(RunDiagnosis.__table__.delete().where(RunDiagnosis.run_id == run_id))
    session.execute(RankFigures.__table__.delete().where(RankFigures.run_id == run_id))
    session.execute(Snapshot.__table__.delete().where(Snapshot.run_id == run_id))
    session.execute(Run.__table__.delete().where(Run.id == run_id))


def run_owner(session: Session, run_id: int) -> str | None:
    return session.execute(select(Run.owner).where(Run.id == run_id)).scalar_one_or_none()


def find_run_id(session: Session, run_name: str) -> int | None:
    rid = session.execute(select(Run.id).where(Run.name == run_name)).scalar_one_or_none()
    return None if rid is None else int(rid)


def run_settings(session: Session, run_id: int):
    """(memory_limit_bytes, gpu_memory_bytes, optimizer) of a run, what its analyses use; None when
    there is no such run."""
    return session.execute(select(Run.memory_limit_bytes, Run.gpu_memory_bytes, Run.optimizer)
                           .where(Run.id == run_id)).one_or_none()


def run_status(session: Session, run_id: int) -> str:
    return session.execute(select(Run.status).where(Run.id == run_id)).scalar_one()
