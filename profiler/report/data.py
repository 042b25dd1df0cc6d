"""Gather one report: the figures of one UTC day and one scope, as a plain JSON-able dict.

    with store.session() as s:
        doc = build_report(SqlReportSource(s), dt.date(2026, 11, 29), Scope.parse("cluster=a"))

`source` (profiler/pipeline/report_source.py) answers the report's queries with plain dicts: nothing
here holds a database session, so the figures can be built from any source of those dicts.

The renderers (html, markdown, JSON) only format this dict; nothing here formats for people
beyond short `text` lines. Sections (all byte counts are integers):
- `totals`: runs, completed, OOM runs, near misses, running, crashed.
- `ooms`, `near_misses`: counts by root cause, cluster and job, and the runs (cause, request,
  limit, headroom, first recommendation). A near miss is analysis/headroom.near_miss: a run without
  an OOM whose peak reserved bytes leave under NEAR_MISS_SHARE (5%) of its limit (the per-process cap,
  else the device total).
- `breakdown`: per cause / cluster / job rows with both counts, for the tables and the plot.
- `regressions`: per job, a torch version that ran in the window and, against the job's previous
  version (all history up to the window's end), raised the mean peak reserved by >10%, the OOM
  rate by 10 points, or mean `pieces` at the OOM by 0.1; `new` when the previous report lacked it.
- `fragmented`: runs whose cached free memory is most in pieces (free bytes outside the largest
  free block), with the allocator setting that would help and why.
- `growing`: runs whose memory grows across epochs: the growth model (analysis/growth.py) calls the
  per-epoch floor of allocated bytes (stat samples) a leak, or the run's diagnosis is a leak.
- `changes`: against the previous report of the scope (stored, else computed for the day before).
- `trend`: mean fragmentation and OOM count per day from stored reports plus this one.
- `timelines`: memory timelines of the flagged runs (stat samples, snapshots, limit, OOM).
"""

from __future__ import annotations

import datetime as dt
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from memq.analysis import growth as gm
from memq.analysis.compare import version_figures, version_key, version_regressions
from memq.analysis.headroom import near_miss
from memq.analysis.memory import free_in_pieces
from memq.analysis.recommend import NO_EFFECT
from memq.analysis.rules import NEAR_MISS_SHARE
from memq.analysis.run_verdict import undetermined
from memq.render.forecast_text import forecast_line
from memq.render.step_need_text import step_need_line
from memq.render.words import said
from memq.store.report_queries import Scope, Window
from memq.units import fmt_bytes

SCHEMA = 1
MiB = 1024**2
FRAG_MIN_RATIO = 0.30
FRAG_MIN_BYTES = 256 * MiB
MAX_LISTED = 50
MAX_FRAGMENTED = 10
MAX_TIMELINES = 12
MAX_SIMULATED = 3
Simulator = Callable[[dict, str], "dict | None"]
TREND_DAYS = 14
ALLOC_SETTING = re.compile(r"(expandable_segments:True|max_split_size_mb:\d+|garbage_collection_threshold:[\d.]+|"
                           r"roundup_power2_divisions:\d+)")


class ReportSource(Protocol):
    """Where the figures come from: plain dicts (memq.pipeline.report_source.SqlReportSource)."""

    def window_runs(self, window: Window, scope: Scope) -> list[dict[str, Any]]: ...
    def run_metrics(self, window: Window, scope: Scope) -> dict[int, dict[str, Any]]: ...
    def epoch_floors(self, window: Window, scope: Scope) -> dict[int, list[dict[str, Any]]]: ...
    def diagnosis_parts(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]: ...
    def version_stats(self, window: Window, scope: Scope) -> list[dict[str, Any]]: ...
    def previous_report(self, day: dt.date, scope: Scope) -> dict[str, Any] | None: ...
    def stored_reports(self, scope: Scope, first: dt.date, last: dt.date) -> list[dict[str, Any]]: ...
    def run_history(self, run_name: str, points: int) -> dict[str, Any]: ...


