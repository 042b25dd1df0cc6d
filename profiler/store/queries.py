"""Read side of the run history: plain dicts for `memq runs / history / compare / versions`.

Byte counts stay integers, times are ISO-8601 UTC strings, so a dict goes to `--json` unchanged.
Every filter is a bound parameter. The queries lean on these indexes: runs (cluster, started_at),
(job, started_at), (started_at); snapshots (run_id, rank, taken_at); stat_samples primary key
(run_id, rank, sampled_at).

- `list_runs(session, RunFilter(...))`
- `get_run(session, name)` -> dict; NotFound for unknown runs
- `run_history(session, name, rank=None)`: snapshots in time order with their figures and
  diagnosis, the run-level diagnosis, what changed between consecutive snapshots, and the stat
  samples downsampled to `points` buckets (max per bucket) for a plot.
- `compare_runs(session, a, b)`: composition and peaks side by side, per-category deltas, settings
  and versions that differ, and which difference explains the gap.
- `torch_versions(session, job)`: peak, OOM rate and fragmentation per torch version, regressions.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Select, case, func, or_, select
from sqlalchemy.orm import Session

from memq.analysis.ranks import RankFacts, diagnose_ranks
from memq.errors import NotFound
from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot, StatSample
from memq.store.repository import to_utc

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "workspace", "other", "unknown")
MiB = 1024 * 1024


def iso(value: dt.datetime | None) -> str | None:
    v = to_utc(value)
    return v.isoformat().replace("+00:00", "Z") if v else None


# --------------------------------------------------------------------------------------------- runs

RUN_FIELDS = ("name", "job", "cluster", "host", "username", "project", "labels", "torch_version",
              "cuda_version", "driver_version", "gpu_model", "gpu_memory_bytes", "memory_limit_bytes",
              "allocator_conf", "optimizer", "param_count", "world_size", "rank", "started_at", "ended_at",
              "status", "primary_cause", "cause_confidence", "peak_reserved_bytes", "peak_allocated_bytes",
              "fragmentation_ratio", "oom_count", "snapshot_count", "oom_forecast_step", "oom_forecast_at")


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
    return [run_dict(r) for r in session.execute(q).scalars()]


def _run_row(session: Session, name: str) -> Run:
    run = session.execute(select(Run).where(Run.name == name)).scalar_one_or_none()
    if run is None:
        raise NotFound(f"no run named {name!r}", hint="list runs with `memq runs`")
    return run


def get_run(session: Session, name: str) -> dict[str, Any]:
    """The run as a plain dict (see RUN_FIELDS); NotFound for unknown names."""
    return run_dict(_run_row(session, name))


def _main_diagnosis(session: Session, run_id: int, rank: int | None) -> RunDiagnosis | None:
    q = select(RunDiagnosis).where(RunDiagnosis.run_id == run_id)
    if rank is not None:
        return session.execute(q.where(RunDiagnosis.rank == rank)).scalar_one_or_none()
    diags = session.execute(q).scalars().all()
    if not diags:
        return None
    return max(diags, key=lambda d: (bool((d.result or {}).get("oom")), d.peak_reserved_bytes or 0, -d.rank))


# ------------------------------------------------------------------------------------------ history


def run_history(session: Session, name: str, rank: int | None = None, points: int = 60,
                max_snapshots: int = 1000) -> dict[str, Any]:
    run = _run_row(session, name)
    q = (select(Snapshot.id, Snapshot.rank, Snapshot.step, Snapshot.epoch, Snapshot.trigger, Snapshot.taken_at,
                Snapshot.sha256, Snapshot.size_bytes, Snapshot.state, Snapshot.analyzer_version, Snapshot.source,
                AnalysisResult.reserved_bytes, AnalysisResult.allocated_bytes, AnalysisResult.active_bytes,
                AnalysisResult.fragmentation_ratio, AnalysisResult.largest_free_block_bytes,
                AnalysisResult.result["diagnosis"].label("diagnosis"),
                AnalysisResult.result["composition"].label("composition"),
                AnalysisResult.result["oom"].label("oom"))
         .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
         .where(Snapshot.run_id == run.id))
    if rank is not None:
        q = q.where(Snapshot.rank == rank)
    rows = list(reversed(session.execute(
        q.order_by(Snapshot.taken_at.desc(), Snapshot.id.desc()).limit(max_snapshots)).all()))
    if rank is not None and not rows:
        ranks = sorted(set(session.execute(select(Snapshot.rank).where(Snapshot.run_id == run.id)).scalars()))
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
            "composition": r.composition, "oom": r.oom, "diagnosis": r.diagnosis,
        })
    from memq.store.sweeps import attach_sweeps

    attach_sweeps(session, snaps)  # each OOM snapshot's stored what-if sweep (`whatif`), else None
    main = _main_diagnosis(session, run.id, rank)
    ranks = rank_section(session, run.id)
    if rank is None and ranks["failed_rank"] is not None:  # the run's verdict is the first failing rank's
        main = _main_diagnosis(session, run.id, ranks["failed_rank"]) or main
    stat_rank = rank if rank is not None else (main.rank if main is not None else (snaps[0]["rank"] if snaps else 0))
    return {
        "run": run_dict(run),
        "limit": run_limit(run, main),
        "rank": rank,
        "snapshots": snaps,
        "diagnosis": with_rank_advice((main.result or {}).get("diagnosis") if main else None, ranks),
        "run_analysis": _diag_dict(main),
        "forecast": run_forecast(session, run.id, rank),
        # the run's own headroom in batch units (profiler/analysis/fit.py `headroom`)
        "fit": (main.result or {}).get("fit") if main is not None else None,
        "fit_reason": _fit_reason(main),
        "ranks": ranks,
        "changes": changes_between(snaps),
        "stats": stat_series(session, run.id, stat_rank, points),
    }


def _fit_reason(main) -> str | None:
    """Why the run has no `fit` (None when it has one)."""
    if main is None:
        return "the run has no analysis yet"
    res = main.result or {}
    if res.get("fit"):
        return None
    return res.get("fit_reason") or ("analysed by an older memq that did not say why: "
                                     "`memq reanalyze --run RUN` gives the reason")


def run_forecast(session: Session, run_id: int, rank: int | None = None) -> dict[str, Any] | None:
    """The run's OOM forecast (ARCHITECTURE.md "Forecast"): of the rank that will run out first, else of
    the rank that matters most (the main diagnosis); None before any analysis."""
    q = select(RunDiagnosis.rank, RunDiagnosis.result["forecast"].label("fc")).where(RunDiagnosis.run_id == run_id)
    if rank is not None:
        q = q.where(RunDiagnosis.rank == rank)
    rows = [(r.rank, r.fc) for r in session.execute(q).all() if isinstance(r.fc, dict)]
    if not rows:
        return None
    coming = [(fc.get("eta_s") if fc.get("eta_s") is not None else float("inf"), fc.get("step") or 0, rk, fc)
              for rk, fc in rows if fc.get("oom_expected")]
    if coming:
        _eta, _step, rk, fc = min(coming, key=lambda t: (t[0], t[1], t[2]))
        return dict(fc, rank=rk)
    main = _main_diagnosis(session, run_id, rank)
    fc = next((fc for rk, fc in rows if main is not None and rk == main.rank), rows[0][1])
    return dict(fc, rank=main.rank if main is not None else rows[0][0])


def rank_facts(session: Session, run_id: int) -> list[RankFacts]:
    """What is stored of each rank of a run: its run-level diagnosis, its own exit figures, its first
    OOM snapshot, and its stat samples' maxima (for ranks that sent nothing else)."""
    from memq.store import rank_figures

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
            leak=any(c.get("cause") == "leak" and (c.get("confidence") or 0) >= 0.5 for c in diag.get("causes") or []),
            peak_allocated_bytes=max(peak_a) if peak_a else None, peak_reserved_bytes=max(peak_r) if peak_r else None,
            limit_bytes=f.get("limit_bytes") or ((res.get("oom") or {}).get("limit_bytes")),
            last_step=f.get("last_step"), step_peak_bytes=sp.get("max_peak_allocated"),
            step_median_bytes=sp.get("median_peak_allocated"), steps=f.get("steps"),
            composition={k: int(v or 0) for k, v in (comp or {}).items()},
            oom_at=taken.timestamp() if taken else None, oom_step=o.step if o is not None else None,
            oom_allocated_bytes=o.allocated_bytes if o is not None else None,
            oom_requested_bytes=o.oom_requested_bytes if o is not None else None))
    return out


