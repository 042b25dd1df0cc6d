"""What every live byte is, by provenance: the one place that decides a live block's class.

Every screen (composition, the segment map, the category timeline, `memq analyze`, `memq fit`'s peak,
the report) reads `block_classes`, so one block has one class everywhere (ARCHITECTURE.md "Composition
and phase"), and says where the class came from: known from the job (the agent's roles) or inferred
from the trace.

Evidence, strongest first:
- the agent's roles (agent/roles.py): a block holding a storage the job's optimizer or model owns is
  that class, whatever its frames say or whenever it was made;
- the block's own stack, or the stack of the trace entry that made it: optimizer code, library
  workspaces, parameter creation and loading, gradient accumulation;
- when in the step it was made and whether it outlived it: made by the autograd engine (its frames,
  or, with stacks="python", no frames at all: the engine's thread records none) and still live once
  backward is over, at a parameter's size: gradients; made in forward and still live: activations;
- blocks older than the trace with no frames of their own: parameters only with evidence, either the
  optimizer state's sizes (Adam keeps 2 blocks per parameter of its size, SGD momentum 1: the
  parameters it implies that nothing else accounts for), or a trace that covers the step from its start
  while nothing else is known to be a parameter and there is no optimizer state (forward only,
  inference). Otherwise they stay unknown: a leak kept from earlier steps, or the activations of a step
  whose start fell out of a short ring buffer, also predate the trace.
With no trace at all (recording off, or paused after warm-up) and no roles, untraced.py reads the model's
state from the snapshot's layout and the frames a paused history left, said "inferred from sizes and
addresses" on every screen.
A frame name that happens to be on a stack is weak evidence: with stacks="all" every forward
allocation passes `torch::autograd::VariableType::*` (forward dispatch), and a gradient is allocated
by the backward node that computed it (`MmBackward0::apply`), not by `AccumulateGrad`, which only
keeps it. Pure: a Snapshot in, plain data out; memoised on the snapshot.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from typing import Any, NamedTuple

from memq.analysis import frames as fr
from memq.analysis.frames import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, event_phase
from memq.analysis.rules import (
    CACHE_MIN_BLOCKS,
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_MAX_BLOCKS,
    CUBLAS_WORKSPACE_OLD_BYTES,
    CUBLAS_WORKSPACES_PER_STREAM,
    INFERENCE_MIN_CALLS,
    OPTIMIZER_SGD_MULTIPLE,
    ORDER_GRADIENT_SHARE,
    PER_PARAM_STATE_MIN_TENSORS,
    STATE_COUNT_SHARE,
    STATE_LEAD_MAX,
    STATE_REQUEST_MIN_BYTES,
    STATE_SPLIT_SHARE,
    STEP_START_ORPHAN_FREES,
)
from memq.analysis.timeline import made_live_in
from memq.analysis.untraced import (
    AFTER_HISTORY,
    FROM_LAYOUT,
    LAYOUT_BEFORE_TRACE,
    LAYOUT_ORIGIN,
    WORKSPACE_LAYOUT,
    age_order,
)
from memq.analysis.untraced import SOURCE_WORDS as _UNTRACED_WORDS
from memq.analysis.untraced import resolve as _resolve_untraced
from memq.model import AGENT_ROLES, Snapshot, frame_file, frame_line, frame_name

# Where a class came from, as the screens say it.
FROM_JOB = "job"  # the agent's roles: the job's optimizer or model holds this storage
FROM_FRAMES = "frames"  # the allocation's own stack names the code that made it
FROM_TRACE = "trace"  # when in the recorded step it was made, and that it outlived the step
FROM_SIZE = "size"  # frameless: its size matches a parameter's (a gradient) or a workspace's
FROM_STATE = "state"  # older than the trace, sized as the optimizer state implies a parameter
FROM_CACHE = "cache"  # an inference cache: kept from one forward call of the trace to the next
FROM_ORDER = "order"  # a trace without stacks: its place in the trace's order (made first and kept: a weight)
FROM_REBOUND = "rebound"  # made by the optimizer step in place of an older parameter of its size
FROM_PER_PARAM = "per_param"  # one line made a block of every parameter's size, outside the model's code
BEFORE_TRACE = "before_trace"  # live, allocated before the recording began
# Why a block is unknown where nothing could be read: a trace recorded without stacks, or no trace at all
NO_FRAMES = "no_frames"
NO_TRACE = "no_trace"
SOURCES = (FROM_JOB, FROM_FRAMES, FROM_TRACE, FROM_SIZE, FROM_STATE, FROM_CACHE, FROM_ORDER, BEFORE_TRACE,
           NO_FRAMES, NO_TRACE, AFTER_HISTORY, FROM_LAYOUT, WORKSPACE_LAYOUT, LAYOUT_BEFORE_TRACE, FROM_REBOUND,
           FROM_PER_PARAM)
KNOWN = "known from the job"
INFERRED = "inferred from the trace"
ORDER = "inferred from the trace's order"  # inferred, from a trace without stacks: its order alone
# with no trace at all (untraced.py): the model's state by its sizes and addresses
LAYOUT = LAYOUT_ORIGIN
ORIGINS = (KNOWN, INFERRED, ORDER, LAYOUT)
# How a screen says what decided one block's class (the segment map's block, the composition's site).
SOURCE_WORDS = {
    FROM_JOB: "known from the job: the agent saw the tensor (the optimizer's or the model's, or a cache "
              "the job declared)",
    FROM_FRAMES: "inferred from the trace: the stack that allocated it",
    FROM_TRACE: "inferred from the trace: when in the step it was made, and that it outlived it",
    FROM_SIZE: "inferred from the trace: no frames, its size (a parameter's, a cuBLAS workspace's)",
    FROM_STATE: "inferred from the trace: allocated before the trace began, sized as the optimizer state implies",
    FROM_CACHE: "inferred from the trace: an inference cache (a KV cache), kept from one forward call to the "
                "next",
    FROM_ORDER: "inferred from the trace's order: recorded without stacks, so where it was made and what it "
                "outlived (made first and kept: a weight; the optimizer's first step makes a parameter's size "
                "in pairs: its state; a backward makes one per weight: a gradient; a workspace amid a "
                "multiply's operands)",
    BEFORE_TRACE: "inferred from the trace: allocated before the trace began",
    FROM_REBOUND: "inferred from the trace: made by the optimizer step in place of a block of its size made "
                  "before it, one per gradient, and nothing else is that gradient's parameter (the step "
                  "rebinds its parameters to new tensors)",
    FROM_PER_PARAM: "inferred from the trace: one line of code outside the model made a block of every "
                    "parameter's size, one for one (per-parameter state, as an optimizer or a gradient "
                    "estimator keeps it, though no torch.optim code made it)",
    NO_FRAMES: "unknown: the trace was recorded without stacks, and its sizes and order alone do not tell "
               "a parameter from a gradient, a moment or an activation (record with stacks=\"python\", or "
               "let the agent send the roles of the job's tensors)",
    NO_TRACE: "unknown: no allocation history was recorded, so nothing tells what made it (record history, "
              "or let the agent send the roles of the job's tensors)",
    **_UNTRACED_WORDS,
}
# The site a screen shows for those blocks (the composition's top allocation site)
ORDER_SITE = {fr.PARAMETERS: "made first and kept", fr.OPTIMIZER_STATE: "the optimizer step's pairs of a "
              "parameter's size", fr.GRADIENTS: "one per weight, made after them", fr.WORKSPACE_CAT:
              "made amid a multiply's operands", fr.ACTIVATIONS: "kept by the step"}
_UNKNOWN_SITE = {NO_FRAMES: "<no frames: the trace was recorded without stacks>",
                 NO_TRACE: "<no allocation history recorded>"}
_LAYOUT_SITE = {AFTER_HISTORY: "<no allocation history: made after it stopped, by the running step>",
                FROM_LAYOUT: "<no allocation history: inferred from sizes and addresses>",
                WORKSPACE_LAYOUT: "<no allocation history: the size of a cuBLAS workspace>",
                LAYOUT_BEFORE_TRACE: "<made before a trace without stacks: inferred from sizes and addresses>"}

# An inference cache (a KV cache the job declared) is in the parameters' class: what inference keeps
# across its forward calls (ARCHITECTURE.md "Composition and phase").
_ROLE_CLASS = {"parameter": fr.PARAMETERS, "buffer": fr.PARAMETERS, "gradient": fr.GRADIENTS,
               "optimizer_state": fr.OPTIMIZER_STATE, "cache": fr.PARAMETERS}
ROLE_CLASSES = tuple(_ROLE_CLASS[r] for r in AGENT_ROLES)
# State tensors per parameter of the same size, by optimizer (torch.optim's own classes).
_STATE_PER_PARAM = (("adamw", 2), ("adamax", 2), ("nadam", 2), ("radam", 2), ("lamb", 2), ("adam", 2),
                    ("sgd", 1), ("rmsprop", 1), ("adagrad", 1), ("lion", 1))


class BlockClass(NamedTuple):
    cls: str
    source: str
    event: int  # index of the trace entry that allocated it; -1 when it predates the trace


def origin(source: str) -> str:
    """How a screen says where a class came from."""
    if source == FROM_JOB:
        return KNOWN
    if source == FROM_ORDER:
        return ORDER
    return LAYOUT if source in (AFTER_HISTORY, FROM_LAYOUT, WORKSPACE_LAYOUT, LAYOUT_BEFORE_TRACE) else INFERRED


def origin_words(by_origin: dict | None) -> str:
    """One class's bytes by origin ({KNOWN: n, INFERRED: m, ORDER: o, LAYOUT: l}) in words, for a table cell
    or a title: one origin said alone, more in shares."""
    if not by_origin:
        return ""
    got = [(o, by_origin.get(o, 0)) for o in ORIGINS if by_origin.get(o, 0)]
    if not got:
        return ""
    if len(got) == 1:
        return got[0][0]
    total = sum(n for _, n in got)
    head = ", ".join(f"{n / total:.0%} {o}" for o, n in got[:-1])
    return f"{head}, the rest {got[-1][0]}"


def block_classes(snap: Snapshot) -> dict[int, BlockClass]:
    """Live block address -> its class. Memoised on the snapshot (callers never mutate it)."""
    done = snap.memo.get("block_classes")
    if done is None:
        done = snap.memo["block_classes"] = _classify(snap)
    return done


def _role_lookup(roles: tuple):
    """A function: block (address, size) -> the class of the agent's first role whose storage starts
    inside the block (a storage starts at its block's address), or None."""
    if not roles:
        return lambda addr, size: None
    starts = [r[0] for r in roles]

    def find(addr: int, size: int) -> str | None:
        i = bisect.bisect_left(starts, addr)
        best = None
        while i < len(roles) and roles[i][0] < addr + size:
            code = roles[i][2]
            if best is None or code < best:
                best = code
            i += 1
        return ROLE_CLASSES[best] if best is not None else None

    return find


def _classify(snap: Snapshot) -> dict[int, BlockClass]:
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    trace = snap.trace
    trace_has_frames = any(ev.frames for ev in trace[-4000:]) or any(ev.frames for ev in trace[:4000])
    # The entry that made each block still live at the end: the last alloc at its address.
    made = made_live_in(snap)
    order = _order(snap)  # a trace without stacks that holds the whole job: its order says
    unnamed = None  # with the agent's roles: sizes of the weights by the order the job did not name
    # Where backward ended: the last engine entry, and whether forward or the optimizer ran after it.
    last_bwd = -1
    after_bwd = False
    seen_phase: dict = {}  # by frames list (traces share one per stack): an inference trace has no backward
    for i in range(len(trace) - 1, -1, -1):
        ev = trace[i]
        if ev.action != "alloc" and ev.action != "free_requested":
            continue
        k = id(ev.frames)
        ph = seen_phase.get(k, "")
        if ph == "":
            ph = seen_phase[k] = event_phase(ev.frames, trace_has_frames)
        if ph == PHASE_BACKWARD:
            last_bwd = i
            break
        if ph in (PHASE_FORWARD, PHASE_OPTIMIZER):
            after_bwd = True
    role_of = _role_lookup(snap.agent.roles if snap.agent is not None else ())
    roles_known = bool(snap.agent is not None and snap.agent.roles)
    # cuBLAS workspaces by their size: frameless, or framed by code no rule names (the thread's first
    # multiply), no more of them than handles
    def frames_of(b) -> list:
        return b.frames or (trace[made[b.address]].frames if b.address in made else [])

    # (a size the optimizer keeps state of is a parameter's, not a workspace's)
    state_sized = {tensor_size(b) for b in live if frames_of(b) and fr.is_optimizer(frames_of(b))}
    workspaces = _workspace_blocks([b for b in live if role_of(b.address, b.size) is None
                                    and tensor_size(b) not in state_sized
                                    and (not frames_of(b) or fr.categorize(frames_of(b)) == fr.OTHER
                                         and not made_by_constructor(frames_of(b)))],
                                   _inside_segment(snap), snap.segments, made)
    forward_seen = None  # whether the trace shows a forward pass (computed when first needed)
    calls = inference_calls(trace)
    sites: set = set()
    caches = _cache_blocks(trace, made, calls, live, sites) if calls else set()
    snap.memo["cache_sites"] = frozenset(sites)
    out: dict[int, BlockClass] = {}
    undecided = []
    predating = []  # older than the trace, no frames of their own, no role: decided by evidence below
    for b in live:
        i = made.get(b.address, -1)
        known = role_of(b.address, b.size)
        if known is not None:
            out[b.address] = BlockClass(known, FROM_JOB, i)
            continue
        if order is not None and i in order.made:
            cls, source = order.made[i]
            if roles_known and source == FROM_ORDER and cls in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE):
                # the job named its weights, gradients and state: not one of them; kept with the weights in
                # sizes that come in several blocks, a cache it did not declare (as older than a trace)
                if unnamed is None:
                    unnamed = Counter(trace[j].size for j, (c, src) in order.made.items()
                                      if src == FROM_ORDER and c == fr.PARAMETERS
                                      and role_of(trace[j].addr, trace[j].size) is None)
                if cls == fr.PARAMETERS and unnamed[trace[i].size] >= CACHE_MIN_BLOCKS:
                    cls, source = fr.PARAMETERS, FROM_CACHE
                else:
                    cls = fr.ACTIVATIONS
            out[b.address] = BlockClass(cls, source, i)
            continue
        frames = b.frames or (trace[i].frames if i >= 0 else [])
        if i < 0 and not b.frames:
            predating.append(b)
            continue
        cat = fr.categorize(frames) if frames else fr.UNKNOWN
        if cat in (fr.OPTIMIZER_STATE, fr.WORKSPACE_CAT, fr.GRADIENTS, fr.PARAMETERS):
            out[b.address] = BlockClass(cat, FROM_FRAMES, i)
            continue
        if b.address in caches:
            out[b.address] = BlockClass(fr.PARAMETERS, FROM_CACHE, i)
            continue
        ph = event_phase(frames, trace_has_frames) if i >= 0 else (fr.phase_of(frames) if frames else None)
        if ph == PHASE_BACKWARD:
            undecided.append(b)  # a gradient or a backward intermediate: decided by size below
            continue
        if frames:
            if cat in (fr.OTHER, fr.ACTIVATIONS) and made_by_constructor(frames):
                if forward_seen is None:
                    forward_seen = _first_forward(trace)
                if i < 0 or i < forward_seen or forward_seen < 0:  # built before the first forward
                    out[b.address] = BlockClass(fr.PARAMETERS, FROM_FRAMES, i)  # the model's construction
                    continue
            if cat == fr.OTHER and b.address in workspaces:
                out[b.address] = BlockClass(fr.WORKSPACE_CAT, FROM_SIZE, i)  # a thread's first multiply
                continue
            # Made by code no rule names and still live: forward's output where the trace shows a
            # forward pass (own modules, stacks="all"), else what the frames said ("other").
            if cat == fr.OTHER and i >= 0:
                if forward_seen is None:
                    forward_seen = _first_forward(trace)
                if forward_seen >= 0:
                    # the step's: its inputs, forward's outputs (an inference engine's KV cache made by its
                    # own code reads so too: nothing in a trace tells it from a first step's input)
                    out[b.address] = BlockClass(fr.ACTIVATIONS, FROM_TRACE, i)
                    continue
            out[b.address] = BlockClass(cat, FROM_FRAMES, i)
        else:
            undecided.append(b)
    _resolve_predating(snap, predating, out, trace, trace_has_frames, last_bwd, workspaces, undecided, made,
                       bool(calls))
    param_sizes = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    grads_known = Counter(tensor_size(b) for b in live if out.get(b.address, _NONE).cls == fr.GRADIENTS)
    for size, n in grads_known.items():  # one gradient per parameter
        param_sizes[size] = max(0, param_sizes[size] - n)
    in_bwd_at_end = _in_backward_at_end(trace, last_bwd)
    peak: list[int] = []  # the trace's most live entry, found when first needed

    def after_peak(i: int) -> bool:
        if not peak:
            peak.append(_most_live_at(trace))
        return i > peak[0]

    # (a training step, read once before the blocks below: a gradient or optimizer state among the classes,
    # or zero_grad's release of gradients; only a trace without stacks asks)
    training = not trace_has_frames and (
        any(bc.cls in (fr.GRADIENTS, fr.OPTIMIZER_STATE) for bc in out.values())
        or _releases_gradients(trace, {tensor_size(b) for b in live if _weight(out.get(b.address, _NONE))}))
    for b in undecided:
        i = made.get(b.address, -1)
        if b.address in workspaces:
            out[b.address] = BlockClass(fr.WORKSPACE_CAT, FROM_SIZE, i)
        elif roles_known and not b.frames:
            # the job said which gradients exist: a frameless block it did not name is not one
            out[b.address] = BlockClass(fr.ACTIVATIONS, FROM_TRACE, i)
        elif param_sizes.get(tensor_size(b), 0) > 0 and (trace_has_frames or after_peak(i)):
            # (in a trace without stacks, one of a parameter's size made before its most live bytes is as
            # likely the forward's output of that shape as a gradient: unknown, below; a backward's come after
            # the forward's saved activations peak)
            param_sizes[tensor_size(b)] -= 1
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_SIZE if not b.frames else FROM_TRACE, i)
        elif i >= 0 and trace_has_frames and not any(param_sizes.values()) and not _params_known(out) \
                and (after_bwd or not in_bwd_at_end):
            # no parameter is known to size it against: made by the engine, kept after backward
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_TRACE, i)
        elif i >= 0 and trace_has_frames:
            out[b.address] = BlockClass(fr.ACTIVATIONS if in_bwd_at_end or b.frames else fr.UNKNOWN, FROM_TRACE, i)
        elif i >= 0 and training and not after_peak(i):
            # a training step's forward made it (before its most live bytes) and it outlived the forward: what
            # the forward saved for the backward, or the step's input
            out[b.address] = BlockClass(fr.ACTIVATIONS, FROM_TRACE, i)
        else:
            out[b.address] = BlockClass(fr.UNKNOWN, FROM_TRACE if trace_has_frames else NO_FRAMES, i)
    _per_param_state(trace, live, out, snap)
    _rebound_params(trace, live, out)
    return out