def build_report(source: ReportSource, day: dt.date, scope: Scope, *, previous: dict | None = None,
                 compute_previous: bool = True, timelines: int = MAX_TIMELINES,
                 now: dt.datetime | None = None, simulate: Simulator | None = None) -> dict[str, Any]:
    """The report of `day` (UTC) for `scope`. `previous`: the previous report's document; when
    None it is read from the reports table, or computed for the day before when none is stored
    and `compute_previous`. `simulate` (see `report_source.whatif_simulator`): replays the top fragmented runs'
    last snapshot under the proposed setting with the allocator model."""
    window = Window.for_date(day)
    runs = source.window_runs(window, scope)
    by_id = {r["id"]: r for r in runs}
    metrics = source.run_metrics(window, scope)

    ooms = [r for r in runs if _is_oom(r)]
    near = [r for r in runs if _near_miss(r)]
    fragmented = _fragmented(runs, metrics)
    floors = source.epoch_floors(window, scope)
    growing = _growing(runs, floors)
    listed_ids = ([r["id"] for r in ooms[:MAX_LISTED]] + [r["id"] for r in near[:MAX_LISTED]]
                  + [f["run_id"] for f in fragmented] + [g["run_id"] for g in growing[:MAX_LISTED]]
                  + [r["id"] for r in runs if r["primary_cause"] == "leak"][:MAX_LISTED])
    parts = source.diagnosis_parts(listed_ids)
    growing = _add_leaks(growing, runs, parts, floors)
    for f in fragmented:
        f.update(_setting_for(by_id[f["run_id"]], parts.get(f["run_id"]) or {}, f))
        f["simulated"] = None
    if simulate is not None:
        for f in [f for f in fragmented if f["setting"]][:MAX_SIMULATED]:
            f["simulated"] = simulate(by_id[f["run_id"]], f["setting"])

    if previous is None:
        stored = source.previous_report(day, scope)
        if stored is not None:
            previous = stored["summary"] | {"_source": "stored"}
        elif compute_previous:
            prev_doc = build_report(source, day - dt.timedelta(days=1), scope, compute_previous=False,
                                    previous={}, timelines=0)
            previous = (prev_doc | {"_source": "computed"}) if prev_doc["totals"]["runs"] else None

    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": "memq.report",
        "date": day.isoformat(),
        "scope": scope.key,
        "scope_label": scope.label,
        "window": {"start": _iso(window.start), "end": _iso(window.end)},
        "generated_at": _iso(now or dt.datetime.now(dt.UTC)),
        "totals": _totals(runs, ooms, near),
        "ooms": _incidents(_shown(ooms, parts), parts, kind="oom"),
        "near_misses": _incidents(near, parts, kind="near_miss"),
        "breakdown": _breakdown(_shown(ooms, parts), near),
        "regressions": _regressions(source.version_stats(window, scope), previous),
        "fragmented": [_public(f) for f in fragmented],
        "growing": [_public(g) for g in growing],
    }
    doc["flagged_runs"] = _flagged(doc)
    doc["changes"] = _changes(doc, previous) if previous else None
    doc["trend"] = _trend(source, day, scope, doc)
    doc["timelines"] = _timelines(source, doc, timelines) if timelines else []
    doc["summary"] = summary_lines(doc)
    return doc


# ------------------------------------------------------------------------------------------ pieces


def _iso(v: dt.datetime | None) -> str | None:
    return v.isoformat().replace("+00:00", "Z") if v else None


def _is_oom(r: dict) -> bool:
    return r["status"] == "oom" or (r["oom_count"] or 0) > 0


def _limit(r: dict) -> tuple[int | None, str | None]:
    if r["memory_limit_bytes"]:
        return int(r["memory_limit_bytes"]), "cap"
    if r["gpu_memory_bytes"]:
        return int(r["gpu_memory_bytes"]), "device"
    return None, None


def _near_miss(r: dict) -> bool:
    """analysis/headroom.near_miss on the run row: no OOM, the peak within the last free bytes of the
    run's cap, else of its device."""
    return near_miss(r["peak_reserved_bytes"], _limit(r)[0], oom=_is_oom(r))


def _run_ref(r: dict) -> dict[str, Any]:
    return {"run": r["name"], "job": r["job"], "cluster": r["cluster"], "torch_version": r["torch_version"],
            "status": r["status"], "primary_cause": r["primary_cause"],
            "confidence": round(r["cause_confidence"], 4) if r["cause_confidence"] is not None else None}


def _totals(runs: list[dict], ooms: list[dict], near: list[dict]) -> dict[str, int]:
    st = Counter(r["status"] for r in runs)
    return {"runs": len(runs), "completed": st.get("completed", 0), "running": st.get("running", 0),
            "crashed": st.get("crashed", 0), "oom_runs": len(ooms), "near_misses": len(near),
            "clusters": len({r["cluster"] for r in runs if r["cluster"]}),
            "jobs": len({r["job"] for r in runs if r["job"]})}


