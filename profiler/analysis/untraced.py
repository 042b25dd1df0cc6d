"""Classes of the live blocks of a snapshot that holds no allocation trace (`torch.cuda.memory._snapshot()`
without `_record_memory_history`, or with the history paused after warm-up), with no roles from the agent;
and of the blocks older than a trace recorded without stacks, which says nothing of them.

What is left to read without a trace: the blocks' sizes, their addresses and segments, and the frames of
the blocks made while a history once ran. Two readings, each said as such on every screen (provenance's
origin "inferred from sizes and addresses"), neither ever used where the agent's roles or a trace decide:

- History once ran (some live blocks carry frames) and the frames name the model's parameters: the model
  was made while it ran, so a frameless block was made after it stopped, by the step that was running
  at the dump: its activations, or its gradients where every parameter size of 1 MiB or more has one
  more frameless block (a backward ran: one gradient per parameter).
- No frames at all: the model's state by its layout. A process's first segments get the highest addresses
  and a model loads one segment per weight, one after another, so the model is the first run of at least
  UNTRACED_MODEL_MIN_SEGMENTS segments back to back from the top (no more than UNTRACED_RUNS_ABOVE_MODEL
  runs above it), and the runs below it made of the same sizes, down to the first segment holding two
  blocks of one such size side by side (`zeros_like` twice: a parameter's two moments, the optimizer
  state begins). In every capture of tests/fixtures/composition_h200 the model's segments are above the
  optimizer state's and the activations'. Adam keeps two state tensors of each parameter's size, and a
  gradient is one more after backward: a model block is a parameter where its size has room for them
  among the blocks of that size. Where nearly all (STATE_SPLIT_SHARE) of the model's first run has that
  room, two blocks per parameter of its size are its state (side by side in segments of the parameters'
  sizes first, then the highest), small blocks split likewise by thirds, and what is live beyond the
  model's state is the running step's (activations, or gradients as above). Otherwise there is no
  optimizer state (inference, or a step before the first optimizer step): the model's blocks are the
  weights, and the rest stays unknown (an inference cache and activations look alike here). Where no run
  is back to back (a driver that aligns its mappings spaces them), the runs are read again with a gap under
  a segment's own size as back to back, and only a model with no state beside it is read there.
Pure: plain data in and out.
"""

from __future__ import annotations

from collections import Counter

from memq.analysis import frames as fr
from memq.analysis.rules import (
    STATE_REQUEST_MIN_BYTES,
    STATE_SPLIT_SHARE,
    UNTRACED_MODEL_MIN_SEGMENTS,
    UNTRACED_RUNS_ABOVE_MODEL,
)

# Where such a class came from (provenance.SOURCES), as the screens say it
AFTER_HISTORY = "after_history"  # no frames where the model's blocks have them: made after the history stopped
FROM_LAYOUT = "layout"  # no history at all: the model's state by its sizes and addresses
LAYOUT_BEFORE_TRACE = "layout_before_trace"  # older than a trace recorded without stacks: the same reading
WORKSPACE_LAYOUT = "workspace_layout"  # no history at all: a cuBLAS workspace by its size and segment
LAYOUT_ORIGIN = "inferred from sizes and addresses"
SOURCE_WORDS = {
    AFTER_HISTORY: f"{LAYOUT_ORIGIN}: no allocation trace; it has no frames while the model's blocks have "
                   "theirs, so it was made after the allocation history stopped, by the step running at the "
                   "dump (a gradient where every parameter size has one more such block)",
    FROM_LAYOUT: f"{LAYOUT_ORIGIN}: no allocation history; the model is the first run of segments loaded "
                 "back to back at the top of the address space, a parameter has room for Adam's two state "
                 "tensors of its size below it, and what is live beyond the model's state is the running step's",
    WORKSPACE_LAYOUT: f"{LAYOUT_ORIGIN}: no allocation history; its size is a cuBLAS workspace's (one per "
                      "handle and stream) and it starts its segment",
    LAYOUT_BEFORE_TRACE: f"{LAYOUT_ORIGIN}: made before the trace began, and the trace records no stacks; the "
                         "model is the first run of segments loaded back to back at the top of the address "
                         "space, a parameter has room for Adam's two state tensors of its size below it, and "
                         "what is live beyond the model's state is the step's",
}
_ADAM_STATE = 2  # state tensors per parameter of its size (provenance._STATE_PER_PARAM: Adam, AdamW, ...)


def _size(b) -> int:
    return b.requested_size if 0 < b.requested_size <= b.size else b.size


