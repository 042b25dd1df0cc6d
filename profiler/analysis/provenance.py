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
from collections import Counter
from typing import NamedTuple

from memq.analysis import frames as fr
from memq.analysis.frames import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER, event_phase
from memq.analysis.rules import (
    CACHE_MIN_BLOCKS,
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_MAX_BLOCKS,
    CUBLAS_WORKSPACE_OLD_BYTES,
    INFERENCE_MIN_CALLS,
    OPTIMIZER_SGD_MULTIPLE,
    STATE_SPLIT_SHARE,
    STEP_START_ORPHAN_FREES,
)
from memq.analysis.timeline import made_live_in
from memq.analysis.untraced import AFTER_HISTORY, FROM_LAYOUT, LAYOUT_ORIGIN, WORKSPACE_LAYOUT
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
BEFORE_TRACE = "before_trace"  # live, allocated before the recording began
# Why a block is unknown where nothing could be read: a trace recorded without stacks, or no trace at all
NO_FRAMES = "no_frames"
NO_TRACE = "no_trace"
SOURCES = (FROM_JOB, FROM_FRAMES, FROM_TRACE, FROM_SIZE, FROM_STATE, FROM_CACHE, BEFORE_TRACE, NO_FRAMES,
           NO_TRACE, AFTER_HISTORY, FROM_LAYOUT, WORKSPACE_LAYOUT)
KNOWN = "known from the job"
INFERRED = "inferred from the trace"
# with no trace at all (untraced.py): the model's state by its sizes and addresses
LAYOUT = LAYOUT_ORIGIN
ORIGINS = (KNOWN, INFERRED, LAYOUT)
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
    BEFORE_TRACE: "inferred from the trace: allocated before the trace began",
    NO_FRAMES: "unknown: the trace was recorded without stacks, and its sizes and order alone do not tell "
               "a parameter from a gradient, a moment or an activation (record with stacks=\"python\", or "
               "let the agent send the roles of the job's tensors)",
    NO_TRACE: "unknown: no allocation history was recorded, so nothing tells what made it (record history, "
              "or let the agent send the roles of the job's tensors)",
    **_UNTRACED_WORDS,
}
# The site a screen shows for those blocks (the composition's top allocation site)
_UNKNOWN_SITE = {NO_FRAMES: "<no frames: the trace was recorded without stacks>",
                 NO_TRACE: "<no allocation history recorded>"}
_LAYOUT_SITE = {AFTER_HISTORY: "<no allocation history: made after it stopped, by the running step>",
                FROM_LAYOUT: "<no allocation history: inferred from sizes and addresses>",
                WORKSPACE_LAYOUT: "<no allocation history: the size of a cuBLAS workspace>"}

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
    return LAYOUT if source in (AFTER_HISTORY, FROM_LAYOUT, WORKSPACE_LAYOUT) else INFERRED


def origin_words(by_origin: dict | None) -> str:
    """One class's bytes by origin ({KNOWN: n, INFERRED: m, LAYOUT: l}) in words, for a table cell or a
    title."""
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
                                    and (not frames_of(b) or fr.categorize(frames_of(b)) == fr.OTHER)],
                                   _inside_segment(snap))
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
    for b in undecided:
        i = made.get(b.address, -1)
        if b.address in workspaces:
            out[b.address] = BlockClass(fr.WORKSPACE_CAT, FROM_SIZE, i)
        elif roles_known and not b.frames:
            # the job said which gradients exist: a frameless block it did not name is not one
            out[b.address] = BlockClass(fr.ACTIVATIONS, FROM_TRACE, i)
        elif param_sizes.get(tensor_size(b), 0) > 0:
            param_sizes[tensor_size(b)] -= 1
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_SIZE if not b.frames else FROM_TRACE, i)
        elif i >= 0 and trace_has_frames and not any(param_sizes.values()) and not _params_known(out) \
                and (after_bwd or not in_bwd_at_end):
            # no parameter is known to size it against: made by the engine, kept after backward
            out[b.address] = BlockClass(fr.GRADIENTS, FROM_TRACE, i)
        elif i >= 0 and trace_has_frames:
            out[b.address] = BlockClass(fr.ACTIVATIONS if in_bwd_at_end or b.frames else fr.UNKNOWN, FROM_TRACE, i)
        else:
            out[b.address] = BlockClass(fr.UNKNOWN, FROM_TRACE if trace_has_frames else NO_FRAMES, i)
    return out


_NONE = BlockClass(fr.UNKNOWN, BEFORE_TRACE, -1)


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