def _first_rec(parts: dict) -> dict:
    recs = ((parts.get("diagnosis") or {}).get("recommendations")) or []
    return recs[0] if recs and isinstance(recs[0], dict) else {}


def _first_action(parts: dict) -> str | None:
    return _first_rec(parts).get("action")


def _first_playbook(parts: dict) -> str | None:
    """The playbook entry id of the first recommendation; "" for a result stored before
    recommendations carried one (rendered without a link), None when there is no recommendation."""
    rec = _first_rec(parts)
    return str(rec.get("playbook") or "") if rec else None


def _incidents(rows: list[dict], parts: dict[int, dict], kind: str) -> dict[str, Any]:
    def count(key):
        c = Counter((r[key] or "-") for r in rows)
        return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))

    listed = []
    said_for: dict[str, str] = {}  # why a need is unknown -> the first run whose row said it
    ordered = sorted(rows, key=lambda r: (r["primary_cause"] or "", r["cluster"] or "", r["job"] or "", r["name"]))
    for r in ordered[:MAX_LISTED]:
        p = parts.get(r["id"]) or {}
        oom = p.get("oom") or {}
        limit, limit_kind = _limit(r)
        if oom.get("limit_bytes") and int(oom["limit_bytes"]) != limit:
            # The analysis' limit of the OOM (e.g. device total minus memory held outside PyTorch).
            limit, limit_kind = int(oom["limit_bytes"]), "derived"
        hr = None
        if limit and r["peak_reserved_bytes"] is not None:
            hr = (limit - int(r["peak_reserved_bytes"]), (limit - int(r["peak_reserved_bytes"])) / limit)
        item = _run_ref(r) | {
            "peak_reserved_bytes": r["peak_reserved_bytes"], "peak_allocated_bytes": r["peak_allocated_bytes"],
            "limit_bytes": limit, "limit_kind": limit_kind,
            "headroom_bytes": hr[0] if hr else None, "headroom_ratio": round(hr[1], 6) if hr else None,
            "recommendation": _first_action(p), "recommendation_playbook": _first_playbook(p),
            # an OOM no deciding test settled: its cause is a candidate, read as undetermined
            "undetermined": undetermined(p.get("diagnosis")),
        }
        if kind == "oom":
            item["requested_bytes"] = oom.get("requested_bytes")
            item["fits_if_compacted"] = oom.get("fits_if_compacted")
            item["step_need"] = step_need_line(p.get("diagnosis"))
            short = step_need_line(p.get("diagnosis"), with_basis=False)
            if item["step_need"] and short and item["step_need"] != short:
                # why the need is unknown, said once in the table: later rows point to the first
                why = item["step_need"][len(short):]
                if why in said_for:
                    item["step_need"] = f"{short} (as for {said_for[why]})"
                else:
                    said_for[why] = item["run"]
        listed.append(item)
    return {"count": len(rows), "by_cause": count("cause_shown" if kind == "oom" else "primary_cause"),
            "by_cluster": count("cluster"),
            "by_job": count("job"), "runs": listed, "listed": len(listed)}


def _shown(rows: list[dict], parts: dict[int, dict]) -> list[dict]:
    """The rows with `cause_shown`: "undetermined" for an OOM whose verdict names its cause only as the
    best candidate (the OOM table says so), else the cause; the counts and the chart read it, so the
    summary never counts "capacity 1" above a row that reads "undetermined"."""
    return [r | {"cause_shown": "undetermined" if undetermined((parts.get(r["id"]) or {}).get("diagnosis"))
                 else r["primary_cause"]} for r in rows]


def _breakdown(ooms: list[dict], near: list[dict]) -> dict[str, list[dict]]:
    out = {}
    for key, name in (("cause_shown", "cause"), ("cluster", "cluster"), ("job", "job")):
        o = Counter((r.get(key, r["primary_cause"]) or "-") for r in ooms)
        n = Counter((r.get(key, r["primary_cause"]) or "-") for r in near)
        rows = [{name: k, "ooms": o.get(k, 0), "near_misses": n.get(k, 0)} for k in set(o) | set(n)]
        out[f"by_{name}"] = sorted(rows, key=lambda x: (-(x["ooms"] + x["near_misses"]), x[name]))
    return out


