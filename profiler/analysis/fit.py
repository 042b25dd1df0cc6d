"""Which batch size (or sequence length) fits, predicted from one measured run (`memq fit`). Pure.

Estimators that need no run count parameters, gradients and optimizer state and stop there; what a
batch changes is the activations. A snapshot whose trace holds the run from its start (the agent's
warm-up recording, at its defaults) has every allocation of a whole training step in order. This
module replays that trace through the caching-allocator model (allocator_model.py) with the
input-sized allocations scaled, so what the allocator rounds, splits and caches at the new shape is
modelled, not guessed:

1. Classify every allocation of the trace by what it holds (`classify`), in this order:
   parameters and optimizer state (by their frames, or allocated in optimizer code); gradients (freed
   in optimizer code: `zero_grad`); what is never freed in the trace (kept across steps); a
   gradient-sized temporary (no Python frames, autograd's thread, and exactly a gradient's size: the
   second use of a tied weight sums into one; a weight's gradient made in a matrix product's precision,
   by its C++ frame or, in any trace, by its float32 cast kept as .grad); an autocast weight copy (see
   CAST_* below); a library workspace (see WORKSPACE_* below); the rest is input-sized and scales (a
   reduction's staging buffer to REDUCE_STAGING_MAX at most).
2. Predict (`predict`): the program with input-sized sizes x k (k = batch / measured batch, times
   length / measured length), optimizer state x the new optimizer's state multiple over the old one;
   peak reserved from the model without a limit, peak allocated from the same sizes.
3. Under a limit (`fits_under`): the model with the limit, which frees its cache and retries before
   it fails as the real allocator does; the largest batch is the largest k the model serves.
4. Interval: the trace's margin either side of the point, and the same margin on the limit for `fits`
   and the largest batch (`fits` is null when the answer changes within it): FIT_MARGIN where the
   model's own ops decide every size (within 0.4% on every such family), FIT_MARGIN_LIBRARY where the
   trace shows a size a library chooses at run time by shape (`library_choice`: cuDNN's convolutions and
   LSTM; up to 12.6% off on the families of tests/fixtures/fit_families), FIT_MARGIN_COMPILE for
   torch.compile, whose autotuning is left out: the peak of a restart (tests/fixtures/fit_compile_cache).

Sequence length is scaled linearly, per site: fused attention (scaled_dot_product_attention) keeps
no t x t matrix; attention scores (SCORES) grow with its square where a model keeps them.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field, replace

from memq.analysis import frames as fr
from memq.analysis import whatif as wi
from memq.analysis.allocator_model import OP_ALLOC, OP_EMPTY_CACHE, OP_FREE, AllocatorModel, Program
from memq.analysis.provenance import block_classes

# The thresholds and figures memq fit decides by live in rules.py, each with its source.
from memq.analysis.rules import (
    CAST_COVERAGE,
    CAST_GRAD_GAP,
    CAST_GRAD_RATIO,
    CUBLAS_WORKSPACE_BYTES,
    CUBLAS_WORKSPACE_OLD_BYTES,
    FIT_FROZEN_GRADIENT_SHARE,
    FIT_MARGIN,
    FIT_MARGIN_COMPILE,
    FIT_MARGIN_COMPILE_FROZEN,
    FIT_MARGIN_COMPILE_LENGTH,
    FIT_MARGIN_LIBRARY,
    FIT_MARGIN_OPTIMIZER,
    FORWARD_ONLY_MARGIN,
    GRAD_TEMP_PER_GRADIENT,
    MIDRUN_MARGIN,
    ONE_STEP_REPEATS,
    REDUCE_SEMAPHORES_MAX,
    REDUCE_STAGING_MAX,
    STATE_BLOCKS,
    STATE_INFER_TOLERANCE,
    STATE_MULTIPLE,
    TEMP_MULTIPLE,
    WORKSPACE_NEAR,
    WORKSPACE_ODD,
)
from memq.analysis.rules import FIT_K_MAX as K_MAX
from memq.analysis.rules import FIT_MIN_BYTES as MIN_BYTES
from memq.model import Snapshot, frame_file, frame_line, frame_name, input_length

# What an allocation holds (the composition of a predicted peak).
PARAMETERS, GRADIENTS, OPT_STATE, OPT_TEMP, KEPT, GRAD_TEMP, CAST_COPY, INPUT, WORKSPACE, REDUCE_BUFFER, SCORES = (
    range(11))
KIND_NAMES = ("parameters", "gradients", "optimizer state", "optimizer step temporaries",
              "kept across steps", "gradient-sized temporaries", "autocast weight copies",
              "input-sized (activations)", "library workspaces", "reduction buffers",
              "attention scores (length squared)")
SCALES_WITH_INPUT = (INPUT,)
ACTIVATIONS = (INPUT, SCORES)  # what a forward makes from its input: x k, and the scores x the length again

OPTIMIZER_NAMES = tuple(STATE_MULTIPLE)


class NotAssessable(Exception):
    """The snapshot cannot answer (why is the message)."""


@dataclass
class Measured:
    """A snapshot's trace, compiled and classified: what `predict` scales."""

    replay: object  # whatif.Replay
    kinds: list[int]  # per handle
    optimizer: str | None  # recorded optimizer (a STATE_MULTIPLE key) or None
    parameter_bytes: int
    cast_share: float
    steps: int  # optimizer steps in the trace
    covers_start: bool  # the trace starts at an empty allocator
    recorded_peak: int  # reserved bytes at the trace's peak, as recorded
    notes: list[str] = field(default_factory=list)
    # Optimizer state: what the new optimizer's state is re-sized from (see `state_plan`).
    gradient_bytes: int = 0  # one whole step's gradients (the trainable parameters' bytes); 0 if unknown
    gradient_sizes: tuple = ()  # those gradients' sizes, one entry per gradient
    state_bytes: int = 0  # the recorded optimizer's state: allocated in the trace or live before it
    pre_state: tuple = ()  # (handle, bytes) of state blocks live before the trace began
    optimizer_inferred: bool = False  # the optimizer was read from its state's size, not named
    partial: str | None = None  # a trace of part of the first step: what it holds (PARTIAL_*), the rest inferred
    optimizer_assumed: bool = False  # of a partial step: the optimizer was neither asked for nor named
    step_ops: tuple = ()  # program op index where each optimizer step begins
    library: str | None = None  # a size a library chooses by shape, seen in the trace (LIBRARY_*), or None
    switched: str | None = None  # of an answer for another optimizer than the recorded one: that optimizer
    autotuning: int = 0  # torch.compile's autotuning requests left out of the program (`without_autotuning`)
    length_asked: bool = False  # of an answer at another sequence length (`asked`): its interval may be wider

    @property
    def margin(self) -> float:
        """The interval either side of a prediction from this trace: FIT_MARGIN, or FIT_MARGIN_LIBRARY where
        the trace shows a size a library chooses by shape; never narrower than that, MIDRUN_MARGIN of a trace
        that starts mid-run, FORWARD_ONLY_MARGIN of the first step's forward alone."""
        return trace_margin(self.library, self.covers_start, self.partial, self.switched, self.length_asked,
                            self.frozen_base)[0]

    @property
    def margin_reason(self) -> str:
        """Why the interval is as wide as it is (the words `memq fit` prints beside it)."""
        return trace_margin(self.library, self.covers_start, self.partial, self.switched, self.length_asked,
                            self.frozen_base)[1]

    @property
    def frozen_base(self) -> bool:
        """Does the trace train a frozen base (one step's gradients under FIT_FROZEN_GRADIENT_SHARE of the
        parameters' bytes: a LoRA fine-tune)?"""
        return 0 < self.gradient_bytes < FIT_FROZEN_GRADIENT_SHARE * self.parameter_bytes


@dataclass(frozen=True)
class Prediction:
    peak_reserved: int
    peak_allocated: int
    composition: dict[str, int]  # at the allocated peak, by kind name


def _is_grad_free(frames) -> bool:
    return bool(frames) and fr.is_optimizer(frames)


def python_frames(frames) -> list:
    """The Python frames of a stack. A trace recorded with stacks="all" (torch's default for
    `_record_memory_history`) gives every allocation C++ frames too, those of autograd's thread
    included: "no Python frames" is what tells that thread's allocations apart, not "no frames"."""
    return [f for f in frames or () if frame_file(f).endswith(".py")]


def _call_site(frames) -> tuple | None:
    frames = python_frames(frames) or frames
    if not frames:
        return None
    return tuple((frame_file(f), frame_name(f), frame_line(f)) for f in frames)


def recorded_optimizer(snap: Snapshot) -> str | None:
    """The optimizer the agent named (its class), else the one the trace's optimizer frames name
    (Adam and AdamW share torch's adam.py: the frames read as adam)."""
    named = ((snap.agent.optimizer if snap.agent is not None else None) or "").lower()
    names = set()
    state = 0
    for ev in snap.trace:
        if ev.action != "alloc" or not ev.frames or not fr.is_optimizer(ev.frames):
            continue
        for f in ev.frames:
            path = frame_file(f)
            if "bitsandbytes" in path:
                names.add("adamw_8bit")
            elif "/optim/" in path:
                base = path.rsplit("/", 1)[-1].removesuffix(".py")
                if base in ("adam", "adamw", "sgd", "adafactor"):
                    names.add(base)
        if fr.categorize(ev.frames) == fr.OPTIMIZER_STATE:
            state += ev.size
    if "8bit" in named:
        return "adamw_8bit"
    for name in ("adamw", "adam", "adafactor", "sgd"):
        if named.startswith(name):
            return "sgd_momentum" if name == "sgd" and state else name
    for name in ("adamw_8bit", "adamw", "adam", "adafactor", "sgd"):
        if name in names:
            return "sgd_momentum" if name == "sgd" and state else name
    return None