def resolve(segments: list, rest: list, framed_params: Counter,
            before_trace: bool = False) -> dict[int, tuple[str, str]]:
    """address -> (class, source) for the frameless, role-less, non-workspace blocks `rest` of a snapshot
    with no trace (`before_trace`: or the blocks older than a trace recorded without stacks, which says
    nothing of them); blocks it cannot decide are left out. `framed_params`: the sizes (requested) of the
    live blocks whose frames say they are parameters."""
    if not rest:
        return {}
    if framed_params:
        return _after_history(rest, framed_params, AFTER_HISTORY)
    if any(b.frames for s in segments for b in s.blocks if b.is_live):
        return {}  # history ran, but after the model was made: the frameless blocks may be the model
    return _by_layout(segments, rest, LAYOUT_BEFORE_TRACE if before_trace else FROM_LAYOUT)


def _after_history(rest: list, params: Counter, source: str) -> dict[int, tuple[str, str]]:
    """The running step's blocks: gradients where every parameter size of 1 MiB or more has one of them
    per parameter among `rest` (the highest addresses first), the rest activations."""
    big = {s: n for s, n in params.items() if s >= STATE_REQUEST_MIN_BYTES}
    have = Counter(_size(b) for b in rest)
    grads = bool(big) and all(have[s] >= n for s, n in big.items())
    out: dict[int, tuple[str, str]] = {}
    left = Counter(params) if grads else Counter()
    for b in sorted(rest, key=lambda b: -b.address):
        s = _size(b)
        if left[s] > 0:
            left[s] -= 1
            out[b.address] = (fr.GRADIENTS, source)
        else:
            out[b.address] = (fr.ACTIVATIONS, source)
    return out


def _pairs(segments: list, rest_addr: set) -> dict[int, list[int]]:
    """Address -> the addresses of its mates: the blocks of `rest` that sit side by side with a block of
    their own size in one segment (a parameter's two moments, made back to back)."""
    out: dict[int, list[int]] = {}
    for seg in segments:
        live = [b for b in seg.blocks if b.is_live and b.address in rest_addr]
        for a, b in zip(live, live[1:], strict=False):
            if a.address + a.size == b.address and _size(a) == _size(b):
                out.setdefault(a.address, []).append(b.address)
                out.setdefault(b.address, []).append(a.address)
    return out


def _runs(segments: list, aligned: bool = False, every: bool = False) -> list[list]:
    """The large segments from the top of the address space down, in runs of segments back to back (each
    ends where the one above it starts: made one after another); `aligned`: or less than its own size below
    it (a driver that aligns each mapping to a coarser boundary spaces them so: every 20 MiB segment 32 MiB
    from the next in tests/fixtures/real and in a published GPT-2 snapshot); `every`: of all the segments,
    small ones and private pools too."""
    # (a CUDA graph's private pool holds what its capture made, never the model loaded before it)
    large = sorted((s for s in segments if every or (s.segment_type != "small" and not s.is_private_pool)),
                   key=lambda s: -s.address)
    runs: list[list] = []
    for seg in large:
        gap = runs[-1][-1].address - (seg.address + seg.total_size) if runs else -1
        if gap == 0 or (aligned and 0 < gap < seg.total_size):
            runs[-1].append(seg)
        else:
            runs.append([seg])
    return runs


def age_order(segments: list):
    """A sort key of live blocks, oldest first, from their addresses alone: the runs of segments mapped back to
    back (`_runs`), the highest run first, each run upward. The driver maps a stretch of address space upward,
    one segment after another (a model loads into one), and a later stretch below the earlier ones; a segment
    is cut from its start, and an expandable segment grows upward. Of the parameter-sized blocks whose frames
    say which is a parameter and which its optimizer state (tests/fixtures/real, captured, public_snapshots:
    27.1 GiB), this puts the parameter first for 95% of the bytes; the highest address first, 71%."""
    run_top = {seg.address: run[0].address for run in _runs(segments, every=True) for seg in run}
    seg_of = {b.address: seg.address for seg in segments for b in seg.blocks}

    def key(b) -> tuple[int, int]:
        return -run_top.get(seg_of.get(b.address, b.address), b.address), b.address

    return key