def _regressions(stats: list[dict], previous: dict | None) -> list[dict]:
    by_job: dict[str, list[dict]] = {}
    for s in stats:
        by_job.setdefault(s["job"], []).append(s)
    before = {(r["job"], r["torch_version"]) for r in (previous or {}).get("regressions") or []}
    out = []
    for job, versions in sorted(by_job.items()):
        versions.sort(key=lambda s: version_key(s["torch_version"]))
        for prev, cur in zip(versions, versions[1:], strict=False):
            if not cur["runs_in_window"]:
                continue
            reasons = version_regressions(version_figures(prev), version_figures(cur))
            if not reasons:
                continue
            p_rate, c_rate = prev["oom_runs"] / prev["runs"], cur["oom_runs"] / cur["runs"]
            pf, cf = prev["mean_fragmentation_ratio"], cur["mean_fragmentation_ratio"]
            pp, cp = prev.get("mean_pieces_share"), cur.get("mean_pieces_share")
            out.append({
                "job": job, "torch_version": cur["torch_version"], "previous_version": prev["torch_version"],
                "runs": cur["runs"], "previous_runs": prev["runs"], "runs_in_window": cur["runs_in_window"],
                "oom_rate": round(c_rate, 4), "previous_oom_rate": round(p_rate, 4),
                "mean_peak_reserved_bytes": cur["mean_peak_reserved_bytes"],
                "previous_mean_peak_reserved_bytes": prev["mean_peak_reserved_bytes"],
                "mean_fragmentation_ratio": _r(cf), "previous_mean_fragmentation_ratio": _r(pf),
                "mean_pieces_share": _r(cp), "previous_mean_pieces_share": _r(pp),
                "reasons": reasons, "new": (job, cur["torch_version"]) not in before,
            })
    return out


def _r(x: float | None, nd: int = 4) -> float | None:
    return round(x, nd) if x is not None else None


def _fragmented(runs: list[dict], metrics: dict[int, dict]) -> list[dict]:
    cands = []
    for r in runs:
        m = metrics.get(r["id"]) or {}
        ratio = m.get("fragmentation_ratio", r["fragmentation_ratio"])
        free = m.get("reserved_unallocated_bytes")
        largest = m.get("largest_free_block_bytes")
        if ratio is None or free is None or largest is None:
            continue
        pieces = free_in_pieces(free, largest)  # the one definition memq analyze uses
        reserved = int(m.get("reserved_bytes") or 0)
        if ratio < FRAG_MIN_RATIO or pieces < max(FRAG_MIN_BYTES, 0.05 * reserved):
            continue
        # A figure is alarming only when it is the problem: the run failed for want of a usable block,
        # or, without an OOM, it came within the near-miss headroom, where the pieces are what a larger
        # input runs into. A healthy run with headroom (its ratio is 0.76-0.79 between any two steps)
        # and an OOM of another cause are not "fragmented".
        if r["primary_cause"] != "fragmentation" and not _near_miss(r):
            continue
        cands.append({"run_id": r["id"], **_run_ref(r), "fragmentation_ratio": round(float(ratio), 4),
                      "fragmented_free_bytes": pieces, "free_bytes": int(free),
                      "largest_free_block_bytes": int(largest), "reserved_bytes": reserved,
                      "share_of_reserved": round(pieces / reserved, 4) if reserved else None})
    # OOMs that fragmentation caused first, then the most bytes in pieces.
    cands.sort(key=lambda c: (c["primary_cause"] != "fragmentation", -c["fragmented_free_bytes"], c["run"]))
    return cands[:MAX_FRAGMENTED]


def _setting_for(run: dict, parts: dict, frag: dict) -> dict[str, Any]:
    """The allocator setting that would help a fragmented run, and why."""
    for rec in ((parts.get("diagnosis") or {}).get("recommendations")) or []:
        action = str(rec.get("action", ""))
        m = ALLOC_SETTING.search(action)
        if m and ("PYTORCH_CUDA_ALLOC_CONF" in action or action.startswith("Try ")):
            return {"setting": m.group(1), "why": rec.get("why"), "expected_effect": rec.get("expected_effect"),
                    "playbook": str(rec.get("playbook") or ""), "setting_source": "diagnosis"}
    conf = ((parts.get("allocator_settings") or {}).get("conf")) or run.get("allocator_conf") or ""
    gib = frag["fragmented_free_bytes"] / 1024**3
    if "expandable_segments:true" not in conf.lower().replace(" ", ""):
        return {"setting": "expandable_segments:True",
                "why": f"{gib:.2f} GiB of cached free memory lies outside the largest free block; expandable "
                       "segments grow one mapping per stream instead of leaving split segments behind",
                "expected_effect": f"up to {gib:.2f} GiB more usable for large requests at the same reserved size",
                "playbook": "expandable-segments", "setting_source": "rule"}
    return {"setting": None,
            "why": "expandable_segments:True is already on; the free memory in pieces sits in segments that "
                   "hold live blocks (or in CUDA-graph private pools), which no allocator setting compacts",
            "expected_effect": NO_EFFECT, "playbook": "allocator-settings", "setting_source": "rule"}