def classify(snap: Snapshot, optimizer: str | None = None) -> Measured:
    """`optimizer`: of a trace that holds only part of its first step (no optimizer step yet), the
    optimizer whose state and step the rest of the step adds (else the agent's, else AdamW, said so)."""
    if not snap.trace:
        raise NotAssessable("the snapshot has no trace: memq fit replays a recorded training step (the agent "
                            "records the warm-up at its defaults, or history=\"on\")")
    try:
        rep = wi.compile_trace(snap)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        # a trace the replay cannot follow (entries out of order, a segment it never saw made): the same
        # inputs `memq whatif` reports as not assessable
        raise NotAssessable(f"the trace cannot be compiled for the allocator model ({type(exc).__name__})") from exc
    recorded_peak = max(rep.recorded_reserved_after(), default=0)
    rep, tuned = without_autotuning(rep, snap.trace)
    held = 0
    if tuned:
        rep, held = released_first_step_holds(rep, snap.trace)
    prog, trace = rep.program, snap.trace
    kinds = [INPUT] * prog.n_handles
    size_of = [0] * prog.n_handles
    ev_of = [-1] * prog.n_handles
    is_open = [False] * prog.n_handles
    grads: dict[int, int] = {}
    n_events = len(trace)
    for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)):
        if op not in (OP_ALLOC, OP_FREE) or not 0 <= rep.op_event[i] < n_events:
            continue  # OOM requests, empty_cache, foreign pools: nothing to classify
        ev = trace[rep.op_event[i]]
        if op == OP_ALLOC:
            size_of[h], ev_of[h], is_open[h] = prog.size[i], rep.op_event[i], True
            if ev.frames and fr.is_optimizer(ev.frames):
                kinds[h] = OPT_TEMP  # OPT_STATE below when it is kept
            elif ev.frames and fr.categorize(ev.frames) == fr.PARAMETERS:
                kinds[h] = PARAMETERS
        elif op == OP_FREE and is_open[h]:
            is_open[h] = False
            if kinds[h] == INPUT and _is_grad_free(ev.frames):
                kinds[h] = GRADIENTS
                grads[size_of[h]] = grads.get(size_of[h], 0) + 1
    for h in range(prog.n_handles):
        if is_open[h] and kinds[h] == INPUT:
            kinds[h] = KEPT
        if kinds[h] == OPT_TEMP and is_open[h]:
            kinds[h] = OPT_STATE  # allocated in optimizer code and kept: state (foreach or fused init)
    big = {s for s in grads if s >= MIN_BYTES}
    for h in range(prog.n_handles):
        if kinds[h] != INPUT or ev_of[h] < 0 or python_frames(trace[ev_of[h]].frames):
            continue
        if size_of[h] in big:
            kinds[h] = GRAD_TEMP
        elif is_workspace(size_of[h]):
            kinds[h] = WORKSPACE
    _activation_gradients(trace, kinds, size_of, ev_of, grads)
    _scale_input_sized_workspaces(kinds, size_of)
    _mark_reduce_buffers(trace, kinds, ev_of)
    notes: list[str] = []
    share = _mark_cast_copies(snap, rep, trace, kinds, size_of, ev_of, grads, big, notes)
    _hold_weight_gradients(trace, kinds, size_of, ev_of, _weight_sizes(rep, kinds, size_of, grads))
    _hold_cast_gradients(prog, kinds, lambda h: ev_of[h] >= 0 and not python_frames(trace[ev_of[h]].frames))
    _mark_scores(snap, trace, kinds, ev_of, range(prog.n_handles))
    _live_classes(snap, rep, kinds, ev_of, is_open)  # names only: after every rule that decides what scales
    steps = optimizer_steps(trace)
    grad_sizes = _step_gradients(prog, rep.op_event, trace, kinds, size_of)
    params = sum(size_of[h] for h in range(prog.n_handles) if kinds[h] == PARAMETERS)
    if not params:  # parameters made before the trace: one step's gradients stand for them
        params = sum(grad_sizes)
    covers = not rep.start_segments
    library = library_choice(trace)  # one scan of the frames: the interval of a whole or a partial step
    if tuned:
        notes.append(f"torch.compile's autotuning ({tuned} requests: its cache-flush buffers and the arguments it "
                     "clones to time candidate kernels) left out: the prediction is of a run whose compiled kernels "
                     "are cached (a restart, or any run after the first at that shape)")
    if held:
        notes.append(f"{held} block(s) of the first step that this first run's compile kept to the end (every later "
                     "step frees its own) are freed as a later step frees them, as a restart does")
    if not covers:
        notes.append("the trace starts mid-run: blocks live before it are held at their recorded size, and the "
                     f"interval is +/-{MIDRUN_MARGIN:.0%} (a trace from the run's start: "
                     f"+/-{trace_margin(library)[0]:.0%})")
    if steps == 0:
        return replace(_one_step(snap, rep, kinds, size_of, ev_of, is_open, optimizer, share, notes, covers, library),
                       autotuning=tuned)
    if steps < 2:
        raise NotAssessable(f"the trace holds {steps} optimizer step(s): a prediction needs a whole training "
                            "step (two optimizer steps apart); the agent's defaults record the warm-up steps")
    pre_state = _pre_trace_state(snap, rep)
    state = sum(size_of[h] for h in range(prog.n_handles) if kinds[h] == OPT_STATE) + sum(b for _h, b in pre_state)
    optimizer, inferred = recorded_optimizer(snap), False
    if optimizer is None:
        optimizer, inferred = infer_optimizer(state, sum(grad_sizes))
        if optimizer is not None:
            notes.append(f"the optimizer is not named in the trace (its state predates it): read as {optimizer} "
                         f"from its state, {state / max(1, sum(grad_sizes)):.2f}x one step's gradients")
    return Measured(replay=rep, kinds=kinds, optimizer=optimizer, parameter_bytes=params,
                    cast_share=round(share, 3), steps=steps, covers_start=covers,
                    recorded_peak=recorded_peak, notes=notes, autotuning=tuned,
                    gradient_bytes=sum(grad_sizes), gradient_sizes=tuple(grad_sizes), state_bytes=state,
                    pre_state=tuple(pre_state), optimizer_inferred=inferred,
                    step_ops=_step_ops(prog, rep.op_event, trace), library=library)



# ------------------------------------------------------------------ one step, or part of one
PARTIAL_FORWARD = "forward"
# A library's own buffer, kept for the process (cuBLAS's workspace), by its C++ frame: at a cut inside a
# step it is live beside the activations, and is not one. (cuDNN's frames are no such sign: a convolution's
# output is allocated under them.)
_KEPT_WORKSPACE = re.compile(r"getCUDABlasLtWorkspace|getCurrentCUDABlasHandle|[Ww]orkspace")
PARTIAL_BACKWARD = "forward and backward"


def _backward_entry(ev, has_python: bool) -> bool:
    """An entry of the autograd engine: its frames (a Python `backward()`, `*Backward*`, the engine),
    or no Python frames at all in a trace that records them elsewhere (the engine's thread has none)."""
    py = python_frames(ev.frames)
    if py:
        return fr.is_backward(py)
    return has_python and (not ev.frames or fr.is_backward(ev.frames))


def _step_bounds(prog, op_event, trace, kinds) -> tuple[int, int, int | None]:
    """(the op where the first training step begins, its first forward op, the op where its backward
    begins or None): the step begins after the last parameter made before the first forward (the
    model's build), the backward at the engine's first entry after that."""
    has_python = any(python_frames(e.frames) for e in trace)
    n_events = len(trace)
    first_fwd = None
    for i, e in enumerate(op_event):
        if 0 <= e < n_events and any(fr.FORWARD_NAME.search(frame_name(f)) for f in python_frames(trace[e].frames)):
            first_fwd = i
            break
    if first_fwd is None:
        raise NotAssessable("the trace holds no forward pass of a training step: memq fit replays a recorded step "
                            "(or part of one, from its forward on)")
    start = 0
    for i in range(first_fwd):
        if prog.ops[i] == OP_ALLOC and kinds[prog.hid[i]] == PARAMETERS:
            start = i + 1
    for i in range(start, len(prog.ops)):
        e = op_event[i]
        if 0 <= e < n_events and prog.ops[i] == OP_ALLOC and _backward_entry(trace[e], has_python):
            return start, first_fwd, i
    return start, first_fwd, None


def inferred_words(partial: str, opt: str, state: int, how: str) -> str:
    """What `memq fit` says it inferred for a partial step (`how`: the optimizer was asked for, named in
    the recording, or assumed)."""
    said = {"assumed": " (assumed: no optimizer is named; give --optimizer)", "named": " (named in the recording)",
            "asked": " (--optimizer)"}[how]
    return (f"the trace holds the first step's {partial} only: the rest of the step is inferred; optimizer state "
            f"inferred from parameters for {opt}{said}: {state / (1 << 20):.0f} MiB")


def _one_step(snap, rep, kinds, size_of, ev_of, is_open, optimizer, share, notes, covers,
              library: str | None) -> Measured:
    """A trace that holds the first step's forward (and maybe its backward) but no optimizer step: the
    rest of the step is added from what the trace holds, and ONE_STEP_REPEATS steps repeat it, so that
    the peak of a step that runs beside the optimizer's state is what is predicted:

    - forward only: the forward's memory played backwards (a saved activation, what the forward left
      live, freed where it was made; a temporary made again where it was freed), beside a chain of
      activation gradients (one of each saved activation's size, the previous one freed) and one gradient
      per parameter (all trainable: the trace cannot tell a frozen one), made as the walk goes;
    - forward and backward: what the backward kept of a parameter's size are the gradients;
    - the optimizer step: its state (STATE_MULTIPLE x each gradient, in STATE_BLOCKS blocks, made at the
      first step and kept) and its temporaries (TEMP_MULTIPLE x each gradient, made and freed); then
      zero_grad frees the gradients;
    - ONE_STEP_REPEATS more steps: the recorded step's allocations (those it frees, its gradients and what
      scales with the input) again, with the same tail.
    The optimizer is the one asked for, else the one the agent named, else AdamW (said so)."""
    prog, trace = rep.program, snap.trace
    kinds = list(kinds)
    start, first_fwd, bwd = _step_bounds(prog, rep.op_event, trace, kinds)
    step_handles = []
    for i in range(start, len(prog.ops)):
        if prog.ops[i] == OP_ALLOC:
            step_handles.append(prog.hid[i])
    made = {prog.hid[i]: i for i in range(start, len(prog.ops)) if prog.ops[i] == OP_ALLOC}
    param_sizes = {size_of[h] for h in range(prog.n_handles) if kinds[h] == PARAMETERS and h not in made}
    param_sizes |= {req for _a, h, req, _s in rep.start_live}
    # cuBLAS's workspace (the rules' size, on Hopper and before it): kept for the process, made at the
    # forward's first matrix product; in a trace of Python frames alone its size is all that tells it
    lib_sizes = {CUBLAS_WORKSPACE_BYTES, int(CUBLAS_WORKSPACE_OLD_BYTES)}
    companion = None  # the call site of cuBLAS's workspace: its next allocation there is cuBLASLt's
    for h in step_handles:  # what the partial step left live: read by when it was made
        site, companion = companion, None
        if not is_open[h] or kinds[h] in (OPT_STATE, OPT_TEMP, CAST_COPY):
            continue
        ev = trace[ev_of[h]]
        if site is not None and _call_site(ev.frames) == site:
            kinds[h] = WORKSPACE
        elif ev.frames and fr.categorize(ev.frames) == fr.PARAMETERS:
            kinds[h] = PARAMETERS
        elif is_workspace(size_of[h]) or any(_KEPT_WORKSPACE.search(frame_name(f)) for f in ev.frames or ()):
            kinds[h] = WORKSPACE
        elif size_of[h] in lib_sizes and (bwd is None or made[h] < bwd):
            kinds[h] = WORKSPACE  # cuBLAS's kept workspace, made at the forward's first matrix product
            lib_sizes.discard(size_of[h])
            companion = _call_site(ev.frames)
        elif bwd is not None and made[h] >= bwd:
            # made by the engine and kept after it: a parameter's .grad, of a parameter's size (a library's
            # buffer made on the engine's thread, frameless in a trace of Python frames, is not)
            kinds[h] = GRADIENTS if not param_sizes or size_of[h] in param_sizes else WORKSPACE
        else:  # the classes of the live blocks (provenance) read a whole step's end, not a cut inside one
            kinds[h] = INPUT
    _mark_scores(snap, trace, kinds, ev_of, step_handles)
    grads = [h for h in step_handles if is_open[h] and kinds[h] == GRADIENTS]
    if bwd is not None and not grads:
        raise NotAssessable("the trace's backward kept no gradients (cut before its first one): a prediction needs "
                            "its forward alone, or its backward to its end")
    big = {size_of[g] for g in grads if size_of[g] >= MIN_BYTES}
    for h in step_handles:  # as `classify` reads a whole step: a frameless temporary of a gradient's size
        if not is_open[h] and kinds[h] == INPUT and size_of[h] in big and not python_frames(trace[ev_of[h]].frames):
            kinds[h] = GRAD_TEMP
    step_grads: dict[int, int] = {}
    for g in grads:
        step_grads[size_of[g]] = step_grads.get(size_of[g], 0) + 1
    _activation_gradients(trace, kinds, size_of, ev_of, step_grads)
    if not share:  # autocast's copies, now that the gradients (or, of a forward alone, the parameters) are known
        counts: dict[int, int] = {}
        for g in grads:
            counts[size_of[g]] = counts.get(size_of[g], 0) + 1
        share = _mark_cast_copies(snap, rep, trace, kinds, size_of, ev_of, counts, big, notes)
    _hold_weight_gradients(trace, kinds, size_of, ev_of,
                           _weight_sizes(rep, kinds, size_of, {size_of[g] for g in grads}) | param_sizes)
    _hold_cast_gradients(prog, kinds, lambda h: ev_of[h] >= 0 and not python_frames(trace[ev_of[h]].frames))
    partial = PARTIAL_BACKWARD if bwd is not None else PARTIAL_FORWARD
    named = recorded_optimizer(snap)
    opt = optimizer or named or "adamw"
    assumed = optimizer is None and named is None
    params = [size_of[h] for h in range(prog.n_handles) if kinds[h] == PARAMETERS]
    params += [req for _a, h, req, _s in rep.start_live if kinds[h] in (PARAMETERS, KEPT)] if not params else []
    if partial == PARTIAL_FORWARD and not params:
        raise NotAssessable("the trace holds a forward pass but no parameters to size its gradients from")
    out = _StepWriter(prog, kinds)
    live_inputs = [h for h in step_handles if is_open[h] and kinds[h] in (*ACTIVATIONS, CAST_COPY)]
    saved = set(live_inputs)
    fwd1 = [(op, h) for op, h in zip(prog.ops[start:], prog.hid[start:], strict=True)
            if op in (OP_ALLOC, OP_FREE) and (h in saved or h in made)]
    fwd1 = [(op, h) for op, h in fwd1 if h in saved or not is_open[h]]
    g1 = out.backward_mirror(fwd1, saved, params) if partial == PARTIAL_FORWARD else grads
    g1 = _in_parameter_order(g1, params, out.size_of)
    out.optimizer_step(g1, opt, first=True)
    out.free_all(g1)  # zero_grad
    kept = [h for h in live_inputs if h not in set(out.freed)]
    # the step's loss is dropped; its input, made before the forward, when the next step's replaces it
    batch = [h for h in kept if made[h] < first_fwd]
    out.free_all([h for h in kept if made[h] >= first_fwd])
    prev_batch = batch
    for _ in range(ONE_STEP_REPEATS):
        mapping = out.repeat(start, lambda h: not is_open[h] or kinds[h] in (*ACTIVATIONS, CAST_COPY, GRADIENTS),
                             at=first_fwd, then=lambda b=prev_batch: out.free_all(b))
        if partial == PARTIAL_FORWARD:
            fwd2 = [(op, mapping[h]) for op, h in fwd1 if h in mapping]
            g2 = out.backward_mirror(fwd2, {mapping[h] for h in saved if h in mapping}, params)
        else:
            g2 = [mapping[h] for h in grads if h in mapping]
        g2 = _in_parameter_order(g2, params, out.size_of)
        out.optimizer_step(g2, opt, first=False)
        out.free_all(g2)
        prev_batch = [mapping[b] for b in batch if b in mapping]
        freed = set(out.freed)
        out.free_all([mapping[h] for h in kept if h in mapping and h not in batch and mapping[h] not in freed])
    grad_sizes = [out.size_of(h) for h in g1]
    state = sum(out.size_of(h) for h in range(len(out.kinds)) if out.kinds[h] == OPT_STATE)
    notes.append(inferred_words(partial, opt, state, "assumed" if assumed else "named" if optimizer is None
                                else "asked"))
    extra = len(out.ops) - len(prog.ops)
    new_rep = replace(rep, program=out.program(), op_event=list(rep.op_event) + [-1] * extra,
                      recorded_alloc_addr=list(rep.recorded_alloc_addr) + [None] * extra)
    param_bytes = sum(params)
    return Measured(replay=new_rep, kinds=out.kinds, optimizer=opt, parameter_bytes=param_bytes,
                    cast_share=round(share, 3), steps=0, covers_start=covers, recorded_peak=0, notes=notes,
                    gradient_bytes=sum(grad_sizes), gradient_sizes=tuple(grad_sizes), state_bytes=state,
                    partial=partial, optimizer_assumed=assumed, library=library)


