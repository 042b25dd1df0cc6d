"""Aggregate queries of one scrape. Each returns plain rows; the collector names the metrics.

Cost: one GROUP BY over snapshots joined to runs and analysis_results (snapshot counts, OOMs,
analysis latency buckets in one pass), one over runs, one over alerts, and two small ones over the
runs active in the last minutes. Measured by benchmarks/bench_exporter.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import and_, case, func, literal, or_, select
from sqlalchemy.orm import Session

from profiler.store import repository as repo
from profiler.store.orm import Alert, AnalysisResult, Run, Snapshot

#: Upper bounds (seconds) of the analysis latency histogram: from the dispatcher's snapshot row to its
#: stored analysis. Seconds for a quiet pipeline, minutes under a backlog.
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


def _seconds_between(session: Session, later, earlier):
    if session.get_bind().dialect.name == "postgresql":
        return func.extract("epoch", later - earlier)
    return (func.julianday(later) - func.julianday(earlier)) * 86400.0


def snapshot_counts(session: Session) -> list[tuple]:
    """(cluster, job, state, cause_of_analysed_oom_or_None, count) over every snapshot row."""
    is_oom = or_(Snapshot.trigger == "oom", AnalysisResult.oom_requested_bytes.is_not(None))
    oom_cause = case((and_(Snapshot.state == "done", is_oom),
                      func.coalesce(AnalysisResult.primary_cause, literal("unknown"))), else_=None)
    q = (select(Run.cluster, Run.job, Snapshot.state, oom_cause.label("oom_cause"), func.count())
         .select_from(Snapshot).join(Run, Run.id == Snapshot.run_id)
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .group_by(Run.cluster, Run.job, Snapshot.state, oom_cause))
    return [tuple(r) for r in session.execute(q)]


def analysis_latency(session: Session, buckets: Sequence[float] = LATENCY_BUCKETS) -> tuple[list[int], int, float]:
    """Cumulative bucket counts (one per bound, then +Inf), count and sum of seconds from a snapshot
    row's creation to its analysis' creation, over snapshots whose analysis was computed for them
    (an analysis reused from identical bytes stored earlier took no time for this row)."""
    lat = _seconds_between(session, AnalysisResult.created_at, Snapshot.created_at)
    cols = [func.sum(case((lat <= b, 1), else_=0)) for b in buckets]
    q = (select(*cols, func.count(), func.sum(lat)).select_from(Snapshot)
         .join(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.state == "done", AnalysisResult.created_at >= Snapshot.created_at))
    row = session.execute(q).one()
    n = int(row[len(buckets)] or 0)
    return [int(v or 0) for v in row[:len(buckets)]] + [n], n, float(row[len(buckets) + 1] or 0.0)


def run_counts(session: Session) -> list[tuple]:
    """(cluster, status, count) of every run."""
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.status, func.count()).group_by(Run.cluster, Run.status))]


def verdict_counts(session: Session) -> list[tuple]:
    """(cluster, job, kind, cause, state, count) of the alert outbox: one row per verdict ever
    reached by a run, never rewritten, so counts only grow (until retention deletes runs)."""
    return [tuple(r) for r in session.execute(
        select(Alert.cluster, Alert.job, Alert.kind, Alert.cause, Alert.state, func.count())
        .group_by(Alert.cluster, Alert.job, Alert.kind, Alert.cause, Alert.state))]


def _active(session: Session, since: dt.datetime):
    limit = func.coalesce(Run.memory_limit_bytes, Run.gpu_memory_bytes)
    headroom = case((and_(limit > 0, Run.peak_reserved_bytes.is_not(None)),
                     1.0 - Run.peak_reserved_bytes * 1.0 / limit), else_=None)
    return (select(Run.name, Run.cluster, Run.job, headroom.label("headroom"),
                   Run.fragmentation_ratio.label("frag"))
            .where(Run.status == "running", Run.updated_at >= repo.db_time(session, since))
            .subquery())


def active_by_job(session: Session, since: dt.datetime) -> list[tuple]:
    """(cluster, job, active runs, least headroom, most fragmentation) of running runs updated
    since `since`."""
    a = _active(session, since)
    return [tuple(r) for r in session.execute(
        select(a.c.cluster, a.c.job, func.count(), func.min(a.c.headroom), func.max(a.c.frag))
        .group_by(a.c.cluster, a.c.job))]


def least_headroom(session: Session, since: dt.datetime, k: int) -> list[tuple]:
    """(run, cluster, job, headroom, fragmentation) of the `k` active runs with the least headroom."""
    if k <= 0:
        return []
    a = _active(session, since)
    return [tuple(r) for r in session.execute(
        select(a.c.name, a.c.cluster, a.c.job, a.c.headroom, a.c.frag).where(a.c.headroom.is_not(None))
        .order_by(a.c.headroom, a.c.name).limit(k))]
