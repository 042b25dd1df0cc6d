"""What every live byte is, by provenance: the one place that decides a live block's class.

Every screen (composition, the segment map, the category timeline, `memq analyze`, the report) reads
`block_classes`, so one block has one class everywhere (ARCHITECTURE.md "Composition and phase").

A frame name that happens to be on a stack is weak evidence: with stacks="all" every forward
allocation passes `torch::autograd::VariableType::*` (forward dispatch), and a gradient is allocated
by the backward node that computed it (`MmBackward0::apply`), not by `AccumulateGrad`, which only
keeps it. So a class comes from where in the step a block was made and whether it outlived it:
- made in optimizer code: optimizer state (it is live, so it persists);
- made by the autograd engine (its frames, or, with stacks="python", no frames at all: the engine's
  thread records none) and still live once backward is over, or the size of a parameter without
  its gradient yet: gradients;
- live and never allocated inside the trace (it predates the recording) when the trace starts with a
  forward or with the recording itself: parameters and buffers (for inference: weights and caches);
- library workspaces by their frames;
- the rest that forward made and that is still live: activations.
Pure: a Snapshot in, plain data out; memoised on the snapshot.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from memq.analysis import frames as fr
from memq.model import Snapshot

# Where a class came from, as the screens say it.
FROM_FRAMES = "frames"  # the allocation's own stack names the code that made it
FROM_TRACE = "trace"  # when in the recorded step it was made, and that it outlived the step
FROM_SIZE = "size"  # frameless: its size matches a parameter's
BEFORE_TRACE = "before_trace"  # live, allocated before the recording began

PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = "forward", "backward", "optimizer_step"


class BlockClass(NamedTuple):
    cls: str
    source: str
    event: int  # index of the trace entry that allocated it; -1 when it predates the trace


def event_phase(frames: list, trace_has_frames: bool) -> str | None:
    """The phase of one trace entry. The autograd engine's frames, or none at all in a trace that
    records Python frames elsewhere (the engine's thread has no Python stack), are backward;
    optimizer code is the optimizer step; any other framed entry is forward (or setup)."""
    if not frames:
        return PHASE_BACKWARD if trace_has_frames else None
    if fr.is_optimizer(frames):
        return PHASE_OPTIMIZER
    if fr.is_backward(frames):
        return PHASE_BACKWARD
    return PHASE_FORWARD


def block_classes(snap: Snapshot) -> dict[int, BlockClass]:
    """Live block address -> its class. Memoised on the snapshot (callers never mutate it)."""
    done = snap.memo.get("block_classes")
    if done is None:
        done = snap.memo["block_classes"] = _classify(snap)
    return done


def _classify(snap: Snapshot) -> dict[int, BlockClass]:
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    trace = snap.trace
    trace_has_frames = any(ev.frames for ev in trace[-4000:]) or any(ev.frames for ev in trace[:4000])
    # The entry that made each block still live at the end: the last alloc at its address.
    made: dict[int, int] = {}
    for i, ev in enumerate(trace):
        if ev.addr is None:
            continue
        if ev.action == "alloc":
            made[ev.addr] = i
        elif ev.action == "free_completed":
            made.pop(ev.addr, None)
    # Where backward ended: the last engine entry, and whether forward or the optimizer ran after it.
    last_bwd = -1
    after_bwd = False
    for i in range(len(trace) - 1, -1, -1):
        ev = trace[i]
        if ev.action != "alloc" and ev.action != "free_requested":
            continue
        ph = event_phase(ev.frames, trace_has_frames)
        if ph == PHASE_BACKWARD:
            last_bwd = i
            break
        if ph in (PHASE_FORWARD, PHASE_OPTIMIZER):
            after_bwd = True
    out: dict[int, BlockClass] = {}
    undecided = []
    param_sizes: Counter = Counter()
    for b in live:
        i = made.get(b.address, -1)
        frames = b.frames or (trace[i].frames if i >= 0 else [])
        if i < 0 and not b.frames:
            if trace:
                out[b.address] = BlockClass(fr.PARAMETERS, BEFORE_TRACE, -1)
                param_sizes[b.size] += 1
            else:
                undecided.append(b)
            continue
        cat = fr.categorize(frames) if frames else fr.UNKNOWN
        if cat in (fr.OPTIMIZER_STATE, fr.WORKSPACE_CAT, fr.GRADIENTS, fr.PARAMETERS):
            out[b.address] = BlockClass(cat, FROM_FRAMES, i)
            if cat == fr.PARAMETERS:
                param_sizes[b.size] += 1
            continue
        ph = event_phase(frames, trace_has_frames) if i >= 0 else (fr.phase_of(frames) if frames else None)
        if ph == PHASE_BACKWARD:
            undecided.append(b)  # a gradient or a backward intermediate: decided by size below
            continue
        if frames:
            # Made in forward (or setup) by code no rule names, and still live: forward's output.
            keep = cat != fr.OTHER or i < 0
            out[b.address] = BlockClass(cat if keep else fr.ACTIVATIONS, FROM_FRAMES if keep else FROM_TRACE, i)
        else:
            undecided.append(b)
    _split_predating(live, out, trace, trace_has_frames, last_bwd)
    for b in undecided:
        i = made.get(b.address, -1)
        if param_sizes.get(b.size, 0) > 0:
            param_sizes[b.size] -= 1
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_SIZE if not trace_has_frames else FROM_TRACE, i)
        elif i >= 0 and trace_has_frames and (after_bwd or not _in_backward_at_end(trace, last_bwd)):
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_TRACE, i)
        elif i >= 0 and trace_has_frames:
            out[b.address] = BlockClass(fr.ACTIVATIONS, FROM_TRACE, i)
        else:
            out[b.address] = BlockClass(fr.UNKNOWN, FROM_TRACE, i)
    return out


def _split_predating(live: list, out: dict, trace: list, trace_has_frames: bool, last_bwd: int) -> None:
    """Gradients that predate the recording. A backward ran inside the trace but left no gradient made
    there (it accumulated in place into `.grad` kept from an earlier step): each parameter then has a
    gradient of its size among the blocks older than the trace, so of every size those blocks come in,
    half are gradients (Adam's state, when it predates too, is found by its frames' absence the same
    way only with the optimizer named, so it is left to the parameters here)."""
    if last_bwd < 0 or _in_backward_at_end(trace, last_bwd):
        return
    if any(bc is not None and bc.cls == fr.GRADIENTS and bc.event >= 0 for bc in out.values()):
        return
    if any(b.address not in out and made_in_backward(b, trace, trace_has_frames) for b in live):
        return
    groups: dict[int, list] = {}
    for b in live:
        bc = out.get(b.address)
        if bc is not None and bc.source == BEFORE_TRACE:
            groups.setdefault(b.size, []).append(b)
    for same in groups.values():
        for b in same[len(same) - len(same) // 2:]:
            out[b.address] = BlockClass(fr.GRADIENTS, BEFORE_TRACE, -1)


def made_in_backward(b, trace: list, trace_has_frames: bool) -> bool:
    frames = b.frames
    return bool(frames) and event_phase(frames, trace_has_frames) == PHASE_BACKWARD


def _in_backward_at_end(trace: list, last_bwd: int) -> bool:
    """True when the recording stops inside backward (an OOM or a dump from a hook in backward): a
    block made there may still be an intermediate of the remaining backward, not a kept gradient."""
    return last_bwd >= 0 and any(ev.action == "oom" for ev in trace[last_bwd:])


def composition(snap: Snapshot) -> tuple[dict, dict]:
    """Live bytes by class, and the top allocation sites of each (every screen's composition)."""
    totals = dict.fromkeys(fr.CATEGORIES, 0)
    sites: dict[str, Counter] = {c: Counter() for c in fr.CATEGORIES}
    classes = block_classes(snap)
    trace = snap.trace
    for seg in snap.segments:
        for b in seg.blocks:
            if not b.is_live:
                continue
            bc = classes.get(b.address)
            cls = bc.cls if bc else fr.UNKNOWN
            totals[cls] += b.size
            frames = b.frames or (trace[bc.event].frames if bc and bc.event >= 0 else [])
            if frames:
                site = fr.stack_signature(frames)
            elif bc and bc.source == BEFORE_TRACE:
                site = "<allocated before the trace began>"
            elif bc and bc.cls == fr.GRADIENTS:
                site = "<autograd thread, matches a parameter's size>"
            else:
                site = "<no frames>"
            sites[cls][site] += b.size
    top = {c: [{"site": s, "bytes": n} for s, n in sites[c].most_common(5)] for c in fr.CATEGORIES if sites[c]}
    return totals, top
