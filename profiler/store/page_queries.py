"""The few reads the web pages need beyond memq.store.queries (which they reuse for everything
the CLI already answers): a sorted, paged runs listing with its total, per-rank lanes of a run, one
snapshot row with its analysis, and the stored reports. Read-only; every value is a bound parameter.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from memq.errors import NotFound
from memq.store.orm import AnalysisResult, Report, Run, Snapshot, StatSample
from memq.store.queries import RunFilter, _filtered, _run_row, iso, mark_undetermined, stat_series
from memq.store.repository import to_utc

#: sort key of the API -> column. Every one of them is a plain column of `runs`.
SORTS = {
    "started": Run.started_at, "run": Run.name, "job": Run.job, "cluster": Run.cluster, "status": Run.status,
    "cause": Run.primary_cause, "confidence": Run.cause_confidence, "peak_reserved": Run.peak_reserved_bytes,
    "peak_allocated": Run.peak_allocated_bytes, "pieces": Run.pieces_share, "fragmentation": Run.fragmentation_ratio,
    "snapshots": Run.snapshot_count, "torch": Run.torch_version,
}
MAX_LANES = 16


@dataclass(frozen=True)
class RunPage:
    filter: RunFilter
    until: dt.datetime | None = None
    sort: str = "started"
    order: str = "desc"
    limit: int = 50
    offset: int = 0  # rows to skip; with a cursor, only the position shown to people
    after: tuple[dt.datetime, int] | None = None  # keyset cursor (started_at, id): the page after it
    before: tuple[dt.datetime, int] | None = None  # ... the page before it


def _db_time(session: Session, t: dt.datetime | None) -> dt.datetime | None:
    if t is None:
        return None
    t = to_utc(t)
    return t.replace(tzinfo=None) if session.get_bind().dialect.name == "sqlite" else t


def page_runs(session: Session, p: RunPage) -> dict[str, Any]:
    """One page of runs and how many match. Ties are ordered by id so a page boundary never repeats
    or skips a run. Sorted by start time (the default, served by the started_at index), pages also
    carry keyset cursors (`next_cursor`, `prev_cursor`): following them costs the same on the last
    page of 100,000 runs as on the first, where an offset makes the database walk every row before."""
    f = RunFilter(**{**p.filter.__dict__, "since": _db_time(session, p.filter.since)})
    base = _filtered(select(Run), f)
    if p.until is not None:
        base = base.where(Run.started_at < _db_time(session, p.until))
    col = SORTS[p.sort]
    desc = p.order == "desc"
    keyset = p.sort == "started"
    cursor = p.after or p.before
    if keyset and cursor is not None:
        t, rid = _db_time(session, cursor[0]), cursor[1]
        forward = p.after is not None
        older = forward == desc  # the rows sought come after the cursor in the listing's order
        key, at = tuple_(Run.started_at, Run.id), tuple_(t, rid)
        cond = key < at if older else key > at
        walk_desc = older
        q = base.where(cond).order_by(*((Run.started_at.desc(), Run.id.desc()) if walk_desc else
                                        (Run.started_at.asc(), Run.id.asc()))).limit(p.limit)
        found = list(session.execute(q).scalars())
        if not forward:
            found.reverse()
    else:
        # The started_at index serves its own order only without a NULLS clause; other columns sort anyway.
        key = col.desc() if desc else col.asc()
        tie = Run.id.desc() if desc else Run.id.asc()
        q = base.order_by(key if keyset else key.nulls_last(), tie).limit(p.limit).offset(p.offset)
        found = list(session.execute(q).scalars())
    rows = mark_undetermined(session, list(found))
    total = int(session.execute(select(func.count()).select_from(base.order_by(None).subquery())).scalar_one())
    nxt = p.offset + p.limit if p.offset + p.limit < total else None
    prev = max(0, p.offset - p.limit) if p.offset > 0 else None
    out = {"runs": rows, "count": len(rows), "total": total, "offset": p.offset, "limit": p.limit,
           "sort": p.sort, "order": p.order, "next_offset": nxt, "prev_offset": prev,
           "next_cursor": None, "prev_cursor": None}
    if keyset and found:
        last, first = found[-1], found[0]
        if nxt is not None and last.started_at is not None:
            out["next_cursor"] = f"{iso(last.started_at)}~{last.id}"
        if prev is not None and first.started_at is not None:
            out["prev_cursor"] = f"{iso(first.started_at)}~{first.id}"
    return out


def run_lanes(session: Session, name: str, points: int = 120) -> dict[str, Any]:
    """Per rank: its stat-sample timeline and its snapshots (for one lane each)."""
    run = _run_row(session, name)
    snap_ranks = set(session.execute(select(Snapshot.rank).where(Snapshot.run_id == run.id).distinct()).scalars())
    stat_ranks = set(session.execute(select(StatSample.rank).where(StatSample.run_id == run.id).distinct()).scalars())
    ranks = sorted(snap_ranks | stat_ranks)
    lanes = []
    for r in ranks[:MAX_LANES]:
        snaps = session.execute(
            select(Snapshot.id, Snapshot.taken_at, Snapshot.trigger, AnalysisResult.reserved_bytes,
                   AnalysisResult.allocated_bytes, AnalysisResult.oom_requested_bytes)
            .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
            .where(Snapshot.run_id == run.id, Snapshot.rank == r).order_by(Snapshot.taken_at, Snapshot.id)).all()
        lanes.append({"rank": r, "stats": stat_series(session, run.id, r, points),
                      "snapshots": [{"id": s.id, "taken_at": iso(s.taken_at), "trigger": s.trigger,
                                     "reserved_bytes": s.reserved_bytes, "allocated_bytes": s.allocated_bytes,
                                     "oom_requested_bytes": s.oom_requested_bytes} for s in snaps]})
    return {"run": run.name, "ranks": ranks, "lanes": lanes, "truncated": len(ranks) > MAX_LANES}


def snapshot_row(session: Session, snapshot_id: int) -> dict[str, Any]:
    """One snapshot's row, its run's name and its stored analysis (None while pending)."""
    r = session.execute(
        select(Snapshot, Run.name, AnalysisResult.result)
        .join(Run, Run.id == Snapshot.run_id)
        .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.id == snapshot_id)).one_or_none()
    if r is None:
        raise NotFound(f"no snapshot with id {snapshot_id}", hint="snapshot ids are listed on their run's page")
    s, run_name, result = r
    return {"id": s.id, "run": run_name, "rank": s.rank, "step": s.step, "epoch": s.epoch, "trigger": s.trigger,
            "taken_at": iso(s.taken_at), "sha256": s.sha256, "size_bytes": s.size_bytes, "source": s.source,
            "state": s.state, "analyzer_version": s.analyzer_version, "context": dict(s.context or {}),
            "last_error": s.last_error, "analysis": result}


def list_reports(session: Session, limit: int = 200) -> list[dict[str, Any]]:
    rows = session.execute(
        select(Report.id, Report.report_date, Report.scope, Report.generated_at, Report.path, Report.summary)
        .order_by(Report.report_date.desc(), Report.scope).limit(limit)).all()
    return [{"id": r.id, "date": r.report_date.isoformat(), "scope": r.scope, "generated_at": iso(r.generated_at),
             "has_html": bool(r.path), "summary": dict(r.summary or {})} for r in rows]


def report_row(session: Session, report_id: int) -> dict[str, Any]:
    r = session.execute(select(Report.id, Report.report_date, Report.scope, Report.generated_at, Report.path,
                               Report.summary).where(Report.id == report_id)).one_or_none()
    if r is None:
        raise NotFound(f"no report with id {report_id}", hint="stored reports are listed at /reports")
    return {"id": r.id, "date": r.report_date.isoformat(), "scope": r.scope, "generated_at": iso(r.generated_at),
            "path": r.path, "summary": dict(r.summary or {})}


MAX_PICKS = 200  # names offered by the compare and versions forms


def pick_lists(session: Session) -> dict[str, Any]:
    """What the compare and versions forms offer before anything is chosen: the most recent runs
    (with their job, for a same-job suggestion) and the jobs with their run counts, newest first."""
    runs = session.execute(select(Run.name, Run.job, Run.torch_version).order_by(Run.started_at.desc(), Run.id.desc())
                           .limit(MAX_PICKS)).all()
    jobs = session.execute(select(Run.job, func.count(Run.id), func.count(func.distinct(Run.torch_version)),
                                  func.max(Run.started_at)).where(Run.job.is_not(None)).group_by(Run.job)
                           .order_by(func.max(Run.started_at).desc()).limit(MAX_PICKS)).all()
    suggestion = None
    seen: dict[str, str] = {}
    for name, job, _torch in runs:  # the two newest runs of one job: the comparison people usually want
        if job and job in seen:
            suggestion = {"a": name, "b": seen[job]}
            break
        if job:
            seen[job] = name
    return {"runs": [r[0] for r in runs], "suggestion": suggestion,
            "jobs": [{"job": j, "runs": n, "versions": v} for j, n, v, _ in jobs]}