def rank_section(session: Session, run_id: int) -> dict[str, Any]:
    """The cross-rank diagnosis of a run (profiler/analysis/ranks.py), computed from what is stored
    whenever it is read, so a late run_end or a rank's new snapshot is in it at once."""
    return diagnose_ranks(rank_facts(session, run_id))


def with_rank_advice(diagnosis: dict[str, Any] | None, ranks: dict[str, Any]) -> dict[str, Any] | None:
    """The run's diagnosis with the cross-rank finding first: which rank, why that one, and advice that
    fits it (rebalance the shards rather than a smaller batch for every rank)."""
    if diagnosis is None or ranks.get("failed_rank") is None or ranks.get("imbalance") in (None, "none", "unknown"):
        return diagnosis
    out = dict(diagnosis)
    out["failed_rank"] = ranks["failed_rank"]
    out["recommendations"] = list(ranks["recommendations"]) + list(diagnosis.get("recommendations") or [])
    causes = [dict(c) for c in diagnosis.get("causes") or []]
    for c in causes:
        if c.get("cause") == diagnosis.get("primary_cause"):
            c["evidence"] = list(ranks["evidence"]) + list(c.get("evidence") or [])
            break
    out["causes"] = causes
    return out


def run_limit(run: Run | Any, main: RunDiagnosis | None) -> dict[str, Any]:
    """The limit the run's verdict was judged against, for headers: the cap the run announced, else the
    limit its diagnosis derived (the OOM message's "allowed", the device less memory outside PyTorch), so
    a header never says "limit -" above a verdict that used one."""
    if run.memory_limit_bytes:
        return {"bytes": int(run.memory_limit_bytes), "source": "the run's cap"}
    oom = ((main.result or {}).get("oom") or {}) if main is not None else {}
    if oom.get("limit_bytes"):
        return {"bytes": int(oom["limit_bytes"]), "source": "the OOM analysis"}
    card = card_limit(run)
    if card is not None:
        return {"bytes": card, "source": "the device less memory outside PyTorch"}
    if getattr(run, "gpu_memory_bytes", None):
        # no cap and no OOM: the run could use the whole device, whose total the agent or ingest recorded
        return {"bytes": int(run.gpu_memory_bytes), "source": "the device total"}
    return {"bytes": None, "source": None}


