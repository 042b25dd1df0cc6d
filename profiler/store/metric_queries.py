"""The exporter's aggregate queries of one scrape (metrics/collector.py). Each returns plain rows;
the collector names the metrics.

Cost: two passes over the snapshots table alone (states per run, then joined to runs; the latency
histogram from its own two timestamps), the OOM snapshots (few) with their analyses, one GROUP BY
over runs, one over alerts, and two small ones over the runs active in the last minutes. Measured
by benchmarks/bench_exporter.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from sqlalchemy import Float, and_, case, func, literal, select, union
from sqlalchemy.dialects.postgresql import array
from sqlalchemy.orm import Session

from memq.store import repository as repo
from memq.store.orm import Alert, AlertSummary, AnalysisResult, Run, Snapshot
from memq.store.states import SNAPSHOT_STATES

#: Upper bounds (seconds) of the analysis latency histogram: from the dispatcher's snapshot row to its
#: analysis attached. Seconds for a quiet pipeline, minutes under a backlog.
LATENCY_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


def _seconds_between(session: Session, later, earlier):
    if session.get_bind().dialect.name == "postgresql":
        # date_part is double precision; EXTRACT returns numeric since PostgreSQL 14 (several times slower)
        return func.date_part("epoch", later - earlier)
    # julianday is a double of days: rounded to the millisecond so that bucket edges hold
    return func.round((func.julianday(later) - func.julianday(earlier)) * 86400.0, 3)


def snapshot_states(session: Session) -> list[tuple]:
    """(cluster, job, state, count) of every snapshot row: counted per run on the snapshots table
    alone, then joined to the run rows."""
    per_run = (select(Snapshot.run_id, Snapshot.state, func.count().label("n"))
               .group_by(Snapshot.run_id, Snapshot.state).subquery())
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.job, per_run.c.state, func.sum(per_run.c.n))
        .join(Run, Run.id == per_run.c.run_id).group_by(Run.cluster, Run.job, per_run.c.state))]


def state_counts(session: Session) -> dict[str, int]:
    """Snapshots per state over every run (`memq status`): each state of SNAPSHOT_STATES, 0 when none."""
    rows = session.execute(select(Snapshot.state, func.count()).group_by(Snapshot.state)).all()
    return dict.fromkeys(SNAPSHOT_STATES, 0) | {k: int(v) for k, v in rows}


def oom_snapshots(session: Session) -> list[tuple]:
    """(cluster, job, cause, count) of analysed snapshots taken at an OOM (trigger `oom`, or an
    analysis that found the failed request), by the snapshot's own primary cause. The few OOM rows
    are found first (each side filtered on its own table), then joined to runs and analyses by key."""
    cols = (Snapshot.id, Snapshot.run_id, Snapshot.analysis_id)
    by_trigger = select(*cols).where(Snapshot.state == "done", Snapshot.trigger == "oom")
    by_analysis = (select(*cols).select_from(AnalysisResult)
                   .join(Snapshot, Snapshot.analysis_id == AnalysisResult.id)
                   .where(AnalysisResult.oom_requested_bytes.is_not(None), Snapshot.state == "done"))
    ooms = union(by_trigger, by_analysis).subquery()
    cause = func.coalesce(AnalysisResult.primary_cause, literal("unknown"))
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.job, cause, func.count()).select_from(ooms)
        .join(Run, Run.id == ooms.c.run_id)
        .outerjoin(AnalysisResult, AnalysisResult.id == ooms.c.analysis_id)
        .group_by(Run.cluster, Run.job, cause))]


def analysis_latency(session: Session, buckets: Sequence[float] = LATENCY_BUCKETS) -> tuple[list[int], int, float]:
    """Cumulative bucket counts (one per bound, then +Inf), count and sum of seconds from a snapshot
    row's creation (the dispatcher, or `memq ingest`) to its analysis being attached (`analysed_at`:
    computed, or reused from identical bytes analysed before), over the snapshots table alone. One
    pass: each row's bucket index is computed once (width_bucket on PostgreSQL)."""
    lat = (select(_seconds_between(session, Snapshot.analysed_at, Snapshot.created_at).label("s"))
           .where(Snapshot.state == "done", Snapshot.analysed_at.is_not(None)).subquery())
    n_bounds = len(buckets)
    if session.get_bind().dialect.name == "postgresql":
        # width_bucket counts the thresholds <= its operand; on negated values that is the number of
        # bounds >= the latency, so (n - it) is the first `le` bucket that holds it (n: +Inf), exactly
        # as Prometheus' inclusive upper bounds want
        negated = array([-b for b in reversed(buckets)], type_=Float)
        idx = (n_bounds - func.width_bucket(-lat.c.s, negated)).label("i")
    else:
        idx = case(*((lat.c.s <= b, i) for i, b in enumerate(buckets)), else_=n_bounds).label("i")
    per = [0] * (n_bounds + 1)
    total = 0.0
    for i, n, s in session.execute(select(idx, func.count(), func.sum(lat.c.s)).group_by(idx)):
        per[int(i)] += int(n)
        total += float(s or 0.0)
    cumulative, acc = [], 0
    for n in per:
        acc += n
        cumulative.append(acc)
    return cumulative, acc, total


