"""Pure analysis of allocator snapshots: plain data in, the JSON contract of ARCHITECTURE.md out.

No torch, sqlalchemy, celery, redis, click, or file/network access here: the same code runs in the
CLI on files, in workers on blobs, and in tests on real fixtures.

    analyze(snapshots, ctx) -> {"schema": 1, "snapshots", "metrics", "oom", "composition",
                                "diagnosis", "details"}

Several snapshots are one run's, in time order; the figures describe the last, the diagnosis uses
all of them.
"""

from __future__ import annotations

import copy
import statistics
from collections import Counter
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from memq.analysis import frames as fr
from memq.analysis.classify import CAUSES, PRECEDENCE, Facts, diagnose
from memq.analysis.fit_reason import missing_reason
from memq.analysis.forecast import forecast as oom_forecast
from memq.analysis.forecast import inputs as forecast_inputs
from memq.analysis.labels import agent_label
from memq.analysis.leak import detect_leak
from memq.analysis.limits import resolve_limits
from memq.analysis.memory import (
    largest_oversize_free_block,
    largest_usable_free_block,
    smallest_request_rounding_to,
)
from memq.analysis.per_snapshot import SnapshotDigest, per_snapshot
from memq.analysis.recommend import message_playbook, message_recommendations, recommend
from memq.analysis.rules import SEGMENT_ROUNDING_BYTES, STATE_REQUEST_MAX_MULTIPLE, STATE_REQUEST_MIN_BYTES
from memq.analysis.step_need import StepNeed, project
from memq.model import OomContext, Snapshot, frame_file, frame_name

# 1.5: growth as a trend; 1.5.1: private pools; 1.5.2: the cross-rank rule; 1.5.3: cause 1 under a cap;
# 1.5.4: fit's changes; 1.5.5: the need in one sentence (step_need.held_bytes), free in pieces outside the
# largest block; 1.5.6: composition by provenance; 1.5.7: inference caches, why unknown is unknown
ANALYZER_VERSION = "1.5.7"
SCHEMA = 1
CONTRACT_METRICS = ("reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
                    "reserved_unallocated_bytes", "largest_free_block_bytes", "fragmentation_ratio",
                    "stranded_bytes")

__all__ = ["ANALYZER_VERSION", "CAUSES", "PRECEDENCE", "analyze", "explain_message", "message_facts"]


def _has_cpp_frames(frames: list) -> bool:
    return any("::" in frame_name(f) or frame_file(f).endswith((".cpp", ".h", ".cu")) for f in frames)


def _head(s: Snapshot | SnapshotDigest) -> tuple[str, int, int, bool | None, bool, tuple[str, ...] | list[str]]:
    """(torch format, segments, trace entries, expandable segments, has an OOM, warnings)."""
    if isinstance(s, SnapshotDigest):
        return s.torch_format, s.segment_count, s.trace_count, s.expandable_segments, s.has_oom, s.warnings
    return s.torch_format, len(s.segments), len(s.trace), s.expandable_segments, s.oom_event() is not None, s.warnings


def _per(s: Snapshot | SnapshotDigest) -> Mapping[str, Any]:
    if isinstance(s, SnapshotDigest):
        if s.analyzer_version != ANALYZER_VERSION:
            raise ValueError(f"a digest made by analyzer {s.analyzer_version} given to {ANALYZER_VERSION}")
        return s.per
    return per_snapshot(s, ANALYZER_VERSION)