def _in_parameter_order(grads: list[int], params: list[int], size_of) -> list[int]:
    """The gradients in the parameters' order (the optimizer's and zero_grad's walk): each parameter, in the
    order the model made them, takes the last-made unused gradient of its size (the backward runs about in
    reverse); gradients no parameter claims follow, in reverse."""
    pool: dict[int, list[int]] = {}
    for g in grads:
        pool.setdefault(size_of(g), []).append(g)
    out = [pool[p].pop() for p in params if pool.get(p)]
    taken = set(out)
    return out + [g for g in reversed(grads) if g not in taken]


class _StepWriter:
    """Appends the inferred rest of a step to a compiled program (new handles get their kind)."""

    def __init__(self, prog: Program, kinds: list[int]):
        self.src = prog
        self.ops, self.hid = list(prog.ops), list(prog.hid)
        self.size, self.stream = list(prog.size), list(prog.stream)
        self.kinds = list(kinds)
        self.sizes: dict[int, int] = {h: s for op, h, s in zip(prog.ops, prog.hid, prog.size, strict=True)
                                      if op == OP_ALLOC}
        self.freed: list[int] = []

    def size_of(self, h: int) -> int:
        return self.sizes.get(h, 0)

    def new(self, kind: int, b: int, stream: int = 0) -> int:
        h = len(self.kinds)
        self.kinds.append(kind)
        self.sizes[h] = b
        self.ops.append(OP_ALLOC), self.hid.append(h), self.size.append(b), self.stream.append(stream)
        return h

    def free(self, h: int) -> None:
        self.ops.append(OP_FREE), self.hid.append(h), self.size.append(0), self.stream.append(0)
        self.freed.append(h)

    def free_all(self, hs) -> None:
        for h in hs:
            self.free(h)

    def backward(self, saved: list[int], params: list[int]) -> list[int]:
        """The saved activations walked in reverse: a gradient of each one's size made, the previous one
        freed, the activation freed; the parameters' gradients made in reverse as the walk goes."""
        grads: list[int] = []
        prev = None
        todo = list(reversed(params))
        n = max(1, len(saved))
        for i, a in enumerate(reversed(saved)):
            t = self.new(self.kinds[a], self.size_of(a))
            if prev is not None:
                self.free(prev)
            prev = t
            while todo and len(grads) < len(params) * (i + 1) // n:
                grads.append(self.new(GRADIENTS, todo.pop(0)))
            self.free(a)
        if prev is not None:
            self.free(prev)
        while todo:
            grads.append(self.new(GRADIENTS, todo.pop(0)))
        return grads

    def backward_mirror(self, fwd: list[tuple[int, int]], saved: set[int], params: list[int]) -> list[int]:
        """The forward's memory played backwards: its allocations (op, handle) reversed, a saved activation
        freed where it was made, a temporary made again where it was freed and freed where it was made;
        beside it the chain of gradients (one of each saved activation's size, the previous one freed)
        and the parameters' gradients, made in reverse as the walk goes."""
        grads: list[int] = []
        todo = list(reversed(params))
        n = max(1, len(saved))
        again: dict[int, int] = {}
        prev = None
        done = 0
        for op, h in reversed(fwd):
            if op == OP_FREE:
                again[h] = self.new(self.kinds[h], self.size_of(h))
            elif h in again:
                self.free(again.pop(h))
            elif h in saved:
                t = self.new(self.kinds[h], self.size_of(h))
                if prev is not None:
                    self.free(prev)
                prev = t
                done += 1
                while todo and len(grads) < len(params) * done // n:
                    grads.append(self.new(GRADIENTS, todo.pop(0)))
                self.free(h)
        if prev is not None:
            self.free(prev)
        self.free_all(list(again.values()))
        while todo:
            grads.append(self.new(GRADIENTS, todo.pop(0)))
        return grads

    def optimizer_step(self, grads: list[int], opt: str, first: bool) -> None:
        """The state (first step) and the step's temporaries, per gradient in the order given (the
        parameters', as the optimizer walks its groups)."""
        mult, blocks, temp = STATE_MULTIPLE[opt], STATE_BLOCKS[opt], TEMP_MULTIPLE[opt]
        if first and mult > 0:
            per = blocks or 1
            for g in grads:
                for _ in range(per):
                    self.new(OPT_STATE, max(1, int(self.size_of(g) * mult / per)))
        if temp > 0:
            self.free_all([self.new(OPT_TEMP, max(1, int(self.size_of(g) * temp))) for g in grads])

    def repeat(self, start: int, again, at: int = -1, then=None) -> dict[int, int]:
        """The recorded step's ops from `start` again, with new handles for the allocations `again`
        accepts; their frees follow them; `then()` before op `at`. Returns old handle -> new."""
        mapping: dict[int, int] = {}
        src = self.src
        for i in range(start, len(src.ops)):
            if i == at and then is not None:
                then()
            op, h = src.ops[i], src.hid[i]
            if op == OP_ALLOC and again(h):
                mapping[h] = self.new(self.kinds[h], src.size[i], src.stream[i])
            elif op == OP_FREE and h in mapping:
                self.free(mapping[h])
        return mapping

    def program(self) -> Program:
        return Program(ops=self.ops, hid=self.hid, size=self.size, stream=self.stream, n_handles=len(self.kinds))


def _step_ops(prog, op_event, trace) -> tuple:
    """The program op at which each optimizer step begins: the first op at or after the step's first
    entry into optimizer code (an allocation, or a free request: plain SGD allocates nothing)."""
    starts, in_opt = [], False
    for i, ev in enumerate(trace):
        if ev.frames and ev.action in ("alloc", "free_requested"):
            opt = fr.is_optimizer(ev.frames)
            if opt and not in_opt:
                starts.append(i)
            in_opt = opt
    out, j = [], 0
    for i, e in enumerate(op_event):
        while j < len(starts) and e >= starts[j]:
            out.append(i)
            j += 1
    return tuple(out)


def _step_gradients(prog, op_event, trace, kinds, size_of) -> list[int]:
    """The sizes of one whole step's gradients: of the gradients freed in each `zero_grad` (one per
    optimizer step), the step that freed the most bytes (a trace that starts mid-step sees part of one)."""
    episode, in_opt, n = [0] * len(trace), False, 0
    for i, ev in enumerate(trace):
        if ev.frames and ev.action in ("alloc", "free_requested"):
            opt = fr.is_optimizer(ev.frames)
            n += opt and not in_opt
            in_opt = opt
        episode[i] = n
    per: dict[int, list[int]] = {}
    for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)):
        if op == OP_FREE and kinds[h] == GRADIENTS and size_of[h] and 0 <= op_event[i] < len(trace):
            per.setdefault(episode[op_event[i]], []).append(size_of[h])
    return max(per.values(), key=sum) if per else []


def _pre_trace_state(snap: Snapshot, rep) -> list[tuple[int, int]]:
    """(handle, requested bytes) of the blocks live before the trace began that optimizer code
    allocated (their frames, kept with the block: recording was on when the state was made)."""
    live = {b.address: b for seg in snap.segments for b in seg.blocks if b.state != "inactive"}
    out = []
    for addr, h, req, _stream in rep.start_live:
        b = live.get(addr)
        if b is not None and b.requested_size == req and b.frames and fr.is_optimizer(b.frames):
            out.append((h, req))
    return out


def infer_optimizer(state_bytes: int, gradient_bytes: int) -> tuple[str | None, bool]:
    """The optimizer a trace does not name, from its state's size against one step's gradients:
    none (plain SGD, or any stateless step), one copy (SGD with momentum) or two (Adam/AdamW), within
    STATE_INFER_TOLERANCE. (None, False) when the gradients are unknown or the ratio is none of these."""
    if gradient_bytes <= 0:
        return None, False
    ratio = state_bytes / gradient_bytes
    for name, mult in (("sgd", 0.0), ("sgd_momentum", 1.0), ("adam", 2.0)):
        if abs(ratio - mult) <= STATE_INFER_TOLERANCE:
            return name, True
    return None, False


def choose(snaps: list[Snapshot]) -> tuple[int, str]:
    """Which of one run's snapshots (oldest first) to measure from, and why: the earliest whose trace
    starts at an empty allocator and holds a whole training step (two optimizer steps: the agent's
    warm-up recording); else the earliest holding a whole step mid-run (of a leaking job, the least
    grown: a later, longer recording window holds the leak's bytes as well as a step's); else the
    longest trace (the earliest of equals), which `classify` refuses with the reason."""
    stepped = [i for i, s in enumerate(snaps) if s.trace and optimizer_steps(s.trace) >= 2]
    for i in stepped:
        try:
            m = classify(snaps[i])
        except NotAssessable:
            continue
        if m.covers_start:
            return i, f"its trace starts at an empty allocator and holds {m.steps} optimizer steps"
    if stepped:
        i = stepped[0]
        return i, (f"its trace holds {optimizer_steps(snaps[i].trace)} optimizer steps from mid-run (no trace of the "
                   "run's start holds two): the earliest such")
    pick = max(range(len(snaps)), key=lambda i: (len(snaps[i].trace), -i))
    return pick, "its longest trace"


def _scale_input_sized_workspaces(kinds: list[int], size_of: list[int]) -> None:
    """A workspace within WORKSPACE_NEAR bytes of an input-sized allocation's size is a copy or transform
    of that activation (cuDNN's, for the algorithm it chose at this shape): it scales with the input."""
    inputs = sorted({size_of[h] for h in range(len(kinds)) if kinds[h] == INPUT and size_of[h] >= MIN_BYTES})
    if not inputs:
        return
    for h in range(len(kinds)):
        if kinds[h] == WORKSPACE and near_input(size_of[h], inputs):
            kinds[h] = INPUT


# C++ frames (a trace recorded with stacks="all") name what a frameless block of autograd's thread is.
# An autograd node's frame; the helpers that compute a weight's gradient (a tied weight's second use sums
# into a temporary of the weight's size) and an input's; the nodes whose output may be a weight's gradient
# (an op with a weight, or one a weight passes through: a transpose, a dtype cast), read as before when the
# helpers are not in the frames (inlined: no `_apply_functional` frame either).
_AUTOGRAD_NODE = re.compile(r"(\w+?)Backward\d*(?:_apply_functional|::apply)")
# a matrix product's gradient for its second operand (a linear layer's weight), made in the product's
# precision: the one helper that alone makes a block of a weight's size read as its gradient
_MAT2_GRAD = r"\bmm_mat2_backward\b"
_MAT2_GRAD_FRAME = re.compile(_MAT2_GRAD)
_WEIGHT_GRAD = re.compile(
    _MAT2_GRAD + r"|backward_weight|embedding_(?:dense_)?backward|AccumulateGrad|InputBuffer::add")
