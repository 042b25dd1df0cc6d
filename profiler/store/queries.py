"""Read side of the run history: the rows behind `memq runs / history / compare / versions`, as plain
dicts and rows; the documents themselves are assembled by the use case (profiler/pipeline/history.py).

Byte counts stay integers, times are ISO-8601 UTC strings, so a dict goes to `--json` unchanged.
Every filter is a bound parameter. The queries lean on these indexes: runs (cluster, started_at),
(job, started_at), (started_at); snapshots (run_id, rank, taken_at); stat_samples primary key
(run_id, rank, sampled_at).

- `list_runs(session, RunFilter(...))`
- `get_run(session, name)` -> dict; NotFound for unknown runs
- `snapshot_rows(session, run_id, name, rank)`, `main_diagnosis(session, run_id, rank)`,
  `forecasts(session, run_id, rank)`, `rank_facts(session, run_id)`: what a run's history reads;
- `stat_series(session, run_id, rank, points)`: the stat samples downsampled to `points` buckets (max per
  bucket) for a plot;
- `version_rows(session, job)`: per torch version of a job, its runs' figures.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session

from memq.analysis.memory import free_in_pieces
from memq.analysis.ranks import RankFacts, leak_listed
from memq.analysis.run_verdict import undetermined
from memq.errors import NotFound
from memq.store import rank_figures
from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot, StatSample
from memq.store.repository import to_utc
from memq.store.run_verdicts import verdict_rank, verdict_ranks


def iso(value: dt.datetime | None) -> str | None:
    v = to_utc(value)
    return v.isoformat().replace("+00:00", "Z") if v else None


# --------------------------------------------------------------------------------------------- runs

RUN_FIELDS = ("name", "job", "cluster", "host", "username", "project", "labels", "torch_version",
              "cuda_version", "driver_version", "gpu_model", "gpu_memory_bytes", "memory_limit_bytes",
              "allocator_conf", "optimizer", "param_count", "world_size", "rank", "started_at", "ended_at",
              "status", "primary_cause", "cause_confidence", "peak_reserved_bytes", "peak_allocated_bytes",
              "fragmentation_ratio", "pieces_share", "oom_count", "snapshot_count", "oom_forecast_step",
              "oom_forecast_at")


def run_dict(run: Run | Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in RUN_FIELDS:
        v = getattr(run, f)
        out["run" if f == "name" else f] = iso(v) if isinstance(v, dt.datetime) else v
    out["labels"] = dict(out.get("labels") or {})
    return out


@dataclass(frozen=True)
class RunFilter:
    cluster: str | None = None
    job: str | None = None
    torch_version: str | None = None
    status: str | None = None
    cause: str | None = None
    since: dt.datetime | None = None
    labels: dict[str, str] = field(default_factory=dict)
    limit: int = 50


def _filtered(q: Select, f: RunFilter) -> Select:
    if f.cluster is not None:
        q = q.where(Run.cluster == f.cluster)
    if f.job is not None:
        q = q.where(Run.job == f.job)
    if f.torch_version is not None:
        v = f.torch_version
        q = q.where(or_(Run.torch_version == v, Run.torch_version.like(_like_prefix(v) + ".%", escape="\\"),
                        Run.torch_version.like(_like_prefix(v) + "+%", escape="\\")))
    if f.status is not None:
        q = q.where(Run.status == f.status)
    if f.cause is not None:
        q = q.where(Run.primary_cause == f.cause)
    if f.since is not None:
        q = q.where(Run.started_at >= f.since)
    for k, v in f.labels.items():
        q = q.where(Run.labels[k].as_string() == v)
    return q


def _like_prefix(v: str) -> str:
    return v.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def list_runs(session: Session, f: RunFilter) -> list[dict[str, Any]]:
    since = f.since
    if since is not None and session.get_bind().dialect.name == "sqlite":
        f = RunFilter(**{**f.__dict__, "since": to_utc(since).replace(tzinfo=None)})
    q = _filtered(select(Run), f).order_by(Run.started_at.desc(), Run.id.desc()).limit(max(1, f.limit))
    return mark_undetermined(session, list(session.execute(q).scalars()))


def mark_undetermined(session: Session, runs: list[Run]) -> list[dict[str, Any]]:
    """run_dict of each run, with `undetermined`: true for an OOM run whose verdict names its cause only as
    the best candidate (no deciding test settled, analysis/run_verdict.undetermined), so a list says
    "undetermined" as the run page and `memq history` do, never the candidate as the run's cause. One
    query for the page's OOM runs."""
    rows = [run_dict(r) for r in runs]
    ooms = [r.id for r in runs if r.status == "oom" or (r.oom_count or 0) > 0]
    weak: set[int] = set()
    if ooms:
        speaks = verdict_ranks(session, ooms)
        for run_id, rank, diag in session.execute(
                select(RunDiagnosis.run_id, RunDiagnosis.rank, RunDiagnosis.result["diagnosis"])
                .where(RunDiagnosis.run_id.in_(ooms))):
            if speaks.get(int(run_id)) == int(rank) and undetermined(diag):
                weak.add(int(run_id))
    for r, row in zip(runs, rows, strict=True):
        row["undetermined"] = r.id in weak
    return rows