def _growing(runs: list[dict], floors: dict[int, list[dict]]) -> list[dict]:
    out = []
    by_id = {r["id"]: r for r in runs}
    for run_id, epochs in floors.items():
        r = by_id.get(run_id)
        if r is None or len(epochs) < 3:
            continue
        limit, _ = _limit(r)
        pts = [gm.Point(x=float(e["epoch"]), live=int(e["min_allocated_bytes"]), label=f"epoch {e['epoch']}",
                        epoch=e["epoch"]) for e in epochs]
        g = gm.assess(pts, "epoch", limit=limit)
        if not g.leak:
            continue
        growth = epochs[-1]["min_allocated_bytes"] - epochs[0]["min_allocated_bytes"]
        out.append({"run_id": run_id, **_run_ref(r), "source": "stat samples",
                    "epochs": len(epochs), "points": g.points, "growth_bytes": growth,
                    "mean_growth_per_epoch_bytes": int(g.trend.slope) if g.trend else None,
                    "summary": g.why,
                    "floors": [e["min_allocated_bytes"] for e in epochs],
                    "epoch_numbers": [e["epoch"] for e in epochs], "leak_evidence": None})
    return out


def _add_leaks(growing: list[dict], runs: list[dict], parts: dict[int, dict], floors: dict) -> list[dict]:
    """Runs the analysis found leaking (comparable snapshots) join those the stat samples flag."""
    have = {g["run_id"]: g for g in growing}
    for r in runs:
        p = parts.get(r["id"]) or {}
        leak = p.get("leak") or {}
        if r["primary_cause"] != "leak" and not leak.get("holds"):
            continue
        gj = leak.get("growth") or {}
        growth = int(gj.get("added_bytes") or 0)
        evidence = next((e for c in ((p.get("diagnosis") or {}).get("causes") or []) if c.get("cause") == "leak"
                         for e in c.get("evidence") or []), None)
        if r["id"] in have:
            have[r["id"]]["source"] = "stat samples and snapshots"
            have[r["id"]]["leak_evidence"] = evidence
            continue
        have[r["id"]] = {"run_id": r["id"], **_run_ref(r), "source": "snapshots",
                         "epochs": len(floors.get(r["id"]) or []),
                         "points": gj.get("points"), "growth_bytes": growth,
                         "mean_growth_per_epoch_bytes": None, "summary": gj.get("summary"),
                         "floors": [], "epoch_numbers": [],
                         "leak_evidence": evidence}
    for g in have.values():
        fc = (parts.get(g["run_id"]) or {}).get("forecast")
        # the forecast as it was made (its time left counted from its own moment, not the report's)
        g["forecast"] = forecast_line(fc, fc.get("as_of_time")) if isinstance(fc, dict) and fc.get("oom_expected") \
            else None
    return sorted(have.values(), key=lambda g: (-(g["growth_bytes"] or 0), g["run"]))


def _public(item: dict) -> dict:
    return {k: v for k, v in item.items() if k != "run_id"}


def _flagged(doc: dict) -> list[dict]:
    """Runs worth a timeline, most serious first, each once: OOMs, growing, near misses, fragmented."""
    seen, out = set(), []
    for why, rows in (("oom", doc["ooms"]["runs"]), ("growing", doc["growing"]),
                      ("near_miss", doc["near_misses"]["runs"]), ("fragmented", doc["fragmented"])):
        for r in rows:
            if r["run"] in seen:
                continue
            seen.add(r["run"])
            out.append({"run": r["run"], "why": why, "primary_cause": r.get("primary_cause")})
    return out


