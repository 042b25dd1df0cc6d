"""The run history's documents: `memq runs / history / compare / versions`, the web pages and the report's
timelines read these. The rows come from the store (profiler/store/queries.py), every verdict from the
analysis (which rank speaks for a run: analysis/run_verdict.py; the changes between snapshots, runs and
versions: analysis/compare.py; the cross-rank finding: analysis/ranks.py); this module puts them together.
Plain dicts: byte counts stay integers, times are ISO-8601 UTC strings, so a document goes to `--json`
unchanged.

- `list_runs(session, RunFilter(...))`, `get_run(session, name)`: the runs as rows say them;
- `run_history(session, name, rank=None)`: snapshots in time order with their figures and diagnosis, the
  run-level diagnosis (the cross-rank finding first), the forecast, what changed between consecutive
  snapshots, and the stat samples downsampled for a plot;
- `compare_runs(session, a, b)`: composition and peaks side by side, per-category deltas, settings and
  versions that differ, and which difference explains the gap;
- `torch_versions(session, job)`: peak, OOM rate and fragmentation per torch version, regressions.
"""

from __future__ import annotations

from typing import Any

from memq.analysis.compare import (
    VersionFigures,
    changes_between,
    compare_sides,
    version_key,
    version_regressions,
)
from memq.analysis.frames import CATEGORIES
from memq.analysis.ranks import diagnose_ranks, rank_advice_first
from memq.analysis.run_verdict import forecast_rank
from memq.store import queries as q
from memq.store.queries import RunFilter, get_run, iso, list_runs, run_dict, stat_series
from memq.store.sweeps import OOM_ANALYSIS, RUN_CAP, attach_sweeps

__all__ = ["RunFilter", "card_limit", "compare_runs", "get_run", "list_runs", "rank_section", "run_forecast",
           "run_history", "run_limit", "torch_versions", "with_rank_advice"]


# ------------------------------------------------------------------------------------------ history


def run_history(session, name: str, rank: int | None = None, points: int = 60,
                max_snapshots: int = 1000) -> dict[str, Any]:
    run = q.run_row(session, name)
    snaps = q.snapshot_rows(session, run.id, name, rank, max_snapshots)
    attach_sweeps(session, snaps)  # each OOM snapshot's stored what-if sweep (`whatif`), else None
    main = q.main_diagnosis(session, run.id, rank)
    ranks = rank_section(session, run.id)
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


def run_forecast(session, run_id: int, rank: int | None = None) -> dict[str, Any] | None:
    """The run's OOM forecast (ARCHITECTURE.md "Forecast"): of the rank that will run out first
    (analysis/run_verdict.forecast_rank), else of the rank that speaks for the run; None before any
    analysis."""
    rows = q.forecasts(session, run_id, rank)
    if not rows:
        return None
    by_rank = dict(rows)
    first = forecast_rank(by_rank)
    if first is not None:
        return dict(by_rank[first], rank=first)
    main = q.main_diagnosis(session, run_id, rank)
    fc = next((fc for rk, fc in rows if main is not None and rk == main.rank), rows[0][1])
    return dict(fc, rank=main.rank if main is not None else rows[0][0])


def rank_section(session, run_id: int) -> dict[str, Any]:
    """The cross-rank diagnosis of a run (profiler/analysis/ranks.py), computed from what is stored
    whenever it is read, so a late run_end or a rank's new snapshot is in it at once."""
    return diagnose_ranks(q.rank_facts(session, run_id))


def with_rank_advice(diagnosis: dict[str, Any] | None, ranks: dict[str, Any]) -> dict[str, Any] | None:
    """The run's diagnosis with the cross-rank finding first: which rank, why that one, and advice that
    fits it (rebalance the shards rather than a smaller batch for every rank)."""
    if diagnosis is None or ranks.get("failed_rank") is None or ranks.get("imbalance") in (None, "none", "unknown"):
        return diagnosis
    out = dict(diagnosis)
    out["failed_rank"] = ranks["failed_rank"]
    out["recommendations"] = rank_advice_first(ranks["recommendations"], diagnosis.get("recommendations") or [],
                                               ranks.get("imbalance"))
    causes = [dict(c) for c in diagnosis.get("causes") or []]
    for c in causes:
        if c.get("cause") == diagnosis.get("primary_cause"):
            c["evidence"] = list(ranks["evidence"]) + list(c.get("evidence") or [])
            break
    out["causes"] = causes
    return out