_INPUT_GRAD = re.compile(r"mm_mat1_backward|backward_input")
_WEIGHT_NODES = frozenset({"Mm", "Addmm", "Bmm", "Baddbmm", "Convolution", "Embedding", "EmbeddingDense", "Linear",
                           "Matmul", "T", "Transpose", "Permute", "ToCopy"})


def _activation_gradients(trace, kinds: list[int], size_of: list[int], ev_of: list[int], grads: dict) -> None:
    """A gradient-sized temporary that is an activation's gradient of a coinciding size (a VAE's 2 MiB SiLU
    gradients match a 2 MiB weight's) scales with the input. Told per block by its C++ frames where they say
    (stacks="all": the autograd node computes an input's gradient, or a weight's); else by how many there
    are: more than GRAD_TEMP_PER_GRADIENT x the gradients of that size or of twice it (a weight's gradient
    in bfloat16, before its cast, is half its float32 one) cannot all be weights'. `grads`: size -> how many
    gradients of that size the trace's optimizer steps freed."""
    temps: dict[int, int] = {}
    for h, kind in enumerate(kinds):
        if kind == GRAD_TEMP:
            temps[size_of[h]] = temps.get(size_of[h], 0) + 1
    for h, kind in enumerate(kinds):
        if kind != GRAD_TEMP or ev_of[h] < 0:
            continue
        frames = trace[ev_of[h]].frames
        scales = activation_gradient([frame_name(f) for f in frames or ()])
        if scales is None:
            s = size_of[h]
            scales = too_many_for_weights(temps[s], grads.get(s, 0) + grads.get(2 * s, 0))
        if scales:
            kinds[h] = INPUT


def too_many_for_weights(temps: int, grads: int) -> bool:
    """Are `temps` frameless temporaries of a gradient's size more than the weights of that size account
    for (GRAD_TEMP_PER_GRADIENT each: a tied embedding's second use makes 2 a step for its 1 gradient)?"""
    return temps > GRAD_TEMP_PER_GRADIENT * grads


def activation_gradient(names: list[str]) -> bool | None:
    """Do these C++ frame names show an autograd node computing an input's gradient (True) or a weight's
    (False)? None when they do not say: no node (Python frames only), or a node of an op with a weight whose
    helper frames were inlined away (which operand, unknown)."""
    if any(_WEIGHT_GRAD.search(n) for n in names):
        return False
    if any(_INPUT_GRAD.search(n) for n in names):
        return True
    node = next((m.group(1) for n in names if (m := _AUTOGRAD_NODE.search(n))), None)
    return None if node is None or node in _WEIGHT_NODES else True


def _mark_reduce_buffers(trace, kinds: list[int], ev_of: list[int]) -> None:
    """A reduction split over thread blocks (torch's gpu_reduce_kernel: a sum over the batch, such as the
    engine's of a broadcast parameter's gradient) allocates its staging buffer, then its semaphores, and
    frees them in the reverse order before anything else is requested: that pattern of four requests, the
    second of at most REDUCE_SEMAPHORES_MAX bytes, frames or none, marks the buffer (REDUCE_STAGING_MAX says
    how it grows). Of 1,550 such buffers on the
    stacks="all" recordings of tests/fixtures/fit_families and fit_one_step (the C++ frame naming the
    reduction) the pattern finds every one; what else it finds is optimizer code's, left as it is."""
    handle = {e: h for h, e in enumerate(ev_of) if e >= 0}
    last: list[int] = []  # the last three requests' entries (a trace can hold millions: no list of all)
    for i, d in enumerate(trace):
        if d.action not in ("alloc", "free_requested"):
            continue
        if len(last) == 3:
            a, b, c = (trace[j] for j in last)
            if (a.action == b.action == "alloc" and c.action == d.action == "free_requested" and c.addr == b.addr
                    and d.addr == a.addr and b.size <= REDUCE_SEMAPHORES_MAX and a.size >= MIN_BYTES):
                h = handle.get(last[0])
                if h is not None and kinds[h] in (INPUT, GRAD_TEMP):
                    kinds[h] = REDUCE_BUFFER
            last.pop(0)
        last.append(i)


def reduce_buffer_size(size: int, k: float) -> int:
    """A reduction's staging buffer at k x the input: it grows with the input up to REDUCE_STAGING_MAX; one
    at or over it already stays."""
    if size >= REDUCE_STAGING_MAX:
        return size
    return max(1, min(int(size * k), int(REDUCE_STAGING_MAX)))


def near_input(size: int, inputs: list[int]) -> bool:
    """Is `size` within WORKSPACE_NEAR bytes of one of `inputs` (sorted sizes of input-sized blocks)?"""
    j = bisect.bisect_left(inputs, size)
    return any(abs(x - size) <= WORKSPACE_NEAR for x in inputs[max(0, j - 1):j + 1])


def _live_classes(snap: Snapshot, rep, kinds: list, ev_of: list, is_open: list) -> None:
    """The blocks still live at the snapshot are named as every other screen names them
    (provenance.block_classes), so the peak's composition and the segment map agree: blocks older than
    the trace (parameters and optimizer state before a ring buffer's window, which the replay holds at
    their size) are no longer read as input-sized, and a block kept across steps that the trace shows
    to be a gradient or a parameter says so. Only names move: what scales with the input, and the
    optimizer's own allocations, keep their kind."""
    classes = block_classes(snap)
    prog, trace = rep.program, snap.trace
    freed = {h for op, h in zip(prog.ops, prog.hid, strict=True) if op == OP_FREE}
    for addr, h, _req, _stream in rep.start_live:
        if h in freed or not 0 <= h < len(kinds):
            continue
        bc = classes.get(addr)
        kinds[h] = _CLASS_KIND.get(bc.cls, KEPT) if bc is not None else KEPT
    for h, kind in enumerate(kinds):
        if kind != KEPT or not is_open[h] or ev_of[h] < 0:
            continue
        bc = classes.get(trace[ev_of[h]].addr)
        if bc is not None and _CLASS_KIND.get(bc.cls) in (PARAMETERS, GRADIENTS, WORKSPACE):
            kinds[h] = _CLASS_KIND[bc.cls]


# Attention scores: a (..., t, t) tensor grows with the square of the length t, where a block of (batch, t,
# width) grows with t. Attention's math path (a float mask such as a relative position bias, or no fused
# kernel) keeps its softmax for backward, one per layer; memq scaled it with t once and predicted
# tests/fixtures/fit_fresh's t5_relpos 7.3% low at 4x the length. Told by the line that made it and its
# bytes: the agent notes the first forward's saved (..., t, t) tensors (agent/scores.py); a trace with C++
# frames names softmax inside `_scaled_dot_product_attention_math`. Every allocation of that line and size is
# a score (the q @ k product beside the softmax is one too); a head width equal to t makes the line's
# (batch, heads, t, width) blocks the same size, and those are then read as scores as well.
_SDPA_MATH = "_scaled_dot_product_attention_math"
_SOFTMAX_OPS = frozenset(("_softmax", "softmax_int", "_safe_softmax"))
_OP_NAME = re.compile(r"at::_ops::(\w+)::")


def _innermost_python(frames) -> tuple[str, int] | None:
    for f in frames or ():
        path = frame_file(f)
        if path.endswith(".py"):
            return path, frame_line(f)
    return None


def _softmax_in_math_attention(frames) -> bool:
    """The allocation is softmax's output (the innermost op frame) inside attention's math path."""
    op = next((m.group(1) for m in map(_OP_NAME.match, map(frame_name, frames)) if m), None)
    return op in _SOFTMAX_OPS and any(_SDPA_MATH in frame_name(f) for f in frames)


def score_sites(snap: Snapshot, allocs=None) -> set[tuple[str, int, int]]:
    """(file, line, bytes) of the attention scores' allocations: the agent's, and those the C++ frames of
    `allocs` (alloc entries; by default every one of the trace) name."""
    sites = {(f, line, n) for f, line, n in snap.agent.square_sites} if snap.agent is not None else set()
    seen: dict[int, bool] = {}
    for ev in (e for e in snap.trace if e.action == "alloc") if allocs is None else allocs:
        if not ev.frames:
            continue
        hit = seen.get(id(ev.frames))
        if hit is None:
            hit = seen[id(ev.frames)] = _softmax_in_math_attention(ev.frames)
        if hit and (site := _innermost_python(ev.frames)) is not None:
            sites.add((*site, ev.size))
    return sites


def _mark_scores(snap: Snapshot, trace, kinds: list[int], ev_of: list[int], handles) -> None:
    """Scores are among what scales with the input: only those allocations are read (one pass over them,
    not the trace)."""
    inputs = [h for h in handles if kinds[h] == INPUT and ev_of[h] >= 0]
    sites = score_sites(snap, [trace[ev_of[h]] for h in inputs])
    if not sites:
        return
    for h in inputs:
        ev = trace[ev_of[h]]
        site = _innermost_python(ev.frames)
        if site is not None and (*site, ev.size) in sites:
            kinds[h] = SCORES


_CLASS_KIND = {fr.PARAMETERS: PARAMETERS, fr.GRADIENTS: GRADIENTS, fr.OPTIMIZER_STATE: OPT_STATE,
               fr.WORKSPACE_CAT: WORKSPACE}


def is_workspace(size: int) -> bool:
    """A frameless allocation of this many bytes reads as a library workspace (WORKSPACE_ODD)."""
    return size >= MIN_BYTES and size % WORKSPACE_ODD == 1


def optimizer_steps(trace) -> int:
    """Entries into optimizer code (allocations and free requests: plain SGD allocates nothing)."""
    steps, in_opt = 0, False
    for ev in trace:
        if ev.frames and ev.action in ("alloc", "free_requested"):
            opt = fr.is_optimizer(ev.frames)
            steps += opt and not in_opt
            in_opt = opt
    return steps