def analyze(items: list[Any], ctx: OomContext | None = None, names: list[str] | None = None,
            triggers: list[str | None] | None = None, optimizer: str | None = None,
            whatif: list[dict] | None = None, labels: list[str | None] | None = None,
            figures: list[dict] | None = None) -> dict:
    """`items`: Snapshot objects or objects with a `.snapshot` (and optionally `.path`), in time order.
    `names`: file names (`snapshots[].file`). `labels`: how evidence names each snapshot, in the
    user's terms (labels.snapshot_label from trigger/step/epoch); a snapshot the agent sent labels
    itself from its embedded facts, and the name is the last resort.
    `triggers`: per snapshot (epoch_end, periodic, oom, ...) when known, to pick comparable points
    (else the agent's own). `whatif`: results of the allocator model for the last snapshot, cited by
    the recommendations. `figures`: per-step figures the agent sent in stats batches (the run's series
    beyond what the last snapshot embeds; the growth model reads both, by step). Any item but the last
    may be a SnapshotDigest (see per_snapshot.py): the result is the same."""
    if not items:
        raise ValueError("analyze() needs at least one snapshot")
    snaps: list[Snapshot | SnapshotDigest] = [getattr(x, "snapshot", x) for x in items]
    if isinstance(snaps[-1], SnapshotDigest):
        raise ValueError("the last snapshot of analyze() must be a decoded snapshot, not a digest")
    names = names or [str(getattr(x, "path", f"snapshot{i}")) for i, x in enumerate(items)]
    per = [_per(s) for s in snaps]  # no GC pause here: analysis stays free of global state
    heads = [_head(s) for s in snaps]
    agents = [p.get("agent") for p in per]
    given = [(labels[i] if labels and i < len(labels) else None) for i in range(len(per))]
    tags = [agent_label(agents[i], given[i] or names[i]) or names[i] for i in range(len(per))]
    trig = [(triggers[i] if triggers and i < len(triggers) else None) or (agents[i] or {}).get("trigger")
            for i in range(len(per))]
    optimizer = optimizer or (agents[-1] or {}).get("optimizer")
    last, last_snap = per[-1], snaps[-1]
    m = last["metrics"]
    lim = resolve_limits(last_snap, ctx, m["reserved_bytes"])
    S = lim.requested
    oom_ev = lim.oom_event
    stream = oom_ev.stream if oom_ev is not None else None
    pool = oom_ev.pool_id if oom_ev is not None and oom_ev.pool_id else None
    largest_usable = largest_usable_free_block(last_snap, S, stream, pool) if S else m["largest_free_block_bytes"]
    blocked = largest_oversize_free_block(last_snap, S) if S else 0

    figs = merge_figures((agents[-1] or {}).get("step_figures") or [], figures or [])
    # the growth model's limit: the given or resolved one, else what the agent read (its cap, else the
    # card: an uncapped job runs out where the card does)
    grow_limit = lim.limit or _agent_limit(agents)
    leak = detect_leak(_comparable_points(heads, per, tags, trig), grow_limit, figs,
                       headroom=_headroom(grow_limit, S, m["active_bytes"], figs), at_oom=S is not None)
    earlier_peak, steps_seen = _earlier_step_peak(per)
    oom_frames = (oom_ev.frames if oom_ev is not None and oom_ev.frames else
                  list((agents[-1] or {}).get("oom_frames") or []) if S else [])
    prev = next((i for i in range(len(per) - 2, -1, -1) if not heads[i][4]), None)
    loading = None
    if S:  # the OOM's own rules load with it: a healthy snapshot's command does not import them
        from memq.analysis.checkpoint import checkpoint_load

        loading = checkpoint_load(oom_frames, last_snap, per[prev]["live_blocks"] if prev is not None else None)
    need = None
    if S and loading is None:
        need = _step_need(per, heads, tags, last_snap, m["active_bytes"], S, lim.limit, prev)
    opt_creation = _optimizer_creation(last, S, oom_frames, optimizer)
    peak_reserved = max(max(p["metrics"]["reserved_bytes"], p["timeline"].get("peak_reserved_bytes") or 0)
                        for p in per)
    # The agent's peak counters saw every completed step, not only the snapshots' moments.
    peak_reserved = max([peak_reserved, *(f["peak_reserved"] for f in (agents[-1] or {}).get("step_figures") or [])])
    if need is not None and lim.limit is None:
        need = replace(need, floor=peak_reserved)  # what the fragmentation test compares with (its lower bound)
    tl = last["timeline"]
    peak_frames = []
    if tl.get("peak_index", -1) is not None and tl.get("peak_index", -1) >= 0:
        peak_frames = last_snap.trace[tl["peak_index"]].frames
    stacks_all = _has_cpp_frames(oom_frames) or any(
        _has_cpp_frames(b.frames) for seg in last_snap.segments[:50] for b in seg.blocks[:20])
    s_min = S
    if S and last_snap.settings.roundup_power2_divisions:
        from memq.analysis.whatif import config_from_settings  # the allocator model: only for this OOM

        divs = config_from_settings(last_snap.settings)[0].roundup_power2_divisions
        s_min = smallest_request_rounding_to(S, divs)
    facts = Facts(
        has_oom=S is not None, S=S, S_min=s_min,
        A=m["active_bytes"], A_req=m["live_requested_bytes"], R=m["reserved_bytes"],
        limit=lim.limit, limit_source=lim.limit_source, limit_lower_bound=peak_reserved,
        device_total=lim.device_total, non_pytorch=lim.non_pytorch, device_free=lim.device_free,
        largest_usable=largest_usable, largest_blocked_by_max_split=blocked,
        private_pool_free=sum(p["free_bytes"] for p in m["pools"] if tuple(p["pool_id"]) != (0, 0)),
        oom_frames=oom_frames,
        composition=last["composition"], peak_live=tl.get("peak_live_bytes"), peak_phase=tl.get("peak_phase"),
        peak_frames=peak_frames, earlier_step_peak=earlier_peak, training_steps_seen=steps_seen,
        settings_non_default=last_snap.settings.non_default,
        roundup=bool(last_snap.settings.roundup_power2_divisions), max_split=last_snap.settings.max_split_size,
        peak_reserved=peak_reserved, leak=leak, stacks_all=stacks_all,
        step_need=need, checkpoint_load=loading, optimizer_creation=opt_creation,
        optimizer_name=optimizer,
        process_in_use=ctx.message.process_in_use_bytes if ctx is not None and ctx.message is not None else None,
    )
    primary, conf, causes, _findings = diagnose(facts)
    recs = recommend(primary, facts, optimizer, leak, whatif)

    oom = None
    if S is not None:
        oom = {"requested_bytes": S, "limit_bytes": lim.limit,
               "fits_largest_free_block": S <= largest_usable,
               "fits_if_compacted": (m["active_bytes"] + S <= lim.limit) if lim.limit is not None else None}
    fc, fc_inputs = _forecast(per, heads, trig, lim.limit, figures or [])
    if fc is not None and fc.get("oom_expected"):
        # where the growth is allocated and what to change there: what a page about it must say
        fc["site"] = leak.get("allocating_site") if leak.get("holds") else None
        fc["advice"] = recs[0]["action"] if primary == "leak" and recs else None
    return {
        "schema": SCHEMA,
        "snapshots": [{"file": n, "torch_format": h[0], "segments": h[1], "trace_entries": h[2],
                       "expandable_segments": h[3]} for n, h in zip(names, heads, strict=True)],
        "metrics": {k: m[k] for k in CONTRACT_METRICS},
        "oom": oom,
        "composition": dict(last["composition"]),
        "diagnosis": {"primary_cause": primary, "confidence": conf, "causes": causes,
                      "recommendations": recs,
                      "step_need": None if need is None else need.as_json()},
        "forecast": fc,
        # the run's headroom in batch units, from its last snapshot whose trace holds whole steps
        "fit": _fit(next((p["fit"] for p in reversed(per) if p.get("fit")), None), lim.limit or _agent_limit(agents)),
        # why `fit` is null (None when there is one)
        "fit_reason": None if any(p.get("fit") for p in per) else _fit_reason(tags, per),
        # Deep copies: these parts come from the per-snapshot memo, which callers must not reach.
        "details": copy.deepcopy({
            "analyzer_version": ANALYZER_VERSION,
            "metrics": {k: v for k, v in m.items() if k not in CONTRACT_METRICS},
            "limits": {"requested_bytes": S, "requested_source": lim.requested_source,
                       "limit_bytes": lim.limit, "limit_source": lim.limit_source,
                       "device_total_bytes": lim.device_total, "device_free_bytes": lim.device_free,
                       "non_pytorch_bytes": lim.non_pytorch, "largest_usable_free_block_bytes": largest_usable,
                       "oom_site": fr.stack_signature(oom_frames) if oom_frames else None},
            "composition_sites": last["sites"],
            # each class's bytes by where the class came from: known from the job, or inferred from the trace
            "composition_origin": last.get("origins") or {},
            "timeline": {k: v for k, v in tl.items() if k not in ("step_start_indices",)},
            "peak_reserved_bytes": peak_reserved,
            "checkpoint_load": loading,
            # what the forecast was made from: stats batches move it on (forecast.refresh)
            "forecast_input": dict(fc_inputs, site=(fc or {}).get("site"), advice=(fc or {}).get("advice")),
            "leak": leak,
            "allocator_settings": {"known": last_snap.settings.known, "conf": last_snap.settings.conf,
                                   "non_default": last_snap.settings.non_default},
            "per_snapshot": [{"file": n, "label": t, "trigger": tr, "active_bytes": p["metrics"]["active_bytes"],
                              "reserved_bytes": p["metrics"]["reserved_bytes"],
                              "peak_live_bytes": p["timeline"].get("peak_live_bytes"),
                              "fragmentation_ratio": p["metrics"]["fragmentation_ratio"],
                              "composition": p["composition"]}
                             for n, t, tr, p in zip(names, tags, trig, per, strict=True)],
            "warnings": sorted({w for h in heads for w in h[5]}),
        }),
    }


