"""What-if sweeps as rows: the plan of one OOM snapshot's sweep (its limit and seeds) and the stored
results (the use case that computes them is pipeline/sweeps.py).

- `plan_for(session, snapshot_id)`: what a sweep of that snapshot replays: its blob, its run's limit,
  and the same rank's earlier snapshots that carry a trace (seeds).
- `store_sweep(session, ...)`: upserted into `whatif_sweeps`, keyed by (sha256, version, context).
- `sweeps_by_sha(session, shas)`: the newest stored sweep of the current version per snapshot bytes
  (what `memq history` shows per OOM snapshot); `attach_sweeps` adds them to listed snapshots.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import case, select

from memq import analysis
from memq.analysis import whatif
from memq.errors import NotFound
from memq.store import repository as repo
from memq.store.orm import AnalysisResult, Run, Snapshot, WhatIfSweep

#: Where a limit came from when the OOM's own analysis derived it: the run header (pipeline/history.run_limit) and
#: the what-if sweep say it in the same words (the run page showed "the OOM analysis" above "the OOM (its
#: analysis)" for one 13.84 GiB).
OOM_ANALYSIS = "the OOM analysis"
RUN_CAP = "the run's cap"

#: Earlier snapshots (newest first, with a trace) a sweep replays before the OOM snapshot's window.
MAX_SEEDS = 8
#: How many earlier snapshot rows are looked at to find those seeds.
MAX_LOOKBACK = 64

Loader = Callable[[str, "str | None"], Any]


def sweep_version() -> str:
    return f"{analysis.ANALYZER_VERSION}+whatif{whatif.WHATIF_MODEL_VERSION}"  # read when called, as analyzer()


@dataclass
class SnapRef:
    id: int
    sha256: str
    source: str | None
    trigger: str
    step: int | None
    epoch: int | None
    rank: int

    def describe(self) -> dict[str, Any]:
        return {"id": self.id, "sha256": self.sha256, "trigger": self.trigger, "step": self.step,
                "epoch": self.epoch, "rank": self.rank}


@dataclass
class SweepPlan:
    target: SnapRef
    run_name: str
    limit_bytes: int | None
    limit_source: str
    recorded_oom: bool
    earlier: list[SnapRef] = field(default_factory=list)

    def context_key(self) -> str:
        return repo.context_key({"limit": self.limit_bytes, "seeds": [e.sha256 for e in self.earlier],
                                 "oom": self.recorded_oom})


def _ref(r) -> SnapRef:
    return SnapRef(int(r.id), r.sha256, r.source, r.trigger, r.step, r.epoch, int(r.rank))


def _has_trace(result: dict | None) -> bool:
    snaps = (result or {}).get("snapshots") or []
    return bool(snaps) and (snaps[-1] or {}).get("trace_entries", 0) > 0


def plan_for(session, snapshot_id: int) -> SweepPlan:
    """What the sweep of one snapshot replays: the snapshot, the run's limit, the seeds."""
    row = session.execute(
        select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.trigger, Snapshot.step, Snapshot.epoch,
               Snapshot.rank, Snapshot.run_id, Snapshot.taken_at, Snapshot.context, Run.name,
               Run.memory_limit_bytes, AnalysisResult.result["oom"].label("oom"))
        .join(Run, Run.id == Snapshot.run_id)
        .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.id == snapshot_id)).one_or_none()
    if row is None:
        raise NotFound(f"no snapshot with id {snapshot_id}")
    ctx = dict(row.context or {})
    oom = row.oom if isinstance(row.oom, dict) else None
    limit, source = None, "unknown"
    # The analysis's limit first: it is what the OOM itself says ("N GiB allowed", the observer), where the
    # run's limit may be the device total reported before the job set its cap.
    for value, where in (((oom or {}).get("limit_bytes"), OOM_ANALYSIS),
                         (ctx.get("limit_bytes"), "the snapshot's facts"), (row.memory_limit_bytes, RUN_CAP)):
        if value:
            limit, source = int(value), where
            break
    if limit is not None and limit == row.memory_limit_bytes:
        source = RUN_CAP  # the words the run's header uses for the same bytes (pipeline/history.run_limit)
    recorded_oom = row.trigger == "oom" or oom is not None or bool(ctx.get("requested_bytes"))
    order = (Snapshot.taken_at.desc(), Snapshot.id.desc())
    rows = session.execute(
        select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.trigger, Snapshot.step, Snapshot.epoch,
               Snapshot.rank, Snapshot.taken_at, AnalysisResult.result["snapshots"].label("heads"))
        .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
        .where(Snapshot.run_id == row.run_id, Snapshot.rank == row.rank, Snapshot.id != row.id)
        .order_by(*order).limit(4 * MAX_LOOKBACK)).all()
    key = (repo.to_utc(row.taken_at) or dt.datetime.max.replace(tzinfo=dt.UTC), row.id)
    earlier = []
    for r in rows:
        if (repo.to_utc(r.taken_at) or dt.datetime.max.replace(tzinfo=dt.UTC), r.id) >= key:
            continue
        if _has_trace({"snapshots": r.heads}):
            earlier.append(_ref(r))
        if len(earlier) >= MAX_SEEDS:
            break
    earlier.reverse()
    return SweepPlan(target=_ref(row), run_name=row.name, limit_bytes=limit, limit_source=source,
                     recorded_oom=recorded_oom, earlier=earlier)