def _run_row(session: Session, name: str) -> Run:
    run = session.execute(select(Run).where(Run.name == name)).scalar_one_or_none()
    if run is None:
        raise NotFound(f"no run named {name!r}", hint="list runs with `memq runs`")
    return run


def get_run(session: Session, name: str) -> dict[str, Any]:
    """The run as a plain dict (see RUN_FIELDS); NotFound for unknown names."""
    return run_dict(_run_row(session, name))


# ------------------------------------------------------------------------------------------ history


def run_row(session: Session, name: str) -> Run:
    """The run's row (read by pipeline/history.py for its documents); NotFound for unknown names."""
    return _run_row(session, name)


def snapshot_rows(session: Session, run_id: int, name: str, rank: int | None = None,
                  max_snapshots: int = 1000) -> list[dict[str, Any]]:
    """The run's snapshots (of `rank`, else of every rank), the newest `max_snapshots` in time order, with
    their analyses' figures and documents; NotFound names the ranks that have snapshots when `rank` has
    none."""
    q = (select(Snapshot.id, Snapshot.rank, Snapshot.step, Snapshot.epoch, Snapshot.trigger, Snapshot.taken_at,
                Snapshot.sha256, Snapshot.size_bytes, Snapshot.state, Snapshot.analyzer_version, Snapshot.source,
                AnalysisResult.reserved_bytes, AnalysisResult.allocated_bytes, AnalysisResult.active_bytes,
                AnalysisResult.fragmentation_ratio, AnalysisResult.largest_free_block_bytes,
                AnalysisResult.result["diagnosis"].label("diagnosis"),
                AnalysisResult.result["composition"].label("composition"),
                AnalysisResult.result["oom"].label("oom"))
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.run_id == run_id))
    if rank is not None:
        q = q.where(Snapshot.rank == rank)
    rows = list(reversed(session.execute(
        q.order_by(Snapshot.taken_at.desc(), Snapshot.id.desc()).limit(max_snapshots)).all()))
    if rank is not None and not rows:
        ranks = sorted(set(session.execute(select(Snapshot.rank).where(Snapshot.run_id == run_id)).scalars()))
        if ranks:
            raise NotFound(f"run {name!r} has no snapshots of rank {rank}",
                           hint="ranks with snapshots: " + ", ".join(map(str, ranks)))
    snaps = []
    for r in rows:
        snaps.append({
            "id": r.id, "rank": r.rank, "step": r.step, "epoch": r.epoch, "trigger": r.trigger,
            "taken_at": iso(r.taken_at), "sha256": r.sha256, "size_bytes": r.size_bytes, "source": r.source,
            "state": r.state, "analyzer_version": r.analyzer_version,
            "reserved_bytes": r.reserved_bytes, "allocated_bytes": r.allocated_bytes, "active_bytes": r.active_bytes,
            "fragmentation_ratio": r.fragmentation_ratio, "largest_free_block_bytes": r.largest_free_block_bytes,
            "free_in_pieces_bytes": free_in_pieces(
                r.reserved_bytes - r.allocated_bytes if r.reserved_bytes is not None and r.allocated_bytes is not None
                else None, r.largest_free_block_bytes),
            "composition": r.composition, "oom": r.oom, "diagnosis": r.diagnosis,
        })
    return snaps