def _comparable_points(heads, per, names, triggers) -> list[dict]:
    """Snapshots taken at the same kind of point (not the OOM one): the leak test compares these.
    Epoch ends first; else the agent's own `comparable` snapshots (every N steps at the same point
    of a step); else the most common trigger."""
    idx = [i for i, h in enumerate(heads) if not h[4]]
    trig = [(triggers[i] if triggers and i < len(triggers) else None) for i in range(len(per))]
    marked = [i for i in idx if (per[i].get("agent") or {}).get("comparable")]
    if any(trig[i] == "epoch_end" for i in idx):
        idx = [i for i in idx if trig[i] == "epoch_end"]
    elif len(marked) >= 2:
        idx = marked
    else:
        kinds = [trig[i] for i in idx if trig[i] not in (None, "oom")]
        if kinds:
            # The most common trigger; a tie goes to the one seen first, never to set order (which
            # follows string hashes: two processes of one run reached different leak verdicts).
            counts = Counter(kinds)
            common = max(counts, key=lambda k: (counts[k], -kinds.index(k)))
            idx = [i for i in idx if trig[i] == common]
    out = []
    for i in idx:
        a = per[i].get("agent") or {}
        out.append({"name": names[i], "active": per[i]["metrics"]["active_bytes"],
                    "composition": per[i]["composition"], "blocks": per[i]["live_blocks"],
                    "step": a.get("step"), "epoch": a.get("epoch"), "t": a.get("time"),
                    "epoch_end": trig[i] == "epoch_end"})
    return out


