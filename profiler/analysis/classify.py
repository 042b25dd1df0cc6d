"""Root cause: the deciding tests of ARCHITECTURE.md ("Causes"), applied in their fixed precedence.

Each deciding test is a `check_<cause>` function (named so that pytest and readers do not take them
for unit tests); each returns a `Finding`: whether it holds, how strongly, the evidence sentences (with the
numbers), and what is missing when it cannot be settled. The first cause that holds, in
`PRECEDENCE` order, is primary; the others that hold are listed with lower confidence; unsettled
ones are listed with low confidence and the input that would settle them. Pure: facts in, findings out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memq.analysis import frames as fr
from memq.analysis.confidence import confidence
from memq.analysis.headroom import in_last_free_bytes
from memq.analysis.memory import free_in_pieces, segment_needed
from memq.analysis.rules import (
    CUDA_CONTEXT_BYTES,
    EXTERNAL_DEVICE_SHARE,
    EXTERNAL_MIN_BYTES,
    FRAG_SPIKE_LIKE_PENALTY,
    FRAG_UNSETTLED_PENALTY,
    PRIVATE_POOL_SHARE,
    SPIKE_FACTOR,
    STRENGTH,
    WORKSPACE_LIMIT_SHARE,
    MiB,
)
from memq.analysis.step_need import need_sentence
from memq.model import CAUSE_NAMES
from memq.units import fmt_bytes

#: How to give a limit that is not known: both commands exist (files, and a run already stored).
#: What a test that needs the limit misses, said in the same words by every cause that misses it.
NEED_LIMIT = "a limit (--limit, the OOM message's 'allowed', or --device-total)"
LIMIT_HINT = "give the limit (--limit SIZE for files; memq reanalyze --run RUN --limit SIZE for a stored run)"
#: An undetermined verdict's lead names the missing limit without its flags: the recommendation that
#: comes with it (recommend.py, "Give memq the limit ...") says where to find one, once per screen.
LIMIT_LEAD = "the limit is not known (the recommendation says how to give it)"
PRECEDENCE = ("external_memory", "leak", "optimizer_state", "activation_spike", "workspace",
              "allocator_config", "fragmentation", "capacity", "healthy")
CAUSES = frozenset(CAUSE_NAMES)
if set(PRECEDENCE) != CAUSES:  # one vocabulary (memq/model.py), one order of decision (here)
    raise ImportError("classify.PRECEDENCE must order exactly memq.model.CAUSE_NAMES")


@dataclass
class Finding:
    cause: str
    holds: bool
    strength: float = 0.0  # 0..1, how clearly the numbers pass the test
    evidence: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # inputs that would settle an unsettled test
    listed: bool = False  # does not hold, but is part of the story: listed below the primary

    @property
    def settled(self) -> bool:
        return not self.missing


@dataclass
class Facts:
    """Everything the tests read. Sizes in bytes; None = unknown.

    The short names are ARCHITECTURE.md's notation ("Causes"), kept so each test reads like its
    definition: S = the failed request; S_min = the smallest request that rounds to S; A = bytes of
    active blocks; A_req = their requested sizes; R = reserved (the segments' total); `limit` = LIMIT,
    what the allocator may reserve in total."""

    has_oom: bool
    S: int | None
    S_min: int | None  # smallest request that rounds to S under the settings in effect (<= S)
    A: int
    A_req: int
    R: int
    limit: int | None
    limit_source: str | None
    limit_lower_bound: int  # the allocator held this much before, so LIMIT is at least this
    device_total: int | None
    non_pytorch: int | None
    largest_usable: int
    largest_blocked_by_max_split: int  # free block >= S that max_split_size forbids using
    private_pool_free: int  # free bytes cached in private pools (CUDA graphs), unusable by the request
    oom_frames: list
    composition: dict
    peak_live: int | None
    peak_phase: str | None
    peak_frames: list
    earlier_step_peak: int | None  # peak live bytes of earlier training steps of the run
    training_steps_seen: int
    settings_non_default: list[str]
    roundup: bool
    max_split: int
    peak_reserved: int
    leak: dict
    stacks_all: bool  # C++ frames present (stacks="all")
    step_need: Any = None  # step_need.StepNeed of the failing step; None when no step was cut off
    checkpoint_load: dict | None = None  # checkpoint.checkpoint_load: the OOM came restoring a checkpoint
    optimizer_creation: dict | None = None  # the failing request creates optimizer state (see analyze)
    optimizer_name: str | None = None
    largest_known: bool = True  # False for an OOM message alone: it gives no free blocks
    device_free: int | None = None  # the card's free bytes at the OOM
    process_in_use: int | None = None  # the message's "this process has P memory in use" (torch >= 2.1)


def g(n: float | None) -> str:
    """Bytes in an evidence sentence (short: it sits in dozens of f-strings here and in recommend)."""
    return fmt_bytes(n, "brief", unknown="unknown")


def _pct(a: float, b: float) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def check_external(f: Facts) -> Finding:
    out = Finding("external_memory", False)
    if not f.has_oom:
        return out
    if f.device_total is None or f.non_pytorch is None:
        out.missing.append("device total and free memory at the OOM (--device-total, the OOM message or the "
                           "agent's observer) would show memory held outside PyTorch")
        return out
    floor = external_floor(f.device_total)
    fits = f.A + (f.S or 0) <= f.device_total - CUDA_CONTEXT_BYTES
    capped = f.limit is not None and f.limit < f.device_total - f.non_pytorch
    if capped and f.device_free is not None and f.S is not None and f.device_free >= f.S:
        # ARCHITECTURE.md cause 1: a per-process cap ran out while the card still had room for the
        # request (other jobs share the card under their own caps): other processes did not cause it
        if f.non_pytorch > CUDA_CONTEXT_BYTES:
            out.evidence.append(f"{g(f.non_pytorch)} of the card is held outside this process's cache, but the "
                                f"{g(f.limit)} cap ran out while the card still had {g(f.device_free)} free: "
                                f"other processes did not cause this OOM")
        return out
    if f.non_pytorch > floor and fits:
        out.holds = True
        out.strength = min(1.0, f.non_pytorch / (STRENGTH["external_full_at_floor_x"] * floor))
        own = own_outside(f.non_pytorch, f.process_in_use, f.R)
        whose = (own_sentence(own, f.process_in_use, f.R) if own is not None
                 else "another process or library holds the card")
        out.evidence.append(f"{g(f.non_pytorch)} of the {g(f.device_total)} device is held outside PyTorch's "
                            f"cache (more than {g(floor)}): {whose}")
        out.evidence.append(f"PyTorch's live set plus the request ({g(f.A)} + {g(f.S)}) would fit the device "
                            f"minus a normal ~1 GiB context")
    elif f.non_pytorch > CUDA_CONTEXT_BYTES:
        out.evidence.append(f"{g(f.non_pytorch)} is held outside PyTorch's cache (below the {g(floor)} threshold)")
    return out


def check_leak(f: Facts) -> Finding:
    lk = f.leak
    out = Finding("leak", bool(lk.get("holds")), evidence=list(lk.get("evidence", [])))
    if out.holds:
        intervals = max(0, int(lk.get("points") or 0) - 1)
        out.strength = min(1.0, STRENGTH["leak"] + STRENGTH["leak_per_interval"] * intervals)
    elif not lk.get("settled", True):
        out.missing.append(lk["evidence"][0].removeprefix("leak: not settled: ") if lk.get("evidence")
                           else "several snapshots of one run")
        out.evidence = []
    return out


def check_optimizer_state(f: Facts) -> Finding:
    out = Finding("optimizer_state", False)
    opt = f.composition.get(fr.OPTIMIZER_STATE, 0)
    if f.has_oom and f.checkpoint_load is not None:
        return _checkpoint_finding(out, f)
    creation = f.optimizer_creation
    in_opt = creation is not None if f.has_oom else f.peak_phase == "optimizer_step"
    if not in_opt:
        return out
    if f.limit is None:
        out.missing.append("a limit (--limit or the OOM message) to tell whether optimizer state pushed "
                           "memory over it")
        out.evidence.append(f"the {'OOM' if f.has_oom else 'peak'} happens inside the optimizer step "
                            f"({g(opt)} of optimizer state live)")
        return out
    total = f.A + (f.S or 0) if f.has_oom else (f.peak_live or f.A)
    over = total - f.limit
    near = in_last_free_bytes(total, f.limit)
    created = opt + (f.S or 0) if f.has_oom else opt
    if (over > 0 or near) and created >= max(over, 0):
        out.holds = True
        out.strength = STRENGTH["optimizer_first_step"] if f.training_steps_seen <= 1 else STRENGTH["optimizer_later"]
        where = creation["by"] if creation else "frames in torch/optim"
        out.evidence.append(
            f"the {'request of ' + g(f.S) + ' fails' if f.has_oom else 'peak happens'} inside the optimizer "
            f"step while its state is created ({g(opt)} of optimizer state live; {where})")
        out.evidence.append(f"live set + request = {g(total)} against a limit of {g(f.limit)} "
                            f"({'over by ' + g(over) if over > 0 else 'within the last 5%'})")
    elif creation is not None:
        # The state's creation is where it failed, though another test explains why (ARCHITECTURE.md 3).
        out.listed = True
        out.evidence.append(f"the failing request of {g(f.S)} creates optimizer state ({creation['by']}), but "
                            f"live + request = {g(total)} leaves {g(f.limit - total)} of the {g(f.limit)} limit")
    if creation is not None:
        out.evidence.append(optimizer_state_sizes(creation))
    return out


def _checkpoint_finding(out: Finding, f: Facts) -> Finding:
    c = f.checkpoint_load
    out.holds, out.strength = True, STRENGTH["checkpoint_load"]
    where = f" at {c['site']}" if c.get("site") else ""
    loaded = f"{g(c['loaded_bytes'])} loaded so far, " if c.get("loaded_bytes") else ""
    out.evidence.append(f"the OOM came while a checkpoint was being restored onto the GPU{where} ({c['by']}): "
                        f"{loaded}beside the live {g(c['params_bytes'])} of parameters and "
                        f"{g(c['state_bytes'])} of optimizer state, which it will replace")
    out.evidence.append("loading is not a training step: the loaded tensors are copies of the model and the "
                        "optimizer state, not a larger input")
    if f.limit is not None:
        out.evidence.append(f"live + request = {g(f.A + (f.S or 0))} against a limit of {g(f.limit)}")
    return out


def optimizer_state_sizes(c: dict) -> str:
    """The state's bytes and what a leaner optimizer would need, for evidence and advice."""
    name = c.get("optimizer") or ("SGD" if c["multiple"] == 1 else "Adam/AdamW")
    if not c.get("params_bytes"):
        return (f"{name} keeps {c['multiple']}x the parameters' bytes as state ({g(c['state_live_bytes'])} "
                "created so far); the parameters' bytes are unknown here (their blocks carry no frames)")
    lean = ", ".join(f"{k} {g(v)}" for k, v in c["lean"].items())
    return (f"{name} keeps {c['multiple']}x the parameters' bytes as state: {g(c['state_full_bytes'])} for "
            f"{g(c['params_bytes'])} of parameters ({g(c['state_live_bytes'])} created before the failure); "
            f"a leaner optimizer needs less: {lean}")


def check_activation_spike(f: Facts) -> Finding:
    out = Finding("activation_spike", False)
    if not f.has_oom or f.S is None:
        return out
    if f.limit is None:
        out.missing.append(NEED_LIMIT)
        return out
    total = f.A + f.S
    n = f.step_need
    if total <= f.limit and (n is None or n.fits_limit is not False):
        if n is not None and n.bytes is not None:
            out.evidence.append(need_text(n, f.limit))
        return out
    need = f.A_req + (f.S_min or f.S)
    if f.roundup and total > f.limit and need <= f.limit:
        # What the step asked for fits: rounding (allocator_config), not the input, broke the limit.
        out.evidence.append(f"the step asked for {g(need)} before rounding, which fits the limit of "
                            f"{g(f.limit)}: not a spike of the input")
        return out
    earlier = f.earlier_step_peak
    if earlier is None:
        out.missing.append("earlier training steps of the same run (earlier snapshots, or a trace that "
                           "holds a completed optimizer step) to compare this step with")
        out.evidence.append("no completed training step precedes the OOM in the data given, so there is "
                            "no earlier step to compare this one with")
        return out
    est = step_estimate(n, total)
    if est > SPIKE_FACTOR * earlier:
        out.holds = True
        out.strength = min(1.0, est / (STRENGTH["spike_full_at_x"] * earlier))
        if n is not None and n.bytes is not None:
            out.evidence.append(need_text(n, f.limit))
        how = "~" if est > total else ""
        parts = "" if est > total else f" (live {g(f.A)} + request {g(f.S)})"
        out.evidence.append(f"this step needs {how}{g(est)}{parts}, {est / earlier:.1f}x the {g(earlier)} peak of "
                            "the earlier steps: one input needs far more than the others")
    else:
        out.evidence.append(f"this step needs {'~' if est > total else ''}{g(est)}, {est / earlier:.2f}x the "
                            f"earlier steps' peak of {g(earlier)} (a spike is > {SPIKE_FACTOR}x)")
    return out


def step_estimate(n: Any, total: int) -> int:
    """The failing step's need for comparisons: the projection's point, else its lower bound, else live
    + request (which it is never below)."""
    if n is None:
        return total
    return max(total, n.bytes if n.bytes is not None else (n.low or 0))


def need_text(n: Any, limit: int | None) -> str:
    """The failing step's need in one sentence (step_need.need_sentence, the one every screen prints):
    "the failing step needed ~16.4 GiB (15.9-16.9 GiB) against 18.0 GiB: it fits in one piece; <basis>"."""
    j = n.as_json()
    if j.get("limit_bytes") is None and limit and n.bytes is None:
        j["limit_bytes"] = limit
    return need_sentence(j)


def check_workspace(f: Facts) -> Finding:
    out = Finding("workspace", False)
    ws = f.composition.get(fr.WORKSPACE_CAT, 0)
    if f.has_oom and f.oom_frames and fr.is_workspace(f.oom_frames):
        out.holds, out.strength = True, STRENGTH["workspace_request"]
        out.evidence.append(f"the failed request of {g(f.S)} is a cuDNN/cuBLAS/NCCL workspace "
                            f"({fr.stack_signature(f.oom_frames, depth=3)})")
    elif f.peak_frames and fr.is_workspace(f.peak_frames) and (f.has_oom or f.limit):
        out.holds, out.strength = True, STRENGTH["workspace_peak"]
        out.evidence.append(f"the peak of live memory ({g(f.peak_live)}) is reached by a workspace allocation "
                            f"({fr.workspace_frame(f.peak_frames)})")
    elif ws and f.limit and ws > WORKSPACE_LIMIT_SHARE * f.limit:
        out.holds, out.strength = True, STRENGTH["workspace_share"]
        out.evidence.append(f"{g(ws)} of live memory is cuDNN/cuBLAS/NCCL workspace")
    elif f.has_oom and not f.stacks_all:
        out.missing.append('C++ frames (record with stacks="all") would show whether the request is a '
                           "cuDNN/cuBLAS workspace")
    return out


def check_allocator_config(f: Facts) -> Finding:
    out = Finding("allocator_config", False)
    if not f.has_oom or not f.settings_non_default or f.S is None:
        return out
    if f.limit is None:
        out.missing.append("a limit to tell whether the non-default allocator settings turned a fit into an OOM")
        return out
    total = f.A + f.S
    s_req = f.S_min or f.S
    if f.roundup and total > f.limit and f.A_req + s_req <= f.limit:
        out.holds, out.strength = True, STRENGTH["allocator_config"]
        out.evidence.append(f"roundup_power2_divisions rounds live blocks up by {g(f.A - f.A_req)} "
                            f"(allocated {g(f.A)} for {g(f.A_req)} requested) and the request to {g(f.S)} "
                            f"(from as little as {g(s_req)}): without it the live set plus the request "
                            f"({g(f.A_req + s_req)}) would fit the limit of {g(f.limit)}; "
                            f"with it, {g(total)} does not")
    if f.max_split > 0 and f.largest_blocked_by_max_split >= f.S and total <= f.limit:
        out.holds, out.strength = True, max(out.strength, STRENGTH["allocator_config"])
        out.evidence.append(f"a free block of {g(f.largest_blocked_by_max_split)} would hold the request but "
                            f"max_split_size_mb:{f.max_split // MiB} forbids splitting it for a "
                            f"{g(f.S)} request")
    return out


def check_fragmentation(f: Facts) -> Finding:
    out = Finding("fragmentation", False)
    if not f.has_oom or f.S is None:
        return out
    need = segment_needed(f.S)
    limit, src = f.limit, f.limit_source
    if limit is None and f.limit_lower_bound:
        limit, src = f.limit_lower_bound, "a lower bound: the allocator held that much earlier"
    if limit is None:
        out.missing.append(NEED_LIMIT)
        return out
    total = f.A + f.S
    n = f.step_need
    if total <= limit < f.R + need and f.S > f.largest_usable and n is not None and n.fits_limit is False:
        out.evidence.append(f"live + request ({g(total)}) fits the limit of {g(limit)}, but "
                            + need_text(n, limit) + ": a compacted cache would have failed later in the same step")
        return out
    if total <= limit < f.R + need and f.S > f.largest_usable:
        out.holds = True
        out.strength = STRENGTH["fragmentation"] if f.limit is not None else STRENGTH["fragmentation_lower_bound"]
        out.evidence.append(f"live {g(f.A)} + request {g(f.S)} = {g(total)} fits the limit of {g(limit)} "
                            f"({src}), but {g(f.R)} is reserved and a new {g(need)} segment does not fit")
        free = f.R - f.A - f.private_pool_free
        if f.largest_known:
            out.evidence.append(f"the largest usable free block is {g(f.largest_usable)} < the {g(f.S)} request: "
                                f"of the {g(free)} cached free, {g(free_in_pieces(free, f.largest_usable))} is in "
                                "pieces outside that block")
        else:
            out.evidence.append(f"{g(free)} is cached but unallocated and the {g(f.S)} request still failed: "
                                "the free cache is in pieces (the message gives no free blocks; a snapshot "
                                "would show them)")
        # Under a lower bound of the limit the projected step fits too: the limit is at least that bound.
        under_floor = f.limit is None and n is not None and n.high is not None and n.high <= limit
        if n is not None and (n.fits_limit is True or under_floor):
            out.evidence.append(need_text(n, limit))
        elif n is not None:
            # The rest of the step is not settled: fragmentation answers for this request only.
            out.strength -= FRAG_UNSETTLED_PENALTY
            out.evidence.append(need_text(n, limit))
            if f.earlier_step_peak and total > SPIKE_FACTOR * f.earlier_step_peak:
                # Already far above the earlier steps with part of the step to go: maybe a larger input.
                out.strength -= FRAG_SPIKE_LIKE_PENALTY
                out.evidence.append(f"this step already holds {g(total)} with the request, "
                                    f"{total / f.earlier_step_peak:.1f}x the {g(f.earlier_step_peak)} peak of the "
                                    "earlier steps: if its input is larger than theirs, the whole step may not fit "
                                    "the limit either (activation_spike)")
        if f.private_pool_free > PRIVATE_POOL_SHARE * max(1, f.R - f.A):
            out.evidence.append(f"{g(f.private_pool_free)} of the free memory is cached in private pools (CUDA "
                                "graphs still alive): only their replays can use it, and expandable_segments "
                                "does not release it")
    return out


def check_capacity(f: Facts) -> Finding:
    out = Finding("capacity", False)
    if not f.has_oom or f.S is None:
        return out
    if f.limit is None:
        out.missing.append(NEED_LIMIT)
        return out
    total = f.A + f.S
    n = f.step_need
    if total <= f.limit and n is not None and n.fits_limit is False:
        out.holds, out.strength = True, STRENGTH["capacity"]
        out.evidence.append(need_text(n, f.limit))
        return out
    if total > f.limit:
        out.holds = True
        out.strength = min(1.0,
                           STRENGTH["capacity"] + (total - f.limit) / max(1, f.limit) * STRENGTH["capacity_per_over"])
        out.evidence.append(f"the live set alone does not fit: {g(f.A)} live + {g(f.S)} requested = {g(total)} "
                            f"> the limit of {g(f.limit)} ({f.limit_source}), whatever the allocator does")
        top = max(((c, v) for c, v in f.composition.items() if c != fr.UNKNOWN), key=lambda kv: kv[1],
                  default=(None, 0))
        if top[0] and top[1]:
            out.evidence.append(f"{top[0]} is the largest part of the live set: {g(top[1])} "
                                f"({_pct(top[1], f.A)})")
    return out


def check_healthy(f: Facts) -> Finding:
    out = Finding("healthy", not f.has_oom and not f.leak.get("holds"))
    if not out.holds:
        return out
    out.strength = STRENGTH["healthy"]
    if f.limit and f.peak_reserved > f.limit:
        out.strength = STRENGTH["healthy_over_limit"]
        out.evidence.append(f"peak reserved {g(f.peak_reserved)} is above the limit of {g(f.limit)} and the run "
                            "did not fail: the limit given is lower than what the process was allowed "
                            "(check --limit)")
    elif f.limit:
        head = f.limit - f.peak_reserved
        out.evidence.append(f"peak reserved {g(f.peak_reserved)} leaves {g(head)} ({_pct(head, f.limit)}) "
                            f"under the limit of {g(f.limit)}")
        if in_last_free_bytes(f.peak_reserved, f.limit):
            out.strength = STRENGTH["healthy_near_miss"]
            out.evidence.append("headroom is under 5% of the limit: a near miss; a larger input would OOM")
    elif f.device_total:
        # the device is known (a screen shows it as the run's limit) but not what this process may reserve
        # of it: say the share of the device, never "no limit given" beside a limit on the same screen
        share = _pct(f.peak_reserved, f.device_total)
        out.evidence.append(f"no OOM recorded; peak reserved {g(f.peak_reserved)} is {share} of the "
                            f"{g(f.device_total)} device (headroom under a per-process cap needs --limit)")
    else:
        out.evidence.append(f"no OOM recorded; peak reserved {g(f.peak_reserved)} (no limit given to "
                            "compute headroom)")
    return out


#: The checks in ARCHITECTURE.md's precedence; `diagnose` runs them all.
CHECKS = (check_external, check_leak, check_optimizer_state, check_activation_spike, check_workspace,
          check_allocator_config, check_fragmentation, check_capacity, check_healthy)


#: The first evidence line of a weak primary (an OOM with no deciding test settled): its cause is the
#: best-supported candidate, not a finding (run_verdict.undetermined reads it).
UNDETERMINED_LEAD = "no deciding test could be settled with the inputs given"


def diagnose(f: Facts) -> tuple[str, float, list[dict], list[Finding]]:
    findings = [t(f) for t in CHECKS]
    primary = next((x for x in findings if x.holds), None)
    if primary is None:
        # An OOM with nothing settled (no limit): name the best-supported candidate, flagged as weak.
        primary = next((x for x in findings if x.cause == "capacity"), findings[-1])
        primary_conf = confidence("weak_primary")
        primary.evidence.insert(0, UNDETERMINED_LEAD + "; "
                                   + "; ".join([LIMIT_LEAD if m == NEED_LIMIT else m for m in primary.missing]
                                               or [LIMIT_HINT]))
    else:
        earlier = PRECEDENCE[: PRECEDENCE.index(primary.cause)]
        primary_conf = confidence(
            "primary", primary.strength,
            earlier_unsettled=any(x.missing and x.cause in earlier for x in findings),
            # an OOM message gives no free blocks: fragmentation can only be suspected from one
            fragmentation_from_message=primary.cause == "fragmentation" and not f.largest_known)
    causes = [{"cause": primary.cause, "confidence": primary_conf,
               "evidence": primary.evidence + [f"unsettled: {m}" for m in primary.missing if primary.holds]}]
    for x in findings:
        if x is primary:
            continue
        if x.holds:
            causes.append({"cause": x.cause, "confidence": confidence("also_holds", x.strength, primary=primary_conf),
                           "evidence": x.evidence})
        elif x.listed:
            causes.append({"cause": x.cause, "confidence": confidence("listed", primary=primary_conf),
                           "evidence": x.evidence})
        elif x.missing and x.cause != "healthy":
            causes.append({"cause": x.cause, "confidence": confidence("not_settled"),
                           "evidence": x.evidence + [f"not settled: {m}" for m in x.missing]})
    # The primary first, then by confidence (precedence among equals: the sort is stable), so every
    # screen lists them in the order the numbers say.
    causes[1:] = sorted(causes[1:], key=lambda c: -c["confidence"])
    return primary.cause, primary_conf, causes, findings


def own_outside(non_pytorch: int | None, process_in_use: int | None, reserved: int | None) -> int | None:
    """The bytes outside PyTorch's cache that are this process's own (the message's "this process has P
    memory in use" less PyTorch's reserved R) when they are most of it, else None: whose the memory is,
    said where the message tells (ARCHITECTURE.md cause 1). `memq explain` and `memq analyze
    --oom-message` both decide it here, so the two never point at different owners."""
    if non_pytorch is None or process_in_use is None or reserved is None:
        return None
    own = process_in_use - reserved
    return own if own >= non_pytorch / 2 else None


def own_sentence(own: int, process_in_use: int, reserved: int) -> str:
    return (f"{g(own)} of it is this process's own ({g(process_in_use)} in use, {g(reserved)} of it PyTorch's): "
            "its CUDA context, cuBLAS/cuDNN workspaces, NCCL buffers or another framework in the same process, "
            "not another program")


def external_floor(device_total: int) -> int:
    """ARCHITECTURE.md cause 1: memory outside PyTorch counts above max(2 GiB, 10% of device total)."""
    return max(EXTERNAL_MIN_BYTES, int(device_total * EXTERNAL_DEVICE_SHARE))
