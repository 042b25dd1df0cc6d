"""The passes that depend on one snapshot only, and their digest.

A run-level diagnosis looks at every snapshot of a run, but of all but the last it needs only a few
figures (active and reserved bytes, trace peaks, optimizer steps, composition, live blocks by site).
`digest(snap)` is those figures as plain JSON data, stored with the snapshot's own analysis, so a run
diagnosis over N snapshots decodes one blob (the last), not N. `SnapshotDigest.from_json` reads it
back; `analyze()` accepts a digest wherever a snapshot other than the last is expected, and gives
the same result as with the decoded snapshot (tests/analysis/test_digest.py holds it to that).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.analysis.leak import live_blocks
from memq.analysis.memory import composition, memory_metrics
from memq.analysis.provenance import entry_phase, origins, state_sites
from memq.analysis.timeline import replay
from memq.model import Snapshot

#: Bumped whenever what a digest holds, or how a field is computed, changes.
DIGEST_FORMAT = 6

# The parts of the per-snapshot passes that analyze() reads of an earlier snapshot.
_METRICS = ("active_bytes", "reserved_bytes", "fragmentation_ratio", "largest_segment_bytes")
_TIMELINE = ("peak_live_bytes", "peak_reserved_bytes", "optimizer_steps", "last_cycle")
# What the agent said about an earlier snapshot (its per-step figures are read from the last only:
# they are cumulative, so an earlier snapshot's are a prefix of the last one's).
_AGENT = ("trigger", "step", "epoch", "step_in_progress", "step_completed", "comparable", "optimizer", "time",
          "limit_bytes")


def per_snapshot(snap: Snapshot, analyzer_version: str) -> dict:
    """metrics, composition, sites, timeline and live blocks of one snapshot; memoised on it
    (callers never mutate what it returns)."""
    key = ("per_snapshot", analyzer_version)
    done = snap.memo.get(key)
    if done is None:
        m = memory_metrics(snap)
        # the replay first: its pass over the trace leaves what provenance reads of it (made_live_in)
        tl = replay(snap, m["live_requested_bytes"], m["reserved_bytes"])
        comp, sites = composition(snap)
        at = tl.get("peak_index")
        at = at if at is not None else -1
        if at >= 0 and (tl.get("peak_phase") is None or id(snap.trace[at].frames) in state_sites(snap)):
            # recorded without stacks, the trace's order may still place the peak; made by code that keeps
            # per-parameter state, the peak is in the optimizer step (provenance.entry_phase says both)
            tl = {**tl, "peak_phase": entry_phase(snap, at)}
        agent = agent_facts(snap)
        own, why = _own_fit(snap, tl)
        done = snap.memo[key] = {"metrics": m, "composition": comp, "sites": sites, "origins": origins(snap),
                                 "timeline": tl, "live_blocks": live_blocks(snap), "agent": agent,
                                 "fit": own, "fit_reason": why}
    return done


def _own_fit(snap: Snapshot, tl: dict) -> tuple[dict | None, str | None]:
    """The predicted peak at multiples of the input (fit.own_curve), from a trace that holds the run
    from its start and whole steps: the agent's warm-up recording at its defaults; else None and why.
    A trace that starts mid-run (every snapshot of a history="on" run after the first) holds its earlier
    blocks at their recorded size, and replaying it 14 times per snapshot would be work on the ingest
    path for a curve the run already has (`memq fit --run` answers from it on demand)."""
    steps = tl.get("optimizer_steps") or 0
    if not snap.trace:
        return None, "no trace (history recording was paused or off when it was taken)"
    if steps < 2:
        return None, f"its trace holds {steps} optimizer step(s): a whole training step needs two"
    if not tl.get("covers_whole_run"):
        return None, (f"its trace ({steps} optimizer steps) starts mid-run: the run's own fit is read from a trace "
                      "that starts at an empty allocator (the agent's warm-up recording); `memq fit --run` "
                      "answers from a mid-run one")
    from memq.analysis.fit import own_curve, own_curve_reason  # the allocator model: only for a whole run

    curve = own_curve(snap)
    return curve, (None if curve else own_curve_reason(snap))


def agent_facts(snap: Snapshot) -> dict | None:
    """The agent's envelope facts of a snapshot as plain data (None when no agent sent it)."""
    a = snap.agent
    if a is None:
        return None
    out = {k: getattr(a, k) for k in _AGENT}
    out["step_figures"] = [{"step": f.step, "epoch": f.epoch, "peak_allocated": f.peak_allocated,
                            "allocated": f.allocated, "peak_reserved": f.peak_reserved, "reserved": f.reserved,
                            "retries": f.retries, "tokens": f.tokens, "ms": f.ms, "span": f.span, "t": f.time}
                           for f in a.step_figures]
    out["oom_frames"] = list(a.oom_frames)
    return out