def _changes(doc: dict, prev: dict) -> dict[str, Any]:
    pt, ct = prev.get("totals") or {}, doc["totals"]
    totals = {k: {"previous": pt.get(k), "now": ct[k], "delta": (ct[k] - pt[k]) if pt.get(k) is not None else None}
              for k in ("runs", "oom_runs", "near_misses", "completed", "crashed")}
    pc = (prev.get("ooms") or {}).get("by_cause") or {}
    cc = doc["ooms"]["by_cause"]
    by_cause = {k: {"previous": pc.get(k, 0), "now": cc.get(k, 0), "delta": cc.get(k, 0) - pc.get(k, 0)}
                for k in sorted(set(pc) | set(cc))}
    pjobs = set((prev.get("ooms") or {}).get("by_job") or {})
    cjobs = set(doc["ooms"]["by_job"])
    pflag = {r["run"] for r in prev.get("flagged_runs") or []}
    pfrag = [f.get("fragmentation_ratio") for f in prev.get("fragmented") or []]
    pgrow = {g["run"] for g in prev.get("growing") or []}
    lines = []
    for k, v in totals.items():
        if v["delta"]:
            lines.append(f"{k.replace('_', ' ')} {v['previous']} -> {v['now']} ({v['delta']:+d})")
    for k, v in by_cause.items():
        if v["delta"]:
            lines.append(f"OOMs by {k} {v['previous']} -> {v['now']}")
    new_jobs = sorted(j for j in cjobs - pjobs if j != "-")
    if new_jobs:
        lines.append("jobs with OOMs that had none: " + ", ".join(new_jobs))
    new_regs = [f"{r['job']} on torch {r['torch_version']}" for r in doc["regressions"] if r["new"]]
    if new_regs:
        lines.append("new regressions: " + ", ".join(new_regs))
    return {
        "previous_date": prev.get("date"), "previous_source": prev.get("_source", "given"),
        "totals": totals, "ooms_by_cause": by_cause,
        "jobs_with_new_ooms": new_jobs,
        "jobs_without_ooms_now": sorted(j for j in pjobs - cjobs if j != "-"),
        "new_regressions": [{"job": r["job"], "torch_version": r["torch_version"]} for r in doc["regressions"]
                            if r["new"]],
        "newly_flagged_runs": sorted({r["run"] for r in doc["flagged_runs"]} - pflag),
        "newly_growing_runs": sorted({g["run"] for g in doc["growing"]} - pgrow),
        "previous_fragmented_runs": len(pfrag),
        "lines": lines or ["no change in the counts"],
    }


def _trend(source: ReportSource, day: dt.date, scope: Scope, doc: dict) -> list[dict]:
    """Per day: OOMs, near misses and the mean `pieces` (share of reserved free in pieces) of the listed
    fragmented runs, from the stored reports of the scope over the last TREND_DAYS days plus this one."""
    first = day - dt.timedelta(days=TREND_DAYS - 1)
    points = []
    for rep in source.stored_reports(scope, first, day - dt.timedelta(days=1)):
        s = rep["summary"]
        points.append(_trend_point(str(rep["date"]), s))
    points.append(_trend_point(doc["date"], doc))
    return points


def _trend_point(date: str, s: dict) -> dict:
    frag = [f.get("fragmentation_ratio") for f in s.get("fragmented") or [] if f.get("fragmentation_ratio") is not None]
    pieces = [f["share_of_reserved"] for f in s.get("fragmented") or [] if f.get("share_of_reserved") is not None]
    t = s.get("totals") or {}
    return {"date": date, "runs": t.get("runs"), "oom_runs": t.get("oom_runs"), "near_misses": t.get("near_misses"),
            "fragmented_runs": len(frag), "mean_fragmentation_ratio": round(sum(frag) / len(frag), 4) if frag else None,
            "mean_pieces_share": round(sum(pieces) / len(pieces), 4) if pieces else None,
            "mean_fragmented_free_bytes": (int(sum(f.get("fragmented_free_bytes") or 0 for f in s.get("fragmented"))
                                           / len(s.get("fragmented"))) if s.get("fragmented") else None)}


def _timelines(source: ReportSource, doc: dict, limit: int) -> list[dict]:
    out = []
    for f in doc["flagged_runs"][:limit]:
        tl = run_timeline(source, f["run"])
        tl["why"] = f["why"]
        out.append(tl)
    return out