def _headroom(limit: int | None, S: int | None, active: int, figs: list) -> int | None:
    """What the growth has to use up: LIMIT less the highest recent step peak (the need of a step, not
    its floor); at an OOM, the room the run's figures started with (the room left is gone by then,
    whatever the cause: only growth that used up a fair part of the start's room is a leak). None where
    it cannot be told (the growth model then takes LIMIT less the last live bytes)."""
    if not limit:
        return None
    peaks = [f["peak_allocated"] for f in figs if isinstance(f.get("peak_allocated"), int)
             and isinstance(f.get("step"), int) and f["step"] >= 1]
    if S is not None:
        return int(limit - max(peaks[:4])) if peaks else None
    return int(limit - max(peaks[-16:] + [active]))


def _agent_limit(agents: list) -> int | None:
    return next(((a or {}).get("limit_bytes") for a in reversed(agents) if (a or {}).get("limit_bytes")), None)


def merge_figures(embedded: list[dict], sent: list[dict]) -> list[dict]:
    """One series from the figures a snapshot embeds and those stats batches sent, by step (the
    snapshot's own reading of a step wins), oldest first."""
    if not sent:
        return list(embedded)
    by_step: dict = {}
    for f in [*sent, *embedded]:
        st = f.get("step") if isinstance(f, dict) else None
        if isinstance(st, int) and not isinstance(st, bool):
            by_step[st] = f
    return [by_step[k] for k in sorted(by_step)]