def _model_region(segments: list, rest_addr: set, paired: dict, aligned: bool = False) -> tuple[int, int] | None:
    """(the end of the model's first run, the lowest address of the model's segments): down to the end of
    the first run of at least
    UNTRACED_MODEL_MIN_SEGMENTS segments back to back from the top (a model loads one segment per weight,
    one after another), and on through the runs below it while nearly all of their live bytes
    (STATE_SPLIT_SHARE) are in the sizes the model's run holds (the rest of the model, loaded into a new
    stretch of address space) or they hold nothing of `rest` (a workspace's), up to the first segment
    holding two blocks of one such size side by side where the model's run holds none so (a parameter's
    two moments: the optimizer state begins); None where there is no such run near the top."""
    runs = _runs(segments, aligned)
    at = next((i for i, r in enumerate(runs) if len(r) >= UNTRACED_MODEL_MIN_SEGMENTS), None)
    if at is None or at > UNTRACED_RUNS_ABOVE_MODEL:
        return None  # no model's run near the top: nothing says where the model is
    core = low = runs[at][-1].address
    sizes, own_pairs = set(), set()
    for seg in segments:
        if seg.address >= low:
            for b in seg.blocks:
                if b.is_live and b.address in rest_addr and _size(b) >= STATE_REQUEST_MIN_BYTES:
                    sizes.add(_size(b))
                    if b.address in paired:
                        own_pairs.add(_size(b))
    for run in runs[at + 1:]:
        live = [b for seg in run for b in seg.blocks if b.is_live and b.address in rest_addr]
        if live and sum(b.size for b in live if _size(b) in sizes) < STATE_SPLIT_SHARE * sum(b.size for b in live):
            break
        for seg in run:
            if any(b.is_live and b.address in paired and _size(b) in sizes and _size(b) not in own_pairs
                   for b in seg.blocks):
                return core, low
            low = seg.address
    return core, low


def _by_layout(segments: list, rest: list, source: str) -> dict[int, tuple[str, str]]:
    k = _ADAM_STATE
    rest_addr = {b.address for b in rest}
    paired = _pairs(segments, rest_addr)
    region = _model_region(segments, rest_addr, paired)
    aligned = region is None
    if aligned:
        region = _model_region(segments, rest_addr, paired, aligned=True)
    if region is None:
        return {}
    core, low = region
    big = sorted((b for b in rest if _size(b) >= STATE_REQUEST_MIN_BYTES), key=lambda b: -b.address)
    n = Counter(_size(b) for b in big)
    # the model's blocks; a parameter has room for its k state blocks among the blocks of its size, and
    # for its gradient too where nearly all of the model's first run has room for one more per block (after
    # backward)
    model = [b for b in big if b.address >= low]
    in_model = Counter(_size(b) for b in model if b.address >= core)
    grads = sum(s * m for s, m in in_model.items() if n[s] >= (2 + k) * m) >= \
        STATE_SPLIT_SHARE * sum(s * m for s, m in in_model.items())
    params: Counter = Counter()
    chosen: set = set()
    for b in model:
        s = _size(b)
        if n[s] >= (1 + k + grads) * (params[s] + 1):
            params[s] += 1
            chosen.add(b.address)
    first = [b for b in model if b.address >= core]
    if sum(b.size for b in first if b.address in chosen) < STATE_SPLIT_SHARE * sum(b.size for b in first):
        # most of the model's first run has no state beside it: no optimizer state (inference, or before the
        # first optimizer step): the model's region are the weights, the rest unknown
        return {b.address: (fr.PARAMETERS, source) for b in rest if b.address >= low}
    if aligned:
        # segments spaced apart leave the state's place among the weights unsaid: in the aligned layouts of
        # tests/fixtures/real, loaded weights sit below the first state segments (a third of the bytes
        # misread when tried), so only the weights of a model with no state are read there
        return {}
    out: dict[int, tuple[str, str]] = {a: (fr.PARAMETERS, source) for a in chosen}
    # the state: k blocks per parameter of its size; first those side by side in a segment that holds
    # only blocks of the parameters' sizes (a step's activations sit beside blocks of other sizes), then
    # the highest
    only_param_sizes = set()
    for seg in segments:
        live = [b for b in seg.blocks if b.is_live and b.address in rest_addr and b.address not in chosen]
        if live and all(params[_size(b)] for b in live):
            only_param_sizes.update(b.address for b in live)
    need = Counter({s: k * p for s, p in params.items()})
    others = sorted((b for b in big if b.address not in chosen),
                    key=lambda b: (not (b.address in paired and b.address in only_param_sizes), -b.address))
    left = []
    for b in others:
        s = _size(b)
        if need[s] > 0:
            need[s] -= 1
            out[b.address] = (fr.OPTIMIZER_STATE, source)
        else:
            left.append(b)
    # small blocks (norms, biases) share the small pool's segments with everything small: each size's
    # highest blocks the parameters, the next k per parameter their state (k + 1 per parameter in all, one
    # more with gradients), the rest the step's
    by_size: dict[int, list] = {}
    for b in rest:
        if _size(b) < STATE_REQUEST_MIN_BYTES:
            by_size.setdefault(_size(b), []).append(b)
    for group in by_size.values():
        group.sort(key=lambda b: -b.address)
        p = len(group) // (1 + k + grads)
        for i, b in enumerate(group):
            if i < p:
                out[b.address] = (fr.PARAMETERS, source)
            elif i < (1 + k) * p:
                out[b.address] = (fr.OPTIMIZER_STATE, source)
            else:
                left.append(b)
    out.update(_after_history(left, params, source))
    return out
