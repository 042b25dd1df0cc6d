"""Across the ranks of one run: which rank failed first, why that one, and what sets it apart
(pure: plain data in, a plain dict out).

Data-parallel jobs fail one rank at a time and the launcher then tears the others down, so each rank's
own diagnosis says `capacity` for the failing rank and nothing for the rest. What helps is the
comparison: with the same parameters and optimizer state on every rank, a rank whose step needs far
more than the others' is fed larger inputs (data imbalance: rebalance or bucket the shards; a smaller
batch for every rank would waste the memory of all the others); a rank that holds more parameter or
optimizer bytes is sharded unevenly (state imbalance); a rank whose own diagnosis is a leak while the
others' is not leaks through rank-specific code (logging, metrics, checkpointing on rank 0). A rank that
needs far more while no rank's composition is known is `uneven`: one rank differs, and what to compare
is said, but not guessed which.

The figures of a rank come from wherever they were recorded: the agent's exit figures (run_end: run
peaks, last step, limit, the per-step peaks' summary), the rank's run-level diagnosis (peaks,
composition at the peak) and its OOM snapshot (live bytes and the failed request).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memq.analysis.rules import LEAK_LISTED_CONFIDENCE
from memq.units import fmt_bytes

MIB = 1 << 20
#: Two ranks' state (parameters, optimizer state) differ when they differ by more than this much and
#: by more than STATE_REL of the larger one: DDP replicas are identical to the byte.
STATE_ABS = 64 * MIB
STATE_REL = 0.10
#: A rank's step needs "far more" than the others' when its activation bytes exceed theirs this much.
DATA_FACTOR = 1.5
#: Peaks of ranks that did not fail are called unbalanced past this ratio (a warning before an OOM).
PEAK_FACTOR = 1.3
# Met on the real two-rank captures (tests/fixtures/ddp_ranks, H200, 2026-12-01), wide margins, so left
# as they were: balanced - step peaks equal to the byte (1.00x against PEAK_FACTOR); data (4x the
# tokens on rank 1) - rank 1's 15.72 GiB of activations against rank 0's whole 6.12 GiB peak, 2.6x
# against DATA_FACTOR; state - parameters and optimizer state equal to the byte on both ranks of every
# capture (difference 0 against STATE_ABS). The leak capture's rank 1 reads 2.08x the other's activations
# (11.88 against 5.70 GiB): past DATA_FACTOR, which is why a rank's own leak is checked before the
# activation comparison. A milder skew (1.3x the tokens, about 1.3x the activations here) stays under
# DATA_FACTOR and reads as balanced: not captured.


@dataclass(frozen=True)
class RankFacts:
    """What is known of one rank; every figure may be missing."""

    rank: int
    status: str | None = None                 # run_end: completed, oom, crashed (torn down)
    end_reason: str | None = None             # run_end: sigterm, process_group_aborted, exception ...
    cause: str | None = None                  # the rank's own run-level primary cause
    confidence: float | None = None
    leak: bool = False                        # its run-level diagnosis lists a leak that holds
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    limit_bytes: int | None = None
    last_step: int | None = None
    step_peak_bytes: int | None = None        # the largest per-step peak of live bytes (agent figures)
    step_median_bytes: int | None = None      # the median per-step peak
    steps: int | None = None
    composition: Mapping[str, int] = field(default_factory=dict)   # at its peak (or the OOM)
    oom_at: float | None = None               # epoch seconds of its first OOM snapshot
    oom_step: int | None = None
    oom_allocated_bytes: int | None = None    # live bytes A at the OOM
    oom_requested_bytes: int | None = None    # the failed request S


def rank_facts_from(rank: int, end: Mapping[str, Any], result: Mapping[str, Any] | None = None, *,
                    oom_step: int | None = None, oom_at: float | None = None) -> RankFacts:
    """A rank from what its agent sent: the run_end payload (`status`, `figures`) and the analysis of its
    snapshots taken together (analysis.analyze's dict; None for a rank torn down before any snapshot).
    The store builds the same facts from its rows (store/queries.rank_facts)."""
    figs = end.get("figures") or {}
    sp = figs.get("step_peaks") or {}
    base = dict(rank=rank, status=end.get("status"), end_reason=figs.get("end_reason"),
                limit_bytes=figs.get("limit_bytes"), last_step=figs.get("last_step"), steps=figs.get("steps"),
                step_peak_bytes=sp.get("max_peak_allocated"), step_median_bytes=sp.get("median_peak_allocated"),
                peak_reserved_bytes=figs.get("peak_reserved_bytes"))
    if result is None:
        return RankFacts(**base, peak_allocated_bytes=figs.get("peak_allocated_bytes"))
    d, oom = result["diagnosis"], result.get("oom")
    peaks = [v for v in (figs.get("peak_allocated_bytes"), result["metrics"]["allocated_bytes"]) if v is not None]
    return RankFacts(**base, cause=d["primary_cause"], confidence=d["confidence"],
                     leak=leak_listed(d),
                     peak_allocated_bytes=max(peaks), composition=result["composition"],
                     oom_at=oom_at if oom else None, oom_step=oom_step if oom else None,
                     oom_allocated_bytes=result["metrics"]["allocated_bytes"] if oom else None,
                     oom_requested_bytes=oom.get("requested_bytes") if oom else None)


def leak_listed(diagnosis: Mapping[str, Any] | None) -> bool:
    """Whether a diagnosis lists a leak that holds (confidence at least LEAK_LISTED_CONFIDENCE): a rank's
    own leak, read the same from a fresh result and from a stored one (store/queries.rank_facts)."""
    return any(c.get("cause") == "leak" and (c.get("confidence") or 0) >= LEAK_LISTED_CONFIDENCE
               for c in (diagnosis or {}).get("causes") or [])


def _state(c: Mapping[str, int]) -> tuple[int | None, int | None]:
    """(parameters, optimizer state) bytes; None when the composition is unknown."""
    if not c:
        return None, None
    return int(c.get("parameters") or 0), int(c.get("optimizer_state") or 0)


def need_bytes(f: RankFacts) -> int | None:
    """What the rank's biggest step needed: A + S at its OOM, else its peak live bytes."""
    if f.oom_allocated_bytes is not None:
        return f.oom_allocated_bytes + (f.oom_requested_bytes or 0)
    vals = [v for v in (f.step_peak_bytes, f.peak_allocated_bytes) if v is not None]
    return max(vals) if vals else None


def activation_bytes(f: RankFacts) -> int | None:
    """What the step itself needed beyond the rank's state (parameters, gradients, optimizer state)."""
    need = need_bytes(f)
    if need is None:
        return None
    c = f.composition
    if not c:
        return None
    state = sum(int(c.get(k) or 0) for k in ("parameters", "gradients", "optimizer_state"))
    return max(0, need - state)


def _differs(a: int, b: int) -> bool:
    return abs(a - b) > max(STATE_ABS, STATE_REL * max(a, b))


def _gib(n: int | None) -> str:
    return fmt_bytes(n, "GiB", unknown="?")


def failed_ranks(facts: Iterable[RankFacts]) -> list[RankFacts]:
    """Ranks that ran out of memory, earliest first (time of the OOM snapshot, else its step, then the
    lowest rank): the order run_verdict.py reads too."""
    bad = [f for f in facts if f.oom_at is not None or f.oom_allocated_bytes is not None or f.status == "oom"]
    big = float("inf")
    return sorted(bad, key=lambda f: (f.oom_at if f.oom_at is not None else big,
                                      f.oom_step if f.oom_step is not None else big, f.rank))


def _row(f: RankFacts) -> dict[str, Any]:
    params, opt = _state(f.composition)
    return {"rank": f.rank, "status": f.status, "end_reason": f.end_reason, "cause": f.cause,
            "confidence": f.confidence, "oom_step": f.oom_step, "last_step": f.last_step,
            "peak_allocated_bytes": f.peak_allocated_bytes, "peak_reserved_bytes": f.peak_reserved_bytes,
            "step_peak_bytes": f.step_peak_bytes, "need_bytes": need_bytes(f), "limit_bytes": f.limit_bytes,
            "parameters_bytes": params, "optimizer_state_bytes": opt,
            "activations_bytes": activation_bytes(f)}


def diagnose_ranks(facts: Iterable[RankFacts]) -> dict[str, Any]:
    """The cross-rank section of a run's diagnosis."""
    facts = sorted(facts, key=lambda f: f.rank)
    out: dict[str, Any] = {"world": len(facts), "ranks": [_row(f) for f in facts], "failed_rank": None,
                           "failed_ranks": [], "cause": None, "imbalance": None, "evidence": [],
                           "recommendations": []}
    if len(facts) < 2:
        out["evidence"].append("one rank recorded: nothing to compare across ranks")
        return out
    failed = failed_ranks(facts)
    out["failed_ranks"] = [f.rank for f in failed]
    ev: list[str] = out["evidence"]
    if not failed:
        return _no_failure(facts, out)
    first = failed[0]
    out["failed_rank"], out["cause"] = first.rank, first.cause
    others = [f for f in facts if f.rank != first.rank and f not in failed] or \
             [f for f in facts if f.rank != first.rank]
    when = f" at step {first.oom_step}" if first.oom_step is not None else ""
    ev.append(f"rank {first.rank} ran out of memory first{when} ({first.cause or 'cause unknown'})"
              + (f"; also out of memory later: rank {', '.join(str(f.rank) for f in failed[1:])}"
                 if len(failed) > 1 else ""))
    torn = [f.rank for f in others if f.status in ("crashed", "running") or f.end_reason]
    if torn:
        ev.append(f"rank {', '.join(map(str, torn))} ended without an OOM of its own (torn down after rank "
                  f"{first.rank} failed)")
    out["imbalance"] = _imbalance(first, others, ev)
    out["recommendations"] = _advice(out["imbalance"], first, others)
    return out


def _imbalance(first: RankFacts, others: list[RankFacts], ev: list[str]) -> str:
    # A rank's own leak first: blocks it keeps from before a snapshot's trace read as parameters by
    # provenance, which would make a leak look like uneven sharding
    if first.leak or first.cause == "leak":
        if not any(f.leak or f.cause == "leak" for f in others):
            ev.append(f"rank {first.rank}'s live bytes grow (between comparable points or step boundaries: its "
                      "own diagnosis is a leak); the other ranks' do not")
            return "leak"
        ev.append("every rank leaks: the growth is not specific to one rank")
        return "none"
    p1, o1 = _state(first.composition)
    states = [_state(f.composition) for f in others if f.composition]
    if p1 is not None and states:
        p0 = int(statistics.median(p for p, _ in states))
        with_opt = [o for _, o in states if o]
        if _differs(p1, p0):
            ev.append(f"rank {first.rank} holds {_gib(p1)} of parameters, the other ranks {_gib(p0)}: "
                      "the model is not replicated evenly")
            return "state"
        if o1 and with_opt and _differs(o1, int(statistics.median(with_opt))):
            ev.append(f"rank {first.rank} holds {_gib(o1)} of optimizer state, the other ranks "
                      f"{_gib(int(statistics.median(with_opt)))}")
            return "state"
    a1 = activation_bytes(first)
    acts = [a for a in (activation_bytes(f) for f in others) if a is not None]
    n1 = need_bytes(first)
    needs = [n for n in (need_bytes(f) for f in others) if n is not None]
    if a1 is not None and acts:
        a0 = max(acts)
        if a1 > DATA_FACTOR * max(a0, 1):
            ev.append(f"rank {first.rank}'s step needed {_gib(a1)} beyond its parameters, gradients and optimizer "
                      f"state, the other ranks' steps at most {_gib(a0)} ({a1 / max(a0, 1):.1f}x) with the same "
                      "parameters: its inputs are larger (data imbalance)")
            return "data"
    elif a1 is not None and needs and a1 > DATA_FACTOR * max(max(needs), 1):
        # A rank torn down before its first snapshot sent only its exit figures (a peak, no composition).
        # Its whole peak bounds its activations from above, and the failing rank's own composition says
        # how little of its need is state: more activation bytes than the others' entire peaks cannot
        # be state held unevenly (the real capture tests/fixtures/ddp_ranks/data: 15.7 GiB against 6.1).
        ev.append(f"rank {first.rank}'s step needed {_gib(a1)} beyond its parameters, gradients and optimizer "
                  f"state, more than the other ranks' whole peak of at most {_gib(max(needs))} "
                  f"({a1 / max(max(needs), 1):.1f}x; they sent no composition, so their peak stands in for their "
                  "activations): its inputs are larger (data imbalance)")
        return "data"
    elif n1 is not None and needs and n1 > DATA_FACTOR * max(needs):
        ev.append(f"rank {first.rank} needed {_gib(n1)}, the other ranks at most {_gib(max(needs))} "
                  f"({n1 / max(max(needs), 1):.1f}x); no composition to separate inputs from state, so the "
                  "kind of imbalance is not settled (a snapshot of the failing rank with frames would settle it)")
        return "uneven"  # one rank unlike the others, but not "data": the evidence does not say which
    if n1 is not None and needs:
        ev.append(f"rank {first.rank} needed {_gib(n1)}, the other ranks up to {_gib(max(needs))}: "
                  "the ranks are balanced, the job as a whole does not fit")
    else:
        ev.append("the other ranks sent no figures (no run_end figures, no snapshots): "
                  "whether one rank differs is not known")
        return "unknown"
    return "none"


def _advice(kind: str | None, first: RankFacts, others: list[RankFacts]) -> list[dict[str, str]]:
    r = first.rank
    if kind == "data":
        return [{"action": f"Rebalance the data across ranks: rank {r} gets larger inputs than the others "
                           "(check the sampler/sharding: DistributedSampler over the whole shuffled dataset, "
                           "not pre-split files), or bucket samples by length so every rank's batch has a "
                           "similar token count; cap the tokens per batch rather than the batch size",
                 "why": f"rank {r}'s step needs far more activation memory than the other ranks' with the "
                        "same parameters and optimizer state",
                 "expected_effect": f"every rank's step near the others' peak; rank {r} no longer runs out "
                                    "of memory. A smaller batch for all ranks would only waste the others' memory",
                 "playbook": "rank-imbalance"}]
    if kind == "state":
        return [{"action": f"Even out what rank {r} holds: check the parameter/optimizer sharding (FSDP/ZeRO "
                           "partition sizes, uneven gradient buckets) and modules or buffers created on one "
                           "rank only (EMA copies, metrics, a rank-0 evaluation model)",
                 "why": f"rank {r} holds more parameter or optimizer bytes than the other ranks",
                 "expected_effect": "the same state bytes on every rank, and rank "
                                    f"{r}'s headroom back to the others'",
                 "playbook": "rank-imbalance"}]
    if kind == "leak":
        return [{"action": f"Look for code that runs on rank {r} only (if rank == {r}: logging, metrics, "
                           "checkpoint or evaluation code keeping tensors or graphs alive) and release "
                           "what it keeps",
                 "why": f"rank {r}'s live bytes grow while the other ranks' stay flat",
                 "expected_effect": f"rank {r} flat like the others; the OOM goes away",
                 "playbook": "rank-imbalance"}]
    if kind == "uneven":
        return [{"action": f"Compare rank {r} with the others before shrinking every rank: its inputs (the "
                           "sampler/sharding, sequence lengths) and what it holds (parameter or optimizer "
                           "sharding, modules or buffers created on that rank only)",
                 "why": f"rank {r} needed far more memory than the other ranks, and nothing recorded says "
                        "whether its inputs or its state are larger",
                 "expected_effect": f"the difference found and removed: rank {r} near the others' peak",
                 "playbook": "rank-imbalance"}]
    if kind == "none":
        return [{"action": "Follow the failing rank's diagnosis: every rank needs about the same memory, "
                           "so the fix applies to all of them",
                 "why": "no rank differs from the others in state, inputs or growth",
                 "expected_effect": "see the rank's own recommendations",
                 # balanced ranks: the section says to compare them before shrinking every rank's batch
                 "playbook": "rank-imbalance"}]
    return []


def _no_failure(facts: list[RankFacts], out: dict[str, Any]) -> dict[str, Any]:
    needs = {f.rank: need_bytes(f) for f in facts if need_bytes(f) is not None}
    ev = out["evidence"]
    if len(needs) < 2:
        ev.append("no OOM; too few ranks with figures to compare")
        return out
    top = max(needs, key=needs.get)
    rest = [v for k, v in needs.items() if k != top]
    med = statistics.median(rest)
    if med and needs[top] > PEAK_FACTOR * med:
        out["imbalance"] = "peak"
        ev.append(f"no OOM, but rank {top} peaks at {_gib(needs[top])}, the other ranks around {_gib(int(med))} "
                  f"({needs[top] / med:.1f}x): it will be the first to run out of memory")
    else:
        out["imbalance"] = "none"
        ev.append(f"no OOM; the ranks' peaks are within {PEAK_FACTOR}x of each other")
    return out


#: Advice that shrinks every rank's step: wrong for a data imbalance, where one rank's inputs are larger
#: and a smaller batch for all would only waste the others' memory (recommend.py's actions).
_SHRINK_EVERY_RANK = ("Reduce the step's memory", "Reduce activation memory", "Leave more headroom",
                      "Leave the step headroom")


def rank_advice_first(rank_recs: list[dict], own: list[dict], imbalance: str | None) -> list[dict]:
    """The cross-rank advice first, then the failing rank's own, less what a data imbalance makes wrong."""
    if imbalance == "data":
        own = [r for r in own if not str(r.get("action") or "").startswith(_SHRINK_EVERY_RANK)]
    return list(rank_recs) + list(own)

