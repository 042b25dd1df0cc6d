"""Write side of the run history: the functions `memq ingest` and the workers call.

Every function takes an open `Session` (from `profiler.store.db.session_scope`), binds every value
as a parameter, and returns plain values (ids, dataclasses, dicts), never ORM rows. Statements are
written for both PostgreSQL and SQLite with the dialect's own INSERT ... ON CONFLICT.

Runs
- `upsert_run(session, RunMeta(...)) -> run_id`: create or update a run by name; fields left None
  keep their stored value, labels are merged, `started_at` keeps the earliest and `ended_at` the
  latest value seen. Safe to call from every rank and every retry.
- `set_run_status(session, run_name, status, ended_at=None)`: running | completed | oom | crashed.
- `delete_run(session, run_name)`: the run with its samples, snapshots and diagnoses.

Snapshots (the analysis work queue; state pending -> running -> done | failed)
- `insert_snapshot(session, NewSnapshot(...)) -> (snapshot_id, created)`: idempotent,
  ON CONFLICT (run, rank, sha256) DO NOTHING; a redelivered message returns the existing id.
- `claim_snapshot(session, snapshot_id, lease_s) -> ClaimedSnapshot | None`: one atomic UPDATE;
  wins only if the snapshot is pending or its lease expired, and attempts < max_attempts.
- `claim_next(session, lease_s, limit)`: the same for the oldest claimable snapshots
  (FOR UPDATE SKIP LOCKED on PostgreSQL).
- `requeue_expired(session) -> [ids]`: the reaper: expired leases go back to pending.
- `complete_snapshot(session, snapshot_id, analysis_id, analyzer_version)`,
  `fail_snapshot(session, snapshot_id, error, retry=True, max_attempts=5)`.

Analysis results (keyed by sha256, analyzer version and context key: nothing is analysed twice)
- `find_analysis(session, sha256, analyzer_version, context_key="") -> analysis_id | None`
- `store_analysis(session, sha256, analyzer_version, result, context_key="") -> analysis_id`:
  upsert of the contract JSON of `profiler.analysis.analyze` plus its queryable figures.
- `context_key(ctx)`: the key of the outside facts (limit, device total, OOM message).
- `store_run_diagnosis(...)`, `refresh_run_summary(session, run_id)`.

Stat samples
- `insert_stat_samples(session, rows) -> int`: batched INSERT ... ON CONFLICT DO NOTHING on the
  primary key (run, rank, sampled_at), so a redelivered batch adds nothing. PostgreSQL gets one
  `INSERT ... SELECT unnest(<column array literals>)` per 10,000 rows (no COPY), SQLite an executemany.
  `stat_row(run_id, rank, stats, ...)` maps a `torch.cuda.memory_stats()` dict to a row.

Reports
- `upsert_report(session, report_date, scope, summary, path=None, analyzer_version=None) -> id`:
  one row per (date, scope); a rerun replaces it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from sqlalchemy import and_, case, func, null, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from profiler.errors import BadInput, NotFound, StorageError, StorageUnavailable
from profiler.store.orm import (
    RUN_STATUSES,
    TRIGGERS,
    AnalysisResult,
    RankFigures,
    Report,
    Run,
    RunDiagnosis,
    Snapshot,
    StatSample,
)

DEFAULT_LEASE_S = 600
DEFAULT_MAX_ATTEMPTS = 5


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def to_utc(value: dt.datetime | float | int | None) -> dt.datetime | None:
    """Aware UTC datetime from a datetime (naive = UTC, as SQLite returns them) or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def db_time(session: Session, value: dt.datetime | None) -> dt.datetime | None:
    """A time as this database takes it in a comparison or a write: SQLite keeps no offset, so
    naive UTC there; aware UTC elsewhere."""
    value = to_utc(value)
    if value is not None and session.get_bind().dialect.name == "sqlite":
        return value.replace(tzinfo=None)
    return value


_db_time = db_time  # early callers used the private name


def _insert(session: Session, table):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise BadInput(f"unsupported database dialect {name!r}", hint="use PostgreSQL or SQLite")


