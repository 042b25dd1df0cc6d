"""What changed between two snapshots, two runs and two torch versions (pure: the history's dicts in,
plain dicts and lines out). The history page's changes between snapshots, `memq compare`, `memq versions`
and the nightly report's regressions all decide here, with the thresholds of rules.py
(CHANGE_MIN_BYTES, CHANGE_MIN_SHARE, CHANGE_FRAG_RATIO, SAME_LIMIT_WITHIN_BYTES, REGRESSION_*).

- `changes_between(snaps)`: from each snapshot to the next of the same rank.
- `compare_sides(A, B)`: two runs' composition, peaks, differing settings and the explanation of the gap.
- `version_regressions(prev, cur)`: why a torch version is a regression against the job's previous one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.analysis.frames import CATEGORIES
from memq.analysis.rules import (
    CHANGE_FRAG_RATIO,
    CHANGE_MIN_BYTES,
    CHANGE_MIN_SHARE,
    REGRESSION_FRAG,
    REGRESSION_OOM_RATE,
    REGRESSION_PEAK_GROWTH,
    SAME_LIMIT_WITHIN_BYTES,
)
from memq.model import said
from memq.units import fmt_bytes

#: A difference of rates or ratios this close to a threshold is on it (0.1 of 0.3333 and 0.4333).
EPS = 1e-9


# ------------------------------------------------------------------------------------- snapshots


def significant(delta: int, base: int | None) -> bool:
    """A change worth naming: at least CHANGE_MIN_BYTES and CHANGE_MIN_SHARE of what it changed from."""
    return abs(delta) >= max(CHANGE_MIN_BYTES, CHANGE_MIN_SHARE * (base or 0))


def changes_between(snaps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What changed from each snapshot to the next of the same rank (the history's snapshot dicts):
    reserved/allocated deltas, composition categories that moved significantly, fragmentation, and the cause."""
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
        moved = {c: v for c, v in comp_delta.items() if significant(v, prev["allocated_bytes"])}
        cause_a = (prev.get("diagnosis") or {}).get("primary_cause")
        cause_b = (s.get("diagnosis") or {}).get("primary_cause")
        frag_a, frag_b = prev.get("fragmentation_ratio"), s.get("fragmentation_ratio")
        notes = []
        if significant(d_alloc, prev["allocated_bytes"]):
            notes.append(f"allocated {fmt_delta(d_alloc)}")
        if significant(d_res, prev["reserved_bytes"]):
            notes.append(f"reserved {fmt_delta(d_res)}")
        # in words, as every screen names classes and causes ("optimizer state", never `optimizer_state`)
        notes += [f"{said(c)} {fmt_delta(v)}" for c, v in sorted(moved.items(), key=lambda kv: -abs(kv[1]))]
        if frag_a is not None and frag_b is not None and abs(frag_b - frag_a) >= CHANGE_FRAG_RATIO:
            notes.append(f"fragmentation {frag_a:.2f} -> {frag_b:.2f}")
        if cause_a != cause_b:
            notes.append(f"diagnosis {said(cause_a)} -> {said(cause_b)}")
        out.append({
            "rank": s["rank"], "from_id": prev["id"], "to_id": s["id"],
            "from": snapshot_label(prev), "to": snapshot_label(s),
            "reserved_delta_bytes": d_res, "allocated_delta_bytes": d_alloc,
            "composition_delta": comp_delta,
            "fragmentation_delta": (round(frag_b - frag_a, 6) if frag_a is not None and frag_b is not None else None),
            "cause_from": cause_a, "cause_to": cause_b,
            "summary": "; ".join(notes) or "no significant change",
        })
    return out


def snapshot_label(s: dict[str, Any]) -> str:
    parts = [s["trigger"]]
    if s.get("epoch") is not None:
        parts.append(f"epoch {s['epoch']}")
    if s.get("step") is not None:
        parts.append(f"step {s['step']}")
    return " ".join(parts)


def fmt_delta(n: int) -> str:
    return ("+" if n >= 0 else "-") + fmt_bytes(abs(n))



# ------------------------------------------------------------------------------------------ runs

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


def same_limit(a: int | None, b: int | None) -> bool:
    """Two limits within SAME_LIMIT_WITHIN_BYTES (torch prints two decimals of GiB) are one limit."""
    if a is None or b is None:
        return a is b
    return abs(int(a) - int(b)) <= SAME_LIMIT_WITHIN_BYTES


