"""Tables of the run history (SQLAlchemy 2 typed ORM). Units: bytes, UTC timestamps.

Rows never leave a session: the repository turns them into plain dataclasses/dicts first.
Constraint and index names come from `NAMING`, so Alembic migrations name them identically on
PostgreSQL and SQLite. Every change here needs a migration in migrations/versions/ (the test
suite fails on drift: `alembic check` must find nothing to do).

Tables
- runs: one training run (all its ranks and hosts), its identity, versions, settings and status,
  plus the run-level verdict denormalised for fast listings (`memq runs --cause`).
- snapshots: one allocator snapshot of one rank; unique on (run, rank, sha256). The same bytes
  under two runs are two rows pointing at one blob and one analysis result.
  `state`/`lease_until`/`attempts` drive the analysis work queue of the workers.
- analysis_results: the analysis of one snapshot's bytes by one analyzer version, under one
  context (limit, device total, OOM message: `context_key`, "" when none). Contract JSON plus the
  figures listings filter on.
- run_diagnoses: the diagnosis of a run's snapshots taken together, per rank.
- rank_figures: one rank's own exit figures (run peaks, last step, limit, per-step peaks), per rank.
- stat_samples: light `torch.cuda.memory_stats()` samples for timelines; primary key
  (run, rank, time) so a redelivered batch inserts nothing twice. No foreign key (see the column).
- reports: one nightly report per (date, scope); a rerun replaces it.
- whatif_sweeps: the standard allocator-settings sweep (profiler/analysis/whatif.py) of one OOM
  snapshot's bytes by one analyzer version under one context (limit, seeding snapshots).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    Date,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from memq.model import RUN_STATUSES, TRIGGERS
from memq.store.states import ALERT_STATES, SNAPSHOT_STATES, SUMMARY_STATES

NAMING = {
    "ix": "ix_%(table_name)s__%(column_0_N_name)s",
    "uq": "uq_%(table_name)s__%(column_0_N_name)s",
    "ck": "ck_%(table_name)s__%(constraint_name)s",
    "fk": "fk_%(table_name)s__%(column_0_name)s__%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# JSONB on PostgreSQL (indexable, compact), JSON text on SQLite.
JsonDoc = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments INTEGER PRIMARY KEY columns.
BigId = BigInteger().with_variant(Integer(), "sqlite")
UtcDateTime = DateTime(timezone=True)


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN (" + ", ".join(f"'{v}'" for v in values) + ")"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {
        dict[str, Any]: JsonDoc,
        dt.datetime: UtcDateTime,
        dt.date: Date,
    }


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: The run id users and agents give (`--run`); unique across the whole history.
    name: Mapped[str] = mapped_column(String(200), unique=True)
    job: Mapped[str | None] = mapped_column(String(200))
    cluster: Mapped[str | None] = mapped_column(String(200))
    host: Mapped[str | None] = mapped_column(String(255))
    username: Mapped[str | None] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(200))
    #: Free-form `k=v` labels, as a JSON object of strings.
    labels: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    torch_version: Mapped[str | None] = mapped_column(String(64))
    cuda_version: Mapped[str | None] = mapped_column(String(64))
    driver_version: Mapped[str | None] = mapped_column(String(64))
    gpu_model: Mapped[str | None] = mapped_column(String(128))
    #: Device total (bytes).
    gpu_memory_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: What the allocator may reserve (per-process cap), bytes; None = the device.
    memory_limit_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: Device memory held outside this run's PyTorch at its start (bytes): an uncapped run's limit is
    #: the device total less this.
    non_pytorch_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: PYTORCH_CUDA_ALLOC_CONF as the process saw it.
    allocator_conf: Mapped[str | None] = mapped_column(String(500))
    optimizer: Mapped[str | None] = mapped_column(String(100))
    param_count: Mapped[int | None] = mapped_column(BigInteger)
    world_size: Mapped[int | None] = mapped_column(Integer)
    #: The rank that reported the run's start (a run spans ranks; snapshots carry their own).
    rank: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    status: Mapped[str] = mapped_column(String(16), default="running", server_default="running")
    # Run-level verdict, copied from the run_diagnoses row of the rank that matters most
    # (the one that hit an OOM, else the highest peak) so listings need no join.
    primary_cause: Mapped[str | None] = mapped_column(String(32))
    cause_confidence: Mapped[float | None] = mapped_column(Float)
    #: Highest reserved bytes seen in any snapshot or stat sample of the run.
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: Fragmentation ratio of the last snapshot (1 - largest free / total free).
    fragmentation_ratio: Mapped[float | None] = mapped_column(Float)
    #: At the OOM, the share of reserved memory free in pieces (analysis/memory.pieces_share); NULL
    #: without an OOM. The lists' `in pieces` column.
    pieces_share: Mapped[float | None] = mapped_column(Float)
    oom_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    snapshot_count: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: The principal whose signed envelope created the run (profiler/identity.py); NULL: unsigned or
    #: ingested. Envelopes of the run from anyone else are dead-lettered; never updated.
    owner: Mapped[str | None] = mapped_column(String(200))
    #: The OOM forecast of the rank that runs out first (analysis/forecast.py): the step, and when
    #: (wall clock, from the forecast's moment and its ETA); NULL when none is expected.
    oom_forecast_step: Mapped[int | None] = mapped_column(BigInteger)
    oom_forecast_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))
    updated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))

    snapshots: Mapped[list[Snapshot]] = relationship(back_populates="run", lazy="raise",
                                                     passive_deletes=True)

    __table_args__ = (
        CheckConstraint(_in("status", RUN_STATUSES), name="status"),
        Index(None, "cluster", "started_at"),
        Index(None, "job", "started_at"),
        Index(None, "started_at"),
    )


class AnalysisResult(Base):
    __tablename__ = "analysis_results"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    sha256: Mapped[str] = mapped_column(String(64))
    analyzer_version: Mapped[str] = mapped_column(String(64))
    #: Hash of the outside facts the analysis used (limit, device total, OOM message); "" = none.
    context_key: Mapped[str] = mapped_column(String(64), default="", server_default="")
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    active_bytes: Mapped[int | None] = mapped_column(BigInteger)
    largest_free_block_bytes: Mapped[int | None] = mapped_column(BigInteger)
    fragmentation_ratio: Mapped[float | None] = mapped_column(Float)
    oom_requested_bytes: Mapped[int | None] = mapped_column(BigInteger)
    primary_cause: Mapped[str | None] = mapped_column(String(32))
    confidence: Mapped[float | None] = mapped_column(Float)
    #: The `memq analyze --json` object (schema, snapshots, metrics, oom, composition, diagnosis).
    result: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    #: What a run diagnosis needs of this snapshot when it is not the last (analysis/per_snapshot.py);
    #: NULL for rows from before migration 0003 until a run diagnosis fills it in.
    digest: Mapped[dict[str, Any] | None] = mapped_column(JsonDoc)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))

    __table_args__ = (UniqueConstraint("sha256", "analyzer_version", "context_key"),)


class Snapshot(Base):
    __tablename__ = "snapshots"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    #: Of the uncompressed snapshot bytes (the blob key).
    sha256: Mapped[str] = mapped_column(String(64))
    step: Mapped[int | None] = mapped_column(BigInteger)
    epoch: Mapped[int | None] = mapped_column(Integer)
    trigger: Mapped[str] = mapped_column(String(16), default="manual", server_default="manual")
    taken_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    #: Uncompressed size, bytes.
    size_bytes: Mapped[int] = mapped_column(BigInteger)
    #: Where the blob store keeps it (relative key, e.g. `ab/ab12....zst`).
    blob_ref: Mapped[str | None] = mapped_column(String(300))
    #: File name or stream entry the snapshot came from (for people, not identity).
    source: Mapped[str | None] = mapped_column(String(500))
    #: Outside facts for this snapshot: {"limit_bytes", "device_total_bytes", "device_free_bytes",
    #: "requested_bytes", "message"}; used again by reanalyze.
    context: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="pending", server_default="pending")
    analyzer_version: Mapped[str | None] = mapped_column(String(64))
    analysis_id: Mapped[int | None] = mapped_column(ForeignKey("analysis_results.id", ondelete="SET NULL"))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))
    #: When it first became done (analysis attached; a reanalysis keeps it): the exporter's latency.
    analysed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)

    run: Mapped[Run] = relationship(back_populates="snapshots", lazy="raise")

    __table_args__ = (
        UniqueConstraint("run_id", "rank", "sha256"),
        CheckConstraint(_in("trigger", TRIGGERS), name="trigger"),
        CheckConstraint(_in("state", SNAPSHOT_STATES), name="state"),
        Index(None, "run_id", "rank", "taken_at"),
        Index(None, "sha256"),
        Index(None, "state", "lease_until"),
        Index(None, "analysis_id"),
        Index(None, "analysed_at"),
    )


class RunDiagnosis(Base):
    __tablename__ = "run_diagnoses"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    analyzer_version: Mapped[str] = mapped_column(String(64))
    primary_cause: Mapped[str | None] = mapped_column(String(32))
    confidence: Mapped[float | None] = mapped_column(Float)
    snapshot_count: Mapped[int] = mapped_column(Integer)
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: Composition of the snapshot with the most allocated bytes (what the peak was made of).
    peak_composition: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    #: Contract JSON of analyze() over all the rank's snapshots in time order.
    result: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    computed_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))


class RankFigures(Base):
    """What one rank's agent reported of itself at exit or teardown (run_end, and the stats flush
    before it): run peaks, the last step, the limit, a summary of its per-step peaks. Ranks torn down
    by the launcher send these even though they took no snapshot (profiler/analysis/ranks.py)."""

    __tablename__ = "rank_figures"

    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str | None] = mapped_column(String(16))
    peak_allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    peak_reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: {"last_step", "limit_bytes", "end_reason", "steps", "step_peaks": {...}} as the agent sent them.
    figures: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    updated_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)


class StatSample(Base):
    __tablename__ = "stat_samples"

    #: runs.id, deliberately without a foreign key: the row-level check halved insert throughput of
    #: this high-volume table (migration 0002); repository.delete_run removes samples first.
    run_id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=False)
    rank: Mapped[int] = mapped_column(Integer, primary_key=True)
    sampled_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, primary_key=True)
    step: Mapped[int | None] = mapped_column(BigInteger)
    epoch: Mapped[int | None] = mapped_column(Integer)
    allocated_bytes: Mapped[int | None] = mapped_column(BigInteger)
    reserved_bytes: Mapped[int | None] = mapped_column(BigInteger)
    active_bytes: Mapped[int | None] = mapped_column(BigInteger)
    inactive_split_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: cudaMalloc retries (`num_alloc_retries`, cumulative) and OOMs (`num_ooms`, cumulative).
    alloc_retries: Mapped[int | None] = mapped_column(Integer)
    oom_count: Mapped[int | None] = mapped_column(Integer)


class Report(Base):
    __tablename__ = "reports"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    report_date: Mapped[dt.date] = mapped_column(Date)
    #: What the report covers: "all", "cluster:<name>", "job:<name>".
    scope: Mapped[str] = mapped_column(String(200))
    analyzer_version: Mapped[str | None] = mapped_column(String(64))
    #: The report's figures (JSON form of the report).
    summary: Mapped[dict[str, Any]] = mapped_column(JsonDoc, default=dict)
    #: Where the rendered HTML was written, if anywhere.
    path: Mapped[str | None] = mapped_column(String(1000))
    generated_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))

    __table_args__ = (UniqueConstraint("report_date", "scope"),)




class AlertSummary(Base):
    """One alert that covers the verdicts of a (cluster, job) suppressed by the per-job rate limit
    since its previous summary (profiler/alerts/outbox.py). Claimed, sent and retried like an alert;
    the covered `alerts` rows point here (`summarised_by`) and keep their state, so the exporter's
    counts over `alerts` do not change when a summary goes out."""

    __tablename__ = "alert_summaries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: The principal of the runs it covers (runs.owner; NULL: unsigned). Budgets are per principal.
    owner: Mapped[str | None] = mapped_column(String(200))
    cluster: Mapped[str | None] = mapped_column(String(200))
    job: Mapped[str | None] = mapped_column(String(200))
    #: Derived from the ids it covers: a resend after a crash carries the same key.
    idem_key: Mapped[str] = mapped_column(String(64), unique=True)
    #: How many suppressed verdicts it covers.
    covered: Mapped[int] = mapped_column(Integer)
    #: What the summary says (counts per cause, first and last run, time span, link).
    body: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    state: Mapped[str] = mapped_column(String(16), default="pending", server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    lease_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    claim_token: Mapped[str | None] = mapped_column(String(36))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)

    __table_args__ = (
        CheckConstraint(_in("state", SUMMARY_STATES), name="state"),
        Index(None, "state", "next_attempt_at"),
        Index(None, "cluster", "job", "claimed_at"),
    )


class Alert(Base):
    """The alert outbox (profiler/alerts/outbox.py): one row per (run, verdict), written when a run's
    verdict becomes an OOM, a leak or a near miss, then claimed with a lease and POSTed by a worker.
    The unique key is what makes a verdict alert once; `idem_key` goes out as the Idempotency-Key
    header so a receiver can drop a resend. Rows are never rewritten to another verdict, so counts
    over this table are monotonic (the exporter's memq_verdicts_total)."""

    __tablename__ = "alerts"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    #: `oom:<cause>`, `leak` or `near_miss` (profiler/alerts/verdict.py).
    verdict: Mapped[str] = mapped_column(String(64))
    kind: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str | None] = mapped_column(String(32))
    # copied from the run so rate limits and metrics need no join
    owner: Mapped[str | None] = mapped_column(String(200))
    cluster: Mapped[str | None] = mapped_column(String(200))
    job: Mapped[str | None] = mapped_column(String(200))
    idem_key: Mapped[str] = mapped_column(String(64), unique=True)
    #: What the alert says (format-independent: title, cause, evidence, recommendation, link, figures).
    body: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    state: Mapped[str] = mapped_column(String(16), default="pending", server_default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    lease_until: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    #: Who holds the lease; only that sender may record the outcome.
    claim_token: Mapped[str | None] = mapped_column(String(36))
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))
    claimed_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    sent_at: Mapped[dt.datetime | None] = mapped_column(UtcDateTime)
    #: The summary that covered this row, for `suppressed` rows once one went out (never twice).
    summarised_by: Mapped[int | None] = mapped_column(ForeignKey("alert_summaries.id"))

    __table_args__ = (
        UniqueConstraint("run_id", "verdict"),
        CheckConstraint(_in("state", ALERT_STATES), name="state"),
        Index(None, "state", "next_attempt_at"),
        Index(None, "cluster", "job", "claimed_at"),
        Index(None, "state", "summarised_by"),
    )


class WhatIfSweep(Base):
    __tablename__ = "whatif_sweeps"

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    #: Of the OOM snapshot the sweep replays (the blob key).
    sha256: Mapped[str] = mapped_column(String(64))
    #: memq.analysis ANALYZER_VERSION + the what-if model's version.
    analyzer_version: Mapped[str] = mapped_column(String(64))
    #: Hash of what the replay used besides the snapshot (limit, seeding snapshots, known OOM).
    context_key: Mapped[str] = mapped_column(String(64), default="", server_default="")
    limit_bytes: Mapped[int | None] = mapped_column(BigInteger)
    #: {"results": [WhatIfResult dicts], "inputs": {...}, "confs": [...]}.
    result: Mapped[dict[str, Any]] = mapped_column(JsonDoc)
    created_at: Mapped[dt.datetime] = mapped_column(UtcDateTime, server_default=text("CURRENT_TIMESTAMP"))

    __table_args__ = (UniqueConstraint("sha256", "analyzer_version", "context_key"),)
