"""Classes of the live blocks of a snapshot that holds no allocation trace (`torch.cuda.memory._snapshot()`
without `_record_memory_history`, or with the history paused after warm-up), with no roles from the agent.

What is left to read without a trace: the blocks' sizes, their addresses and segments, and the frames of
the blocks made while a history once ran. Two readings, each said as such on every screen (provenance's
origin "inferred from sizes and addresses"), neither ever used where the agent's roles or a trace decide:

- History once ran (some live blocks carry frames) and the frames name the model's parameters: the model
  was made while it ran, so a frameless block was made after it stopped, by the step that was running
  at the dump: its activations, or its gradients where every parameter size of 1 MiB or more has one
  more frameless block (a backward ran: one gradient per parameter).
- No frames at all: the model's state by its structure. Adam keeps two state tensors of each parameter's
  size, made back to back (`zeros_like` twice), and the model is made first, so its parameters are the
  highest-address blocks of their sizes: the driver hands the first segments of a process the highest
  addresses (in every capture of tests/fixtures/composition_h200 the model's segments are above the
  optimizer state's and the activations'). Walking the blocks from the highest address down, a block is
  a parameter while its size still has room for two state blocks per parameter among the blocks of that
  size; the walk stops at the first two blocks of one parameter's size side by side in one segment (a
  parameter's two moments): the state begins there. Of the rest, two blocks per parameter of its size
  are its state (the pairs first), and the remainder is the running step's (everything live beyond the
  model's state: activations, or gradients as above). Where the walk finds no such pair there is no
  optimizer state to read the model by (inference, or a step before the first optimizer step): the
  parameters are then the blocks of the first run of at least UNTRACED_MODEL_MIN_SEGMENTS segments
  that sit back to back from the top of the address space (a model's weights, loaded one segment after
  another), and the rest stays unknown (activations and an inference cache look alike here).
Pure: plain data in and out.
"""

from __future__ import annotations

from collections import Counter

from memq.analysis import frames as fr
from memq.analysis.rules import STATE_REQUEST_MIN_BYTES, STATE_SPLIT_SHARE, UNTRACED_MODEL_MIN_SEGMENTS

# Where such a class came from (provenance.SOURCES), as the screens say it
AFTER_HISTORY = "after_history"  # no frames where the model's blocks have them: made after the history stopped
FROM_LAYOUT = "layout"  # no history at all: the model's state by its sizes and addresses
LAYOUT_ORIGIN = "inferred from sizes and addresses"
SOURCE_WORDS = {
    AFTER_HISTORY: f"{LAYOUT_ORIGIN}: no allocation trace; it has no frames while the model's blocks have "
                   "theirs, so it was made after the allocation history stopped, by the step running at the "
                   "dump (a gradient where every parameter size has one more such block)",
    FROM_LAYOUT: f"{LAYOUT_ORIGIN}: no allocation history; the model's parameters are the highest-address "
                 "blocks of their sizes, Adam's two state tensors per parameter of its size follow, and what "
                 "is live beyond them is the running step's",
}
_ADAM_STATE = 2  # state tensors per parameter of its size (provenance._STATE_PER_PARAM: Adam, AdamW, ...)


def _size(b) -> int:
    return b.requested_size if 0 < b.requested_size <= b.size else b.size


def resolve(segments: list, rest: list, framed_params: Counter) -> dict[int, tuple[str, str]]:
    """address -> (class, source) for the frameless, role-less, non-workspace blocks `rest` of a snapshot
    with no trace; blocks it cannot decide are left out. `framed_params`: the sizes (requested) of the
    live blocks whose frames say they are parameters."""
    if not rest:
        return {}
    if framed_params:
        return _after_history(rest, framed_params, AFTER_HISTORY)
    if any(b.frames for s in segments for b in s.blocks if b.is_live):
        return {}  # history ran, but after the model was made: the frameless blocks may be the model
    return _by_layout(segments, rest)


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


def _by_layout(segments: list, rest: list) -> dict[int, tuple[str, str]]:
    k = _ADAM_STATE
    rest_addr = {b.address for b in rest}
    paired = _pairs(segments, rest_addr)
    big = sorted((b for b in rest if _size(b) >= STATE_REQUEST_MIN_BYTES), key=lambda b: -b.address)
    n = Counter(_size(b) for b in big)
    params: Counter = Counter()
    chosen: set = set()
    state_found = False
    walked = skipped = 0
    paired_params: set = set()  # sizes of which two parameters sit side by side: the model's own pairs
    for b in big:
        s = _size(b)
        mates = paired.get(b.address, ())
        if params[s] and mates and s not in paired_params and not any(m in chosen for m in mates):
            # two blocks of a parameter's size side by side, where the model's own blocks of that size
            # never were: a parameter's moments, the state begins
            state_found = True
            break
        walked += b.size
        if n[s] >= (1 + k) * (params[s] + 1):
            params[s] += 1
            chosen.add(b.address)
            if any(m in chosen for m in mates):
                paired_params.add(s)
        else:
            skipped += b.size
    if not state_found or skipped > (1 - STATE_SPLIT_SHARE) * walked:
        # no state, or a "model" most of whose blocks have none (weights with no optimizer): read by its run
        return _model_run(segments, rest_addr)
    out: dict[int, tuple[str, str]] = {a: (fr.PARAMETERS, FROM_LAYOUT) for a in chosen}
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
            out[b.address] = (fr.OPTIMIZER_STATE, FROM_LAYOUT)
        else:
            left.append(b)
    # small blocks (norms, biases): each size's highest third the parameters, the next two thirds their state
    by_size: dict[int, list] = {}
    for b in rest:
        if _size(b) < STATE_REQUEST_MIN_BYTES:
            by_size.setdefault(_size(b), []).append(b)
    small_params: Counter = Counter()
    for s, group in by_size.items():
        group.sort(key=lambda b: -b.address)
        p = len(group) // (1 + k)
        small_params[s] = p
        for i, b in enumerate(group):
            if i < p:
                out[b.address] = (fr.PARAMETERS, FROM_LAYOUT)
            elif i < (1 + k) * p:
                out[b.address] = (fr.OPTIMIZER_STATE, FROM_LAYOUT)
            else:
                left.append(b)
    out.update(_after_history(left, params, FROM_LAYOUT))
    return out


def _model_run(segments: list, rest_addr: set) -> dict[int, tuple[str, str]]:
    """No optimizer state to read the model by: the parameters are the blocks of `rest` from the top of the
    address space down to the end of the first run of at least UNTRACED_MODEL_MIN_SEGMENTS large segments
    back to back (each starts where the one below it ends: loaded one after another); the rest stays
    unknown."""
    large = sorted((s for s in segments if s.segment_type != "small"), key=lambda s: -s.address)
    runs: list[list] = []
    for seg in large:
        if runs and seg.address + seg.total_size == runs[-1][-1].address:
            runs[-1].append(seg)
        else:
            runs.append([seg])
    model = next((r for r in runs if len(r) >= UNTRACED_MODEL_MIN_SEGMENTS), None)
    if model is None:
        return {}
    low = model[-1].address
    out: dict[int, tuple[str, str]] = {}
    for seg in segments:
        if seg.address >= low:
            for b in seg.blocks:
                if b.is_live and b.address in rest_addr:
                    out[b.address] = (fr.PARAMETERS, FROM_LAYOUT)
    return out