def _forecast(per: list[dict], heads: list, trig: list, limit: int | None,
              sent: list[dict]) -> tuple[dict | None, dict]:
    """The OOM forecast as of the last snapshot that is not an OOM one (a run that has run out keeps
    the forecast it had before: it can be judged against what happened)."""
    keep = [i for i, h in enumerate(heads) if not h[4]]
    as_of = keep[-1] if keep else len(per) - 1
    agents = [p.get("agent") or {} for p in per]
    upto = agents[as_of].get("step")
    figs = [f for f in merge_figures(agents[-1].get("step_figures") or [], sent)
            if as_of == len(per) - 1 or upto is None or f["step"] <= upto]
    idx = [i for i in keep if agents[i].get("comparable") or trig[i] == "epoch_end"] or keep
    comparable = [{"step": agents[i].get("step"), "epoch": agents[i].get("epoch"),
                   "epoch_end": trig[i] == "epoch_end", "t": agents[i].get("time"),
                   "active": per[i]["metrics"]["active_bytes"], "reserved": per[i]["metrics"]["reserved_bytes"],
                   "peak": per[i]["timeline"].get("peak_live_bytes"),
                   "n_blocks": len(per[i].get("live_blocks") or ())} for i in idx]
    timed = [(a["time"], a["step"]) for a in (agents[i] for i in keep)
             if isinstance(a.get("time"), (int, float)) and isinstance(a.get("step"), int)]
    sps = None
    if len(timed) >= 2 and timed[-1][1] > timed[0][1]:
        sps = (timed[-1][0] - timed[0][0]) / (timed[-1][1] - timed[0][1])
    elif figs and any(f.get("ms") for f in figs):
        sps = statistics.median(f["ms"] for f in figs if f.get("ms")) / 1000.0
    # A running run's limit: the given one, else what its agent read at its last boundary (a cap set
    # after agent.start reaches the service no other way before the OOM).
    limit = limit or agents[as_of].get("limit_bytes") or agents[-1].get("limit_bytes")
    kw = {"largest_segment": per[as_of]["metrics"].get("largest_segment_bytes") or None, "seconds_per_step": sps,
          "composition": [dict(per[i]["composition"]) for i in idx], "comparable": comparable,
          "as_of_time": agents[as_of].get("time")}
    return oom_forecast(figs, limit, **kw), forecast_inputs(figs, limit, **kw)


def _earlier_step_peak(per: list[dict]) -> tuple[int | None, int]:
    """Peak live bytes of completed training steps before the last one, from earlier snapshots and
    from the last trace up to the start of its last optimizer step."""
    peaks = []
    steps = 0
    for p in per[:-1]:
        t = p["timeline"]
        if (t.get("optimizer_steps") or p["composition"].get(fr.OPTIMIZER_STATE)) and t.get("peak_live_bytes"):
            peaks.append(t["peak_live_bytes"])
            steps += max(1, t.get("optimizer_steps") or 0)
    t = per[-1]["timeline"]
    sp = t.get("step_peaks") or []
    if t.get("optimizer_steps"):
        steps += t["optimizer_steps"]
        if len(sp) >= 2:
            peaks.extend(sp[:-1])
    # The agent's per-step figures (completed steps, from the allocator's peak counters).
    figs = (per[-1].get("agent") or {}).get("step_figures") or []
    peaks.extend(f["peak_allocated"] for f in figs)
    steps = max(steps, len(figs))
    return (max(peaks) if peaks else None), steps


#: Earlier recorded steps tried as the failing step's reference (the latest ones: the same code and
#: shapes are likeliest there, and each costs an alignment).
MAX_REFERENCES = 3


def _fit_reason(names: list, per: list[dict]) -> str:
    return missing_reason([(str(n), p.get("fit_reason") or ("no trace" if p.get("fit") is None else None))
                           for n, p in zip(names, per, strict=True)])


def _fit(curve_doc: dict | None, limit: int | None) -> dict | None:
    if not curve_doc:
        return None
    from memq.analysis.fit import headroom  # the allocator model behind it: only for a run with a curve

    return copy.deepcopy(headroom(curve_doc, limit))