def run_counts(session: Session) -> list[tuple]:
    """(cluster, status, count) of every run."""
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.status, func.count()).group_by(Run.cluster, Run.status))]


def run_causes(session: Session) -> list[tuple]:
    """(cluster, job, status, run-level primary cause, count) of every diagnosed run, whatever brought
    its snapshots (the agent, `memq ingest`, `memq push`)."""
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.job, Run.status, Run.primary_cause, func.count())
        .where(Run.primary_cause.is_not(None))
        .group_by(Run.cluster, Run.job, Run.status, Run.primary_cause))]


def verdict_counts(session: Session) -> list[tuple]:
    """(cluster, job, kind, cause, state, count) of the alert outbox: one row per verdict ever
    reached by a run, never rewritten, so counts only grow (until retention deletes runs)."""
    return [tuple(r) for r in session.execute(
        select(Alert.cluster, Alert.job, Alert.kind, Alert.cause, Alert.state, func.count())
        .group_by(Alert.cluster, Alert.job, Alert.kind, Alert.cause, Alert.state))]


def summary_states(session: Session) -> dict[str, int]:
    """Summaries of rate-limited verdicts (profiler/alerts/summary.py) per delivery state."""
    return {s: int(n) for s, n in session.execute(
        select(AlertSummary.state, func.count()).group_by(AlertSummary.state))}


def _active(session: Session, since: dt.datetime):
    limit = func.coalesce(Run.memory_limit_bytes, Run.gpu_memory_bytes)
    headroom = case((and_(limit > 0, Run.peak_reserved_bytes.is_not(None)),
                     1.0 - Run.peak_reserved_bytes * 1.0 / limit), else_=None)
    return (select(Run.name, Run.cluster, Run.job, headroom.label("headroom"),
                   Run.fragmentation_ratio.label("frag"), Run.pieces_share.label("pieces"))
            .where(Run.status == "running", Run.updated_at >= repo.db_time(session, since))
            .subquery())


def active_by_job(session: Session, since: dt.datetime) -> list[tuple]:
    """(cluster, job, active runs, least headroom, most fragmentation, most `pieces`) of running runs
    updated since `since`."""
    a = _active(session, since)
    return [tuple(r) for r in session.execute(
        select(a.c.cluster, a.c.job, func.count(), func.min(a.c.headroom), func.max(a.c.frag),
               func.max(a.c.pieces))
        .group_by(a.c.cluster, a.c.job))]


def least_headroom(session: Session, since: dt.datetime, k: int) -> list[tuple]:
    """(run, cluster, job, headroom, fragmentation, `pieces`) of the `k` active runs with the least
    headroom."""
    if k <= 0:
        return []
    a = _active(session, since)
    return [tuple(r) for r in session.execute(
        select(a.c.name, a.c.cluster, a.c.job, a.c.headroom, a.c.frag, a.c.pieces).where(a.c.headroom.is_not(None))
        .order_by(a.c.headroom, a.c.name).limit(k))]


def soonest_ooms(session: Session, k: int) -> list[tuple]:
    """(run, cluster, job, forecast OOM moment) of the `k` running runs whose forecast OOM comes first."""
    if k <= 0:
        return []
    return [tuple(r) for r in session.execute(
        select(Run.name, Run.cluster, Run.job, Run.oom_forecast_at)
        .where(Run.status == "running", Run.oom_forecast_at.is_not(None))
        .order_by(Run.oom_forecast_at, Run.name).limit(k))]
