"""Analysis results keyed by (sha256, analyzer version, context), run-level diagnoses, run summaries."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import and_, func, null, or_, select, update
from sqlalchemy.orm import Session

from memq.analysis.memory import pieces_share
from memq.analysis.run_verdict import forecast_moment, forecast_rank
from memq.store.orm import (
    AnalysisResult,
    Run,
    RunDiagnosis,
    Snapshot,
    StatSample,
)
from memq.store.repository.common import _db_time, _insert, json_safe, utcnow
from memq.store.run_verdicts import verdict_rank


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


def found_analysis(session: Session, sha256: str, analyzer_version: str, context_key: str = ""):
    """(id, oom_requested_bytes, oom) of the stored analysis of these bytes in this context, or None: what
    reusing it needs (its id, and whether it found an OOM)."""
    return session.execute(select(AnalysisResult.id, AnalysisResult.oom_requested_bytes,
                                  AnalysisResult.result["oom"].label("oom")).where(
        AnalysisResult.sha256 == sha256, AnalysisResult.analyzer_version == analyzer_version,
        AnalysisResult.context_key == context_key)).one_or_none()


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


CONTRACT_KEYS = ("schema", "snapshots", "metrics", "oom", "composition", "diagnosis", "forecast", "fit", "fit_reason")
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
    """Copy the verdict of the rank that speaks for the run (analysis/run_verdict.run_verdict) onto the
    run row, with peaks over snapshots and stat samples."""
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
    speaks = verdict_rank(session, run_id) if diags else None
    # The rank that speaks may have no diagnosis in `diags` yet: its snapshots name it (an OOM) before its
    # own recompute stores one, or it committed between the two reads. That recompute refreshes the run.
    main = next((d for d in diags if d.rank == speaks), None)
    if main is not None:
        values["primary_cause"] = main.primary_cause
        values["cause_confidence"] = main.confidence
        values["fragmentation_ratio"] = ((main.result or {}).get("metrics") or {}).get("fragmentation_ratio")
        values["pieces_share"] = pieces_share(main.result)
        values.update(forecast_summary(diags))
    session.execute(update(Run).where(Run.id == run_id).values(**values))


def forecast_summary(diags) -> dict[str, Any]:
    """The run row's OOM forecast columns: the forecast of the rank that runs out first
    (analysis/run_verdict.forecast_rank), its step and the wall-clock moment; None when no rank's
    forecast expects an OOM."""
    by_rank = {d.rank: (d.result or {}).get("forecast") for d in diags}
    rank = forecast_rank(by_rank)
    if rank is None:
        return {"oom_forecast_step": None, "oom_forecast_at": None}
    fc = by_rank[rank]
    step = fc.get("step")
    at = forecast_moment(fc)
    return {"oom_forecast_step": step if isinstance(step, int) and not isinstance(step, bool) else None,
            "oom_forecast_at": dt.datetime.fromtimestamp(at, dt.UTC) if at is not None else None}


def max_present(*vals):
    present = [int(v) for v in vals if v is not None]
    return max(present) if present else None


# ------------------------------------------------------------------------------------- reads


def analysis_diagnosis(session: Session, analysis_id: int) -> dict | None:
    """The diagnosis of one stored analysis (its cause and evidence), read alone: not the whole result."""
    return session.execute(select(AnalysisResult.result["diagnosis"]).where(AnalysisResult.id == analysis_id)
                           ).scalar_one_or_none()


def analysis_doc(session: Session, analysis_id: int) -> dict | None:
    """The stored result of one analysis, or None."""
    return session.execute(select(AnalysisResult.result).where(AnalysisResult.id == analysis_id)).scalar_one_or_none()


def run_result(session: Session, run_id: int, rank: int, analyzer_version: str | None = None) -> dict | None:
    """The stored run-level result of a rank (made by `analyzer_version` when given), or None."""
    q = select(RunDiagnosis.result).where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank)
    if analyzer_version is not None:
        q = q.where(RunDiagnosis.analyzer_version == analyzer_version)
    doc = session.execute(q).scalar_one_or_none()
    return None if doc is None else dict(doc)


def run_result_row(session: Session, run_id: int, rank: int):
    """(result, computed_at) of a rank's run diagnosis, or None."""
    return session.execute(select(RunDiagnosis.result, RunDiagnosis.computed_at)
                           .where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank)).one_or_none()


def replace_run_result(session: Session, run_id: int, rank: int, computed_at: dt.datetime,
                       result: Mapping[str, Any]) -> bool:
    """Write `result` over a rank's run diagnosis only if it is still the one computed at `computed_at`
    (a recompute that landed meanwhile wins); then the run row's forecast columns follow. Returns
    whether it was written."""
    done = session.execute(update(RunDiagnosis)
                           .where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank,
                                  RunDiagnosis.computed_at == computed_at)
                           .values(result=result).execution_options(synchronize_session=False))
    if not done.rowcount:
        return False
    diags = session.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == run_id)).scalars().all()
    session.execute(update(Run).where(Run.id == run_id).values(**forecast_summary(diags),
                                                               updated_at=func.current_timestamp()))
    return True


def stale_diagnoses(session: Session, computed_before: dt.datetime, max_snapshots: int,
                    limit: int = 200) -> list[tuple[int, int]]:
    """(run, rank) pairs whose analysed snapshots (up to `max_snapshots`) are not all in their run-level
    diagnosis, made before `computed_before`, or that have none."""
    done = (select(Snapshot.run_id, Snapshot.rank, func.count().label("n"))
            .where(Snapshot.state == "done").group_by(Snapshot.run_id, Snapshot.rank).subquery())
    old = _db_time(session, computed_before)
    fewest = (func.least(done.c.n, max_snapshots) if session.get_bind().dialect.name == "postgresql"
              else func.min(done.c.n, max_snapshots))
    rows = session.execute(
        select(done.c.run_id, done.c.rank)
        .outerjoin(RunDiagnosis, and_(RunDiagnosis.run_id == done.c.run_id, RunDiagnosis.rank == done.c.rank))
        .where((RunDiagnosis.run_id.is_(None))
               | and_(RunDiagnosis.snapshot_count < fewest, RunDiagnosis.computed_at < old))
        .limit(limit)).all()
    return [(int(r.run_id), int(r.rank)) for r in rows]