def _step_need(per, heads, tags, last_snap: Snapshot, A: int, S: int, limit: int | None,
               prev: int | None) -> StepNeed:
    """The failing step's need (step_need.py) against the best-aligned earlier recorded step."""
    refs = []
    if per[-1]["timeline"].get("last_cycle"):
        refs.append((per[-1]["timeline"]["last_cycle"], "the step before it in the OOM snapshot's trace"))
    for i in range(len(per) - 2, -1, -1):
        if len(refs) >= MAX_REFERENCES:
            break
        if per[i]["timeline"].get("last_cycle"):
            refs.append((per[i]["timeline"]["last_cycle"], f"the last step recorded in the {tags[i]}"))
    cur = per[-1]["timeline"].get("current_step")
    peak_so_far = None
    if cur:  # the OOM snapshot's own trace shows the failing step from its boundary
        blocks, peak_so_far = cur["blocks"], cur.get("peak_so_far")
    elif prev is not None:
        # At agent defaults: what is live now and was not at the previous snapshot, at its requested size.
        before = per[prev]["live_blocks"]
        blocks = [b.requested_size or b.size for seg in last_snap.segments for b in seg.blocks
                  if b.is_live and (b.address, b.size) not in before]
    else:
        blocks = [k[1] for k, site in per[-1]["live_blocks"].items() if site == fr.NO_FRAMES]
    if not refs:
        return replace(project(None, None, blocks, S, A, limit, peak_so_far), limit=limit)
    tries = [project(r, src, blocks, S, A, limit, peak_so_far) for r, src in refs]
    return replace(max(tries, key=lambda t: (t.bytes is not None, t.matched_share or 0.0)), limit=limit)


