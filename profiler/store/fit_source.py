"""The measured run `memq fit --run` (and the web run page's fit form) replays: of the run's snapshots
(of one rank), the earliest whose trace starts at an empty allocator and holds a whole training step
(two optimizer steps or more: the agent's warm-up recording at its defaults); else the earliest whose
trace holds a whole step mid-run (the least grown, when the run leaks: a later recording window of a
leaking job is longer, but its live bytes are the leak's, not a step's); else the longest trace. With
the limit the run was judged against."""

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
    chosen: str = ""  # why this snapshot (said with the answer)


def fit_source(session, run_name: str, rank: int | None = None) -> FitSource:
    run_id = repo.run_id_for(session, run_name)
    run = session.get(Run, run_id)
    q = (select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.rank, Snapshot.step, Snapshot.taken_at,
                AnalysisResult.result["snapshots"].label("heads"), AnalysisResult.result["oom"].label("oom"),
                AnalysisResult.result[("details", "timeline", "covers_whole_run")].label("whole"),
                AnalysisResult.result[("details", "timeline", "optimizer_steps")].label("steps"))
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.run_id == run_id))
    if rank is not None:
        q = q.where(Snapshot.rank == rank)
    rows = session.execute(q.order_by(Snapshot.rank, Snapshot.taken_at, Snapshot.id)).all()
    best, best_n, best_rank, chosen = None, 0, -1, ""
    for r in rows:
        heads = r.heads if isinstance(r.heads, list) else []
        n = int((heads[-1] or {}).get("trace_entries") or 0) if heads else 0
        if not n:
            continue
        steps = _int(r.steps)
        whole = r.whole is True or r.whole == 1 or r.whole == "true"
        # 2: a whole step from the run's start; 1: a whole step mid-run; 0: the rest (longest first)
        kind = 2 if whole and steps >= 2 else 1 if steps >= 2 else 0
        if kind > best_rank or (kind == best_rank == 0 and n > best_n):
            best, best_n, best_rank = r, n, kind
            chosen = ("its trace starts at an empty allocator and holds {s} optimizer steps",
                      "its trace holds {s} optimizer steps from mid-run (no trace of the run's start holds "
                      "two): the earliest such",
                      "its longest trace")[2 - kind].format(s=steps)
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
    return FitSource(int(best.id), best.sha256, best.source, int(best.rank), best.step, best_n, limit, source,
                     chosen)


def _int(v) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0