# --------------------------------------------------------------------------------------------- runs


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
    allocator_conf: str | None = None
    optimizer: str | None = None
    param_count: int | None = None
    world_size: int | None = None
    rank: int | None = None
    started_at: dt.datetime | None = None
    ended_at: dt.datetime | None = None
    status: str | None = None

    def __post_init__(self):
        if not self.name or len(self.name) > 200:
            raise BadInput("a run needs a name of 1 to 200 characters", hint="pass --run NAME")
        if self.status is not None and self.status not in RUN_STATUSES:
            raise BadInput(f"run status {self.status!r} is not one of {', '.join(RUN_STATUSES)}")


_KEEP_COLUMNS = ("job", "cluster", "host", "username", "project", "torch_version", "cuda_version",
                 "driver_version", "gpu_model", "gpu_memory_bytes", "memory_limit_bytes", "allocator_conf",
                 "optimizer", "param_count", "world_size", "rank", "status")


def upsert_run(session: Session, meta: RunMeta) -> int:
    """Create or update the run `meta.name`; returns its id (see module docstring)."""
    values: dict[str, Any] = {k: v for k, v in asdict(meta).items() if v is not None and k != "labels"}
    values["labels"] = {str(k): str(v) for k, v in dict(meta.labels).items()}
    values["started_at"] = _db_time(session, meta.started_at) or _db_time(session, utcnow())
    if meta.ended_at is not None:
        values["ended_at"] = _db_time(session, meta.ended_at)
    stmt = _insert(session, Run).values(**values)
    ex = stmt.excluded
    t = Run.__table__.c
    dialect = session.get_bind().dialect.name
    merged_labels = (t.labels.op("||")(ex.labels) if dialect == "postgresql"
                     else func.json_patch(t.labels, ex.labels))
    set_: dict[str, Any] = {c: ex[c] for c in _KEEP_COLUMNS if c in values}
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


def set_run_status(session: Session, run_name: str, status: str, ended_at: dt.datetime | None = None) -> None:
    if status not in RUN_STATUSES:
        raise BadInput(f"run status {status!r} is not one of {', '.join(RUN_STATUSES)}")
    values: dict[str, Any] = {"status": status, "updated_at": func.current_timestamp()}
    if ended_at is not None or status != "running":
        values["ended_at"] = _db_time(session, ended_at or utcnow())
    res = session.execute(update(Run).where(Run.name == run_name).values(**values))
    if res.rowcount == 0:
        raise NotFound(f"no run named {run_name!r}", hint="list runs with `memq runs`")


# ---------------------------------------------------------------------------------------- snapshots


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


# --------------------------------------------------------------------------------- analysis results


def context_key(ctx: Mapping[str, Any] | None) -> str:
    """Stable key of the outside facts an analysis used; "" when there are none."""
    facts = {k: v for k, v in (ctx or {}).items() if v not in (None, "")}
    if not facts:
        return ""
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def find_analysis(session: Session, sha256: str, analyzer_version: str, context_key: str = "") -> int | None:
    rid = session.execute(select(AnalysisResult.id).where(
        AnalysisResult.sha256 == sha256, AnalysisResult.analyzer_version == analyzer_version,
        AnalysisResult.context_key == context_key)).scalar_one_or_none()
    return None if rid is None else int(rid)


def _figures(result: Mapping[str, Any]) -> dict[str, Any]:
    metrics = result.get("metrics") or {}
    diag = result.get("diagnosis") or {}
    oom = result.get("oom") or {}
    return {
        "reserved_bytes": metrics.get("reserved_bytes"),
        "allocated_bytes": metrics.get("allocated_bytes"),
        "active_bytes": metrics.get("active_bytes"),
        "largest_free_block_bytes": metrics.get("largest_free_block_bytes"),
        "fragmentation_ratio": metrics.get("fragmentation_ratio"),
        "oom_requested_bytes": oom.get("requested_bytes") if oom else None,
        "primary_cause": diag.get("primary_cause"),
        "confidence": diag.get("confidence"),
    }


CONTRACT_KEYS = ("schema", "snapshots", "metrics", "oom", "composition", "diagnosis")
MAX_DETAILS_CHARS = 512 * 1024


