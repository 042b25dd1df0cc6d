"""The measured run `memq fit --run` (and the web run page's fit form) replays: of the run's snapshots
(of one rank), the one whose trace is longest, the earliest of equals (the agent's warm-up recording
at its defaults, which starts at an empty allocator), with the limit the run was judged against."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select

from memq.errors import NotFound
from memq.store import repository as repo
from memq.store.orm import AnalysisResult, Run, Snapshot


@dataclass(frozen=True)
class FitSource:
    snapshot_id: int
    sha256: str
    source: str | None
    rank: int
    step: int | None
    trace_entries: int
    limit_bytes: int | None
    limit_source: str | None


def fit_source(session, run_name: str, rank: int | None = None) -> FitSource:
    run_id = repo.run_id_for(session, run_name)
    run = session.get(Run, run_id)
    q = (select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.rank, Snapshot.step, Snapshot.taken_at,
                AnalysisResult.result["snapshots"].label("heads"), AnalysisResult.result["oom"].label("oom"))
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.run_id == run_id))
    if rank is not None:
        q = q.where(Snapshot.rank == rank)
    rows = session.execute(q.order_by(Snapshot.rank, Snapshot.taken_at, Snapshot.id)).all()
    best, best_n = None, 0
    for r in rows:
        heads = r.heads if isinstance(r.heads, list) else []
        n = int((heads[-1] or {}).get("trace_entries") or 0) if heads else 0
        if n > best_n:
            best, best_n = r, n
    if best is None:
        where = f" of rank {rank}" if rank is not None else ""
        raise NotFound(f"run {run_name!r} has no snapshot with a trace{where}",
                       hint="memq fit replays a recorded training step: the agent records the warm-up at its "
                            "defaults (or history=\"on\"); `memq history --run " + run_name + "` lists what it has")
    limit, source = None, None
    if run is not None and run.memory_limit_bytes:
        limit, source = int(run.memory_limit_bytes), "the run's cap"
    else:
        oom = next((r.oom for r in reversed(rows) if isinstance(r.oom, dict) and r.oom.get("limit_bytes")), None)
        if oom:
            limit, source = int(oom["limit_bytes"]), "the run's OOM analysis"
    return FitSource(int(best.id), best.sha256, best.source, int(best.rank), best.step, best_n, limit, source)