def _mark_cast_copies(snap, rep, trace, kinds, size_of, ev_of, grads, big, notes) -> float:
    """Mark autocast's weight copies (CAST_COPY); returns the share of the weights' bytes they cover.

    What autocast was doing is taken, first rule first, from: the agent, which read CUDA autocast's state
    at the first forward (`off`: no copies at all, whatever sizes coincide; a dtype: the copies found are
    held without the coverage test); the C++ frames of a trace recorded with stacks="all" (an allocation
    under `autocast::cached_cast` is a cast); else the copies are held only when they cover at least
    CAST_COVERAGE of the gradients' bytes (a float32 model's activations match half a weight's size often
    enough: 0.27 and 0.48 of the gradients on the calibration set's float32 GPTs). The weights are the
    gradients' sizes and the parameters' (a frozen base, as in a LoRA fine-tune, has no gradients)."""
    state = snap.agent.autocast if snap.agent is not None else None
    if state == "off":
        notes.append("autocast was off at the first forward (the agent read it): no weight copies")
        return 0.0
    params: dict[int, int] = {}
    for h in range(len(kinds)):
        if kinds[h] == PARAMETERS and size_of[h] >= 2 * MIN_BYTES:
            params[size_of[h]] = params.get(size_of[h], 0) + 1
    live = {b.address: b for seg in snap.segments for b in seg.blocks if b.state != "inactive"}
    for addr, _h, req, _stream in rep.start_live:
        b = live.get(addr)
        if b is not None and req >= 2 * MIN_BYTES and b.frames and fr.categorize(b.frames) == fr.PARAMETERS:
            params[req] = params.get(req, 0) + 1
    big_all = set(big) | set(params)
    halves = {s // 2 for s in big_all}
    # stacks="all": autocast's own frame names the casts (of activations too: the half-size test stays), of
    # any weight's size (a LoRA adapter's copy is 24 KiB), and nothing else is one (a float32 layer norm's
    # output can be half a weight's size): the call-site heuristic is for traces of Python frames alone
    cxx_frames = any(ev.frames and not frame_file(ev.frames[0]).endswith(".py") for ev in trace[:64])
    copies = set() if cxx_frames else set(_cast_copies(trace, kinds, size_of, ev_of, halves))
    if cxx_frames:
        weights = {size_of[h] for h in range(len(kinds)) if kinds[h] == PARAMETERS} | set(grads)
        weights |= {req for _a, _h, req, _s in rep.start_live}
        halves = halves | {s // 2 for s in weights if s >= 2}
    cxx = False
    for h in range(len(kinds)):
        if kinds[h] == INPUT and ev_of[h] >= 0 and size_of[h] in halves and _autocast_frame(trace[ev_of[h]].frames):
            copies.add(h)
            cxx = True
    covered = {size_of[h] * 2 for h in copies}
    counts = {sz: max(grads.get(sz, 0), params.get(sz, 0)) for sz in big_all}
    total = sum(sz * n for sz, n in counts.items())
    share = sum(sz * n for sz, n in counts.items() if sz in covered) / total if total else 0.0
    told = state not in (None, "off") or cxx
    if copies and holds_cast_copies(share, told):
        for h in copies:
            kinds[h] = CAST_COPY
        why = (f"autocast {state} at the first forward (the agent read it)" if state not in (None, "off") else
               "autocast's cast in the C++ frames" if cxx else "the copies' coverage")
        notes.append(f"autocast weight copies found for {share:.0%} of the weights' bytes ({why}): held at their size")
    return share


def _weight_sizes(rep, kinds, size_of, grads) -> set[int]:
    """The weights' sizes: the gradients', the parameters' made in the trace and of the blocks live before it."""
    out = set(grads) | {size_of[h] for h in range(len(kinds)) if kinds[h] == PARAMETERS}
    return out | {req for _a, _h, req, _s in rep.start_live}


def _hold_weight_gradients(trace, kinds, size_of, ev_of, weights: set[int]) -> None:
    """A trace with C++ frames (stacks="all") names where a weight's gradient is computed (a matrix
    product's gradient for its second operand, `mm_mat2_backward`, made in the product's precision; the
    other helpers `activation_gradient` reads also run for what is not a weight's own gradient, such as
    an accumulation's sum): one of a weight's size or half of it (autocast's bfloat16 of a float32
    weight) is held at its size, not scaled with the input (the checkpointed bf16 GPT's tied 32000 x 512
    head: 31 MiB at every batch, 125 MiB when scaled 4x, which moved the allocator's packing by 1 GiB). A
    product of two activations has a second operand of no weight's size: it scales."""
    for h in range(len(kinds)):
        if kinds[h] != INPUT or ev_of[h] < 0 or not (size_of[h] in weights or 2 * size_of[h] in weights):
            continue
        if any(_MAT2_GRAD_FRAME.search(frame_name(f)) for f in trace[ev_of[h]].frames or ()):
            kinds[h] = GRAD_TEMP


def _hold_cast_gradients(prog, kinds, frameless) -> None:
    """A weight's gradient made in a matrix product's precision under autocast, found without C++ frames:
    autograd casts it to the weight's float32 (an allocation of exactly CAST_GRAD_RATIO x its size) and
    frees it at once, CAST_GRAD_GAP ops later; with .grad set to None the float32 copy becomes the .grad,
    kept to zero_grad (or to the trace's end), or, when its strides are not the weight's (an einsum's or
    bmm's weight), .grad is a copy of it made on the next op and the cast is freed on the one after. An
    activation's gradient cast the same way is consumed by the next op, not kept: it scales.
    `frameless(h)`: the block has no Python frames (autograd's thread)."""
    ops, hid, size = prog.ops, prog.hid, prog.size
    kept = (GRADIENTS, KEPT)  # the last step's .grad, when zero_grad comes first in a step, is never freed
    alloc = {}
    for i, (op, h) in enumerate(zip(ops, hid, strict=True)):
        if op == OP_ALLOC:
            alloc[h] = i
        elif op == OP_FREE and h in alloc and kinds[h] == INPUT and i >= CAST_GRAD_GAP:
            j = i - CAST_GRAD_GAP
            if ops[j] != OP_ALLOC or size[j] != CAST_GRAD_RATIO * size[alloc[h]] or not frameless(h):
                continue
            copied = (i + 2 < len(ops) and ops[i + 1] == OP_ALLOC and size[i + 1] == size[j]
                      and kinds[hid[i + 1]] in kept and ops[i + 2] == OP_FREE and hid[i + 2] == hid[j])
            if kinds[hid[j]] in kept or copied:
                kinds[h] = GRAD_TEMP


def holds_cast_copies(share: float, told: bool) -> bool:
    """Are the half-size copies found autocast's (held at their size)? Yes when the agent or autocast's
    own frame said so, else when they cover CAST_COVERAGE of the weights' bytes."""
    return told or share >= CAST_COVERAGE


def _autocast_frame(frames) -> bool:
    return any("autocast" in frame_name(f) and "cast" in frame_name(f).rsplit("autocast", 1)[-1] for f in frames or ())


# torch.nn.functional's ops that CUDA autocast runs in float32 (torch's "CUDA Ops that can autocast to
# float32" list): their outputs and statistics are never half-precision weight copies, whatever their size
# (a layer norm's output at 4 x 256 x 768 is half of a 768 x 2048 weight).
AUTOCAST_FLOAT32_OPS = frozenset({
    "layer_norm", "group_norm", "softmax", "log_softmax", "cross_entropy", "nll_loss", "mse_loss", "l1_loss",
    "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits", "kl_div", "cosine_similarity", "pdist",
    "cdist", "softplus",
})


# torch.compile's runtime (AOTAutograd's wrappers, inductor's compiled module and its launcher; torch 2.0's
# aot_autograd.py held the wrappers): its frames under an allocation say a compiled graph made it.
_COMPILED_GRAPH = re.compile(
    r"[/\\]torch[/\\](?:_inductor[/\\]|_functorch[/\\](?:_aot_autograd[/\\]|aot_autograd\.py))")


def compiled_graph(frames) -> bool:
    """Was this allocation made by a torch.compile'd graph (AOTAutograd's runtime or inductor's code)? Such a
    graph traced autocast's casts into dtype conversions of its own, so autocast casts nothing at run time:
    its runs of allocations at one line are one op's outputs (cuDNN attention's output and statistics, its
    gradients dq, dk and dv), not a weight's copy and then the op's output. On the compiled bf16 GPT of
    tests/fixtures/fit_families (gpt_compile), the stacks="all" recording holds no allocation under autocast's
    cast among its 2,616 (the eager bf16 ViT: 510 of 4,638, the LoRA GPT: 972 of 5,672), while the call-site
    reading of its Python frames took 36 of cuDNN attention's 2 MiB outputs, one batch x length x width in
    bfloat16 and half a 512 x 2048 weight by coincidence, for copies and held them: 1.15% under the
    stacks="all" recording at 4x. Eager code at a graph break runs outside these frames and is read as
    before."""
    return any(_COMPILED_GRAPH.search(frame_file(f)) for f in frames or ())


# torch.compile's autotuning, at a kernel's first call: under inductor's benchmarker (runtime/benchmarking.py,
# torch 2.5-2.13) it clones the kernel's arguments (triton_heuristics.py's maybe_clone_args, inside the
# timed call) and times each candidate config after zeroing a buffer the size of the device's L2 cache. A
# kernel's launch outside the benchmarker is the run's own, whatever triton_heuristics.py frames it has.
# A run whose kernels are cached (inductor's on-disk cache: a restart, or any run after the first at a
# shape) does none of it, and on tests/fixtures/fit_compile_cache its program is the first run's without
# those requests (and 98 scalars of the compilation). The first run's step-1 autotuning leaves segments
# that a restart never makes: its peak reserved at one shape was from 17% lower (4x the batch) to 1.9%
# higher than the restart's.
_AUTOTUNING_FILES = re.compile(r"[/\\]torch[/\\]_inductor[/\\]runtime[/\\]benchmarking\.py$")


def autotuning_request(frames) -> bool:
    """Was this allocation made by torch.compile's autotuning (a cache-flush buffer, a cloned argument)?"""
    return any(_AUTOTUNING_FILES.search(frame_file(f)) for f in python_frames(frames))


def without_autotuning(rep, trace) -> tuple[object, int]:
    """The replay with torch.compile's autotuning requests (`autotuning_request`) and their frees left out,
    and how many there were: the program of a run whose compiled kernels are cached. The recorded segment
    events no longer line up with the program and are dropped (the recorded peak is read before)."""
    prog, n = rep.program, len(trace)
    seen: dict[int, bool] = {}  # by frames list: a stack is one list however many requests share it

    def tuning(frames) -> bool:
        key = id(frames)
        if key not in seen:
            seen[key] = autotuning_request(frames)
        return seen[key]

    tuned = {h for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
             if op == OP_ALLOC and 0 <= rep.op_event[i] < n and tuning(trace[rep.op_event[i]].frames)}
    if not tuned:
        return rep, 0
    keep = [i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
            if not (op in (OP_ALLOC, OP_FREE) and h in tuned)]
    program = Program(ops=[prog.ops[i] for i in keep], hid=[prog.hid[i] for i in keep],
                      size=[prog.size[i] for i in keep], stream=[prog.stream[i] for i in keep],
                      n_handles=prog.n_handles)
    return replace(rep, program=program, op_event=[rep.op_event[i] for i in keep],
                   recorded_alloc_addr=[rep.recorded_alloc_addr[i] for i in keep], recorded_events=[],
                   recorded_oom_ops=[]), len(tuned)


def released_first_step_holds(rep, trace) -> tuple[object, int]:
    """Of a first run that compiled its graphs (its autotuning was left out: `without_autotuning`), the replay
    with the first step's blocks that the run never freed, where every later step frees its own block made
    at that stack and size, freed as long after they were made as the first later such block was (before the
    first optimizer step at the latest); and how many there were. A cold compile may keep first-step outputs
    at a graph break to the run's end (moe_lm of tests/fixtures/fit_compile_judge2: the head's 125 MiB logits
    and one more block, which no restart keeps), so without this the prediction is a first run's, not a
    restart's."""
    prog, n = rep.program, len(trace)
    first_opt = next((i for i, (op, e) in enumerate(zip(prog.ops, rep.op_event, strict=True))
                      if op == OP_ALLOC and 0 <= e < n and trace[e].frames and fr.is_optimizer(trace[e].frames)),
                     None)
    if first_opt is None:
        return rep, 0
    made: dict[int, int] = {}  # handle -> op index of its allocation
    free_at: dict[int, int] = {}  # handle -> op index of its free
    for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True)):
        if op == OP_ALLOC:
            made[h] = i
        elif op == OP_FREE:
            free_at[h] = i

    def site(h: int) -> tuple:
        e = rep.op_event[made[h]]
        return (id(trace[e].frames), prog.size[made[h]]) if 0 <= e < n else (None, None)

    # a later step's block of each stack and size: how many ops after it was made it was freed
    later_life: dict[tuple, int] = {}
    later_kept: set[tuple] = set()
    for h, i in made.items():
        if i > first_opt:
            key = site(h)
            if h in free_at:
                later_life.setdefault(key, free_at[h] - i)
            else:
                later_kept.add(key)
    held = []  # (op index to free it before, handle)
    for h, i in made.items():
        if i < first_opt and h not in free_at and prog.size[i] > 0:
            key = site(h)
            if key[0] is not None and key in later_life and key not in later_kept:
                held.append((min(i + later_life[key], first_opt), h))
    if not held:
        return rep, 0
    by_at: dict[int, list[int]] = {}
    for at, h in held:
        by_at.setdefault(at, []).append(h)
    ops, hid, size, stream, op_event, addr = [], [], [], [], [], []
    for i in range(len(prog.ops) + 1):
        for h in by_at.get(i, ()):  # freed just before op i, where a later step frees its own
            ops.append(OP_FREE)
            hid.append(h)
            size.append(0)
            stream.append(prog.stream[made[h]])
            op_event.append(-1)
            addr.append(None)
        if i < len(prog.ops):
            ops.append(prog.ops[i])
            hid.append(prog.hid[i])
            size.append(prog.size[i])
            stream.append(prog.stream[i])
            op_event.append(rep.op_event[i])
            addr.append(rep.recorded_alloc_addr[i])
    program = Program(ops=ops, hid=hid, size=size, stream=stream, n_handles=prog.n_handles)
    return replace(rep, program=program, op_event=op_event, recorded_alloc_addr=addr, recorded_events=[],
                   recorded_oom_ops=[]), len(held)