def contract_only(result: Mapping[str, Any]) -> dict[str, Any]:
    """The analyze() result as stored: the JSON contract keys, plus `details` (timeline, limits,
    leak evidence) when it is under MAX_DETAILS_CHARS of JSON."""
    doc = {k: result.get(k) for k in CONTRACT_KEYS}
    details = result.get("details")
    if details is not None:
        details = json_safe(details)
        if len(json.dumps(details)) <= MAX_DETAILS_CHARS:
            doc["details"] = details
    return json_safe(doc)


def json_safe(value: Any) -> Any:
    """Plain JSON data: tuples to lists, non-finite floats (JSONB refuses NaN) to None, other
    objects to strings."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def store_analysis(session: Session, sha256: str, analyzer_version: str, result: Mapping[str, Any],
                   context_key: str = "", digest: Mapping[str, Any] | None = None) -> int:
    """Upsert the analysis of `sha256` by `analyzer_version` (with the snapshot's digest for run
    diagnoses, analysis/per_snapshot.py); returns its id."""
    doc = contract_only(result)
    values = {"sha256": sha256, "analyzer_version": analyzer_version, "context_key": context_key,
              "result": doc, "digest": null() if digest is None else json_safe(digest), **_figures(doc)}
    stmt = _insert(session, AnalysisResult).values(**values)
    set_ = {k: stmt.excluded[k] for k in values if k not in ("sha256", "analyzer_version", "context_key")}
    stmt = stmt.on_conflict_do_update(index_elements=["sha256", "analyzer_version", "context_key"],
                                      set_=set_).returning(AnalysisResult.id)
    return int(session.execute(stmt).scalar_one())


def fill_digest(session: Session, analysis_id: int, digest: Mapping[str, Any]) -> None:
    """Attach a digest to an analysis stored without a usable one (before migration 0003, or of an
    older digest format)."""
    session.execute(update(AnalysisResult).where(AnalysisResult.id == analysis_id).values(digest=json_safe(digest)))


def drop_digests_outside_window(session: Session, run_id: int, rank: int, window: int) -> int:
    """Digests are read only for a rank's newest `window` snapshots (a run diagnosis); those of its
    older snapshots are dropped, unless the same analysis is also a newer snapshot's of this rank or
    any snapshot's of another (run, rank) (bytes shared across runs: kept, to be safe). A digest
    dropped wrongly costs one decode, which fills it in again. Returns the digests dropped."""
    order = (Snapshot.taken_at.desc(), Snapshot.id.desc())
    mine = (Snapshot.run_id == run_id) & (Snapshot.rank == rank) & Snapshot.analysis_id.is_not(None)
    newest = select(Snapshot.analysis_id).where(mine).order_by(*order).limit(window)
    older = select(Snapshot.analysis_id).where(mine).order_by(*order).offset(window)
    elsewhere = select(Snapshot.id).where(Snapshot.analysis_id == AnalysisResult.id,
                                          ~((Snapshot.run_id == run_id) & (Snapshot.rank == rank)))
    res = session.execute(update(AnalysisResult)
                          .where(AnalysisResult.digest.is_not(None), AnalysisResult.id.in_(older.scalar_subquery()),
                                 AnalysisResult.id.not_in(newest.scalar_subquery()), ~elsewhere.exists())
                          .values(digest=null()).execution_options(synchronize_session=False))
    return int(res.rowcount or 0)


def store_run_diagnosis(session: Session, run_id: int, rank: int, analyzer_version: str,
                        result: Mapping[str, Any], snapshot_count: int, peak_reserved_bytes: int | None,
                        peak_allocated_bytes: int | None, peak_composition: Mapping[str, Any]) -> None:
    doc = contract_only(result)
    diag = doc.get("diagnosis") or {}
    values = {"run_id": run_id, "rank": rank, "analyzer_version": analyzer_version,
              "primary_cause": diag.get("primary_cause"), "confidence": diag.get("confidence"),
              "snapshot_count": snapshot_count, "peak_reserved_bytes": peak_reserved_bytes,
              "peak_allocated_bytes": peak_allocated_bytes, "peak_composition": dict(peak_composition),
              "result": doc, "computed_at": _db_time(session, utcnow())}
    stmt = _insert(session, RunDiagnosis).values(**values)
    set_ = {k: stmt.excluded[k] for k in values if k not in ("run_id", "rank")}
    session.execute(stmt.on_conflict_do_update(index_elements=["run_id", "rank"], set_=set_))


def refresh_run_summary(session: Session, run_id: int) -> None:
    """Copy the verdict of the rank that matters most onto the run row, with peaks over snapshots
    and stat samples. The rank that matters: an OOM diagnosis first, then the highest peak."""
    diags = session.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == run_id)).scalars().all()
    snap_peak = session.execute(
        select(func.max(AnalysisResult.reserved_bytes), func.max(AnalysisResult.allocated_bytes),
               func.count(Snapshot.id))
        .select_from(Snapshot).outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.run_id == run_id)).one()
    stat_peak = session.execute(
        select(func.max(StatSample.reserved_bytes), func.max(StatSample.allocated_bytes),
               func.max(StatSample.oom_count))
        .where(StatSample.run_id == run_id)).one()
    ooms = session.execute(
        select(func.count()).select_from(Snapshot).outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.run_id == run_id,
               or_(Snapshot.trigger == "oom", AnalysisResult.oom_requested_bytes.is_not(None)))).scalar_one()
    values: dict[str, Any] = {
        "peak_reserved_bytes": max_present(snap_peak[0], stat_peak[0], *(d.peak_reserved_bytes for d in diags)),
        "peak_allocated_bytes": max_present(snap_peak[1], stat_peak[1], *(d.peak_allocated_bytes for d in diags)),
        "snapshot_count": int(snap_peak[2] or 0),
        "oom_count": max(int(ooms or 0), int(stat_peak[2] or 0)),
        "updated_at": func.current_timestamp(),
    }
    if diags:
        def weight(d: RunDiagnosis):
            oom = bool((d.result or {}).get("oom"))
            return (oom, d.peak_reserved_bytes or 0, -d.rank)

        main = max(diags, key=weight)
        values["primary_cause"] = main.primary_cause
        values["cause_confidence"] = main.confidence
        values["fragmentation_ratio"] = ((main.result or {}).get("metrics") or {}).get("fragmentation_ratio")
    session.execute(update(Run).where(Run.id == run_id).values(**values))


def max_present(*vals):
    present = [int(v) for v in vals if v is not None]
    return max(present) if present else None


# ------------------------------------------------------------------------------------- stat samples

STAT_COLUMNS = ("run_id", "rank", "sampled_at", "step", "epoch", "allocated_bytes", "reserved_bytes",
                "active_bytes", "inactive_split_bytes", "alloc_retries", "oom_count")
_STAT_PG_TYPES = ("bigint", "integer", "timestamptz", "bigint", "integer", "bigint", "bigint", "bigint", "bigint",
                  "integer", "integer")
# One statement per batch: every column travels as one array literal, so the statement is the same
# whatever the batch size and the server expands the arrays with unnest(). Building the literals with
# str.join is several times cheaper than adapting 10,000 Python values per column one by one.
_STAT_PG_SQL = (
    "INSERT INTO stat_samples (" + ", ".join(STAT_COLUMNS) + ") SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in _STAT_PG_TYPES)
    + ") ON CONFLICT (run_id, rank, sampled_at) DO NOTHING"
)
STAT_BATCH_ROWS = 10_000


def stat_row(run_id: int, rank: int, stats: Mapping[str, Any], sampled_at: dt.datetime | float,
             step: int | None = None, epoch: int | None = None) -> dict[str, Any]:
    """A stat_samples row from a `torch.cuda.memory_stats()` dict (flat keys)."""
    def g(*keys):
        for k in keys:
            v = stats.get(k)
            if v is not None:
                return int(v)
        return None

    return {
        "run_id": run_id, "rank": rank, "sampled_at": to_utc(sampled_at),
        "step": step if step is not None else g("step"),
        "epoch": epoch if epoch is not None else g("epoch"),
        "allocated_bytes": g("allocated_bytes.all.current", "allocated_bytes"),
        "reserved_bytes": g("reserved_bytes.all.current", "reserved_bytes"),
        "active_bytes": g("active_bytes.all.current", "active_bytes"),
        "inactive_split_bytes": g("inactive_split_bytes.all.current", "inactive_split_bytes"),
        "alloc_retries": g("num_alloc_retries", "alloc_retries"),
        "oom_count": g("num_ooms", "oom_count"),
    }


def insert_stat_samples(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert stat sample rows (dicts with STAT_COLUMNS keys; `sampled_at` a datetime or epoch
    seconds) in batches of STAT_BATCH_ROWS, inside the session's transaction; rows whose
    (run, rank, sampled_at) is already stored are skipped. PostgreSQL: one INSERT ... SELECT
    unnest(arrays) per batch; SQLite: executemany. Returns the number of rows offered."""
    dialect = session.get_bind().dialect.name
    total = 0
    batch: list[dict[str, Any]] = []
    for r in rows:
        batch.append({c: r.get(c) for c in STAT_COLUMNS} | {"sampled_at": to_utc(r["sampled_at"])})
        if len(batch) >= STAT_BATCH_ROWS:
            total += _flush_stats(session, batch, dialect)
            batch = []
    if batch:
        total += _flush_stats(session, batch, dialect)
    return total