def main_diagnosis(session: Session, run_id: int, rank: int | None) -> RunDiagnosis | None:
    """The run-level diagnosis of `rank`, else of the rank that speaks for the run
    (analysis/run_verdict.run_verdict, read through store/run_verdicts)."""
    if rank is None:
        rank = verdict_rank(session, run_id)
        if rank is None:
            return None
    return session.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank)
                           ).scalar_one_or_none()


def forecasts(session: Session, run_id: int, rank: int | None = None) -> list[tuple[int, dict]]:
    """(rank, stored forecast) of the run's rank diagnoses that have one (of `rank` only when given)."""
    q = select(RunDiagnosis.rank, RunDiagnosis.result["forecast"].label("fc")).where(RunDiagnosis.run_id == run_id)
    if rank is not None:
        q = q.where(RunDiagnosis.rank == rank)
    return [(r.rank, r.fc) for r in session.execute(q).all() if isinstance(r.fc, dict)]


def rank_facts(session: Session, run_id: int) -> list[RankFacts]:
    """What is stored of each rank of a run: its run-level diagnosis, its own exit figures, its first
    OOM snapshot, and its stat samples' maxima (for ranks that sent nothing else)."""
    diags = {d.rank: d for d in session.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == run_id)).scalars()}
    figs = rank_figures.for_run(session, run_id)
    first_oom: dict[int, Any] = {}
    for r in session.execute(
            select(Snapshot.rank, Snapshot.step, Snapshot.taken_at, AnalysisResult.allocated_bytes,
                   AnalysisResult.oom_requested_bytes, AnalysisResult.result["composition"].label("composition"))
            .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
            .where(Snapshot.run_id == run_id, Snapshot.trigger == "oom")
            .order_by(Snapshot.taken_at, Snapshot.id)):
        first_oom.setdefault(r.rank, r)
    stats = {r[0]: r for r in session.execute(
        select(StatSample.rank, func.max(StatSample.allocated_bytes), func.max(StatSample.reserved_bytes))
        .where(StatSample.run_id == run_id).group_by(StatSample.rank))}
    snap_ranks = set(session.execute(select(Snapshot.rank).where(Snapshot.run_id == run_id).distinct()).scalars())
    out = []
    for rank in sorted(set(diags) | set(figs) | set(first_oom) | set(stats) | snap_ranks):
        d, f, o, st = diags.get(rank), figs.get(rank, {}), first_oom.get(rank), stats.get(rank)
        res = (d.result or {}) if d is not None else {}
        diag = res.get("diagnosis") or {}
        sp = f.get("step_peaks") or {}
        comp = (o.composition if o is not None and o.composition else None) or (d.peak_composition if d else None)
        peak_a = [v for v in (f.get("peak_allocated_bytes"), d.peak_allocated_bytes if d else None,
                              st[1] if st else None) if v is not None]
        peak_r = [v for v in (f.get("peak_reserved_bytes"), d.peak_reserved_bytes if d else None,
                              st[2] if st else None) if v is not None]
        taken = to_utc(o.taken_at) if o is not None and o.taken_at is not None else None
        out.append(RankFacts(
            rank=rank, status=f.get("status"), end_reason=f.get("end_reason"),
            cause=d.primary_cause if d else None, confidence=d.confidence if d else None,
            leak=leak_listed(diag),
            peak_allocated_bytes=max(peak_a) if peak_a else None, peak_reserved_bytes=max(peak_r) if peak_r else None,
            limit_bytes=f.get("limit_bytes") or ((res.get("oom") or {}).get("limit_bytes")),
            last_step=f.get("last_step"), step_peak_bytes=sp.get("max_peak_allocated"),
            step_median_bytes=sp.get("median_peak_allocated"), steps=f.get("steps"),
            composition={k: int(v or 0) for k, v in (comp or {}).items()},
            oom_at=taken.timestamp() if taken else None, oom_step=o.step if o is not None else None,
            oom_allocated_bytes=o.allocated_bytes if o is not None else None,
            oom_requested_bytes=o.oom_requested_bytes if o is not None else None))
    return out