def compare_sides(A: dict[str, Any], B: dict[str, Any]) -> dict[str, Any]:
    """What differs between two runs' sides (pipeline/history._run_side: the run row, the composition and
    limit of its verdict, its recorded allocator settings): composition and peak deltas, the settings
    that differ, and which difference explains the gap."""
    comp_delta = None
    if A["composition"] is not None and B["composition"] is not None:
        comp_delta = {c: B["composition"][c] - A["composition"][c] for c in CATEGORIES}
    peaks = {}
    for k in ("peak_reserved_bytes", "peak_allocated_bytes"):
        peaks[k] = {"a": A[k], "b": B[k], "delta": (B[k] - A[k]) if A[k] is not None and B[k] is not None else None}
    fa, fb = A["fragmentation_ratio"], B["fragmentation_ratio"]
    frag = {"a": fa, "b": fb, "delta": round(fb - fa, 6) if fa is not None and fb is not None else None}
    # what the screens show: at the OOM, the share of reserved free in pieces (memory.pieces_share)
    pa, pb = A.get("pieces_share"), B.get("pieces_share")
    pieces = {"a": pa, "b": pb, "delta": round(pb - pa, 6) if pa is not None and pb is not None else None}
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
    return {"composition": {"a": A["composition"], "b": B["composition"], "delta": comp_delta},
            "composition_delta": comp_delta, "peaks": peaks, "fragmentation": frag, "pieces": pieces,
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
    if abs(gap) >= CHANGE_MIN_BYTES:
        # The live bytes carry the gap: the composition category that moved most in its direction.
        sign = 1 if gap > 0 else -1
        cat, delta = max(comp_delta.items(), key=lambda kv: kv[1] * sign)
        if delta * sign < CHANGE_MIN_BYTES:
            cat, delta = None, 0
    elif cache_delta is not None and abs(cache_delta) >= CHANGE_MIN_BYTES:
        # Same live peak, different cached-but-free memory: allocator behaviour.
        cat, delta = "cache", cache_delta
    else:
        cat, delta = None, 0
    if cat is None:
        text = (f"the runs' peaks differ by less than {CHANGE_MIN_BYTES >> 20} MiB" if abs(gap) < CHANGE_MIN_BYTES else
                f"peak allocated differs by {fmt_delta(gap)} but no single category of the snapshots "
                "carries it (the peak happened between snapshots)")
        return {"category": None, "delta_bytes": 0, **base, "share_of_gap": None, "settings": [], "text": text}
    drivers = DRIVERS.get(cat, ())
    settings = sorted((d for d in diffs if d["field"].split(".")[0] in drivers),
                      key=lambda d: drivers.index(d["field"].split(".")[0]))
    share = (delta / gap) if gap and cat != "cache" else None
    text = f"{cat.replace('_', ' ')} {fmt_delta(delta)}"
    if share is not None and 0 < share <= 2:
        text += f" ({share:.0%} of the {fmt_delta(gap)} peak allocated gap)"
    elif cat == "cache":
        text += " of reserved-but-free memory at the same live peak"
    if settings:
        s0 = settings[0]
        field = s0["field"].split(".")[0]
        # a more direct driver recorded in neither run (two runs ingested without their optimizer): the
        # difference found may drive the gap, it is not shown to (torch 2.10 -> 2.11 does not make AdamW)
        unknown = [d for d in drivers[: drivers.index(field)] if A.get(d) is None and B.get(d) is None]
        name = s0["field"].replace("_", " ")
        if unknown:
            text += (f"; a differing setting that may drive it: {name} {s0['a']} -> {s0['b']} (not recorded for "
                     f"either run: {', '.join(d.replace('_', ' ') for d in unknown)})")
        else:
            text += f"; differing setting that drives it: {name} {s0['a']} -> {s0['b']}"
    else:
        text += "; no recorded setting that drives it differs (batch size, sequence length or code may)"
    return {"category": cat, "delta_bytes": int(delta), **base,
            "share_of_gap": round(share, 4) if share is not None else None, "settings": settings, "text": text}


# -------------------------------------------------------------------------------------- versions


def version_key(v: str | None) -> tuple:
    if not v:
        return ((-1,),)
    parts = re.split(r"[.+]", v)
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in parts)


@dataclass(frozen=True)
class VersionFigures:
    """One torch version of a job, over its runs."""

    torch_version: str | None
    runs: int
    oom_runs: int
    mean_peak_reserved_bytes: int | None
    #: the lists' `pieces` averaged over the version's OOM runs (analysis/memory.pieces_share); None
    #: without an OOM run. Not the fragmentation ratio: healthy runs' 0.7-0.8 would flag a version
    #: whose only change is more healthy runs.
    mean_pieces_share: float | None

    @property
    def oom_rate(self) -> float | None:
        return self.oom_runs / self.runs if self.runs else None


def version_figures(d: Mapping[str, Any]) -> VersionFigures:
    return VersionFigures(d.get("torch_version"), int(d.get("runs") or 0), int(d.get("oom_runs") or 0),
                          d.get("mean_peak_reserved_bytes"), d.get("mean_pieces_share"))


def version_regressions(prev: VersionFigures, cur: VersionFigures, vs: bool = False) -> list[str]:
    """Why `cur` is a regression against the job's previous version `prev` (empty: it is not): its mean
    peak reserved grows by more than REGRESSION_PEAK_GROWTH, its OOM rate rises by REGRESSION_OOM_RATE
    or more, or its share of reserved memory free in pieces at the OOM (`pieces`) by REGRESSION_FRAG or
    more. `vs`: each line names `prev`."""
    tail = f" vs {prev.torch_version}" if vs else ""
    out = []
    if prev.mean_peak_reserved_bytes and cur.mean_peak_reserved_bytes is not None:
        growth = cur.mean_peak_reserved_bytes / prev.mean_peak_reserved_bytes - 1
        if growth > REGRESSION_PEAK_GROWTH:
            out.append(f"mean peak reserved +{growth:.0%}{tail}")
    p, c = prev.oom_rate, cur.oom_rate
    if p is not None and c is not None and c - p >= REGRESSION_OOM_RATE - EPS:
        out.append(f"OOM rate {p:.0%} -> {c:.0%}{tail}")
    pf, cf = prev.mean_pieces_share, cur.mean_pieces_share
    if pf is not None and cf is not None and cf - pf >= REGRESSION_FRAG - EPS:
        out.append(f"pieces at the OOM {pf:.2f} -> {cf:.2f}{tail}")
    return out