def _int_array(values: list[Any]) -> str:
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _ts_array(values: list[dt.datetime]) -> str:
    return "{" + ",".join('"' + v.isoformat() + '"' for v in values) + "}"


def _flush_stats(session: Session, batch: list[dict[str, Any]], dialect: str) -> int:
    if dialect == "postgresql":
        import psycopg

        params = [_ts_array([r[c] for r in batch]) if c == "sampled_at" else _int_array([r[c] for r in batch])
                  for c in STAT_COLUMNS]
        dbapi = session.connection().connection.dbapi_connection  # the session's own transaction
        try:
            with dbapi.cursor() as cur:
                cur.execute(_STAT_PG_SQL, params)
        except psycopg.OperationalError as exc:
            raise StorageUnavailable(f"database unavailable while inserting stat samples: {exc}") from exc
        except psycopg.Error as exc:
            raise StorageError(f"database refused stat samples: {str(exc).splitlines()[0][:300]}") from exc
        return len(batch)
    if dialect == "sqlite":
        for r in batch:
            r["sampled_at"] = r["sampled_at"].replace(tzinfo=None)
    stmt = _insert(session, StatSample.__table__).on_conflict_do_nothing(
        index_elements=["run_id", "rank", "sampled_at"])
    session.execute(stmt, batch)
    return len(batch)