@dataclass(frozen=True)
class SnapshotDigest:
    """Stands in for an earlier snapshot of a run in analyze() (never for the last one)."""
    analyzer_version: str
    torch_format: str
    segment_count: int
    trace_count: int
    expandable_segments: bool | None
    has_oom: bool
    warnings: tuple[str, ...]
    per: Mapping[str, Any]

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> SnapshotDigest:
        """Raises ValueError when `doc` is not a digest of this format (the caller decodes the
        blob instead)."""
        try:
            if doc.get("format") != DIGEST_FORMAT:
                raise ValueError(f"digest format {doc.get('format')!r}, expected {DIGEST_FORMAT}")
            sites = list(doc["sites"])
            blocks = {(int(a), int(s)): sites[i] for a, s, i in doc["live_blocks"]}
            per = {"metrics": {k: doc["metrics"][k] for k in _METRICS},
                   "timeline": {k: doc["timeline"][k] for k in _TIMELINE},
                   "composition": {str(k): int(v) for k, v in doc["composition"].items()},
                   "live_blocks": blocks, "fit": doc["fit"], "fit_reason": doc.get("fit_reason"),
                   "agent": None if doc["agent"] is None else {k: doc["agent"][k] for k in _AGENT}}
            return cls(analyzer_version=str(doc["analyzer_version"]), torch_format=str(doc["torch_format"]),
                       segment_count=int(doc["segments"]), trace_count=int(doc["trace_entries"]),
                       expandable_segments=doc["expandable_segments"], has_oom=bool(doc["has_oom"]),
                       warnings=tuple(doc["warnings"]), per=per)
        except (KeyError, TypeError, IndexError, AttributeError) as exc:
            raise ValueError(f"not a snapshot digest ({type(exc).__name__}: {exc})") from exc


def digest(snap: Snapshot, analyzer_version: str) -> dict[str, Any]:
    """The JSON form of SnapshotDigest (sites interned: a live block is [address, size, site index])."""
    p = per_snapshot(snap, analyzer_version)
    sites: dict[str, int] = {}
    blocks = [[a, s, sites.setdefault(site, len(sites))] for (a, s), site in p["live_blocks"].items()]
    return {"format": DIGEST_FORMAT, "analyzer_version": analyzer_version, "torch_format": snap.torch_format,
            "segments": len(snap.segments), "trace_entries": len(snap.trace),
            "expandable_segments": snap.expandable_segments, "has_oom": snap.oom_event() is not None,
            "warnings": list(snap.warnings),
            "metrics": {k: p["metrics"][k] for k in _METRICS},
            "timeline": {k: p["timeline"].get(k) for k in _TIMELINE},
            "composition": dict(p["composition"]), "sites": list(sites), "live_blocks": blocks,
            "agent": None if p["agent"] is None else {k: p["agent"][k] for k in _AGENT}, "fit": p["fit"],
            "fit_reason": p.get("fit_reason")}