def card_limit(run: Run | Any) -> int | None:
    """An uncapped run's limit from its run_start: the device total less what was held outside its
    PyTorch then. None without both figures."""
    total, outside = getattr(run, "gpu_memory_bytes", None), getattr(run, "non_pytorch_bytes", None)
    if not total or outside is None:
        return None
    return max(0, int(total) - int(outside))


def _diag_dict(d: RunDiagnosis | None) -> dict[str, Any] | None:
    if d is None:
        return None
    res = d.result or {}
    return {"rank": d.rank, "analyzer_version": d.analyzer_version, "snapshot_count": d.snapshot_count,
            "primary_cause": d.primary_cause, "confidence": d.confidence,
            "peak_reserved_bytes": d.peak_reserved_bytes, "peak_allocated_bytes": d.peak_allocated_bytes,
            "peak_composition": d.peak_composition, "metrics": res.get("metrics"), "oom": res.get("oom"),
            "computed_at": iso(d.computed_at)}


def _significant(delta: int, base: int | None) -> bool:
    return abs(delta) >= max(64 * MiB, 0.01 * (base or 0))


def changes_between(snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What changed from each snapshot to the next of the same rank: reserved/allocated deltas,
    composition categories that moved by more than max(64 MiB, 1%), fragmentation, and the cause."""
    out = []
    last_by_rank: dict[int, dict[str, Any]] = {}
    for s in snaps:
        prev = last_by_rank.get(s["rank"])
        last_by_rank[s["rank"]] = s
        if prev is None or s["allocated_bytes"] is None or prev["allocated_bytes"] is None:
            continue
        d_res = (s["reserved_bytes"] or 0) - (prev["reserved_bytes"] or 0)
        d_alloc = s["allocated_bytes"] - prev["allocated_bytes"]
        comp_a, comp_b = prev.get("composition") or {}, s.get("composition") or {}
        comp_delta = {c: int(comp_b.get(c, 0) or 0) - int(comp_a.get(c, 0) or 0) for c in CATEGORIES}
        moved = {c: v for c, v in comp_delta.items() if _significant(v, prev["allocated_bytes"])}
        cause_a = (prev.get("diagnosis") or {}).get("primary_cause")
        cause_b = (s.get("diagnosis") or {}).get("primary_cause")
        frag_a, frag_b = prev.get("fragmentation_ratio"), s.get("fragmentation_ratio")
        notes = []
        if _significant(d_alloc, prev["allocated_bytes"]):
            notes.append(f"allocated {_fmt_delta(d_alloc)}")
        if _significant(d_res, prev["reserved_bytes"]):
            notes.append(f"reserved {_fmt_delta(d_res)}")
        notes += [f"{c} {_fmt_delta(v)}" for c, v in sorted(moved.items(), key=lambda kv: -abs(kv[1]))]
        if frag_a is not None and frag_b is not None and abs(frag_b - frag_a) >= 0.1:
            notes.append(f"fragmentation {frag_a:.2f} -> {frag_b:.2f}")
        if cause_a != cause_b:
            notes.append(f"diagnosis {cause_a} -> {cause_b}")
        out.append({
            "rank": s["rank"], "from_id": prev["id"], "to_id": s["id"],
            "from": _label(prev), "to": _label(s),
            "reserved_delta_bytes": d_res, "allocated_delta_bytes": d_alloc,
            "composition_delta": comp_delta,
            "fragmentation_delta": (round(frag_b - frag_a, 6) if frag_a is not None and frag_b is not None else None),
            "cause_from": cause_a, "cause_to": cause_b,
            "summary": "; ".join(notes) or "no significant change",
        })
    return out


def _label(s: dict[str, Any]) -> str:
    parts = [s["trigger"]]
    if s.get("epoch") is not None:
        parts.append(f"epoch {s['epoch']}")
    if s.get("step") is not None:
        parts.append(f"step {s['step']}")
    return " ".join(parts)


def _fmt_delta(n: int) -> str:
    from memq.units import fmt_bytes

    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n))


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


# ------------------------------------------------------------------------------------------ compare

COMPARED_SETTINGS = ("torch_version", "cuda_version", "driver_version", "gpu_model", "gpu_memory_bytes",
                     "memory_limit_bytes", "allocator_conf", "optimizer", "param_count", "world_size",
                     "cluster", "job", "host")

# Which recorded settings can move each composition category (most direct first).
DRIVERS = {
    "optimizer_state": ("optimizer", "param_count", "world_size", "torch_version"),
    "parameters": ("param_count", "world_size"),
    "gradients": ("param_count", "world_size", "optimizer"),
    "activations": ("labels", "param_count", "torch_version", "allocator_conf"),
    "workspace": ("torch_version", "cuda_version", "driver_version", "gpu_model"),
    "other": ("torch_version", "labels", "allocator_conf"),
    "unknown": ("torch_version", "labels"),
    "cache": ("allocator_conf", "allocator_settings", "torch_version", "memory_limit_bytes"),
}

# Two limits closer than this are one limit: torch's OOM message prints sizes with two decimals of GiB
# (c10 CUDACachingAllocator format_size), so a limit read from "18.85 GiB allowed" is within 0.005 GiB of
# the cap the run announced, and two such readings within 0.01 GiB of each other.
SAME_LIMIT_WITHIN_BYTES = 10 * 2**30 // 1000


def same_limit(a: int | None, b: int | None) -> bool:
    if a is None or b is None:
        return a is b
    return abs(int(a) - int(b)) <= SAME_LIMIT_WITHIN_BYTES


def recorded_allocator_settings(main: RunDiagnosis | None) -> str | None:
    """The allocator settings the snapshots recorded (torch >= 2.3), "defaults" when none differs from
    torch's; None where the snapshots predate the record."""
    rec = (((main.result or {}).get("details") or {}).get("allocator_settings") or {}) if main else {}
    if not rec.get("known"):
        return None
    return ",".join(rec.get("non_default") or []) or "defaults"



def _run_side(session: Session, name: str) -> dict[str, Any]:
    run = _run_row(session, name)
    main = _main_diagnosis(session, run.id, None)
    ranks = rank_section(session, run.id)
    if ranks["failed_rank"] is not None:
        main = _main_diagnosis(session, run.id, ranks["failed_rank"]) or main
    comp = {c: int((main.peak_composition or {}).get(c, 0) or 0) for c in CATEGORIES} if main else None
    side = run_dict(run)
    side["composition"] = comp
    side["limit"] = run_limit(run, main)
    side["allocator_settings"] = recorded_allocator_settings(main)
    side["ranks"] = ranks
    side["diagnosis"] = with_rank_advice((main.result or {}).get("diagnosis") if main else None, side["ranks"])
    return side


def compare_runs(session: Session, a: str, b: str) -> dict[str, Any]:
    A, B = _run_side(session, a), _run_side(session, b)
    comp_delta = None
    if A["composition"] is not None and B["composition"] is not None:
        comp_delta = {c: B["composition"][c] - A["composition"][c] for c in CATEGORIES}
    peaks = {}
    for k in ("peak_reserved_bytes", "peak_allocated_bytes"):
        peaks[k] = {"a": A[k], "b": B[k], "delta": (B[k] - A[k]) if A[k] is not None and B[k] is not None else None}
    fa, fb = A["fragmentation_ratio"], B["fragmentation_ratio"]
    frag = {"a": fa, "b": fb, "delta": round(fb - fa, 6) if fa is not None and fb is not None else None}
    diffs = [{"field": f, "a": A[f], "b": B[f]} for f in COMPARED_SETTINGS
             if A[f] != B[f] and f != "memory_limit_bytes"]
    sa, sb = A["allocator_settings"], B["allocator_settings"]
    if sa is not None and sb is not None and sa != sb:
        # what the allocator ran with, read from the snapshots: a run's announced allocator_conf may be unset
        diffs.append({"field": "allocator_settings", "a": sa, "b": sb, "source": "recorded in the snapshots"})
    la, lb = A["limit"], B["limit"]
    if not same_limit(la["bytes"], lb["bytes"]):
        # the limit each verdict used (a run's cap, else what its OOM analysis derived), not only the
        # announced cap: one run with an OOM-derived limit and one without is a difference, not "-" vs bytes
        diffs.append({"field": "limit", "a": la["bytes"], "b": lb["bytes"], "kind": "bytes",
                      "a_source": la["source"], "b_source": lb["source"]})
    for k in sorted(set(A["labels"]) | set(B["labels"])):
        if A["labels"].get(k) != B["labels"].get(k):
            diffs.append({"field": f"labels.{k}", "a": A["labels"].get(k), "b": B["labels"].get(k)})
    return {"runs": [a, b], "a": A, "b": B, "ranks": {"a": A["ranks"]["ranks"], "b": B["ranks"]["ranks"]},
            "composition": {"a": A["composition"], "b": B["composition"], "delta": comp_delta},
            "composition_delta": comp_delta, "peaks": peaks, "fragmentation": frag,
            "differences": diffs, "explanation": explain_gap(A, B, comp_delta, diffs)}


def explain_gap(A: dict, B: dict, comp_delta: dict[str, int] | None, diffs: list[dict]) -> dict[str, Any]:
    """Which category carries most of the peak gap, and which differing setting can drive it."""
    pa, pb = A.get("peak_allocated_bytes"), B.get("peak_allocated_bytes")
    ra, rb = A.get("peak_reserved_bytes"), B.get("peak_reserved_bytes")
    if comp_delta is None or pa is None or pb is None:
        return {"category": None, "text": "one of the runs has no analysed snapshot; nothing to explain"}
    gap = pb - pa
    reserved_gap = (rb - ra) if ra is not None and rb is not None else None
    cache_delta = (reserved_gap - gap) if reserved_gap is not None else None
    base = {"gap_bytes": gap, "reserved_gap_bytes": reserved_gap, "cache_delta_bytes": cache_delta}
    if abs(gap) >= 64 * MiB:
        # The live bytes carry the gap: the composition category that moved most in its direction.
        sign = 1 if gap > 0 else -1
        cat, delta = max(comp_delta.items(), key=lambda kv: kv[1] * sign)
        if delta * sign < 64 * MiB:
            cat, delta = None, 0
    elif cache_delta is not None and abs(cache_delta) >= 64 * MiB:
        # Same live peak, different cached-but-free memory: allocator behaviour.
        cat, delta = "cache", cache_delta
    else:
        cat, delta = None, 0
    if cat is None:
        text = ("the runs' peaks differ by less than 64 MiB" if abs(gap) < 64 * MiB else
                f"peak allocated differs by {_fmt_delta(gap)} but no single category of the snapshots "
                "carries it (the peak happened between snapshots)")
        return {"category": None, "delta_bytes": 0, **base, "share_of_gap": None, "settings": [], "text": text}
    drivers = DRIVERS.get(cat, ())
    settings = sorted((d for d in diffs if d["field"].split(".")[0] in drivers),
                      key=lambda d: drivers.index(d["field"].split(".")[0]))
    share = (delta / gap) if gap and cat != "cache" else None
    text = f"{cat.replace('_', ' ')} {_fmt_delta(delta)}"
    if share is not None and 0 < share <= 2:
        text += f" ({share:.0%} of the {_fmt_delta(gap)} peak allocated gap)"
    elif cat == "cache":
        text += " of reserved-but-free memory at the same live peak"
    if settings:
        s0 = settings[0]
        text += f"; differing setting that drives it: {s0['field']} {s0['a']} -> {s0['b']}"
    else:
        text += "; no recorded setting that drives it differs (batch size, sequence length or code may)"
    return {"category": cat, "delta_bytes": int(delta), **base,
            "share_of_gap": round(share, 4) if share is not None else None, "settings": settings, "text": text}


# ----------------------------------------------------------------------------------------- versions


def version_key(v: str | None) -> tuple:
    if not v:
        return ((-1,),)
    parts = re.split(r"[.+]", v)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


def torch_versions(session: Session, job: str, regression_threshold: float = 0.10) -> dict[str, Any]:
    """Per torch version over the job's runs: runs, OOM runs and rate, mean/max peak reserved and
    allocated, mean fragmentation. A version is flagged when, against the previous version, its
    mean peak grows by more than `regression_threshold`, its OOM rate rises by 10 points or more,
    or its mean fragmentation grows by 0.1 or more."""
    exists = session.execute(select(func.count()).select_from(Run).where(Run.job == job)).scalar_one()
    if not exists:
        raise NotFound(f"no runs of job {job!r}", hint="list jobs' runs with `memq runs --json`")
    q = (select(Run.torch_version, func.count(), func.sum(case((Run.status == "oom", 1), else_=0)),
                func.avg(Run.peak_reserved_bytes), func.max(Run.peak_reserved_bytes),
                func.avg(Run.peak_allocated_bytes), func.avg(Run.fragmentation_ratio))
         .where(Run.job == job).group_by(Run.torch_version))
    rows = sorted(session.execute(q).all(), key=lambda r: version_key(r[0]))
    out, prev = [], None
    for v, n, ooms, avg_res, max_res, avg_alloc, frag in rows:
        item = {"torch_version": v, "runs": int(n), "oom_runs": int(ooms or 0),
                "oom_rate": round((ooms or 0) / n, 4) if n else None,
                "mean_peak_reserved_bytes": int(avg_res) if avg_res is not None else None,
                "max_peak_reserved_bytes": int(max_res) if max_res is not None else None,
                "mean_peak_allocated_bytes": int(avg_alloc) if avg_alloc is not None else None,
                "mean_fragmentation_ratio": round(float(frag), 4) if frag is not None else None,
                "regression": False, "regressions": []}
        if prev is not None:
            r = item["regressions"]
            if prev["mean_peak_reserved_bytes"] and item["mean_peak_reserved_bytes"] is not None:
                growth = item["mean_peak_reserved_bytes"] / prev["mean_peak_reserved_bytes"] - 1
                if growth > regression_threshold:
                    r.append(f"mean peak reserved +{growth:.0%} vs {prev['torch_version']}")
            if item["oom_rate"] is not None and prev["oom_rate"] is not None and \
                    item["oom_rate"] - prev["oom_rate"] >= 0.10:
                r.append(f"OOM rate {prev['oom_rate']:.0%} -> {item['oom_rate']:.0%} vs {prev['torch_version']}")
            if item["mean_fragmentation_ratio"] is not None and prev["mean_fragmentation_ratio"] is not None and \
                    item["mean_fragmentation_ratio"] - prev["mean_fragmentation_ratio"] >= 0.10:
                r.append(f"fragmentation {prev['mean_fragmentation_ratio']:.2f} -> "
                         f"{item['mean_fragmentation_ratio']:.2f} vs {prev['torch_version']}")
            item["regression"] = bool(r)
        out.append(item)
        prev = item
    return {"job": job, "versions": out}