_NONE = BlockClass(fr.UNKNOWN, BEFORE_TRACE, -1)


def _first_release(trace: list) -> tuple[Counter, int]:
    """The trace's first run of frees of blocks it did not make (no allocation between them): the sizes freed,
    and the index of the run's last free (-1 where there is none)."""
    made: set = set()
    freed: Counter = Counter()
    last = -1
    for i, ev in enumerate(trace):
        if ev[0] == "alloc":
            if freed:
                break
            made.add(ev[1])
        elif ev[0] == "free_requested" and ev[1] not in made:
            freed[ev[2]] += 1
            last = i
    return freed, last


def _releases_gradients(trace: list, sizes: set) -> bool:
    """Whether the trace's first run of frees of blocks it did not make holds two or more of the parameters'
    sizes: zero_grad releasing the last step's gradients, as a step begins."""
    freed, _ = _first_release(trace)
    return sum(n for size, n in freed.items() if size in sizes) >= 2


def _released_beside(trace: list, by_size: dict) -> tuple[int, int, Counter]:
    """zero_grad's release read from the older blocks alone (a trace without stacks that begins as a step
    does, with nothing known of the parameters): the trace's first run of frees of blocks it did not make,
    two or more, nearly all of whose bytes (STATE_SPLIT_SHARE) are in sizes of which the older blocks hold a
    multiple, k + 1 times as many for most of the bytes (each parameter freed its gradient and kept itself
    and its k state tensors; 0: no state, as plain SGD). (the index of the run's last free, k, the sizes
    released); (-1, 0, {}) where there is no such run."""
    freed, last = _first_release(trace)
    total = sum(size * n for size, n in freed.items())
    if sum(freed.values()) < 2 or not total:
        return -1, 0, Counter()
    by_k: Counter = Counter()
    for size, n in freed.items():
        held = len(by_size.get(size, ()))
        if held and held % n == 0:
            by_k[held // n - 1] += size * n
    # (k is the count most of the bytes say; a size that says 0 beside it may be weights that are views of
    # one buffer, whose state is in the weights' own sizes: an LSTM's under cuDNN)
    k = by_k.most_common(1)[0][0] if by_k else 0
    return (last, k, freed) if sum(by_k.values()) >= STATE_SPLIT_SHARE * total else (-1, 0, Counter())


def trace_release(snap: Snapshot) -> tuple[int, int, Counter]:
    """`_released_beside` of the snapshot's trace against every live frameless block older than it (the
    agent's named ones too: the phases read it where the roles decide the classes), memoised: the one
    reading of zero_grad's release that the split of the older blocks and the trace's phases share."""
    got = snap.memo.get("trace_release")
    if got is None:
        made = made_live_in(snap)
        by_size: dict[int, list] = {}
        for seg in snap.segments:
            for b in seg.blocks:
                if b.is_live and made.get(b.address, -1) < 0 and not b.frames:
                    by_size.setdefault(tensor_size(b), []).append(b)
        got = snap.memo["trace_release"] = (_released_beside(snap.trace, by_size) if snap.trace
                                            else (-1, 0, Counter()))
    return got


def _most_live_at(trace: list, levels: list | None = None) -> int:
    """The trace entry at which the most bytes made in the trace were live (its first such entry); `levels`:
    those bytes after each entry, where they are counted already."""
    if levels is not None:
        return max(range(len(levels)), key=levels.__getitem__, default=-1)
    level = top = 0
    at = -1
    for i, ev in enumerate(trace):
        if ev[0] == "alloc":
            level += ev[2]
            if level > top:
                top, at = level, i
        elif ev[0] == "free_completed":
            level -= ev[2]
    return at


def tensor_size(b) -> int:
    """The bytes the tensor asked for (the allocator rounds a block to 512 B and may leave up to 1 MiB of
    a segment unsplit beside it, so two tensors of one shape can sit in blocks of two sizes)."""
    return b.requested_size if 0 < b.requested_size <= b.size else b.size


def _weight(bc: BlockClass) -> bool:
    """A parameter or buffer (an inference cache is in their class, but no gradient or state is sized by it)."""
    return bc.cls == fr.PARAMETERS and bc.source != FROM_CACHE


def _params_known(out: dict) -> bool:
    return any(_weight(bc) for bc in out.values())


def _first_forward(trace: list) -> int:
    """Index of the trace's first entry inside a module's call (`forward`, `_call_impl`: a forward pass,
    not the model's construction), or -1 when the trace shows none."""
    seen: set[int] = set()
    for i, ev in enumerate(trace):
        if not ev.frames or id(ev.frames) in seen:
            continue
        seen.add(id(ev.frames))
        if any(fr.FORWARD_NAME.search(frame_name(f)) for f in ev.frames):
            return i
    return -1


def state_per_param(snap: Snapshot, out: dict, live: list) -> int | None:
    """Optimizer state blocks per parameter of the same size: from the optimizer the agent named, the
    optimizer's file in the state's frames, or the ratio of state to known parameter bytes (above
    OPTIMIZER_SGD_MULTIPLE: Adam's two moments); None when nothing says."""
    names = []
    if snap.agent is not None and snap.agent.optimizer:
        names.append(snap.agent.optimizer.lower())
    trace = snap.trace
    for b in live:
        bc = out.get(b.address)
        if bc is None or bc.cls != fr.OPTIMIZER_STATE:
            continue
        frames = b.frames or (trace[bc.event].frames if bc.event >= 0 else [])
        for f in frames:
            path = frame_file(f).lower()
            if "/optim/" in path:
                names.append(path.rsplit("/", 1)[-1])
                break
        if len(names) > 1:
            break
    for name in names:
        for key, k in _STATE_PER_PARAM:
            if key in name:
                return k
    params = sum(b.size for b in live if _weight(out.get(b.address, _NONE)))
    state = sum(b.size for b in live if out.get(b.address, _NONE).cls == fr.OPTIMIZER_STATE)
    if params and state:
        return 2 if state > OPTIMIZER_SGD_MULTIPLE * params else 1
    return None


def covers_step_start(trace: list, trace_has_frames: bool, released: int = -1) -> bool:
    """The trace holds the step from its start: it frees at most STEP_START_ORPHAN_FREES blocks it did
    not allocate (the previous step's outputs, as their names are rebound), and it does not begin
    inside backward or the optimizer step. A ring buffer that wrapped mid-step fails both. `released`:
    the last entry of zero_grad's release of gradients (`_released_beside`), whose frees are the step's
    start itself."""
    if not trace:
        return False
    allocated: set[int] = set()
    orphans = 0
    first_phase = None
    for i, ev in enumerate(trace):
        if ev.action == "alloc":
            allocated.add(ev.addr)
            if first_phase is None and ev.frames:
                first_phase = event_phase(ev.frames, trace_has_frames)
        elif ev.action == "free_requested" and ev.addr not in allocated:
            if ev.frames and fr.is_optimizer(ev.frames) or i <= released:
                continue  # zero_grad releasing the last step's gradients: the step's start itself
            orphans += 1
            if orphans > STEP_START_ORPHAN_FREES:
                return False
    return first_phase not in (PHASE_BACKWARD, PHASE_OPTIMIZER)


def _resolve_predating(snap: Snapshot, predating: list, out: dict, trace: list, trace_has_frames: bool,
                       last_bwd: int, workspaces: set, undecided: list, made: dict, inference: bool) -> None:
    """Blocks older than the trace with no frames and no role. Parameters where the optimizer state's
    sizes imply them (each size's state blocks / state per parameter, less the parameters already
    known) or, with no optimizer state and nothing known to be a parameter, where the trace covers the
    step from its start (split from their state, and their kept gradients, oldest first: `_age_order`);
    gradients kept from an earlier backward beside them (a backward that ran in the trace made none: it
    accumulated into them); cuBLAS workspaces by their size; where the trace has no stacks, the model's
    state by its layout (untraced.py); the rest unknown."""
    if not predating:
        return
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    state_sizes = Counter(tensor_size(b) for b in live if out.get(b.address, _NONE).cls == fr.OPTIMIZER_STATE)
    known_params = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    by_size: dict[int, list] = {}
    for b in predating:
        if b.address not in workspaces:
            by_size.setdefault(tensor_size(b), []).append(b)
    released = trace_release(snap) if not trace_has_frames else (-1, 0, Counter())
    params: dict[int, list] = {}
    split_grads: set = set()  # sizes whose kept gradients the split below named
    if state_sizes:
        k = state_per_param(snap, out, live) or _state_per_param_by_count(
            snap, out, predating, trace, trace_has_frames, last_bwd, state_sizes, by_size) or 1
        for size, group in by_size.items():
            need = math.ceil(state_sizes.get(size, 0) / k) - known_params.get(size, 0)
            if need > 0:
                params[size] = group[:need]
                for b in params[size]:
                    out[b.address] = BlockClass(fr.PARAMETERS, FROM_STATE, -1)
    elif not known_params and covers_step_start(trace, trace_has_frames, released[0]):
        if released[0] >= 0:  # gradients released at the step's start were not kept; their count says k
            k, kept = released[1], 0
        else:  # a backward in the trace that made no gradient accumulated into ones kept since an earlier step
            kept = int(not _made_in_bwd(undecided, made, by_size, trace, trace_has_frames)
                       and _grads_predate(out, predating, trace, trace_has_frames, last_bwd))
            k = _state_split(snap, trace, by_size, kept)
            kept = kept if k else 0
        flat, state_only = None, set()
        # (one flat gradient released for weights that are views of one buffer says no k of their own)
        for kk in dict.fromkeys((k, 2, 1) if (k or released[0] >= 0) and not kept else ()):
            if kk and (found := _flat_weights(by_size, kk)):
                k, (flat, state_only) = kk, found
                out[flat.address] = BlockClass(fr.PARAMETERS, FROM_STATE, -1)
                break
        age = _age_order(snap)
        for size, group in by_size.items():
            if size in state_only:
                for b in group:
                    out[b.address] = BlockClass(fr.OPTIMIZER_STATE, FROM_STATE, -1)
                continue
            if flat is not None and size == tensor_size(flat):
                continue  # (the flat block is alone of its size)
            if released[0] >= 0 and flat is None and size not in released[2]:
                params[size] = group  # no gradient was released at this size: frozen weights, no state
            elif k and len(group) % (k + 1 + kept) == 0:
                # each parameter, its gradient where kept, and its k state tensors: oldest first as
                # `_age_order` has them, the parameter (the model is made first), the gradient (the first
                # backward), the state (the first optimizer step)
                group = sorted(group, key=age)
                n = len(group) // (k + 1 + kept)
                params[size] = group[:n]
                if kept:
                    split_grads.add(size)
                for b in group[n:n + n * kept]:
                    out[b.address] = BlockClass(fr.GRADIENTS, BEFORE_TRACE, -1)
                for b in group[n + n * kept:]:
                    out[b.address] = BlockClass(fr.OPTIMIZER_STATE, FROM_STATE, -1)
            elif k and size >= (1 << 20):
                continue  # a size that is no parameter with its state: nothing says what it is
            else:
                params[size] = group
            for b in params[size]:
                out[b.address] = BlockClass(fr.PARAMETERS, BEFORE_TRACE, -1)
    if not _made_in_bwd(undecided, made, by_size, trace, trace_has_frames) \
            and _grads_predate(out, predating, trace, trace_has_frames, last_bwd):
        for size, group in by_size.items():
            if size in split_grads:
                continue
            mine = params.get(size, [])
            if not state_sizes:  # each parameter and its gradient are two blocks of this size
                for b in mine[len(mine) - len(mine) // 2:]:
                    out[b.address] = BlockClass(fr.GRADIENTS, BEFORE_TRACE, -1)
            else:
                n_params = len(mine) + known_params.get(size, 0)
                rest = [b for b in group if b.address not in out or out[b.address].cls != fr.PARAMETERS]
                for b in rest[:n_params]:
                    out[b.address] = BlockClass(fr.GRADIENTS, BEFORE_TRACE, -1)
    # one gradient per parameter: the rest at a parameter's size (kept from an earlier backward, or
    # accumulating); a cuBLAS workspace by its size, when there are no more of them than handles
    free_params = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    free_params.subtract(Counter(tensor_size(b) for b in live if out.get(b.address, _NONE).cls == fr.GRADIENTS))
    rest = [b for b in predating if b.address not in out]
    roles_known = snap.agent is not None and bool(snap.agent.roles)
    if not roles_known and (not trace or not trace_has_frames):
        # no trace at all, or one without stacks that began after these were made (it says nothing of them):
        # the model's state by its sizes and addresses (untraced.py), said as such
        framed = Counter(tensor_size(b) for b in live if b.frames and _weight(out.get(b.address, _NONE)))
        decided = _resolve_untraced(snap.segments, [b for b in rest if b.address not in workspaces], framed,
                                    before_trace=bool(trace))
        for addr, (cls, source) in decided.items():
            out[addr] = BlockClass(cls, source, -1)
        rest = [b for b in rest if b.address not in out]
    # an inference trace: what the job did not name and every forward call of the trace kept, in sizes that
    # come in several blocks (a key and a value per layer), is its cache; a lone block is the prompt's
    kept = Counter(tensor_size(b) for b in rest if b.address not in workspaces) if inference else Counter()
    for b in rest:
        if b.address in workspaces:
            out[b.address] = BlockClass(fr.WORKSPACE_CAT, FROM_SIZE if trace else WORKSPACE_LAYOUT, -1)
        elif roles_known and kept[tensor_size(b)] >= CACHE_MIN_BLOCKS:
            out[b.address] = BlockClass(fr.PARAMETERS, FROM_CACHE, -1)
        elif roles_known:
            # the job named its parameters, gradients and optimizer state: what it did not name and no
            # frames explain is the step's (activations, inputs, kept outputs)
            out[b.address] = BlockClass(fr.ACTIVATIONS, BEFORE_TRACE, -1)
        elif trace and free_params.get(tensor_size(b), 0) > 0:
            # with no history at all, a frameless block of a parameter's size made while recording was
            # off is as likely forward's output of that shape as a gradient: unknown (the roles say)
            free_params[tensor_size(b)] -= 1
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_SIZE, -1)
        else:
            out[b.address] = BlockClass(fr.UNKNOWN, BEFORE_TRACE if trace else NO_TRACE, -1)


def cache_sites(snap: Snapshot) -> frozenset:
    """The allocation sites of the snapshot's inference cache, as the ids of trace entries' frames lists:
    a timeline draws every block they made, freed or live, as the cache (parameters' class)."""
    block_classes(snap)
    return snap.memo.get("cache_sites", frozenset())


def state_sites(snap: Snapshot) -> frozenset:
    """The allocation sites (ids of frames lists) of per-parameter state no torch.optim frame names
    (`_per_param_state`): their entries are the optimizer step's."""
    block_classes(snap)
    return snap.memo.get("state_sites", frozenset())


def _in_module(frames: list, memo: dict) -> bool:
    k = id(frames)
    got = memo.get(k)
    if got is None:
        got = memo[k] = any(fr.FORWARD_NAME.search(frame_name(f)) for f in frames)
    return got


def inference_calls(trace: list) -> list[tuple[int, int]]:
    """The forward calls of an inference trace, as [first, last] entry indices: runs of framed entries
    inside a module's call, told apart by the entries between them outside any (sampling the next token,
    reordering a beam), after the trace's last backward or optimizer entry (a framed trace's frameless
    allocations are the autograd engine's): a job that trains, then generates, generates after its last
    step. Empty unless there are at least INFERENCE_MIN_CALLS of them."""
    if not trace:
        return []
    has_frames = any(ev.frames for ev in trace[:4000]) or any(ev.frames for ev in trace[-4000:])
    if not has_frames:
        return []
    # from the end back to the last backward or optimizer entry: a training trace stops at once
    begin = 0
    phase_memo: dict = {}
    for i in range(len(trace) - 1, -1, -1):
        ev = trace[i]
        if ev.action != "alloc" and ev.action != "free_requested":
            continue
        if not ev.frames:
            if ev.action == "alloc":  # the autograd engine's thread: a backward ran
                begin = i + 1
                break
            continue
        k = id(ev.frames)
        ph = phase_memo.get(k)
        if ph is None:
            ph = phase_memo[k] = event_phase(ev.frames, True)
        if ph != PHASE_FORWARD:
            begin = i + 1
            break
    memo: dict = {}
    spans: list[tuple[int, int]] = []
    start = last = -1
    for i in range(begin, len(trace)):
        ev = trace[i]
        if (ev.action != "alloc" and ev.action != "free_requested") or not ev.frames:
            continue
        if _in_module(ev.frames, memo):
            if start < 0:
                start = i
            last = i
        elif start >= 0:
            spans.append((start, last))
            start = -1
    if start >= 0:
        spans.append((start, last))
    return spans if len(spans) >= INFERENCE_MIN_CALLS else []


def _cache_blocks(trace: list, made: dict, calls: list, live: list, sites: set) -> set:
    """Addresses of the live blocks that are an inference cache: blocks of an allocation site (one stack)
    that keeps at least CACHE_MIN_BLOCKS of them live at the end, no more than it held at every forward
    call's start since its first (a cache is replaced or written in place; a list that keeps every call's
    output grows), and that kept a block across a call: made before a call began and freed inside a later
    one (a cache grown by concatenation, or reordered between tokens, is replaced while the model reads
    it), or never freed (a static cache). Blocks older than the trace that carry their own stack (a ring
    buffer that lost their making) were kept across every call of it: those of a stack that holds at least
    CACHE_MIN_BLOCKS of them are a cache too. A ring buffer that began mid-generation frees blocks it never
    saw made: a free carries its allocation's frames, so each counts against its site (the blocks live
    before the trace count alike at every call's start and at the end, so the comparison needs no more).
    Adds to `sites` the cache's allocation sites (the ids of their trace entries' frames lists), whose
    earlier blocks, freed as the cache grew, were the cache too."""
    starts = [s for s, _ in calls]
    ends = [e for _, e in calls]
    site_of: dict[int, int] = {}  # address -> site (the id of its allocation's frames)
    alloc_at: dict[int, int] = {}
    count: Counter = Counter()
    low: dict[int, int] = {}  # site -> fewest live blocks at a call's start since its first block
    seen_at: dict[int, int] = {}  # site -> the index of its last change
    crossed: set = set()

    def note(site: int, i: int) -> None:
        # the call starts between the site's last change and now saw its count as it is
        last = seen_at.get(site)
        if last is not None and bisect.bisect_right(starts, last) < bisect.bisect_right(starts, i):
            low[site] = min(low.get(site, count[site]), count[site])
        seen_at[site] = i

    for i, ev in enumerate(trace):
        if ev.action == "alloc" and ev.frames:
            site = id(ev.frames)
            note(site, i)
            site_of[ev.addr] = site
            alloc_at[ev.addr] = i
            count[site] += 1
        elif ev.action == "free_requested" and ev.addr in site_of:
            site = site_of.pop(ev.addr)
            a = alloc_at.pop(ev.addr)
            note(site, i)
            count[site] -= 1
            k = bisect.bisect_right(starts, i) - 1
            if k >= 0 and i <= ends[k] and starts[k] > a:
                crossed.add(site)  # made before this call began, freed inside it
        elif ev.action == "free_requested" and ev.frames:
            # a block older than the trace (a ring buffer that began mid-generation) freed: a free carries
            # its allocation's frames, so it leaves its site too; what was live before the trace counts
            # alike at every call's start and at the end, so comparing the two needs no more of it
            site = id(ev.frames)
            note(site, i)
            count[site] -= 1
    end = len(trace)
    for site in list(seen_at):
        note(site, end)
    live_at_end: dict[int, list] = {}
    older: dict[tuple, list] = {}
    for b in live:
        i = made.get(b.address, -1)
        if i < 0:
            if b.frames:
                key = tuple((frame_file(f), frame_line(f), frame_name(f)) for f in b.frames)
                older.setdefault(key, []).append(b)
            continue
        if b.address not in site_of:
            continue
        live_at_end.setdefault(site_of[b.address], []).append(b)
    out: set = set()
    named = (fr.OPTIMIZER_STATE, fr.WORKSPACE_CAT, fr.GRADIENTS, fr.PARAMETERS)  # frames say what these are
    for blocks in older.values():
        if len(blocks) >= CACHE_MIN_BLOCKS and fr.categorize(blocks[0].frames) not in named:
            out.update(b.address for b in blocks)
    for site, blocks in live_at_end.items():
        n = len(blocks)
        if n < CACHE_MIN_BLOCKS or site not in low or low[site] < count[site]:
            continue
        if fr.categorize(trace[made[blocks[0].address]].frames) in named:
            continue
        kept = any(bisect.bisect_right(starts, made[b.address]) < len(starts) for b in blocks)
        if site in crossed or kept:
            out.update(b.address for b in blocks)
            sites.add(site)
    return out


def _inside_segment(snap: Snapshot) -> set:
    """Addresses of the live frameless blocks that do not start their segment, or share it with another
    live frameless block."""
    out = set()
    for seg in snap.segments:
        bare = [b.address for b in seg.blocks if b.is_live and not b.frames]
        if len(bare) > 1:
            out.update(bare)
        elif bare and bare[0] != seg.address:
            out.add(bare[0])
    return out


def _workspace_blocks(frameless: list, inside: set = frozenset(), segments: list = (), made: dict | None = None) -> set:
    """Addresses of the frameless blocks that are cuBLAS workspaces by their size: only where that size
    comes in no more blocks than CUBLAS_WORKSPACE_MAX_BLOCKS (a handle per thread and stream); more are
    tensors of that shape. A block that does not start its segment, or shares it with another frameless
    block, is not one: every workspace of the 33 captures of benchmarks/gpu/composition_capture.py (66)
    and of tests/fixtures/real starts its segment, alone or beside framed blocks only (made once per
    handle, from a fresh or a whole cached segment), while a weight of that size loaded beside other
    weights (the inference captures) or a step's activation beside others (the OOM captures) shares one.
    Of those, a stream (their segment's, of `segments`) holds CUBLAS_WORKSPACES_PER_STREAM at most: those
    older than the trace first (`made`: where each live block was made in it; a workspace is made at its
    thread's first multiply, so a trace begun at a later step made none: a ConvNet's 32 MiB activations
    of the evening H100 set), then the highest (a weight of that size made alone after them, the bf16
    generation captures, is none)."""
    out = set()
    seg_size = {b.address: seg.total_size for seg in segments for b in seg.blocks if b.is_live}
    for size in (CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_OLD_BYTES):
        same = [b.address for b in frameless if tensor_size(b) == size and b.address not in inside]
        if len(same) > CUBLAS_WORKSPACE_MAX_BLOCKS:
            # more than there are handles: tensors of that size among them. A workspace's segment was made
            # for it (exactly its size); a weight cast into a segment a larger tensor left sits in a larger one
            same = [a for a in same if seg_size.get(a) == size]
        if 0 < len(same) <= CUBLAS_WORKSPACES_PER_STREAM:
            out.update(same)
        elif len(same) <= CUBLAS_WORKSPACE_MAX_BLOCKS:
            # a stream has one per thread that multiplies on it (the job's and the autograd engine's), made
            # at each one's first product, above what the job made later of that size
            wanted = set(same)
            stream_of = {b.address: seg.stream for seg in segments for b in seg.blocks if b.address in wanted}
            per_stream: dict = {}
            made = made or {}
            for a in sorted(same, key=lambda a: (made.get(a, -1) >= 0, -a)):
                per_stream.setdefault(stream_of.get(a, 0), []).append(a)
            for on_stream in per_stream.values():
                out.update(on_stream[:CUBLAS_WORKSPACES_PER_STREAM])
    return out


def _made_in_bwd(undecided: list, made: dict, by_size: dict, trace: list, trace_has_frames: bool) -> bool:
    """Whether the trace's backward made a block of a size older blocks have (a gradient made there)."""
    return any(b.address in made and tensor_size(b) in by_size
               and event_phase(trace[made[b.address]].frames, trace_has_frames) == PHASE_BACKWARD
               for b in undecided)


def _state_split(snap: Snapshot, trace: list, by_size: dict, kept_grads: int = 0) -> int:
    """State tensors per parameter among blocks older than the trace, when an optimizer is evidenced (the
    agent named it, or its code ran in the trace: a step, or zero_grad releasing the last gradients; or
    `kept_grads`, gradients kept across steps, unless a parameter and its gradient, pairs, explain the
    bytes) and every size of at least 1 MiB comes in a multiple of k + 1 blocks (a parameter and its k
    state tensors; k + 2 with `kept_grads`: its gradient too); 0 when nothing says there is state."""
    named = (snap.agent.optimizer or "").lower() if snap.agent is not None else ""
    seen_optimizer = bool(named)
    for ev in trace:
        if ev.frames and fr.is_optimizer(ev.frames):
            seen_optimizer = True
            for f in ev.frames:
                path = frame_file(f).lower()
                if "/optim/" in path and not path.endswith("/optimizer.py"):
                    named = named or path.rsplit("/", 1)[-1]
            if named:
                break
    if not seen_optimizer and not kept_grads:  # (gradients kept across steps: a training job all the same)
        return 0
    groups = [(size, len(g)) for size, g in by_size.items() if size >= (1 << 20) and len(g) > 1]
    total = sum(size * n for size, n in groups)
    if not total:
        return 0

    def fits(k: int) -> bool:  # nearly all those bytes come in multiples of k + 1 blocks
        return sum(size * n for size, n in groups if n % (k + 1 + kept_grads) == 0) >= STATE_SPLIT_SHARE * total

    if not seen_optimizer and sum(size * n for size, n in groups if n % 2 == 0) >= STATE_SPLIT_SHARE * total:
        return 0  # no optimizer seen, and a parameter with its kept gradient explains every size

    for key, k in _STATE_PER_PARAM:
        if key in named:
            return k if fits(k) else 0
    return next((k for k in (2, 1) if fits(k)), 0)


def _flat_weights(by_size: dict, k: int) -> tuple[Any, set] | None:
    """Parameters that are views of one buffer (cuDNN keeps an LSTM's or GRU's weights so: one block for
    all of them), among blocks older than the trace, where the optimizer keeps k state tensors of each
    parameter's own size: the sizes whose blocks come in multiples of k but not of k + 1 have no parameter
    block of their own, and one lone block is exactly as large as the parameters their state implies.
    (that block, those sizes: all their blocks state), or None where no block adds up exactly."""
    regular = {s for s, g in by_size.items() if len(g) % (k + 1) == 0}
    state_only = {s for s, g in by_size.items() if s not in regular and len(g) > 1 and len(g) % k == 0}
    implied = sum(len(by_size[s]) // k * s for s in state_only)
    lone = by_size.get(implied, [])
    return (lone[0], state_only) if implied and len(lone) == 1 and implied not in regular | state_only else None


def _age_order(snap: Snapshot):
    """untraced.age_order of the snapshot's segments (oldest first), memoised on it."""
    key = snap.memo.get("age_order")
    if key is None:
        key = snap.memo["age_order"] = age_order(snap.segments)
    return key


def _grads_predate(out: dict, predating: list, trace: list, trace_has_frames: bool, last_bwd: int) -> bool:
    """A backward ran inside the trace and is over, but left no gradient made there (it accumulated in
    place into `.grad` kept from an earlier step): the gradients are among the blocks older than the
    trace."""
    if last_bwd < 0 or _in_backward_at_end(trace, last_bwd):
        return False
    if any(bc.cls == fr.GRADIENTS and bc.event >= 0 for bc in out.values()):
        return False
    return not any(b.address not in out and made_in_backward(b, trace, trace_has_frames) for b in predating)


def made_in_backward(b, trace: list, trace_has_frames: bool) -> bool:
    frames = b.frames
    return bool(frames) and event_phase(frames, trace_has_frames) == PHASE_BACKWARD


def _in_backward_at_end(trace: list, last_bwd: int) -> bool:
    """True when the recording stops inside backward (an OOM or a dump from a hook in backward): a
    block made there may still be an intermediate of the remaining backward, not a kept gradient."""
    return last_bwd >= 0 and any(ev.action == "oom" for ev in trace[last_bwd:])


# The code that builds or loads a model: a constructor (an nn.Module subclass's `__init__` making
# nn.Parameter(torch.empty(...)), an inference engine's `__init__` allocating its weights), or a weight
# initialiser or loader by its conventional name. torch's own modules are caught by frames.categorize.
_BUILD_NAME = re.compile(r"^__init__$|^reset_parameters$|^from_pretrained$|^_?(init|load)_(all_)?weights?")
# Constructors whose tensors are not the model's: an optimizer's (a hand-written Adam may make its state
# up front), DDP's (its gradient buckets), a process group's (communication buffers).
_NOT_MODEL_BUILD = re.compile(r"optim", re.IGNORECASE)  # in a file's or a function's name
_NOT_MODEL_DIR = re.compile(r"/nn/parallel/|/distributed/")


@fr.per_frames_list
def made_by_constructor(frames: list) -> bool:
    """The stack is the model's construction: a constructor or weight initialiser, outside any forward
    call and backward, and neither it nor what it calls is optimizer or DDP code (what calls it may be:
    Megatron's `setup_model_and_optimizer` builds the model). What it made and is still live is a
    parameter or a buffer (the model is built once and kept), whether the trace began before the model
    was made (the block has a trace entry) or there is none (a torch 2.0 block carries its own history)."""
    build = False
    for f in frames:  # innermost first
        name, path = frame_name(f), frame_file(f)
        if fr.FORWARD_NAME.search(name):
            return False
        if build:
            continue
        if _NOT_MODEL_BUILD.search(path.rsplit("/", 1)[-1]) or _NOT_MODEL_BUILD.search(name) \
                or _NOT_MODEL_DIR.search(path):
            return False
        build = bool(_BUILD_NAME.search(name))
    return build and not fr.is_backward(frames)


def _rebound_params(trace: list, live: list, out: dict) -> None:
    """Parameters a hand-written optimizer rebinds every step (`p.data = p.data - lr * update`): the
    step makes each one anew beside its state, so its frames say optimizer state. Where a size has
    gradients but no live block of it is a parameter, the step's blocks of that size come from two or
    more allocation sites (the state's, the update's), and the site that comes last (the update reads
    the moments, so it is made after them) made one block per gradient, each while the step freed a
    block of that size made before it (the old parameter): those are the parameters."""
    grads = Counter(tensor_size(b) for b in live if out.get(b.address, _NONE).cls == fr.GRADIENTS)
    if not grads:
        return
    weights = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    sites: dict[int, dict[int, list]] = {}  # size -> allocation site -> the step's live blocks
    for b in live:
        bc = out.get(b.address, _NONE)
        size = tensor_size(b)
        if bc.cls == fr.OPTIMIZER_STATE and bc.event >= 0 and grads[size] and not weights[size]:
            sites.setdefault(size, {}).setdefault(id(trace[bc.event].frames), []).append(b)
    if not sites:
        return
    start = min(out[b.address].event for by_site in sites.values() for bs in by_site.values() for b in bs)
    replaced = _replaced_in_step(trace, start)
    for size, by_site in sites.items():
        if len(by_site) < 2:
            continue
        last = max(by_site.values(), key=lambda bs: min(out[b.address].event for b in bs))
        if len(last) != grads[size]:
            continue
        if sum(replaced[n] for n in {b.size for b in last} | {size}) < len(last):
            continue
        for b in last:
            out[b.address] = BlockClass(fr.PARAMETERS, FROM_REBOUND, out[b.address].event)


def _per_param_state(trace: list, live: list, out: dict, snap: Snapshot) -> None:
    """Per-parameter state that no torch.optim frame names (a zeroth-order gradient estimator's moments,
    a hand-written optimizer outside a `step`): the live blocks one allocation site made outside the
    model's code and outside backward, whose sizes are the parameters' sizes one for one (k times over,
    for k state tensors per parameter made on one line). Read as an inference cache or the step's output
    otherwise. The parameters must be known, and at least PER_PARAM_STATE_MIN_TENSORS of them: a few
    blocks that match a small model's few sizes are as likely its outputs. Not where the agent sent roles:
    the job named its optimizer state, and what it did not name is the step's. The sites are remembered
    (`state_sites`): their entries are the optimizer step's (`entry_phase`)."""
    if snap.agent is not None and snap.agent.roles:
        return
    weights = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    n_weights = sum(weights.values())
    if n_weights < PER_PARAM_STATE_MIN_TENSORS:
        return
    by_site: dict[int, list] = {}
    for b in live:
        bc = out.get(b.address, _NONE)
        if bc.event < 0 or bc.source not in (FROM_CACHE, FROM_TRACE, FROM_FRAMES) \
                or bc.cls not in (fr.PARAMETERS, fr.ACTIVATIONS, fr.OTHER):
            continue
        if bc.source == FROM_FRAMES and bc.cls == fr.PARAMETERS:
            continue  # the model's own code made it
        if weights[tensor_size(b)]:
            by_site.setdefault(id(trace[bc.event].frames), []).append(b)
    sites = set()
    for site, blocks in by_site.items():
        k, rem = divmod(len(blocks), n_weights)
        if k == 0 or rem or Counter(tensor_size(b) for b in blocks) != Counter({s: n * k for s, n in weights.items()}):
            continue
        frames = trace[out[blocks[0].address].event].frames
        if not frames or fr.is_backward(frames) or made_by_constructor(frames):
            continue
        for b in blocks:
            out[b.address] = BlockClass(fr.OPTIMIZER_STATE, FROM_PER_PARAM, out[b.address].event)
        sites.add(site)
    if sites:
        snap.memo["state_sites"] = frozenset(sites)


def _replaced_in_step(trace: list, start: int) -> Counter:
    """By size: the blocks made before `start` (in the trace or before it) that optimizer code frees from
    there on, what the step's new blocks replaced."""
    made_since: set = set()
    n: Counter = Counter()
    for ev in trace[start:]:
        if ev.action == "alloc":
            made_since.add(ev.addr)
        elif ev.action == "free_requested" and ev.addr not in made_since and ev.frames \
                and fr.is_optimizer(ev.frames):
            made_since.add(ev.addr)  # counted once
            n[ev.size] += 1
    return n


def _state_per_param_by_count(snap: Snapshot, out: dict, predating: list, trace: list, trace_has_frames: bool,
                              last_bwd: int, state_sizes: Counter, by_size: dict) -> int | None:
    """State blocks per parameter where nothing names the optimizer (a hand-written one), no parameter is
    known, and the trace's backward added fresh gradients into gradients older than the trace (it made
    blocks of their sizes and freed them, and kept none): then the blocks older than the trace are the
    parameters and their gradients, two per parameter, and k is what at least STATE_COUNT_SHARE of the
    state's bytes agree on, size by size (k state blocks per two older blocks). None otherwise (then
    each state block is read as implying a parameter of its own, which claims the gradients too)."""
    if not (_grads_predate(out, predating, trace, trace_has_frames, last_bwd)
            and _fresh_gradients_freed(trace, by_size, trace_has_frames)):
        return None
    total = sum(size * n for size, n in state_sizes.items())
    for k in (2, 1):
        fit = sum(size * n for size, n in state_sizes.items()
                  if len(by_size.get(size, ())) % 2 == 0 and n == k * len(by_size.get(size, ())) // 2 > 0)
        if total and fit >= STATE_COUNT_SHARE * total:
            return k
    return None


def _fresh_gradients_freed(trace: list, by_size: dict, trace_has_frames: bool) -> bool:
    """The backward in the trace made blocks of the sizes older than it and freed them: fresh gradients
    that the autograd engine added into gradients kept from an earlier step, in place."""
    made_in_bwd: set = set()
    sizes = set(by_size) | {b.size for g in by_size.values() for b in g}
    for ev in trace:
        if ev.action == "alloc" and ev.size in sizes \
                and event_phase(ev.frames, trace_has_frames) == PHASE_BACKWARD:
            made_in_bwd.add(ev.addr)
        elif ev.action == "free_requested" and ev.addr in made_in_bwd:
            return True
    return False


def composition(snap: Snapshot) -> tuple[dict, dict]:
    """Live bytes by class, and the top allocation sites of each (every screen's composition). Each
    site says where its class came from (`origin`: known from the job, or inferred from the trace)."""
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
            if bc and bc.source == FROM_JOB:
                site = "<known from the job: the optimizer's or the model's tensors>"
            elif bc and bc.source in _UNKNOWN_SITE:
                site = _UNKNOWN_SITE[bc.source]
            elif bc and bc.source == FROM_CACHE:  # with the weights in class, but said to be a cache
                site = "<inference cache> " + (fr.stack_signature(frames) if frames else "")
            elif bc and bc.source == FROM_ORDER:
                site = f"<no frames: {ORDER_SITE.get(bc.cls, bc.cls)}, by the trace's order>"
            elif frames:
                site = fr.stack_signature(frames)
            elif bc and bc.source in _LAYOUT_SITE:
                site = _LAYOUT_SITE[bc.source]
            elif bc and bc.source == FROM_STATE:
                site = "<allocated before the trace began, sized as the optimizer state implies>"
            elif bc and bc.source == BEFORE_TRACE:
                site = "<allocated before the trace began>"
            elif bc and bc.cls == fr.GRADIENTS:
                site = "<autograd thread, matches a parameter's size>"
            elif bc and bc.cls == fr.WORKSPACE_CAT:
                site = "<no frames, the size of a cuBLAS workspace>"
            else:
                site = "<no frames>"
            sites[cls][(site, origin(bc.source) if bc else INFERRED)] += b.size
    top = {c: [{"site": s, "bytes": n, "origin": o} for (s, o), n in sites[c].most_common(5)]
           for c in fr.CATEGORIES if sites[c]}
    return totals, top


def origins(snap: Snapshot) -> dict:
    """Live bytes of each class by where the class came from: {class: {"known from the job": n,
    "inferred from the trace": m}} (classes with bytes only)."""
    out: dict[str, dict] = {}
    classes = block_classes(snap)
    for seg in snap.segments:
        for b in seg.blocks:
            if b.is_live:
                bc = classes.get(b.address)
                cls = bc.cls if bc else fr.UNKNOWN
                o = origin(bc.source) if bc else INFERRED
                d = out.setdefault(cls, {})
                d[o] = d.get(o, 0) + b.size
    return out


# ------------------------------------------------------------------ a trace recorded without stacks
class _Order(NamedTuple):
    """What a trace recorded without stacks says by its order alone (`_order`)."""
    made: dict  # trace index of an alloc still live at the end -> (class, source)
    backward: list  # (first, last) entry of each backward pass the gradients show
    optimizer: list  # (first, last) entry of each optimizer step
    released: frozenset  # trace indices of the gradients zero_grad released (earlier steps')


def _order(snap: Snapshot) -> _Order | None:
    """Classes and phases of a trace recorded without stacks, from its order alone, where it holds the whole
    job (every live block was made inside it: nothing predates it). Memoised; None where it does not apply
    (a framed trace, or one that lost its beginning)."""
    if "order" in snap.memo:
        return snap.memo["order"]
    snap.memo["order"] = got = _read_order(snap)
    return got


def _read_order(snap: Snapshot) -> _Order | None:
    """A trace without stacks that holds the whole job: every segment and every block live at the end were
    made in it. Its allocations that stay live to the end come in runs (consecutive allocations with no
    short-lived one between them):
    - a cuBLAS workspace is made amid a multiply's operands, at a thread's first multiply: a block of a
      workspace's size whose neighbouring allocations are both freed in the trace, made before the first
      backward is over (at most CUBLAS_WORKSPACE_MAX_BLOCKS);
    - the optimizer's state is made in one run, per parameter its tensors of the parameter's size one
      after the other (AdamW: two): the first run of which nine tenths of the bytes (STATE_SPLIT_SHARE)
      come in adjacent pairs of one size that earlier kept blocks have, in more than one size; or
      (SGD's momentum: one) a run one block per earlier block's size, that copies at least
      ORDER_GRADIENT_SHARE of their bytes;
    - the weights are made first: the earliest blocks of the sizes that state implies, with the rest of
      their runs (buffers); with no state, the trace's largest run;
    - gradients are made later at a weight's size, one per parameter, by a backward (after its step's
      forward ended; `_steps` tells the steps): where the state shows an optimizer, or where they copy at
      least ORDER_GRADIENT_SHARE of the weights' bytes;
    - an inference cache (no optimizer, no gradients) is a later run of pairs of one size (a key and a
      value per layer, made together as the cache grows or is made);
    - the rest (inputs, kept outputs) are the step's: activations."""
    trace = snap.trace
    if not trace:
        return None
    # the whole job: every segment was made in the trace (the timeline's covers_whole_run) and every live
    # block too; a trace that lost its beginning may have lost the weights' making. (Entries are read by
    # position: this reads every entry of traces of a million.)
    created = set()
    for ev in trace:
        if ev[5]:
            return None
        if ev[0] == "segment_alloc" or ev[0] == "segment_map":
            created.add(ev[1])
    if any(seg.address not in created for seg in snap.segments):
        return None
    made = made_live_in(snap)
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    if not live or any(b.address not in made for b in live):
        return None
    kept = set(made.values())
    size_at = {i: trace[i].size for i in kept}
    ws_sized = [i for i in kept if size_at[i] in (CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_OLD_BYTES)
                and all(j not in kept for j in _neighbours(trace, i))]
    workspaces = set(ws_sized)  # candidates: which are workspaces is decided once the steps are known
    # runs of kept allocations: consecutive ones with no short-lived allocation between them
    runs: list[list[int]] = []
    cur: list[int] = []
    i = -1
    for ev in trace:
        i += 1
        if ev[0] != "alloc":
            continue
        if i in kept:
            if i not in workspaces:
                cur.append(i)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    out: dict[int, tuple[str, str]] = {}
    # the optimizer's state: the first run of pairs of sizes earlier live blocks have (Adam), or of one
    # block per earlier block's size that copies at least half of them (SGD's momentum)
    state_run = None
    per_param: list = []  # a size per parameter the state was made for
    earlier: Counter = Counter()
    for run in runs:
        if len(run) >= 2:
            sizes = [size_at[i] for i in run]
            # the backward's last gradients may lead the run where zero_grad keeps them (set_to_none=False):
            # kept, with no short-lived allocation between them and the state, each a weight's size; the
            # state begins where its pairs line up best
            leads = [j for j in range(min(len(sizes), STATE_LEAD_MAX + 1)) if all(earlier[n] > 0 for n in sizes[:j])]
            lead, pairs = max(((j, _adjacent_pairs(sizes, j, earlier)) for j in leads),
                              key=lambda jp: (2 * sum(jp[1]) / max(1, sum(sizes[jp[0]:])), -jp[0]))
            # a model's parameters come in more than one size (weights, biases, norms); a cache's key and
            # value of one layer are one size
            if len(set(pairs)) > 1 and 2 * sum(pairs) >= STATE_SPLIT_SHARE * sum(sizes[lead:]):
                state_run, per_param = run[lead:], pairs
                break
            # SGD's momentum, one block per parameter; here too the backward's last kept gradients may lead it:
            # the first lead from which nearly all of it lines up with the blocks before it, else the best
            cands = [_one_per_param(sizes, j, earlier) for j in leads]
            lead, ones, before = next((c for c in cands if _copies_share(c[2], c[1]) >= STATE_SPLIT_SHARE),
                                      max(cands, key=lambda t: (_copies_share(t[2], t[1]), -t[0])))
            copies = _kept_copies(before, ones)
            rest = sizes[lead:]
            if len(set(ones)) > 1 and sum(ones) >= STATE_SPLIT_SHARE * sum(rest) \
                    and sum(rest) >= ORDER_GRADIENT_SHARE * sum(n * c for n, c in before.items()) / copies:
                state_run, per_param = run[lead:], ones
                break
        earlier.update(size_at[i] for i in run)
    weights: set[int] = set()
    weight_runs: list[list[int]] = []
    if state_run is not None:
        need = Counter(per_param)
        for run in runs:
            if run[0] >= state_run[0]:
                break
            took = False
            for i in run:
                if need[size_at[i]] > 0:
                    need[size_at[i]] -= 1
                    took = True
            if took:
                weight_runs.append(run)
        for i in state_run:
            out[i] = (fr.OPTIMIZER_STATE, FROM_ORDER)
    elif runs:
        weight_runs = [max(runs, key=lambda r: sum(size_at[i] for i in r))]
    for run in weight_runs:
        weights.update(run)
    for i in weights:
        out[i] = (fr.PARAMETERS, FROM_ORDER)
    last_weight = max(weights, default=-1)
    # a gradient per parameter the optimizer keeps state for (buffers have none), else per weight
    n_params = len(per_param) if state_run is not None else len(weights)
    # their sizes: of the parameters the state was made for where there is state (a frozen base has none)
    trainable = Counter(per_param) if state_run is not None else Counter(size_at[i] for i in weights)
    steps, levels = _steps(trace, weights, size_at, n_params, trainable)
    # the last step's gradients, still live: the earliest blocks of a weight's size, one per parameter,
    # made after its forward ended (the most bytes live since the last zero_grad, up to the last such block:
    # forward's saved activations all live and the loss's gradient made; saved activations of a weight's
    # shape are made before it)
    bound = steps[-1][3] if steps else max(last_weight, 0)
    free = trainable.copy()
    last = max((i for i in kept if i > bound and i not in out and free[size_at[i]] > 0), default=-1)
    fwd_end = max(range(bound, last + 1), key=levels.__getitem__, default=len(trace))
    grads = []
    step_end = len(trace)  # where the step those gradients were made in ends: the trace's end, the last step
    if state_run is not None:
        # made between the weights and the optimizer's first step, and kept since: the first backward's
        # gradients, never released (zero_grad(set_to_none=False), or accumulated into every step); their
        # step ends with the state its optimizer step made, and later steps' backwards accumulate in place
        early = [i for i in kept if last_weight < i < state_run[0] and i not in out and free[size_at[i]] > 0]
        if sum(size_at[i] for i in early) >= ORDER_GRADIENT_SHARE * sum(n * c for n, c in trainable.items()):
            fwd_end, step_end = last_weight, state_run[-1] + 1
    # the earliest: a next micro-batch's forward (gradient accumulation) makes blocks of a weight's shape
    for i in sorted(i for i in kept if i > fwd_end and i not in out and i not in workspaces):
        if free[size_at[i]] > 0 and len(grads) < n_params:
            free[size_at[i]] -= 1
            grads.append(i)
    weight_sizes = Counter(size_at[i] for i in weights)
    if grads and len(grads) < n_params and _backward_done(trace, kept, bound, fwd_end, weight_sizes):
        # the step's live bytes peaked after its first gradients (a spike of the backward's own): the rest of
        # them were made before that, latest first
        before = sorted((i for i in kept if bound < i < fwd_end and i not in out and i not in workspaces), reverse=True)
        for i in before:
            if free[size_at[i]] > 0 and len(grads) < n_params:
                free[size_at[i]] -= 1
                grads.append(i)
    weight_bytes = sum(size_at[i] for i in weights)
    if grads and (state_run is not None or sum(size_at[i] for i in grads) >= ORDER_GRADIENT_SHARE * weight_bytes):
        for i in grads:
            out[i] = (fr.GRADIENTS, FROM_ORDER)
        steps.append((min(grads), max(grads), step_end, step_end, ()))
    else:
        grads = []
    if state_run is None and not grads and not steps:
        for run in runs:
            if run[0] > last_weight and len(run) % 2 == 0 and \
                    all(size_at[run[k]] == size_at[run[k + 1]] for k in range(0, len(run), 2)):
                for i in run:
                    out[i] = (fr.PARAMETERS, FROM_CACHE)
    # a thread's workspace is made at its first multiply, before the first backward is over (the
    # autograd engine's in it); a block of that size made amid short-lived ones later is a tensor
    first = ws_sized if not steps else [i for i in ws_sized if i <= steps[0][1]]
    if len(first) <= CUBLAS_WORKSPACE_MAX_BLOCKS:
        out.update((i, (fr.WORKSPACE_CAT, FROM_ORDER)) for i in first)
    for i in kept:
        if i not in out:
            out[i] = (fr.ACTIVATIONS, FROM_ORDER)
    backward, optimizer = [], []
    # a backward begins where its step's forward ended (the most bytes live before its first gradient) and
    # ends with its last gradient; the optimizer step follows, up to zero_grad releasing those gradients
    # (or the trace's end)
    bound = max(last_weight, 0)
    for g0, g1, end, after, _got in steps:
        top_at = max(range(bound, g0 + 1), key=levels.__getitem__, default=g0)
        backward.append((top_at, g1))
        if end == len(trace) and state_run is not None:
            # the last step's optimizer: its temporaries come and go; from the last time live bytes are
            # back where backward left them on, they only grow: a next micro-batch's forward
            end = next((j + 1 for j in range(len(trace) - 1, g1, -1) if levels[j] <= levels[g1]), g1 + 1)
            optimizer.append((g1 + 1, end - 1))
        elif end < len(trace):
            optimizer.append((g1 + 1, end - 1))
        bound = after
    if state_run is not None:
        optimizer.append((state_run[0], state_run[-1]))
        top = _most_live_at(trace, levels)
        if top > state_run[-1] and not any(a <= top <= b for a, b in backward + optimizer):
            # a later step whose backward made no gradient (it accumulated into kept ones): the trace's most
            # live bytes are still where a backward begins, its step's forward having saved everything, unless
            # they are the optimizer's temporaries (a weight's size each, made in a row)
            (optimizer if _in_a_row_of(trace, top, trainable) else backward).append((top, top))
    return _Order(out, backward, optimizer, frozenset(j for _g0, _g1, _e, _a, got in steps for j in got))


def _in_a_row_of(trace: list, i: int, sizes: Counter) -> bool:
    """Whether allocation i is one of two or more made in a row (no free between them) at the given sizes."""
    if trace[i][2] not in sizes:
        return False
    return any(0 <= i + step < len(trace) and trace[i + step][0] == "alloc" and trace[i + step][2] in sizes
               for step in (-1, 1))


def _backward_done(trace: list, kept: set, bound: int, fwd_end: int, weight_sizes: Counter) -> bool:
    """Whether the last step's backward is over: a finished backward has released every activation its forward
    saved, so of the blocks the step made before its most live bytes, the only ones still live that are not of
    a weight's size are the inputs it began with (made before its first short-lived allocation)."""
    first_tmp = next((i for i in range(bound + 1, len(trace)) if trace[i][0] == "alloc" and i not in kept),
                     len(trace))
    return not any(first_tmp < i < fwd_end and not weight_sizes[trace[i][2]] for i in kept)


def _adjacent_pairs(sizes: list, start: int, earlier: Counter) -> list:
    """From `start` on, the sizes of adjacent blocks of one size that earlier kept blocks have (a parameter's
    two moments, made one after the other; fused Adam puts a small step tensor before each pair)."""
    pairs = []
    k = start
    while k < len(sizes) - 1:
        if sizes[k] == sizes[k + 1] and earlier[sizes[k]] > 0:
            pairs.append(sizes[k])
            k += 2
        else:
            k += 1
    return pairs


def _one_per_param(sizes: list, lead: int, earlier: Counter) -> tuple[int, list, Counter]:
    """(lead, the parameter sizes the run from `lead` on holds a block for, the kept blocks before it): each
    block of an earlier kept block's size stands for one parameter, and the rest for the buffer they add up
    to (`_flat_partner`); the `lead` blocks before it are earlier kept blocks too."""
    before = earlier + Counter(sizes[:lead])
    left = before.copy()
    ones = []
    for n in sizes[lead:]:
        if left[n] > 0:
            left[n] -= 1
            ones.append(n)
    flat = _flat_partner(sum(sizes[lead:]) - sum(ones), left)
    if flat:
        ones.append(flat)
    return lead, ones, before


def _held_share(before: Counter, ones: list, copies: int) -> float:
    """The share of a run's bytes (one block per parameter) of sizes the kept blocks before it hold exactly
    `copies` times per block of the run."""
    run = Counter(ones)
    return sum(n * c for n, c in run.items() if before[n] == copies * c) / (sum(ones) or 1)


def _copies_share(before: Counter, ones: list) -> float:
    """How well a run of one block per parameter lines up with the kept blocks before it: held once, or twice
    (a kept gradient beside each parameter), whichever lines up more of its bytes."""
    return max(_held_share(before, ones, m) for m in (1, 2))


def _flat_partner(rest: int, left: Counter) -> int | None:
    """A run that may be SGD's momentum, one block per parameter, holds blocks of sizes no earlier kept block
    has: parameters that are views of one buffer (cuDNN keeps an LSTM's or GRU's weights so, and their
    gradient too), each given a state tensor of its own size. Where those blocks add up, `rest` bytes, to
    exactly one earlier kept block's size not yet matched (`left`), that block is their buffer: its size."""
    return rest if rest and left[rest] > 0 else None


def _kept_copies(earlier: Counter, ones: list) -> int:
    """How many kept blocks each parameter has among the earlier ones, for a run that may be SGD's momentum
    (one block per parameter): 2 where nearly all (STATE_SPLIT_SHARE) of the run's bytes are of sizes the
    earlier blocks hold exactly twice per block of the run (the parameter, and its gradient kept since the
    first backward by zero_grad(set_to_none=False)), else 1. The run then copies the model when it copies
    half of that share of the earlier bytes, as it does where gradients are released."""
    return 2 if ones and _held_share(earlier, ones, 2) >= STATE_SPLIT_SHARE else 1


def _steps(trace: list, weights: set, size_at: dict, n_params: int, trainable: Counter) -> tuple[list[tuple], list]:
    """The training steps of a trace without stacks whose gradients zero_grad released, as (first
    gradient, last gradient, zero_grad's first free of them, the allocation after its last, the gradients'
    trace indices), in order, and the bytes live after
    every entry. zero_grad frees a step's gradients together (a run of frees with no allocation between
    them), one per parameter (`n_params`, the earliest made: the optimizer's last temporaries may be freed
    with them), at least ORDER_GRADIENT_SHARE of the weights' bytes, made one by one amid as many other
    entries (a foreach temporary list of the optimizer is made in a row)."""
    if not weights:
        return [], []
    last_weight = max(weights)
    sizes = trainable
    weight_bytes = sum(n * c for n, c in trainable.items())
    out = []
    born: dict = {}  # address -> alloc index, of the blocks at a weight's size made after the weights
    freed: list[int] = []  # those the current run of frees released
    run_start = -1
    freed_bytes = 0
    levels = []
    level = 0

    def close(after: int) -> None:
        left = sizes.copy()
        matched = []
        for j in sorted(freed):
            if left[trace[j][2]] > 0 and len(matched) < n_params:
                left[trace[j][2]] -= 1
                matched.append(j)
        # made one by one amid the backward's other entries, not as one list in a row (the optimizer's
        # foreach temporaries, one per weight too, are made together and freed together)
        if matched and sum(trace[j][2] for j in matched) >= ORDER_GRADIENT_SHARE * weight_bytes \
                and max(matched) - min(matched) + 1 > 2 * len(matched):
            out.append((min(matched), max(matched), run_start, after, matched))

    i = -1
    for ev in trace:
        i += 1
        a = ev[0]
        if a == "alloc":
            level += ev[2]
            if freed:
                if freed_bytes >= ORDER_GRADIENT_SHARE * weight_bytes:
                    close(i)
                freed = []
                freed_bytes = 0
            if i > last_weight and ev[2] in sizes:
                born[ev[1]] = i
        elif a == "free_completed":
            level -= ev[2]
        elif a == "free_requested":
            j = born.pop(ev[1], None)
            if j is not None:
                if not freed:
                    run_start = i
                freed.append(j)
                freed_bytes += ev[2]
        levels.append(level)
    if freed and freed_bytes >= ORDER_GRADIENT_SHARE * weight_bytes:
        close(len(trace))
    return out, levels


def _neighbours(trace: list, i: int) -> list:
    """The allocations just before and just after entry i."""
    out = []
    for step in (-1, 1):
        j = i + step
        while 0 <= j < len(trace) and trace[j][0] != "alloc":
            j += step
        if 0 <= j < len(trace):
            out.append(j)
    return out


def freed_class(snap: Snapshot):
    """For the category timeline of a trace read by its order (`_read_order`): a function, trace index of
    an allocation freed inside the trace -> its class (a gradient zero_grad released; made in an optimizer
    step: the optimizer's, as its frames would say; else the step's activations); None for any other trace
    (its frames say, or nothing does)."""
    order = _order(snap)
    if order is None:
        return None
    merged: list[list[int]] = []  # the optimizer stretches, disjoint (the state's run is inside its step)
    for lo, hi in sorted(order.optimizer):
        if merged and lo <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], hi)
        elif lo <= hi:
            merged.append([lo, hi])
    starts = [lo for lo, _ in merged]
    released = order.released

    def cls(i: int) -> str:
        if i in released:
            return fr.GRADIENTS
        k = bisect.bisect_right(starts, i) - 1
        return fr.OPTIMIZER_STATE if k >= 0 and i <= merged[k][1] else fr.ACTIVATIONS

    return cls


def _released_step(snap: Snapshot) -> tuple[int, int] | None:
    """A trace without stacks that begins as a step does, with zero_grad releasing the gradients of the
    blocks older than it (`trace_release`): (where its backward begins, where it ends), or None where the
    trace does not begin so. The backward runs from the first gradient the step made (a block read as a
    gradient, made in the trace) of STATE_REQUEST_MIN_BYTES or more (or of the largest size released, where
    all were smaller), or from the trace's most live entry where that comes first (a step's backward begins
    on top of everything its forward saved), to the last gradient made; (-1, -1) where no such gradient was
    made (a forward, or a backward that failed before its first)."""
    if "released_step" in snap.memo:
        return snap.memo["released_step"]
    got = None
    trace = snap.trace
    last, _k, freed = trace_release(snap)
    if last >= 0:
        grads = [bc.event for bc in block_classes(snap).values() if bc.cls == fr.GRADIENTS and bc.event >= 0]
        # (one of 1 MiB or more, or of the largest size released where all were smaller, as a LoRA's adapters:
        # a small one is as likely a forward's small output of that size)
        least = min(STATE_REQUEST_MIN_BYTES, max(freed))
        big = [e for e in grads if trace[e].size >= least]
        got = (min(_most_live_at(trace), min(big)), max(grads)) if big else (-1, -1)
    snap.memo["released_step"] = got
    return got


def _released_step_phase(snap: Snapshot, i: int) -> str | None:
    """Entry i's phase in a trace `_released_step` reads: forward before its backward, the optimizer step after
    it; None where the trace does not begin with zero_grad's release."""
    step = _released_step(snap)
    if step is None:
        return None
    first, last = step
    if first < 0 or i < first:
        return PHASE_FORWARD
    return PHASE_BACKWARD if i <= last else PHASE_OPTIMIZER


def entry_phase(snap: Snapshot, i: int) -> str | None:
    """The phase of trace entry i: from its frames (frames.event_phase); in a trace recorded without stacks
    that holds the whole job, from the trace's order (`_read_order`): a gradient was made in backward, the
    optimizer's state in its step, the rest where the stretches of backward and optimizer steps put it,
    else forward (or setup); None where nothing tells."""
    trace = snap.trace
    has_frames = snap.memo.get("trace_has_frames")
    if has_frames is None:
        has_frames = snap.memo["trace_has_frames"] = any(ev.frames for ev in trace)
    if has_frames:
        frames = trace[i].frames
        if frames and id(frames) in state_sites(snap):
            return PHASE_OPTIMIZER  # the code that makes the optimizer's state is its step
        return event_phase(frames, True)
    order = _order(snap)
    if order is None:
        return _released_step_phase(snap, i)
    got = order.made.get(i)
    if got is not None and got[0] == fr.GRADIENTS:
        return PHASE_BACKWARD
    if got is not None and got[0] == fr.OPTIMIZER_STATE:
        return PHASE_OPTIMIZER
    if any(a <= i <= b for a, b in order.backward):
        return PHASE_BACKWARD
    if any(a <= i <= b for a, b in order.optimizer):
        return PHASE_OPTIMIZER
    return PHASE_FORWARD