def delete_run(session: Session, run_name: str) -> None:
    """Remove a run with its stat samples, snapshots and diagnoses (blobs and shared analysis
    results stay: other runs may hold the same bytes)."""
    run_id = run_id_for(session, run_name)
    session.execute(StatSample.__table__.delete().where(StatSample.run_id == run_id))
    session.execute(RunDiagnosis.__table__.delete().where(RunDiagnosis.run_id == run_id))
    session.execute(RankFigures.__table__.delete().where(RankFigures.run_id == run_id))
    session.execute(Snapshot.__table__.delete().where(Snapshot.run_id == run_id))
    session.execute(Run.__table__.delete().where(Run.id == run_id))


# ------------------------------------------------------------------------------------------ reports


def upsert_report(session: Session, report_date: dt.date, scope: str, summary: Mapping[str, Any],
                  path: str | None = None, analyzer_version: str | None = None) -> int:
    """One report per (date, scope): a rerun replaces the stored one. Returns its id."""
    values = {"report_date": report_date, "scope": scope, "summary": json_safe(summary),
              "path": path, "analyzer_version": analyzer_version, "generated_at": _db_time(session, utcnow())}
    stmt = _insert(session, Report).values(**values)
    set_ = {k: stmt.excluded[k] for k in ("summary", "path", "analyzer_version", "generated_at")}
    stmt = stmt.on_conflict_do_update(index_elements=["report_date", "scope"], set_=set_).returning(Report.id)
    return int(session.execute(stmt).scalar_one())