def run_limit(run: Any, main: Any) -> dict[str, Any]:
    """The limit the run's verdict was judged against, for headers: the cap the run announced, else the
    limit its diagnosis derived (the OOM message's "allowed", the device less memory outside PyTorch), so
    a header never says "limit -" above a verdict that used one."""
    if run.memory_limit_bytes:
        return {"bytes": int(run.memory_limit_bytes), "source": RUN_CAP}
    oom = ((main.result or {}).get("oom") or {}) if main is not None else {}
    if oom.get("limit_bytes"):
        return {"bytes": int(oom["limit_bytes"]), "source": OOM_ANALYSIS}
    card = card_limit(run)
    if card is not None:
        return {"bytes": card, "source": "the device less memory outside PyTorch"}
    if getattr(run, "gpu_memory_bytes", None):
        # no cap and no OOM: the run could use the whole device, whose total the agent or ingest recorded
        return {"bytes": int(run.gpu_memory_bytes), "source": "the device total"}
    if oom and run.peak_reserved_bytes:
        # an OOM with no limit known: the verdict compared with the peak the allocator held (its lower
        # bound); the header says that bound, never a bare "limit -" above "fits the limit of 16.89 GiB"
        return {"bytes": None, "source": None, "at_least": int(run.peak_reserved_bytes)}
    return {"bytes": None, "source": None}


def card_limit(run: Any) -> int | None:
    """An uncapped run's limit from its run_start: the device total less what was held outside its
    PyTorch then. None without both figures."""
    total, outside = getattr(run, "gpu_memory_bytes", None), getattr(run, "non_pytorch_bytes", None)
    if not total or outside is None:
        return None
    return max(0, int(total) - int(outside))


def _diag_dict(d: Any) -> dict[str, Any] | None:
    if d is None:
        return None
    res = d.result or {}
    return {"rank": d.rank, "analyzer_version": d.analyzer_version, "snapshot_count": d.snapshot_count,
            "primary_cause": d.primary_cause, "confidence": d.confidence,
            "peak_reserved_bytes": d.peak_reserved_bytes, "peak_allocated_bytes": d.peak_allocated_bytes,
            "peak_composition": d.peak_composition, "metrics": res.get("metrics"), "oom": res.get("oom"),
            "computed_at": iso(d.computed_at)}


# ------------------------------------------------------------------------------------------ compare

def recorded_allocator_settings(main: Any) -> str | None:
    """The allocator settings the snapshots recorded (torch >= 2.3), "defaults" when none differs from
    torch's; None where the snapshots predate the record."""
    rec = (((main.result or {}).get("details") or {}).get("allocator_settings") or {}) if main else {}
    if not rec.get("known"):
        return None
    return ",".join(rec.get("non_default") or []) or "defaults"


def _run_side(session, name: str) -> dict[str, Any]:
    run = q.run_row(session, name)
    main = q.main_diagnosis(session, run.id, None)
    ranks = rank_section(session, run.id)
    comp = {c: int((main.peak_composition or {}).get(c, 0) or 0) for c in CATEGORIES} if main else None
    side = run_dict(run)
    side["composition"] = comp
    side["limit"] = run_limit(run, main)
    side["allocator_settings"] = recorded_allocator_settings(main)
    side["ranks"] = ranks
    side["diagnosis"] = with_rank_advice((main.result or {}).get("diagnosis") if main else None, side["ranks"])
    return side


def compare_runs(session, a: str, b: str) -> dict[str, Any]:
    A, B = _run_side(session, a), _run_side(session, b)
    return {"runs": [a, b], "a": A, "b": B, "ranks": {"a": A["ranks"]["ranks"], "b": B["ranks"]["ranks"]},
            **compare_sides(A, B)}


# ----------------------------------------------------------------------------------------- versions


def torch_versions(session, job: str) -> dict[str, Any]:
    """Per torch version over the job's runs: runs, OOM runs and rate, mean/max peak reserved and
    allocated, and the mean `pieces` of its OOM runs (the lists' column: share of reserved memory free in
    pieces at the OOM; `mean_fragmentation_ratio` stays in the JSON for older readers); a version is
    flagged by analysis/compare.version_regressions against the previous version."""
    rows = sorted(q.version_rows(session, job), key=lambda r: version_key(r[0]))
    out, prev = [], None
    for v, n, ooms, avg_res, max_res, avg_alloc, frag, pieces in rows:
        figs = VersionFigures(v, int(n), int(ooms or 0), int(avg_res) if avg_res is not None else None,
                              round(float(pieces), 4) if pieces is not None else None)
        item = {"torch_version": v, "runs": int(n), "oom_runs": int(ooms or 0),
                "oom_rate": round((ooms or 0) / n, 4) if n else None,
                "mean_peak_reserved_bytes": figs.mean_peak_reserved_bytes,
                "max_peak_reserved_bytes": int(max_res) if max_res is not None else None,
                "mean_peak_allocated_bytes": int(avg_alloc) if avg_alloc is not None else None,
                "mean_pieces_share": figs.mean_pieces_share,
                "mean_fragmentation_ratio": round(float(frag), 4) if frag is not None else None,
                "regression": False, "regressions": []}
        if prev is not None:
            item["regressions"] = version_regressions(prev, figs, vs=True)
            item["regression"] = bool(item["regressions"])
        out.append(item)
        prev = figs
    return {"job": job, "versions": out}