def stat_series(session: Session, run_id: int, rank: int, points: int = 60) -> dict[str, Any]:
    """Stat samples of one rank in at most `points` buckets of consecutive samples (max per bucket),
    plus the totals over all samples."""
    where = (StatSample.run_id == run_id, StatSample.rank == rank)
    tot = session.execute(select(
        func.count(), func.max(StatSample.reserved_bytes), func.max(StatSample.allocated_bytes),
        func.max(StatSample.alloc_retries), func.max(StatSample.oom_count),
        func.min(StatSample.sampled_at), func.max(StatSample.sampled_at)).where(*where)).one()
    count = int(tot[0] or 0)
    out: dict[str, Any] = {"rank": rank, "count": count, "peak_reserved_bytes": tot[1], "peak_allocated_bytes": tot[2],
                           "alloc_retries": tot[3], "oom_count": tot[4], "first": iso(tot[5]), "last": iso(tot[6]),
                           "series": []}
    if not count:
        return out
    stride = max(1, math.ceil(count / max(1, points)))
    rn = func.row_number().over(order_by=StatSample.sampled_at).label("rn")
    inner = select(StatSample, rn).where(*where).subquery()
    bucket = ((inner.c.rn - 1) // stride).label("bucket")
    q = (select(bucket, func.min(inner.c.sampled_at), func.max(inner.c.step), func.max(inner.c.epoch),
                func.max(inner.c.allocated_bytes), func.max(inner.c.reserved_bytes), func.max(inner.c.active_bytes),
                func.max(inner.c.inactive_split_bytes), func.max(inner.c.alloc_retries), func.max(inner.c.oom_count))
         .group_by(bucket).order_by(bucket))
    for b in session.execute(q):
        out["series"].append({"t": iso(b[1]), "step": b[2], "epoch": b[3], "allocated_bytes": b[4],
                              "reserved_bytes": b[5], "active_bytes": b[6], "inactive_split_bytes": b[7],
                              "alloc_retries": b[8], "oom_count": b[9]})
    return out


# ----------------------------------------------------------------------------------------- versions


def version_rows(session: Session, job: str) -> list[tuple]:
    """Per torch version of the job's runs: (version, runs, OOM runs, mean and max peak reserved, mean peak
    allocated, mean fragmentation ratio, mean pieces share); NotFound for a job with no runs."""
    exists = session.execute(select(func.count()).select_from(Run).where(Run.job == job)).scalar_one()
    if not exists:
        raise NotFound(f"no runs of job {job!r}", hint="list jobs' runs with `memq runs --json`")
    q = (select(Run.torch_version, func.count(), func.sum(case((Run.status == "oom", 1), else_=0)),
                func.avg(Run.peak_reserved_bytes), func.max(Run.peak_reserved_bytes),
                func.avg(Run.peak_allocated_bytes), func.avg(Run.fragmentation_ratio),
                func.avg(Run.pieces_share))
         .where(Run.job == job).group_by(Run.torch_version))
    return [tuple(r) for r in session.execute(q).all()]
