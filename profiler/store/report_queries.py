"""Read side of the nightly report: a few set-based queries over the runs of one day and scope.

Kept apart from `queries` (the listing commands) so the report can change without touching them.
Every function takes an open `Session`, binds every filter value, and returns plain dicts. A day's
runs are selected by one predicate (see `_in_window`), and the other queries join that same
predicate instead of sending lists of ids, so a day of 10,000 runs costs a handful of statements.

- `Window.for_date(d)`: [d 00:00 UTC, d+1 00:00 UTC).
- `Scope.parse("cluster=C")`: "all" | cluster | job; stored as "all", "cluster:C", "job:J".
- `window_runs(session, window, scope)`: the runs active in the window with their summary columns.
- `run_metrics(session, window, scope)`: per run, the metrics of its run-level diagnosis.
- `diagnosis_parts(session, run_ids)`: oom, recommendations, allocator settings and leak verdict of
  a few chosen runs (bounded list; the report asks for its flagged runs only).
- `epoch_floors(session, window, scope)`: per run and epoch, min/max allocated of its stat samples.
- `version_stats(session, window, scope)`: per (job, torch version), over all history up to the end
  of the window, for the jobs that ran in the window.
- `stored_report(...)`, `previous_report(...)`, `stored_reports(...)`, `latest_activity_date(...)`.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, bindparam, case, func, or_, select
from sqlalchemy.orm import Session

from memq.errors import BadInput
from memq.store.orm import Report, Run, RunDiagnosis, StatSample
from memq.store.repository import to_utc
from memq.store.run_verdicts import verdict_ranks


@dataclass(frozen=True)
class Window:
    start: dt.datetime
    end: dt.datetime

    @classmethod
    def for_date(cls, day: dt.date) -> Window:
        start = dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)
        return cls(start, start + dt.timedelta(days=1))

    def db(self, session: Session) -> tuple[dt.datetime, dt.datetime]:
        """The bounds as the database compares them (naive UTC on SQLite)."""
        return _db_time(session, self.start), _db_time(session, self.end)


@dataclass(frozen=True)
class Scope:
    kind: str = "all"  # all | cluster | job
    value: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Scope:
        """`all`, `cluster=C` / `cluster:C`, `job=J` / `job:J`."""
        t = (text or "all").strip()
        if t in ("", "all"):
            return cls()
        for sep in ("=", ":"):
            if sep in t:
                kind, value = t.split(sep, 1)
                kind, value = kind.strip().lower(), value.strip()
                if kind in ("cluster", "job") and value and len(value) <= 190:
                    return cls(kind, value)
        raise BadInput(f"cannot read scope {text!r}", hint="use all, cluster=NAME or job=NAME")

    @property
    def key(self) -> str:
        """How the reports table stores it: "all", "cluster:<name>", "job:<name>"."""
        return "all" if self.kind == "all" else f"{self.kind}:{self.value}"

    @property
    def label(self) -> str:
        return "all clusters and jobs" if self.kind == "all" else f"{self.kind} {self.value}"

    def slug(self) -> str:
        """A file-name-safe form of the key, for the report directory."""
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.key.replace(":", "-"))[:120] or "all"


def _db_time(session: Session, value: dt.datetime) -> dt.datetime:
    v = to_utc(value)
    if session.get_bind().dialect.name == "sqlite":
        return v.replace(tzinfo=None)
    return v


def _in_window(session: Session, window: Window, scope: Scope):
    """A run belongs to the window when it started before its end and its last activity
    (ended_at; for runs without an end, the last update) is at or after its start."""
    start, end = window.db(session)
    conds = [Run.started_at < end,
             or_(Run.ended_at >= start, and_(Run.ended_at.is_(None), Run.updated_at >= start))]
    if scope.kind == "cluster":
        conds.append(Run.cluster == scope.value)
    elif scope.kind == "job":
        conds.append(Run.job == scope.value)
    return and_(*conds)


RUN_COLUMNS = (Run.id, Run.name, Run.job, Run.cluster, Run.host, Run.torch_version, Run.status, Run.primary_cause,
               Run.cause_confidence, Run.peak_reserved_bytes, Run.peak_allocated_bytes, Run.memory_limit_bytes,
               Run.gpu_memory_bytes, Run.fragmentation_ratio, Run.oom_count, Run.snapshot_count, Run.allocator_conf,
               Run.started_at, Run.ended_at)


def window_runs(session: Session, window: Window, scope: Scope) -> list[dict[str, Any]]:
    q = select(*RUN_COLUMNS).where(_in_window(session, window, scope)).order_by(Run.id)
    out = []
    for r in session.execute(q):
        d = r._asdict()
        d["started_at"] = to_utc(d["started_at"])
        d["ended_at"] = to_utc(d["ended_at"])
        out.append(d)
    return out


def run_metrics(session: Session, window: Window, scope: Scope) -> dict[int, dict[str, Any]]:
    """run id -> `metrics` of its run-level diagnosis (of the rank that speaks for the run:
    analysis/run_verdict.run_verdict)."""
    q = (select(RunDiagnosis.run_id, RunDiagnosis.rank, RunDiagnosis.result["metrics"].label("metrics"))
         .join(Run, Run.id == RunDiagnosis.run_id)
         .where(_in_window(session, window, scope)))
    rows = session.execute(q).all()
    speaks = verdict_ranks(session, select(Run.id).where(_in_window(session, window, scope)))
    return {r.run_id: r.metrics for r in rows if isinstance(r.metrics, dict) and r.rank == speaks.get(r.run_id)}


def diagnosis_parts(session: Session, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """For a few runs: the oom, diagnosis (causes, recommendations), allocator settings, leak verdict
    (from the stored result's `details`) and OOM forecast of the rank that speaks for the run."""
    ids = sorted({int(i) for i in run_ids})
    if not ids:
        return {}
    q = (select(RunDiagnosis.run_id, RunDiagnosis.rank,
                RunDiagnosis.result["oom"].label("oom"), RunDiagnosis.result["diagnosis"].label("diagnosis"),
                RunDiagnosis.result["details"]["allocator_settings"].label("allocator_settings"),
                RunDiagnosis.result["details"]["leak"].label("leak"),
                RunDiagnosis.result["details"]["limits"].label("limits"),
                RunDiagnosis.result["forecast"].label("forecast"))
         .where(RunDiagnosis.run_id.in_(bindparam("ids", expanding=True))))
    speaks = verdict_ranks(session, ids)
    return {r.run_id: {"rank": r.rank, "oom": r.oom, "diagnosis": r.diagnosis,
                       "allocator_settings": r.allocator_settings, "leak": r.leak, "limits": r.limits,
                       "forecast": r.forecast}
            for r in session.execute(q, {"ids": ids}) if r.rank == speaks.get(r.run_id)}


def epoch_floors(session: Session, window: Window, scope: Scope) -> dict[int, list[dict[str, Any]]]:
    """run id -> [{epoch, min_allocated, max_allocated, samples}] in epoch order, from stat samples
    of the run's lowest rank that has them (one GROUP BY over the window's runs)."""
    q = (select(StatSample.run_id, StatSample.rank, StatSample.epoch, func.min(StatSample.allocated_bytes),
                func.max(StatSample.allocated_bytes), func.count())
         .join(Run, Run.id == StatSample.run_id)
         .where(_in_window(session, window, scope), StatSample.epoch.is_not(None),
                StatSample.allocated_bytes.is_not(None))
         .group_by(StatSample.run_id, StatSample.rank, StatSample.epoch))
    per: dict[int, dict[int, list[dict[str, Any]]]] = {}
    for run_id, rank, epoch, lo, hi, n in session.execute(q):
        per.setdefault(run_id, {}).setdefault(rank, []).append(
            {"epoch": int(epoch), "min_allocated_bytes": int(lo), "max_allocated_bytes": int(hi), "samples": int(n)})
    out = {}
    for run_id, ranks in per.items():
        rank = min(ranks)
        out[run_id] = sorted(ranks[rank], key=lambda e: e["epoch"])
    return out


def version_stats(session: Session, window: Window, scope: Scope) -> list[dict[str, Any]]:
    """Per (job, torch version) over every run of that job that started before the window's end:
    runs, OOM runs, mean peak reserved, mean fragmentation, the mean `pieces` of the OOM runs (what the
    regressions compare), and how many runs fall in the window.
    Only jobs with a run in the window are considered."""
    start, end = window.db(session)
    jobs = select(Run.job).where(_in_window(session, window, scope), Run.job.is_not(None)).distinct()
    in_win = case((or_(Run.ended_at >= start, and_(Run.ended_at.is_(None), Run.updated_at >= start)), 1), else_=0)
    is_oom = case((or_(Run.status == "oom", Run.oom_count > 0), 1), else_=0)
    conds = [Run.job.in_(jobs.scalar_subquery()), Run.started_at < end, Run.torch_version.is_not(None)]
    if scope.kind == "cluster":
        conds.append(Run.cluster == scope.value)
    q = (select(Run.job, Run.torch_version, func.count(), func.sum(is_oom), func.avg(Run.peak_reserved_bytes),
                func.avg(Run.fragmentation_ratio), func.avg(Run.pieces_share), func.sum(in_win))
         .where(*conds).group_by(Run.job, Run.torch_version))
    return [{"job": job, "torch_version": v, "runs": int(n), "oom_runs": int(ooms or 0),
             "mean_peak_reserved_bytes": int(res) if res is not None else None,
             "mean_fragmentation_ratio": float(frag) if frag is not None else None,
             "mean_pieces_share": float(pieces) if pieces is not None else None,
             "runs_in_window": int(win or 0)}
            for job, v, n, ooms, res, frag, pieces, win in session.execute(q)]


def stored_report(session: Session, day: dt.date, scope: Scope) -> dict[str, Any] | None:
    row = session.execute(select(Report.id, Report.report_date, Report.summary, Report.path, Report.generated_at)
                          .where(Report.report_date == day, Report.scope == scope.key)).one_or_none()
    return _report_row(row)


def previous_report(session: Session, day: dt.date, scope: Scope, max_age_days: int = 31) -> dict[str, Any] | None:
    """The stored report of the same scope with the latest date before `day` (within max_age_days)."""
    row = session.execute(
        select(Report.id, Report.report_date, Report.summary, Report.path, Report.generated_at)
        .where(Report.scope == scope.key, Report.report_date < day,
               Report.report_date >= day - dt.timedelta(days=max_age_days))
        .order_by(Report.report_date.desc()).limit(1)).one_or_none()
    return _report_row(row)


def stored_reports(session: Session, scope: Scope, first: dt.date, last: dt.date) -> list[dict[str, Any]]:
    """Stored reports of a scope with first <= date <= last, oldest first."""
    rows = session.execute(
        select(Report.id, Report.report_date, Report.summary, Report.path, Report.generated_at)
        .where(Report.scope == scope.key, Report.report_date >= first, Report.report_date <= last)
        .order_by(Report.report_date)).all()
    return [_report_row(r) for r in rows]


def report_dates(session: Session, scope: Scope, first: dt.date, last: dt.date) -> set[dt.date]:
    rows = session.execute(select(Report.report_date).where(
        Report.scope == scope.key, Report.report_date >= first, Report.report_date <= last)).scalars()
    return set(rows)


def count_reports(session: Session, day: dt.date, scope: Scope) -> int:
    return int(session.execute(select(func.count()).select_from(Report).where(
        Report.report_date == day, Report.scope == scope.key)).scalar_one())


def _report_row(row) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"id": row.id, "date": row.report_date, "summary": dict(row.summary or {}), "path": row.path,
            "generated_at": to_utc(row.generated_at)}


def latest_activity_date(session: Session, scope: Scope) -> dt.date | None:
    """The UTC date of the latest run activity in the scope (ended_at, else last update)."""
    last = func.coalesce(Run.ended_at, Run.updated_at)
    q = select(func.max(last))
    if scope.kind == "cluster":
        q = q.where(Run.cluster == scope.value)
    elif scope.kind == "job":
        q = q.where(Run.job == scope.value)
    value = session.execute(q).scalar_one_or_none()
    if value is None:
        return None
    if isinstance(value, str):  # SQLite returns max() over a coalesce as text
        value = dt.datetime.fromisoformat(value)
    return to_utc(value).date()
