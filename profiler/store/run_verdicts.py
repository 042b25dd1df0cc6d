"""Which rank speaks for each run, read from what is stored and decided by the one rule
(memq.analysis.run_verdict.run_verdict): the run row's cause, the history page, compare, the report and
the alerts all ask here, so no screen picks another rank's diagnosis.

A few set-based statements for any number of runs: each rank's run-level diagnosis (cause, OOM, peak),
its first OOM snapshot (time and step), its exit status (rank_figures).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session

from memq.analysis.ranks import RankFacts
from memq.analysis.run_verdict import RankDiagnosis, forecast_rank, run_verdict
from memq.store.orm import AnalysisResult, RankFigures, RunDiagnosis, Snapshot
from memq.store.repository.common import to_utc


def verdict_inputs(session: Session, runs: Iterable[int] | Select
                   ) -> dict[int, tuple[list[RankDiagnosis], list[RankFacts]]]:
    """run id -> (its ranks' diagnoses, its ranks' OOM facts), for run_verdict. `runs`: run ids, or a
    SELECT of run ids (a report's window: joined, not sent as a list)."""
    if isinstance(runs, Select):
        ids: Any = runs.scalar_subquery()
        out: dict[int, tuple[list[RankDiagnosis], list[RankFacts]]] = defaultdict(lambda: ([], []))
    else:
        ids = sorted({int(i) for i in runs})
        out = {i: ([], []) for i in ids}
        if not ids:
            return out
    for r in session.execute(select(RunDiagnosis.run_id, RunDiagnosis.rank, RunDiagnosis.primary_cause,
                                    RunDiagnosis.peak_reserved_bytes, RunDiagnosis.result["oom"].label("oom"))
                             .where(RunDiagnosis.run_id.in_(ids))):
        out[int(r.run_id)][0].append(RankDiagnosis(rank=int(r.rank), cause=r.primary_cause, oom=bool(r.oom),
                                                   peak_reserved_bytes=r.peak_reserved_bytes))
    first_oom: dict[tuple[int, int], Any] = {}
    for r in session.execute(
            select(Snapshot.run_id, Snapshot.rank, Snapshot.step, Snapshot.taken_at, AnalysisResult.allocated_bytes)
            .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
            .where(Snapshot.run_id.in_(ids), Snapshot.trigger == "oom")
            .order_by(Snapshot.taken_at, Snapshot.id)):
        first_oom.setdefault((int(r.run_id), int(r.rank)), r)
    status = {(int(r.run_id), int(r.rank)): r.status for r in session.execute(
        select(RankFigures.run_id, RankFigures.rank, RankFigures.status).where(RankFigures.run_id.in_(ids)))}
    for run_id, rank in sorted(set(first_oom) | set(status)):
        o = first_oom.get((run_id, rank))
        taken = to_utc(o.taken_at) if o is not None and o.taken_at is not None else None
        out[run_id][1].append(RankFacts(
            rank=rank, status=status.get((run_id, rank)), oom_at=taken.timestamp() if taken else None,
            oom_step=o.step if o is not None else None,
            oom_allocated_bytes=o.allocated_bytes if o is not None else None))
    return dict(out)


def verdict_ranks(session: Session, runs: Iterable[int] | Select) -> dict[int, int | None]:
    """run id -> the rank whose run-level diagnosis is the run's (None: no diagnosis yet)."""
    return {run_id: run_verdict(diags, facts) for run_id, (diags, facts) in verdict_inputs(session, runs).items()}


def verdict_rank(session: Session, run_id: int) -> int | None:
    return verdict_ranks(session, [run_id])[int(run_id)]


def verdict_result(session: Session, run_id: int, *, forecast: bool = False) -> dict[str, Any] | None:
    """The stored run-level result of the rank that speaks for the run; with `forecast`, of the rank whose
    forecast OOM comes first (analysis/run_verdict.forecast_rank) when one expects an OOM."""
    docs = {int(r.rank): r.result for r in session.execute(
        select(RunDiagnosis.rank, RunDiagnosis.result).where(RunDiagnosis.run_id == run_id))}
    rank = forecast_rank({k: (v or {}).get("forecast") for k, v in docs.items()}) if forecast else None
    if rank is None:
        rank = verdict_rank(session, run_id)
    doc = docs.get(rank) if rank is not None else None
    return dict(doc) if doc is not None else None