def covers_step_start(trace: list, trace_has_frames: bool) -> bool:
    """The trace holds the step from its start: it frees at most STEP_START_ORPHAN_FREES blocks it did
    not allocate (the previous step's outputs, as their names are rebound), and it does not begin
    inside backward or the optimizer step. A ring buffer that wrapped mid-step fails both."""
    if not trace:
        return False
    allocated: set[int] = set()
    orphans = 0
    first_phase = None
    for ev in trace:
        if ev.action == "alloc":
            allocated.add(ev.addr)
            if first_phase is None and ev.frames:
                first_phase = event_phase(ev.frames, trace_has_frames)
        elif ev.action == "free_requested" and ev.addr not in allocated:
            if ev.frames and fr.is_optimizer(ev.frames):
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
    step from its start; gradients kept from an earlier backward beside them (a backward that ran in
    the trace made none: it accumulated into them); cuBLAS workspaces by their size; the rest unknown."""
    if not predating:
        return
    live = [b for seg in snap.segments for b in seg.blocks if b.is_live]
    state_sizes = Counter(tensor_size(b) for b in live if out.get(b.address, _NONE).cls == fr.OPTIMIZER_STATE)
    known_params = Counter(tensor_size(b) for b in live if _weight(out.get(b.address, _NONE)))
    by_size: dict[int, list] = {}
    for b in predating:
        if b.address not in workspaces:
            by_size.setdefault(tensor_size(b), []).append(b)
    params: dict[int, list] = {}
    if state_sizes:
        k = state_per_param(snap, out, live) or 1
        for size, group in by_size.items():
            need = math.ceil(state_sizes.get(size, 0) / k) - known_params.get(size, 0)
            if need > 0:
                params[size] = group[:need]
                for b in params[size]:
                    out[b.address] = BlockClass(fr.PARAMETERS, FROM_STATE, -1)
    elif not known_params and covers_step_start(trace, trace_has_frames):
        k = _state_split(snap, trace, by_size)
        for size, group in by_size.items():
            if k and len(group) % (k + 1) == 0:
                # each parameter and its k state tensors: the oldest of every k + 1 are the parameters (the
                # model is made before the optimizer's first step), and the oldest blocks sit at the
                # highest addresses (the driver hands out address space from the top: the highest were
                # the parameters for 374 of 405 parameter-sized blocks whose frames say which, in
                # tests/fixtures/real, captured and public_snapshots; captured/leak_epochs is the exception)
                group = sorted(group, key=lambda b: -b.address)
                n = len(group) // (k + 1)
                params[size] = group[:n]
                for b in group[n:]:
                    out[b.address] = BlockClass(fr.OPTIMIZER_STATE, FROM_STATE, -1)
            elif k and size >= (1 << 20):
                continue  # a size that is no parameter with its state: nothing says what it is
            else:
                params[size] = group
            for b in params[size]:
                out[b.address] = BlockClass(fr.PARAMETERS, BEFORE_TRACE, -1)
    made_in_bwd = any(b.address in made and tensor_size(b) in by_size
                      and event_phase(trace[made[b.address]].frames, trace_has_frames) == PHASE_BACKWARD
                      for b in undecided)
    if not made_in_bwd and _grads_predate(out, predating, trace, trace_has_frames, last_bwd):
        for size, group in by_size.items():
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
    if not trace and not roles_known:
        # no trace at all: the model's state by its sizes and addresses (untraced.py), said as such
        framed = Counter(tensor_size(b) for b in live if b.frames and _weight(out.get(b.address, _NONE)))
        decided = _resolve_untraced(snap.segments, [b for b in rest if b.address not in workspaces], framed)
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
    CACHE_MIN_BLOCKS of them are a cache too. Adds to `sites` the cache's allocation sites (the ids of
    their trace entries' frames lists), whose earlier blocks, freed as the cache grew, were the cache too."""
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
        if n < CACHE_MIN_BLOCKS or site not in low or low[site] < n:
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


def _workspace_blocks(frameless: list, inside: set = frozenset()) -> set:
    """Addresses of the frameless blocks that are cuBLAS workspaces by their size: only where that size
    comes in no more blocks than CUBLAS_WORKSPACE_MAX_BLOCKS (a handle per thread and stream); more are
    tensors of that shape. A block that does not start its segment, or shares it with another frameless
    block, is not one: every workspace of the 33 captures of benchmarks/gpu/composition_capture.py (66)
    and of tests/fixtures/real starts its segment, alone or beside framed blocks only (made once per
    handle, from a fresh or a whole cached segment), while a weight of that size loaded beside other
    weights (the inference captures) or a step's activation beside others (the OOM captures) shares one."""
    out = set()
    for size in (CUBLAS_WORKSPACE_BYTES, CUBLAS_WORKSPACE_OLD_BYTES):
        same = [b.address for b in frameless if tensor_size(b) == size and b.address not in inside]
        if 0 < len(same) <= CUBLAS_WORKSPACE_MAX_BLOCKS:
            out.update(same)
    return out


def _state_split(snap: Snapshot, trace: list, by_size: dict) -> int:
    """State tensors per parameter among blocks older than the trace, when an optimizer is evidenced (the
    agent named it, or its code ran in the trace: a step, or zero_grad releasing the last gradients) and
    every size of at least 1 MiB comes in a multiple of k + 1 blocks (a parameter and its k state
    tensors); 0 when nothing says there is state among them."""
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
    if not seen_optimizer:
        return 0
    groups = [(size, len(g)) for size, g in by_size.items() if size >= (1 << 20) and len(g) > 1]
    total = sum(size * n for size, n in groups)
    if not total:
        return 0

    def fits(k: int) -> bool:  # nearly all those bytes come in multiples of k + 1 blocks
        return sum(size * n for size, n in groups if n % (k + 1) == 0) >= STATE_SPLIT_SHARE * total

    for key, k in _STATE_PER_PARAM:
        if key in named:
            return k if fits(k) else 0
    return next((k for k in (2, 1) if fits(k)), 0)


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