def run_timeline(source: ReportSource, run_name: str, points: int = 240) -> dict[str, Any]:
    """What a memory timeline plot needs: stat samples (reserved, allocated; max per bucket), the
    snapshots (time, trigger, reserved, allocated), the limit and the OOM (time, request)."""
    return timeline_from_history(source.run_history(run_name, points))


def timeline_from_history(h: dict[str, Any]) -> dict[str, Any]:
    """`run_timeline` from a run's `memq history --json` document."""
    run = h["run"]
    snaps = [{"t": s["taken_at"], "trigger": s["trigger"], "epoch": s["epoch"], "step": s["step"],
              "reserved_bytes": s["reserved_bytes"], "allocated_bytes": s["allocated_bytes"],
              "oom": s["oom"]} for s in h["snapshots"]]
    oom = None
    for s in reversed(snaps):
        if s["trigger"] == "oom" or s["oom"]:
            req = (s["oom"] or {}).get("requested_bytes")
            oom = {"t": s["t"], "reserved_bytes": s["reserved_bytes"], "allocated_bytes": s["allocated_bytes"],
                   "requested_bytes": req}
            break
    limit = run["memory_limit_bytes"]
    limit_kind = "cap" if limit else None
    if not limit:
        oom_limit = ((h.get("run_analysis") or {}).get("oom") or {}).get("limit_bytes")
        if oom_limit:
            limit, limit_kind = oom_limit, "derived"
    series = [{"t": p["t"], "reserved_bytes": p["reserved_bytes"], "allocated_bytes": p["allocated_bytes"],
               "epoch": p["epoch"], "step": p["step"]} for p in h["stats"]["series"]]
    return {"run": run["run"], "job": run["job"], "cluster": run["cluster"], "status": run["status"],
            "primary_cause": run["primary_cause"], "undetermined": undetermined(h.get("diagnosis")),
            "limit_bytes": limit, "limit_kind": limit_kind,
            "peak_reserved_bytes": run["peak_reserved_bytes"], "series": series, "snapshots": snaps, "oom": oom}


# ----------------------------------------------------------------------------------- short summary


def summary_lines(doc: dict) -> list[str]:
    """A few sentences for the top of every format and the webhook."""
    t = doc["totals"]
    lines = [f"{t['runs']} runs in {doc['scope_label']} on {doc['date']}: {t['oom_runs']} OOM, "
             f"{t['near_misses']} near misses (headroom under {NEAR_MISS_SHARE:.0%} of the limit)."]
    if doc["ooms"]["count"]:
        lines.append("OOMs by cause: " + ", ".join(f"{said(k)} {v}" for k, v in doc["ooms"]["by_cause"].items()) + ".")
    regs = doc["regressions"]
    if regs:
        lines.append("Regressions: " + "; ".join(
            f"{r['job']} torch {r['previous_version']} -> {r['torch_version']}: {', '.join(r['reasons'])}"
            + (" (new)" if r["new"] else "") for r in regs[:5]) + ".")
    if doc["growing"]:
        lines.append("Memory grows across epochs: " + ", ".join(
            f"{g['run']} (+{fmt_bytes(g['growth_bytes'] or 0)})" for g in doc["growing"][:5]) + ".")
    if doc["fragmented"]:
        f = doc["fragmented"][0]
        share = f.get("share_of_reserved")
        lines.append(f"Most fragmented: {f['run']} ({fmt_bytes(f['fragmented_free_bytes'])} free in pieces"
                     + (f", {share:.2f} of reserved" if share is not None else "") + ")"
                     + (f"; try {f['setting']}" if f.get("setting") else "") + ".")
    ch = doc.get("changes")
    if ch:
        lines.append(f"Since {ch['previous_date']}: " + "; ".join(ch["lines"][:4]) + ".")
    return lines


def stored_summary(doc: dict) -> dict:
    """What the reports table keeps: the document without the timelines (they are re-read from
    the runs when rendering again)."""
    return {k: v for k, v in doc.items() if k != "timelines"}


# --------------------------------------------------------------------------- what-if of a setting


def simulated_outcome(sim: dict) -> str:
    """One phrase for a simulated setting, with its basis: what the html and markdown reports print."""
    v = sim.get("verdict")
    if sim.get("predicted_oom") is None:
        return "not assessable"
    if v == "survives_window":
        return f"no OOM within the recorded window only (confidence {sim.get('confidence')})"
    return ("still OOM" if sim["predicted_oom"] else "no OOM") + f" (confidence {sim.get('confidence')})"