def _optimizer_creation(last: Mapping[str, Any], S: int | None, oom_frames: list, optimizer: str | None) -> dict | None:
    """When the failing request is the optimizer state's own creation: by its frames (torch/optim),
    or, without frames, an OOM in the first optimizer step (no step completed before it) whose
    request is a parameter-sized tensor. Returns the state's bytes and what leaner optimizers need."""
    if not S:
        return None
    comp = last["composition"]
    params = comp.get(fr.PARAMETERS, 0)
    by = None
    if oom_frames and fr.is_optimizer(oom_frames):
        by = "its frames are in torch/optim"
    elif not oom_frames:  # frames elsewhere (the loss, a layer's forward) say it is not the optimizer's
        a = last.get("agent") or {}
        figs = a.get("step_figures") or []
        cur = a.get("step_in_progress")
        first = cur is not None and not any(f["step"] < cur for f in figs) and a.get("step_completed") is None
        # A block holds its request rounded up, or a whole segment when the rest is too small to split.
        sized = any(S <= k[1] < S + SEGMENT_ROUNDING_BYTES for k in last["live_blocks"])
        # One parameter's state tensor is at most that parameter's size (twice it for fp32 state of
        # half-precision parameters; a flat state buffer at most all of them): a request larger than
        # twice all the parameters is an activation of the same size as a live one (the logits of a
        # 4x longer sequence, tests/fixtures/ddp_ranks/data), not state being created.
        state_sized = not params or S <= STATE_REQUEST_MAX_MULTIPLE * params + SEGMENT_ROUNDING_BYTES
        if first and sized and state_sized and S >= STATE_REQUEST_MIN_BYTES:
            by = (f"the OOM is in the first optimizer step (step {cur}, no step completed before it) and the "
                  "request is the size of a parameter tensor")
    if by is None:
        return None
    kind = (optimizer or "").lower()
    mult = 1 if "sgd" in kind else 2  # SGD momentum keeps 1x the parameters, Adam(W) 2x
    state = comp.get(fr.OPTIMIZER_STATE, 0)
    return {"by": by, "state_live_bytes": state, "state_full_bytes": mult * params if params else None,
            "params_bytes": params, "optimizer": optimizer, "multiple": mult,
            "lean": {"SGD with momentum": params, "8-bit AdamW (bitsandbytes)": params // 2} if params else {}}


def message_facts(ctx: OomContext) -> Facts:
    """The facts an OOM message (and the CLI's limits) give: no snapshot, so no composition, frames,
    free blocks or history."""
    msg = ctx.message
    A = msg.allocated_bytes if msg else None
    R = msg.reserved_bytes if msg else None
    lim = resolve_limits(None, ctx, R)
    S = lim.requested
    return Facts(
        has_oom=S is not None, S=S, S_min=S, A=A or 0, A_req=A or 0, R=R or 0,
        limit=lim.limit, limit_source=lim.limit_source, limit_lower_bound=0, device_total=lim.device_total,
        non_pytorch=lim.non_pytorch, largest_usable=0, largest_blocked_by_max_split=0, private_pool_free=0,
        oom_frames=[],
        composition={}, peak_live=None, peak_phase=None, peak_frames=[],
        earlier_step_peak=None, training_steps_seen=0, settings_non_default=[],
        roundup=False, max_split=-1, peak_reserved=R or 0, leak={"holds": False, "settled": False,
                                                                 "evidence": ["one message, no snapshots"]},
        stacks_all=False, largest_known=False, device_free=lim.device_free,
    )


def explain_message(ctx: OomContext) -> dict:
    """The contract from an OOM message alone: what the message carries, null for the rest, and the
    verdict its own figures settle (message_verdict.py), with advice for that situation first."""
    from memq.analysis.message_verdict import judge  # only with a message: not for a snapshot

    msg = ctx.message
    if msg is None:
        raise ValueError("explain_message() needs a parsed message")
    v = judge(msg, limit=ctx.limit_bytes, device_total=ctx.device_total_bytes)
    A, R, S = msg.allocated_bytes, msg.reserved_bytes, msg.requested_bytes
    unalloc = msg.reserved_unallocated_bytes
    causes = [{"cause": v.primary, "confidence": v.confidence, "evidence": v.evidence}]
    causes += [{"cause": c, "confidence": conf, "evidence": e} for c, conf, e in v.others if c != v.primary]
    recs = message_recommendations(v, msg)
    T = v.figures.get("device_total")
    F = msg.device_free_bytes
    non_pt = (T - F - R) if (T is not None and F is not None and R is not None) else None
    return {
        "schema": SCHEMA,
        "snapshots": [],
        "metrics": {"reserved_bytes": R, "allocated_bytes": A, "active_bytes": None, "requested_bytes": None,
                    "reserved_unallocated_bytes": unalloc, "largest_free_block_bytes": None,
                    "fragmentation_ratio": None, "stranded_bytes": None},
        "oom": None if S is None else {"requested_bytes": S, "limit_bytes": v.limit,
                                       "fits_largest_free_block": None,
                                       # MPS's cap counts the process's other Metal allocations too
                                       "fits_if_compacted": (A + (msg.other_allocations_bytes or 0) + S <= v.limit)
                                       if (A is not None and v.limit) else None},
        "composition": {c: None for c in fr.CATEGORIES},
        "diagnosis": {"primary_cause": v.primary, "confidence": v.confidence, "causes": causes,
                      "recommendations": recs},
        # The playbook entries the message's own figures point to (and popular advice they rule out).
        # Only where the message's figures alone decide between the cache and the step (a cap, another
        # process, graphs' pools or a failure outside the allocator have their own advice above).
        "playbook": (message_playbook(message_facts(ctx), unalloc, msg.text)
                     if v.situation in ("fragmentation", "near_limit", "capacity", "external", "own_libraries", "cap")
                     else []),
        "details": {"analyzer_version": ANALYZER_VERSION,
                    "message_verdict": v.situation,
                    "message_layout": msg.layout, "message_kind": msg.kind, "platform": msg.platform,
                    "server": msg.server, "truncated": msg.truncated, "notes": list(msg.notes),
                    "other_processes": [{"pid": pid, "bytes": b} for pid, b in msg.other_processes],
                    "limits": {"requested_bytes": S, "limit_bytes": v.limit, "limit_source": v.limit_source,
                               "device_total_bytes": T, "device_free_bytes": F,
                               "this_process_bytes": msg.process_in_use_bytes,
                               "private_pool_bytes": msg.private_pool_bytes,
                               "non_pytorch_bytes": non_pt},
                    "message": msg.text},
    }