def _cast_copies(trace, kinds, size_of, ev_of, halves: set[int]) -> list[int]:
    """Handles that look like autocast weight copies: per run of consecutive allocations at one
    call site, the first large one (not the run's last: that is the op's output) of half a
    gradient's size; none in a compiled graph's code (`compiled_graph`)."""
    order = sorted((e, h) for h, e in enumerate(ev_of) if e >= 0)
    runs: list[list[int]] = []
    prev = None
    for e, h in order:
        site = _call_site(trace[e].frames)
        if site is not None and site == prev:
            runs[-1].append(h)
        else:
            runs.append([h])
        prev = site
    out = []
    for run in runs:
        if len(run) < 2 or not trace[ev_of[run[0]]].frames:
            continue
        py = python_frames(trace[ev_of[run[0]]].frames)
        if py and frame_name(py[0]) in AUTOCAST_FLOAT32_OPS:
            continue  # autocast runs these in float32: nothing there is cast to half
        if compiled_graph(py):  # a compiled graph casts in its own kernels: autocast makes no copy
            continue
        upto = run if _region_ends_after(trace, ev_of[run[-1]]) else run[:-1]
        large = [h for h in upto if size_of[h] >= MIN_BYTES // 2]  # half a weight of MIN_BYTES
        if large and size_of[large[0]] in halves and kinds[large[0]] == INPUT:
            out.append(large[0])
    return out


def _region_ends_after(trace, e: int) -> bool:
    """Does autocast's region end right after allocation event `e`, before any other allocation? Then the
    op whose inputs were just cast never ran, and the run's last allocation is a cast, not the op's output: a
    checkpoint's recomputation stops once it has remade what backward needs (torch.utils.checkpoint's early
    stop), which can be a weight's copy for the next linear (the checkpointed bf16 ViT of
    tests/fixtures/fit_fresh: each block's last 2 MiB copy of a 512 x 2048 weight)."""
    for i in range(e + 1, len(trace)):  # the next allocation or free (segment events may come between)
        ev = trace[i]
        if ev.action == "alloc":
            return False
        if ev.action.startswith("free"):
            py = python_frames(ev.frames)
            return bool(py) and frame_name(py[0]) == "__exit__" and frame_file(py[0]).endswith("autocast_mode.py")
    return False


def scaled_sizes(m: Measured, k: float, state_ratio: float = 1.0, temp_ratio: float | None = None,
                 seq_k: float = 1.0) -> list[int]:
    """The program's request sizes at k x the measured input, of which seq_k is the length's part (attention
    scores grow with it once more)."""
    prog = m.replay.program
    kinds = m.kinds
    temp_ratio = state_ratio if temp_ratio is None else temp_ratio
    out = []
    for op, h, s in zip(prog.ops, prog.hid, prog.size, strict=True):
        if op != OP_ALLOC:
            out.append(s)
            continue
        kind = kinds[h]
        if kind in SCALES_WITH_INPUT:
            out.append(max(1, int(s * k)))
        elif kind == SCORES:
            out.append(max(1, int(s * k * seq_k)))
        elif kind == REDUCE_BUFFER:
            out.append(reduce_buffer_size(s, k))
        elif kind == OPT_STATE and state_ratio != 1.0:
            out.append(max(1, int(s * state_ratio)))
        elif kind == OPT_TEMP and temp_ratio != 1.0:
            out.append(max(1, int(s * temp_ratio)))
        else:
            out.append(s)
    return out


@dataclass(frozen=True)
class StatePlan:
    """How another optimizer changes the program: the recorded optimizer's state allocations in the
    trace x `ratio` and its step temporaries x `temp_ratio`; the state blocks live before the trace
    freed at its start and `pre_new` allocated in their place; `first_new` allocated at the first
    optimizer step (state the recorded one did not keep); `step_temps` allocated and freed at the start
    of every optimizer step (temporaries the recorded one did not make)."""

    ratio: float = 1.0
    temp_ratio: float = 1.0
    pre_new: tuple = ()
    first_new: tuple = ()
    step_temps: tuple = ()
    dup: int = 1  # each recorded state block becomes this many (the new optimizer keeps more per parameter)
    keep_every: int = 1  # of the recorded state blocks, every this many is kept (it keeps fewer)

    @property
    def changes(self) -> bool:
        return self.ratio != 1.0 or self.temp_ratio != 1.0 or self.dup != 1 or self.keep_every != 1 \
            or bool(self.pre_new or self.first_new or self.step_temps)


def state_plan(m: Measured, optimizer: str | None) -> StatePlan:
    """The new optimizer's state, re-sized from the parameters it trains: STATE_MULTIPLE x each
    gradient's bytes (one step's gradients are the trainable parameters), in place of the recorded
    state, whether the trace allocated it or it was live before the trace began; and its step's
    temporaries (TEMP_MULTIPLE) in place of the recorded one's."""
    if optimizer is None or optimizer == m.optimizer:
        return StatePlan()
    if optimizer not in STATE_MULTIPLE:
        raise ValueError(f"unknown optimizer {optimizer!r}: one of {', '.join(OPTIMIZER_NAMES)}")
    if m.optimizer is None:
        raise NotAssessable(f"the trace holds {m.steps} optimizer steps but neither names its optimizer nor shows "
                            "state of a known size or gradients to size a new one from")
    old, new = STATE_MULTIPLE[m.optimizer], STATE_MULTIPLE[optimizer]
    t_old, t_new = TEMP_MULTIPLE[m.optimizer], TEMP_MULTIPLE[optimizer]
    b_old, b_new = STATE_BLOCKS[m.optimizer], STATE_BLOCKS[optimizer]
    sizes = m.gradient_sizes or ((m.parameter_bytes,) if m.parameter_bytes else ())
    ratio, dup, keep = (new / old if old > 0 else 1.0), 1, 1
    if old > 0 and new > 0 and b_old and b_new and b_new != b_old:
        # per block: the new optimizer's block over the recorded one's, and how many blocks per parameter
        ratio = (new / b_new) / (old / b_old)
        dup, keep = (b_new // b_old, 1) if b_new > b_old else (1, b_old // b_new)
    pre_new = tuple(max(1, int(b * ratio)) for i, (_h, b) in enumerate(m.pre_state) if ratio > 0 and i % keep == 0
                    for _ in range(dup))
    first_new: tuple = ()
    if old == 0 and new > 0:
        if not sizes:
            raise NotAssessable("the trace shows no gradients to size the new optimizer's state from")
        per = max(1, b_new)
        first_new = tuple(max(1, int(g * new / per)) for g in sizes for _ in range(per))
    elif old > 0 and not m.state_bytes and m.gradient_sizes and new > old:
        # a named optimizer whose state the snapshot does not show (made before the trace, its blocks
        # without frames): the difference, one block per gradient, at the first step
        first_new = tuple(max(1, int(g * (new - old))) for g in m.gradient_sizes)
    temp_ratio = t_new / t_old if t_old > 0 else 1.0
    step_temps = tuple(max(1, int(g * t_new)) for g in sizes) if t_old == 0 and t_new > 0 else ()
    return StatePlan(ratio=ratio, temp_ratio=temp_ratio, pre_new=pre_new, first_new=first_new,
                     step_temps=step_temps, dup=dup, keep_every=keep)


def _program(m: Measured, sizes: list[int], plan: StatePlan) -> Program:
    prog = m.replay.program
    replace_pre = (plan.ratio != 1.0 or plan.dup != 1 or plan.keep_every != 1) and bool(m.pre_state)
    if not replace_pre and not plan.first_new and not plan.step_temps and plan.dup == 1 and plan.keep_every == 1:
        return Program(ops=prog.ops, hid=prog.hid, size=sizes, stream=prog.stream, n_handles=prog.n_handles)
    ops: list = []
    hid: list = []
    size: list = []
    stream: list = []
    n = prog.n_handles

    def emit(op: int, h: int, b: int) -> None:
        ops.append(op), hid.append(h), size.append(b), stream.append(0)

    if replace_pre:
        # The recorded state made before the trace, replaced by the new one's: freed, the segments that
        # held it released (a run with the other optimizer never reserved them), the new state allocated;
        # the peak is counted from there (`prefix` ops, see _run).
        for h, _b in m.pre_state:
            emit(OP_FREE, h, 0)
        emit(OP_EMPTY_CACHE, -1, 0)
        for b in plan.pre_new:
            emit(OP_ALLOC, n, b)
            n += 1
    prefix = len(ops)
    first = next((i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
                  if op == OP_ALLOC and m.kinds[h] in (OPT_STATE, OPT_TEMP)), None)
    if first is None:  # an optimizer that allocates nothing: before the first gradient is freed
        first = next((i for i, (op, h) in enumerate(zip(prog.ops, prog.hid, strict=True))
                      if op == OP_FREE and m.kinds[h] == GRADIENTS), len(prog.ops))
    inserts: dict[int, list] = {}
    if plan.first_new:
        inserts.setdefault(first, []).append("state")
    if plan.step_temps:
        for i in (m.step_ops or (first,)):
            inserts.setdefault(i, []).append("temps")
    state_seen = 0
    for i, (op, h, st) in enumerate(zip(prog.ops, prog.hid, prog.stream, strict=True)):
        for what in inserts.get(i, ()):
            if what == "state":  # kept from the first step on
                for b in plan.first_new:
                    emit(OP_ALLOC, n, b)
                    n += 1
            else:  # the step's temporaries: live while it runs (here, at its start), then freed
                base = n
                for b in plan.step_temps:
                    emit(OP_ALLOC, n, b)
                    n += 1
                for t in range(base, n):
                    emit(OP_FREE, t, 0)
        if op == OP_ALLOC and m.kinds[h] == OPT_STATE and (plan.dup != 1 or plan.keep_every != 1):
            nth = state_seen = state_seen + 1
            if (nth - 1) % plan.keep_every:
                continue  # a block the new optimizer does not keep: never allocated (its free finds nothing)
            ops.append(op), hid.append(h), size.append(sizes[i]), stream.append(st)
            for _ in range(plan.dup - 1):  # the blocks it keeps beside this one, of the same size
                emit(OP_ALLOC, n, sizes[i])
                n += 1
            continue
        ops.append(op), hid.append(h), size.append(sizes[i]), stream.append(st)
    out = Program(ops=ops, hid=hid, size=size, stream=stream, n_handles=n)
    out.prefix = prefix  # type: ignore[attr-defined]
    return out


def _slice(prog: Program, a: int, b: int) -> Program:
    return Program(ops=prog.ops[a:b], hid=prog.hid[a:b], size=prog.size[a:b], stream=prog.stream[a:b],
                   n_handles=prog.n_handles)


def _model(m: Measured, limit: int | None, n_handles: int) -> AllocatorModel:
    rep = m.replay
    model = AllocatorModel(rep.recorded_config, limit, n_handles=n_handles)
    model.load(rep.start_segments)
    return model


def _run(m: Measured, limit: int | None, prog: Program, k: float, stop_at_oom: bool = True):
    try:
        model = _model(m, limit, prog.n_handles)
        pre = getattr(prog, "prefix", 0)
        if pre:  # the recorded state replaced before the trace: the peak counts from there
            head = model.run(_slice(prog, 0, pre), stop_at_oom=stop_at_oom)
            if head.oom_op is not None and stop_at_oom:
                return head
            model.peak = model.reserved
            return model.run(_slice(prog, pre, len(prog.ops)), stop_at_oom=stop_at_oom)
        return model.run(prog, stop_at_oom=stop_at_oom)
    except (TypeError, IndexError, KeyError, ValueError) as exc:
        # the model's address space is sized for the recorded run: an expandable segment grown far past
        # what the run mapped has no recorded neighbour to grow into
        raise NotAssessable(f"the allocator model cannot replay this trace at {k:g}x its input "
                            f"({type(exc).__name__}): measure a run nearer that shape") from exc


def predict(m: Measured, k: float, optimizer: str | None = None, seq_k: float = 1.0,
            sizes: list[int] | None = None) -> Prediction:
    """The peak at k x the measured input (seq_k of it the length's part: see `scaled_sizes`). `sizes`, one
    per program op, replaces `scaled_sizes`'s where the sizes at that shape are known otherwise (a run at
    that shape: what its libraries chose, which no rule here can tell from the measured shape)."""
    plan = state_plan(m, optimizer)
    told = sizes
    if sizes is None:
        sizes = scaled_sizes(m, k, plan.ratio, plan.temp_ratio, seq_k)
    prog = _program(m, sizes, plan)
    sim = _run(m, None, prog, k, stop_at_oom=False)
    kinds = [*m.kinds, *[OPT_STATE] * (prog.n_handles - len(m.kinds))]
    by_kind = [0] * len(KIND_NAMES)
    held: dict[int, int] = {}
    for _addr, h, req, _stream in m.replay.start_live:
        by_kind[kinds[h]] += req
        held[h] = req  # live before the trace: its free in the trace lowers the level
    level = sum(by_kind)
    peak, at_peak = level, list(by_kind)
    pre = getattr(prog, "prefix", 0)
    for i, (op, h, s) in enumerate(zip(prog.ops, prog.hid, prog.size, strict=True)):
        if i == pre and pre:  # the recorded state replaced: the peak counts from here
            peak, at_peak = level, list(by_kind)
        if op == OP_ALLOC:
            held[h] = s
            by_kind[kinds[h]] += s
            level += s
            if level > peak:
                peak, at_peak = level, list(by_kind)
        elif op == OP_FREE and h in held:
            s = held.pop(h)
            by_kind[kinds[h]] -= s
            level -= s
    comp = {KIND_NAMES[i]: n for i, n in enumerate(at_peak) if n > 0}
    reserved = sim.peak_reserved
    if k == 1.0 and not plan.changes and told is None and not m.autotuning:
        # the measured shape: what the run reserved is measured (the model, which does not know where
        # the driver placed each segment, can pack the same requests tighter); not where the autotuning
        # was left out: a run with its kernels cached is another program than the recorded one
        reserved = m.recorded_peak or reserved
    return Prediction(peak_reserved=reserved, peak_allocated=peak, composition=comp)


def fits_under(m: Measured, k: float, limit: int, optimizer: str | None = None, seq_k: float = 1.0) -> bool:
    """Does the model serve every request at scale k under `limit` (cache freed and retried first)?"""
    plan = state_plan(m, optimizer)
    prog = _program(m, scaled_sizes(m, k, plan.ratio, plan.temp_ratio, seq_k), plan)
    return _run(m, limit, prog, k).oom_op is None


def largest_unit(m: Measured, unit0: int, limit: int, optimizer: str | None = None,
                 k_other: float = 1.0, seq_k: float = 1.0, is_length: bool = False) -> int:
    """The largest integer u (batch or length) whose scale u / unit0 (x k_other) fits `limit`;
    0 when even u = 1 does not. `seq_k`: the length's part of k_other when u is the batch; `is_length`:
    u is the length (attention scores grow with it twice). Bisection: a larger input never needs less
    (the model is monotone in the input-sized bytes at the calibration set's shapes)."""
    def ok(u: int) -> bool:
        return fits_under(m, u / unit0 * k_other, limit, optimizer, u / unit0 if is_length else seq_k)

    top = max(1, int(K_MAX * unit0))
    if not ok(1):
        return 0
    lo, hi = 1, unit0
    while hi < top and ok(hi):
        lo, hi = hi, min(top, hi * 2)
    if hi == top and ok(hi):
        return top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------ how wide the interval is
# What decides a trace's interval: whether its program is decided by the model's own ops (every size a
# function of the shapes: within 0.4% on every such family), or holds sizes a library chooses at run time
# by shape, which one shape cannot tell (cuDNN's convolution algorithms and their workspaces, cuDNN's
# RNN workspace): FIT_MARGIN_LIBRARY; or is torch.compile's, whose prediction is a restart's (its autotuning
# left out, `without_autotuning`): FIT_MARGIN_COMPILE.
# Read from the Python frames (the agent's recordings) first, so that the agent's and a hand recording of
# one model agree; C++ frames (stacks="all") add what Python frames cannot show (a functional conv call).
LIBRARY_CONV = "cuDNN convolutions choose their algorithm and workspace by shape"
LIBRARY_RNN = "cuDNN's LSTM/GRU chooses its workspace by shape"
LIBRARY_COMPILE = "torch.compile's kernels are generated (and their buffers sized) per shape"
# No frame says which library, but its workspace is there (WORKSPACE_ODD: a frameless block of an odd byte
# count, which no tensor has): only the convolutional families' recordings hold one (a functional conv call
# shows no conv.py frame).
LIBRARY_WORKSPACE = "a library's workspace (a frameless block of an odd byte count) is sized by the library per shape"
# Python files: torch's convolution and RNN modules; torch.compile's runtime (inductor's compiled module,
# its generated code, triton's launcher). torch/_dynamo/eval_frame.py alone is not compile: checkpointing
# runs through its "disable" wrapper in eager models.
_LIBRARY_FILES = ((LIBRARY_CONV, re.compile(r"torch/nn/modules/conv\.py$")),
                  (LIBRARY_RNN, re.compile(r"torch/nn/modules/rnn\.py$")),
                  (LIBRARY_COMPILE, re.compile(r"torch/_inductor/|torchinductor|inductor_cache|/triton/")))
# C++ frames: the convolution ops and their backward, the cuDNN/MIOpen RNN, dynamo's compiled frames.
# cuDNN's attention is not here: its buffers follow the shape (lora_gpt, gpt_ckpt_bf16: within 0.4%).
_LIBRARY_NAMES = ((LIBRARY_CONV, re.compile(r"\b(?:cudnn_|miopen_|mkldnn_)?convolution|conv(?:_transpose)?[123]d\b"
                                            r"|ConvolutionBackward")),
                  (LIBRARY_RNN, re.compile(r"_cudnn_rnn|miopen_rnn|CudnnRnnBackward")),
                  (LIBRARY_COMPILE, re.compile(r"dynamo_eval_custom_code|inductor|triton")))


def library_choice(trace) -> str | None:
    """The first of LIBRARY_CONV, LIBRARY_RNN, LIBRARY_COMPILE the trace's allocations show (their Python
    frames first, then their C++ ones), else LIBRARY_WORKSPACE where a library's workspace is there, else
    None: no size a library chooses by shape."""
    files: set[str] = set()
    names: set[str] = set()
    odd = False
    for ev in trace:
        if ev.action != "alloc":
            continue
        odd = odd or (is_workspace(ev.size) and not python_frames(ev.frames))
        for f in ev.frames or ():
            path = frame_file(f)
            if path.endswith(".py"):
                files.add(path)
            else:
                names.add(frame_name(f))
    for why, pat in _LIBRARY_FILES:
        if any(pat.search(p) for p in files):
            return why
    for why, pat in _LIBRARY_NAMES:
        if any(pat.search(n) for n in names):
            return why
    return LIBRARY_WORKSPACE if odd else None


def asked(m: Measured, optimizer: str | None = None, length: bool = False) -> Measured:
    """The measured run as a question asks it: for another optimizer than the recorded one (its interval,
    FIT_MARGIN_OPTIMIZER), at another sequence length (a compiled model's, FIT_MARGIN_COMPILE_LENGTH)."""
    if optimizer and m.optimizer and optimizer != m.optimizer:
        m = replace(m, switched=optimizer)
    if length and m.library == LIBRARY_COMPILE:
        m = replace(m, length_asked=True)
    return m


def trace_margin(library: str | None, covers_start: bool = True, partial: str | None = None,
                 switched: str | None = None, length: bool = False, frozen: bool = False) -> tuple[float, str]:
    """(the margin, why): FIT_MARGIN of a program the model's own ops decide, FIT_MARGIN_COMPILE of a
    torch.compile'd one, FIT_MARGIN_LIBRARY where a library chooses sizes by shape (`library` says which);
    never narrower than that, MIDRUN_MARGIN of a trace
    that starts mid-run, FORWARD_ONLY_MARGIN of the first step's forward alone, FIT_MARGIN_OPTIMIZER of an
    answer for another optimizer (`switched`) than the recorded one; of a compiled model at another length
    (`length`), FIT_MARGIN_COMPILE_LENGTH; of a compiled model that trains a frozen base (`frozen`),
    FIT_MARGIN_COMPILE_FROZEN."""
    if library == LIBRARY_COMPILE:
        margin, why = FIT_MARGIN_COMPILE, (
            "torch.compile: the peak of a run whose compiled kernels are cached (a restart, or any run after the "
            "first at that shape); a first run at a new shape autotunes its kernels, and reserved from 17% less "
            "to 2% more in measured runs")
        if length:
            margin, why = FIT_MARGIN_COMPILE_LENGTH, (
                why + "; at another length wider: inside compiled code attention's (t x t) scores are not told "
                "apart, so they are scaled with the length once, not with its square")
        if frozen:
            margin, why = FIT_MARGIN_COMPILE_FROZEN, (
                why + "; wider for a frozen base: inside compiled code autocast's copies of its weights are not "
                "told from activations and are scaled with them (the prediction is over, not under)")
    elif library:
        margin, why = FIT_MARGIN_LIBRARY, f"wider: {library}, which one measured shape cannot tell"
    else:
        margin, why = FIT_MARGIN, "the trace shows no size a library chooses by shape: the model's own ops decide it"
    if not covers_start and MIDRUN_MARGIN > margin:
        margin, why = MIDRUN_MARGIN, f"the trace starts mid-run ({why}: +/-{margin:.0%} from the run's start)"
    if switched and FIT_MARGIN_OPTIMIZER > margin:
        margin, why = FIT_MARGIN_OPTIMIZER, (f"another optimizer ({switched}) than the recorded one: its state is "
                                             f"re-sized from the parameters, which the model packs up to 11% off "
                                             f"({why})")
    if partial == PARTIAL_FORWARD and FORWARD_ONLY_MARGIN > margin:
        margin, why = FORWARD_ONLY_MARGIN, ("the first step's forward alone: its backward, gradients and optimizer "
                                            f"are inferred ({why})")
    return margin, why


def interval(m: Measured, peak: int) -> tuple[int, int]:
    """[low, high] about a predicted peak: the trace's margin (`Measured.margin`) either side."""
    return int(peak * (1 - m.margin)), int(peak * (1 + m.margin))


def tri_fits(m: Measured, k: float, limit: int, optimizer: str | None = None, seq_k: float = 1.0) -> bool | None:
    """True when the model fits under the limit less the margin, False when it fails even with the
    margin added, else None (the interval straddles the limit)."""
    if fits_under(m, k, int(limit * (1 - m.margin)), optimizer, seq_k):
        return True
    if not fits_under(m, k, int(limit * (1 + m.margin)), optimizer, seq_k):
        return False
    return None


def decide_fits(m: Measured, k: float, limit: int, low: int, high: int,
                optimizer: str | None = None, seq_k: float = 1.0) -> tuple[bool | None, str]:
    """`fits` and why. The interval [low, high] is the peak reserved without a cap: wholly under the
    limit, it fits; straddling it, null (the interval cannot tell); wholly over it, the model runs
    under the limit (a cap makes the allocator free its cache and retry, so a run may fit a cap below
    its uncapped peak): true when it serves every request under the limit less the margin, false
    when it fails even the limit plus the margin, else null."""
    gib = 1 << 30
    span = f"{low / gib:.2f}-{high / gib:.2f} GiB"
    if high <= limit:
        return True, f"the predicted peak reserved, {span}, is under the {limit / gib:.2f} GiB limit"
    if low <= limit:
        return None, (f"the predicted peak reserved, {span}, straddles the {limit / gib:.2f} GiB limit: within the "
                      f"+/-{m.margin:.0%} interval it may or may not fit (a run at this shape, or a smaller one, "
                      "settles it)")
    t = tri_fits(m, k, limit, optimizer, seq_k)
    if t is True:
        return True, (f"uncapped it would reserve {span}, over the limit; under the cap the allocator frees its "
                      f"cache and retries, and the model serves every request under the limit less {m.margin:.0%}")
    if t is False:
        return False, (f"the predicted peak reserved, {span}, is over the {limit / gib:.2f} GiB limit, and the model "
                       f"runs out of memory even under the limit plus {m.margin:.0%} (cache freed and retried)")
    return None, (f"uncapped it would reserve {span}, over the limit; whether the allocator, freeing its cache "
                  f"under the cap, serves every request changes within +/-{m.margin:.0%} of the limit")


def dominant(pred: Prediction, n: int = 3) -> list[dict]:
    total = sum(pred.composition.values()) or 1
    top = sorted(pred.composition.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{"kind": name, "bytes": b, "share": round(b / total, 3)} for name, b in top]


@dataclass(frozen=True)
class Question:
    """What `memq fit` is asked. `batch`/`seq` None: the measured one. `from_*`: what was measured."""

    batch: int | None = None
    from_batch: int | None = None
    seq: int | None = None
    from_seq: int | None = None
    optimizer: str | None = None
    limit: int | None = None
    limit_source: str | None = None

    def seq_scale(self) -> float:
        """The length's part of `scale`: attention scores grow with it once more."""
        return self.seq / self.from_seq if self.seq is not None else 1.0

    def scale(self) -> float:
        k = 1.0
        if self.batch is not None:
            k *= self.batch / self.from_batch
        if self.seq is not None:
            k *= self.seq / self.from_seq
        return k


def measured_shape(q: Question, snap: Snapshot) -> tuple[Question, str | None]:
    """`--from-batch` (and `--from-seq`) when the question leaves them out and the agent read the first
    forward's input: its first dimension is the batch, and its length as `model.input_length` reads it
    (the second dimension of 2-D token ids). (question, the note saying so) or (question, None)."""
    shapes = snap.agent.input_shapes if snap.agent is not None else ()
    if not shapes or not shapes[0]:
        return q, None
    first = shapes[0]
    said = []
    if q.batch is not None and q.from_batch is None:
        q = replace(q, from_batch=int(first[0]))
        said.append(f"batch {first[0]}")
    length = input_length(shapes, snap.agent.input_dtypes)
    if q.seq is not None and q.from_seq is None and length is not None:
        q = replace(q, from_seq=length)
        said.append(f"length {length}")
    if not said:
        return q, None
    module = snap.agent.input_module or "the model"
    return q, (f"measured {' and '.join(said)}: the agent read {module}'s first input, shape "
               f"{list(first)} (give --from-batch/--from-seq when that is not the training input)")


def check(q: Question) -> None:
    """Refuse contradictory or impossible questions (ValueError, the CLI's bad input)."""
    for name, v in (("--batch", q.batch), ("--from-batch", q.from_batch), ("--seq", q.seq),
                    ("--from-seq", q.from_seq)):
        if v is not None and v < 1:
            raise ValueError(f"{name} must be at least 1, got {v}")
    if q.batch is not None and q.from_batch is None:
        raise ValueError("--batch needs --from-batch (the batch size the measured run used): the snapshot "
                         "does not record it")
    if q.seq is not None and q.from_seq is None:
        raise ValueError("--seq needs --from-seq (the sequence length the measured run used)")
    if q.optimizer is not None and q.optimizer not in STATE_MULTIPLE:
        raise ValueError(f"unknown optimizer {q.optimizer!r}: one of {', '.join(OPTIMIZER_NAMES)}")
    if q.limit is not None and q.limit <= 0:
        raise ValueError("the limit must be positive")
    if q.scale() > K_MAX:
        raise ValueError(f"{q.scale():.1f}x the measured input is past the {K_MAX:.0f}x a measured step can "
                         "stand for: measure a run nearer that shape")


def answer(m: Measured, q: Question) -> dict:
    """The `memq fit --json` object (docs/analysis.md "memq fit")."""
    check(q)
    m = asked(m, q.optimizer, q.seq is not None)  # the interval the question has
    k, seq_k = q.scale(), q.seq_scale()
    pred = predict(m, k, q.optimizer, seq_k)
    base = predict(m, 1.0) if (k != 1.0 or q.optimizer) else pred
    low, high = interval(m, pred.peak_reserved)
    out = {
        "peak_bytes": pred.peak_reserved, "low": low, "high": high,
        "peak_allocated_bytes": pred.peak_allocated,
        "scale": round(k, 4), "batch": q.batch, "from_batch": q.from_batch, "seq": q.seq, "from_seq": q.from_seq,
        "limit_bytes": q.limit, "limit_source": q.limit_source if q.limit is not None else None,
        "fits": None, "fits_reason": None, "headroom_bytes": None, "headroom_low": None, "headroom_high": None,
        "max_batch": None, "max_batch_low": None, "max_batch_high": None,
        "max_seq": None, "max_seq_low": None, "max_seq_high": None,
        "max_scale": None, "max_scale_low": None, "max_scale_high": None,
        "optimizer": {"recorded": m.optimizer, "predicted": q.optimizer or m.optimizer,
                      "state_multiple": STATE_MULTIPLE.get(q.optimizer or m.optimizer or "", None)},
        "dominant": dominant(pred),
        "composition": pred.composition,
        "measured": {"peak_bytes": base.peak_reserved, "peak_allocated_bytes": base.peak_allocated,
                     "optimizer_steps": m.steps, "optimizer_inferred": m.optimizer_inferred,
                     "trace_from_start": m.covers_start,
                     "autocast_copy_share": m.cast_share,
                     "partial_step": m.partial, "optimizer_assumed": m.optimizer_assumed,
                     # the recorded run's own peak, where the program replayed is not the recorded one (its
                     # torch.compile autotuning left out: `peak_bytes` is then a restart's at that shape)
                     "recorded_peak_bytes": m.recorded_peak or None, "autotuning_left_out": m.autotuning},
        "inferred": inferred_parts(m),
        "notes": list(m.notes),
        "margin": m.margin, "margin_reason": m.margin_reason,
    }
    if q.limit is None:
        out["fits_reason"] = "no limit known: give --limit SIZE or --gpu NAME"
    else:
        out["fits"], out["fits_reason"] = decide_fits(m, k, q.limit, low, high, q.optimizer, seq_k)
        out["headroom_bytes"] = q.limit - pred.peak_reserved
        out["headroom_low"], out["headroom_high"] = q.limit - high, q.limit - low
        unit, unit0, other = _search_unit(q)
        if unit is not None:
            best = {tag: largest_unit(m, unit0, int(q.limit * f), q.optimizer, other, seq_k, unit == "seq")
                    for tag, f in (("", 1.0), ("_low", 1 - m.margin), ("_high", 1 + m.margin))}
            for tag, v in best.items():
                out[f"max_{unit}{tag}"] = v
        scale_units = 1000
        lengthwise = unit == "seq"  # a question of length alone: its input units are lengths (scores squared)
        for tag, f in (("", 1.0), ("_low", 1 - m.margin), ("_high", 1 + m.margin)):
            most = largest_unit(m, scale_units, int(q.limit * f), q.optimizer, is_length=lengthwise)
            out[f"max_scale{tag}"] = round(most / scale_units, 3)
    out["basis"] = _basis(m, q, out)
    return out


def _search_unit(q: Question) -> tuple[str | None, int, float]:
    """What the largest-fit search varies: the batch (length held at its asked value), else the length."""
    if q.from_batch is not None:
        other = (q.seq / q.from_seq) if q.seq is not None else 1.0
        return "batch", q.from_batch, other
    if q.from_seq is not None:
        return "seq", q.from_seq, 1.0
    return None, 1, 1.0


def inferred_parts(m: Measured) -> list[str]:
    """What a prediction from part of a step took from outside the trace (empty for a whole step)."""
    if m.partial is None:
        return []
    out = []
    if m.partial == PARTIAL_FORWARD:
        out += ["backward (the forward's memory played backwards, with a chain of activation gradients)",
                "gradients from the parameters (all taken as trainable)"]
    how = "assumed, no optimizer named" if m.optimizer_assumed else "named"
    out += [f"optimizer state inferred from parameters for {m.optimizer} ({how}): "
            f"{STATE_MULTIPLE[m.optimizer]:g}x the gradients' bytes",
            f"optimizer step temporaries for {m.optimizer}: {TEMP_MULTIPLE[m.optimizer]:g}x the gradients' bytes",
            f"{ONE_STEP_REPEATS} more steps like the first, beside the optimizer state"]
    return out


def _basis(m: Measured, q: Question, out: dict) -> str:
    what = []
    if q.batch is not None:
        what.append(f"batch {q.from_batch} -> {q.batch}")
    if q.seq is not None:
        squared = ", attention scores with its square" if SCORES in m.kinds else ""
        what.append(f"length {q.from_seq} -> {q.seq} (linear per site{squared})")
    if q.optimizer and q.optimizer != m.optimizer:
        what.append(f"optimizer {m.optimizer} -> {q.optimizer} (state {STATE_MULTIPLE[q.optimizer]:.2f}x the "
                    "parameter bytes, from the playbook)")
    shape = "; ".join(what) or "the measured shape"
    if m.partial is not None:
        return (f"the recorded first step's {m.partial} (no optimizer step in the trace), the rest of the step "
                f"inferred ({'; '.join(inferred_parts(m))}), replayed through the allocator model with its "
                f"input-sized allocations scaled {out['scale']:g}x ({shape}); interval +/-{m.margin:.0%}: "
                f"{m.margin_reason}")
    return (f"the recorded trace ({m.steps} optimizer steps) replayed through the allocator model with its "
            f"input-sized allocations scaled {out['scale']:g}x ({shape}); parameters, gradients, optimizer "
            f"state and autocast copies held at their measured size; interval +/-{m.margin:.0%}: {m.margin_reason}")


# `fit` in a run's analysis (memq history --json): the predicted peak reserved at these multiples of
# the measured input, stored with the snapshot (its limit is the run's, known later), read against the
# run's limit by `headroom`. Up to K_MAX, denser where runs usually sit (under 2x).
CURVE_SCALES = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, K_MAX)


def own_curve(snap: Snapshot) -> dict | None:
    """The per-snapshot part of a run's `fit`: None when the snapshot cannot be replayed for it."""
    if not snap.trace:
        return None
    try:
        m = classify(snap)
    except NotAssessable:
        return None
    if m.partial is not None:
        return None  # the run's own curve reads whole steps; part of one needs its optimizer said (memq fit)
    try:
        base = predict(m, 1.0)
    except NotAssessable:
        return None
    curve = [[1.0, base.peak_reserved]]
    for k in CURVE_SCALES[1:]:
        try:
            curve.append([k, predict(m, k).peak_reserved])
        except NotAssessable:
            break  # the curve ends where the model can no longer follow
    return {"curve": curve, "peak_allocated_bytes": base.peak_allocated, "dominant": dominant(base),
            "optimizer": m.optimizer, "optimizer_steps": m.steps, "margin": m.margin,
            "margin_reason": m.margin_reason,
            # the curve is a restart's where the autotuning was left out: what the run itself reserved
            "recorded_peak_bytes": m.recorded_peak if m.autotuning and m.recorded_peak else None}


def own_curve_reason(snap: Snapshot) -> str:
    """Why `own_curve` gave nothing for a snapshot with a trace."""
    try:
        m = classify(snap)
        predict(m, 1.0)
    except NotAssessable as exc:
        return str(exc)
    if m.partial is not None:
        return (f"the trace holds the first step's {m.partial} only (no optimizer step): `memq fit --optimizer "
                "NAME` predicts from it, the rest of the step inferred")
    return "the trace could not be replayed"


def _curve_margin(curve_doc: dict) -> tuple[float, str]:
    """The margin a stored curve was made with; a curve stored before margins were per trace does not say
    whether a library chose sizes in it: the wider one."""
    if isinstance(curve_doc.get("margin"), (int, float)) and curve_doc["margin"] > 0:
        return float(curve_doc["margin"]), str(curve_doc.get("margin_reason") or "")
    return FIT_MARGIN_LIBRARY, "the curve does not say whether a library chose sizes by shape in its trace"


def headroom(curve_doc: dict | None, limit: int | None) -> dict | None:
    """A run's `fit`: its own peak with the interval, whether it fits its limit, and the largest
    multiple of its input whose predicted peak stays under the limit (linear between curve points:
    `memq fit`, which replays under the limit, is exact where this is an estimate)."""
    if not curve_doc or not curve_doc.get("curve"):
        return None
    curve = curve_doc["curve"]
    peak = curve[0][1]
    margin, why = _curve_margin(curve_doc)
    out = {"peak_bytes": peak, "low": int(peak * (1 - margin)), "high": int(peak * (1 + margin)),
           "margin": margin, "margin_reason": why,
           "peak_allocated_bytes": curve_doc.get("peak_allocated_bytes"),
           "recorded_peak_bytes": curve_doc.get("recorded_peak_bytes"), "limit_bytes": limit, "fits": None,
           "fits_reason": None, "max_scale": None, "dominant": curve_doc.get("dominant"),
           "optimizer": curve_doc.get("optimizer")}
    gib = 1 << 30
    span = f"{out['low'] / gib:.2f}-{out['high'] / gib:.2f} GiB"
    if not limit:
        out["fits_reason"] = "the run's limit is not known (the agent reports its cap; `memq reanalyze --limit`)"
        return out
    out["fits"] = True if out["high"] <= limit else False if out["low"] > limit else None
    out["fits_reason"] = (f"its peak reserved, {span}, is " + {True: "under", False: "over",
                                                                None: "straddling"}[out["fits"]]
                          + f" the {limit / gib:.2f} GiB limit")
    if peak > limit:
        out["max_scale"] = int(limit / peak * 100) / 100  # below the measured input: proportional
        return out
    best = curve[-1][0]
    for (k0, p0), (k1, p1) in zip(curve, curve[1:], strict=False):
        if p1 > limit:
            best = k0 + (k1 - k0) * ((limit - p0) / (p1 - p0) if p1 > p0 else 0.0)
            break
    out["max_scale"] = int(best * 100) / 100
    return out