def oom_snapshot_ids(session, run_id: int, rank: int) -> list[int]:
    """The rank's analysed OOM snapshots (trigger oom, or an OOM in their analysis): what gets swept."""
    rows = session.execute(select(Snapshot.id, Snapshot.trigger, AnalysisResult.oom_requested_bytes)
                           .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
                           .where(Snapshot.run_id == run_id, Snapshot.rank == rank, Snapshot.state == "done")).all()
    return [int(r.id) for r in rows if r.trigger == "oom" or r.oom_requested_bytes is not None]


def stored_sweep_id(session, sha256: str, version: str, key: str) -> int | None:
    """The id of the sweep stored for these bytes, version and inputs, or None."""
    sid = session.execute(select(WhatIfSweep.id).where(
        WhatIfSweep.sha256 == sha256, WhatIfSweep.analyzer_version == version,
        WhatIfSweep.context_key == key)).scalar_one_or_none()
    return None if sid is None else int(sid)


def target_for_run(session, run_name: str, rank: int | None = None) -> int:
    """The snapshot `memq whatif --run` replays: the run's last OOM snapshot (of `rank` when given),
    else its last snapshot."""
    run_id = repo.run_id_for(session, run_name)
    q = (select(Snapshot.id, Snapshot.trigger, AnalysisResult.result["oom"].label("oom"))
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.run_id == run_id))
    if rank is not None:
        q = q.where(Snapshot.rank == rank)
    rows = session.execute(q.order_by(Snapshot.taken_at.desc(), Snapshot.id.desc())).all()
    if not rows:
        raise NotFound(f"run {run_name!r} has no snapshot" + (f" of rank {rank}" if rank is not None else ""),
                       hint="nothing to replay: `memq history --run " + run_name + "` lists what it has")
    for r in rows:
        if r.trigger == "oom" or isinstance(r.oom, dict):
            return int(r.id)
    return int(rows[0].id)


def report_target(session, run_id: int):
    """The snapshot the nightly report replays for a run: its last OOM snapshot, else its last one
    (id, sha256, source, trigger), or None."""
    return session.execute(
        select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.trigger)
        .where(Snapshot.run_id == run_id)
        .order_by(case((Snapshot.trigger == "oom", 0), else_=1), Snapshot.taken_at.desc(), Snapshot.id.desc())
        .limit(1)).one_or_none()


def store_sweep(session, sha256: str, version: str, key: str, limit_bytes: int | None, doc: dict) -> int:
    values = {"sha256": sha256, "analyzer_version": version, "context_key": key, "limit_bytes": limit_bytes,
              "result": repo.json_safe(doc)}
    stmt = repo._insert(session, WhatIfSweep).values(**values)
    stmt = stmt.on_conflict_do_update(index_elements=["sha256", "analyzer_version", "context_key"],
                                      set_={"result": stmt.excluded.result, "limit_bytes": stmt.excluded.limit_bytes}
                                      ).returning(WhatIfSweep.id)
    return int(session.execute(stmt).scalar_one())


#: The fields of each setting `memq history` shows (the stored sweep keeps all of them).
SHOWN = ("conf", "predicted_oom", "verdict", "confidence", "reason", "coverage", "start_state",
         "peak_reserved_bytes", "headroom_bytes", "shortfall_bytes", "first_failure")


def sweeps_by_sha(session, shas: Iterable[str]) -> dict[str, dict[str, Any]]:
    """{sha256: the newest sweep of the current version} for the given snapshot bytes."""
    shas = sorted(set(shas))
    if not shas:
        return {}
    rows = session.execute(
        select(WhatIfSweep.sha256, WhatIfSweep.result, WhatIfSweep.limit_bytes, WhatIfSweep.created_at,
               WhatIfSweep.analyzer_version)
        .where(WhatIfSweep.sha256.in_(shas), WhatIfSweep.analyzer_version == sweep_version())
        .order_by(WhatIfSweep.created_at, WhatIfSweep.id)).all()
    out = {}
    for r in rows:
        doc = dict(r.result or {})
        out[r.sha256] = {
            "limit_bytes": r.limit_bytes, "limit_source": doc.get("limit_source"),
            "analyzer_version": r.analyzer_version, "computed_at": repo.to_utc(r.created_at).isoformat(),
            "seeds": ((doc.get("results") or [{}])[0].get("inputs") or {}).get("seeds", []),
            "joined": ((doc.get("results") or [{}])[0].get("inputs") or {}).get("joined", []),
            "results": [{k: x.get(k) for k in SHOWN} | {"notes": x.get("notes") or []}
                        for x in doc.get("results") or []],
        }
    return out


def attach_sweeps(session, snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each snapshot dict of a history gets `whatif`: its stored sweep, or None."""
    found = sweeps_by_sha(session, (s["sha256"] for s in snaps if s.get("sha256")))
    for s in snaps:
        s["whatif"] = found.get(s.get("sha256"))
    return snaps
