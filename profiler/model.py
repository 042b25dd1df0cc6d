"""Plain data types of a parsed allocator snapshot. Units are bytes and microseconds.

Frames stay as the snapshot gives them (dicts with `filename`, `line`, `name`): converting the
millions of frames of a large trace into objects would cost more than the rest of the analysis.
Read them through `frame_name` / `frame_file`, which accept the shapes seen in the wild.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

ACTIVE_ALLOCATED = "active_allocated"
ACTIVE_PENDING_FREE = "active_pending_free"  # emitted by torch; docs call it active_awaiting_free
INACTIVE = "inactive"

SMALL_SIZE = 1024 * 1024  # requests up to 1 MiB come from the small pool

#: The causes a diagnosis names (ARCHITECTURE.md "CAUSE is one of"), in the contract's order; the order
#: they are decided in is analysis/classify.py PRECEDENCE.
CAUSE_NAMES = ("fragmentation", "capacity", "leak", "optimizer_state", "activation_spike", "workspace",
               "external_memory", "allocator_config", "healthy")
#: Where in a run a snapshot was taken (the envelope's `trigger`).
TRIGGERS = ("periodic", "epoch_end", "oom", "manual", "signal")
#: A run's status, in the order it may move (analysis/run_status.py): running < completed < crashed < oom.
RUN_STATUSES = ("running", "completed", "crashed", "oom")

Frames = list  # list of frame dicts; empty when no stack was recorded

# The roles the agent reports for the tensors it can see (agent/roles.py sends their index): the
# optimizer's parameters, their `.grad`, `optimizer.state`, the model's buffers, and the inference
# caches (a KV cache) the job declared (agent.roles.declare). New roles go at the end: an index once
# sent keeps its meaning.
AGENT_ROLES = ("parameter", "gradient", "optimizer_state", "buffer", "cache")
#: The attention scores' sites the agent notes at the first forward that learns (agent/scores.py), and the
#: parser keeps: at most this many, one per attention line and score size, a handful in any model; a cap so
#: that no model's forward grows the agent's memory.
SQUARE_SITES_MAX = 64


def input_length(shapes, dtypes=()) -> int | None:
    """The length of the first forward's input: the second dimension of a 2-D first argument of integers
    (token ids); None for any other input (features, an image, a spectrogram). Without dtypes (an agent
    that sent none) a 2-D first argument is taken as token ids. The agent (which scores it notes) and
    `memq fit` (the measured length) read it here."""
    if not shapes or len(shapes[0]) != 2 or shapes[0][1] < 2:
        return None
    if dtypes and not str(dtypes[0]).startswith(("int", "uint")):
        return None
    return int(shapes[0][1])


def frame_name(frame: Any) -> str:
    if isinstance(frame, dict):
        return str(frame.get("name", ""))
    if isinstance(frame, (list, tuple)) and len(frame) >= 3:
        return str(frame[2])
    return ""


def frame_file(frame: Any) -> str:
    """The frame's file with "/" between its folders: a job run on Windows records `C:\\work\\torch\\nn\\...`
    (tests/fixtures/public_snapshots' DeComFL file), and every rule reads paths as torch's own
    (`torch/nn/modules/`)."""
    if isinstance(frame, dict):
        path = str(frame.get("filename", ""))
    elif isinstance(frame, (list, tuple)) and frame:
        path = str(frame[0])
    else:
        return ""
    return path.replace("\\", "/") if "\\" in path else path


def frame_line(frame: Any) -> int:
    if isinstance(frame, dict):
        v = frame.get("line", 0)
    elif isinstance(frame, (list, tuple)) and len(frame) >= 2:
        v = frame[1]
    else:
        v = 0
    return v if isinstance(v, int) else 0


@dataclass(slots=True)
class Block:
    address: int
    size: int
    requested_size: int
    state: str
    frames: Frames

    @property
    def is_live(self) -> bool:
        """Live blocks hold memory the allocator cannot hand out (allocated or awaiting free)."""
        return self.state != INACTIVE


@dataclass(slots=True)
class Segment:
    device: int
    address: int
    total_size: int
    stream: int
    segment_type: str  # "small" | "large"
    pool_id: tuple
    is_expandable: bool
    blocks: list[Block]
    frames: Frames

    @property
    def is_private_pool(self) -> bool:
        return tuple(self.pool_id) != (0, 0)

    @property
    def active_bytes(self) -> int:
        return sum(b.size for b in self.blocks if b.is_live)


class TraceEvent(NamedTuple):
    """One ring-buffer entry, reduced to what the analysis reads. A tuple: the parser builds a million
    of them from the decoded dicts, and a tuple is built in C and costs less than the dict it replaces.
    `frames` lists are shared: entries with the same stack hold one list object (the parser interns
    them), so a pass may cache per `id(frames)`; never mutate one."""

    action: str
    addr: int | None
    size: int
    stream: int
    time_us: int | None
    frames: Frames
    device_free: int | None = None
    pool_id: tuple | None = None  # only on `oom` entries: the pool the failed request was for
    user_metadata: str = ""  # torch >= 2.5: the job's annotation (`_set_memory_metadata`), when set


@dataclass(frozen=True, slots=True)
class AllocatorSettings:
    conf: str = ""  # PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF as the process saw it
    max_split_size: int = -1  # bytes; -1 = unlimited (default)
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    roundup_power2_divisions: tuple = ()  # ((interval_mib, divisions), ...) with divisions > 0
    known: bool = False  # False when the snapshot predates allocator_settings (torch < 2.3)

    @property
    def non_default(self) -> list[str]:
        out = []
        if self.max_split_size not in (-1, None) and self.max_split_size < 2**62:
            out.append(f"max_split_size_mb:{self.max_split_size // (1024 * 1024)}")
        if self.garbage_collection_threshold:
            out.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.expandable_segments:
            out.append("expandable_segments:True")
        if self.roundup_power2_divisions:
            divs = {v for _, v in self.roundup_power2_divisions}
            if len(self.roundup_power2_divisions) >= 16 and len(divs) == 1:
                out.append(f"roundup_power2_divisions:{divs.pop()}")
            else:
                out.append("roundup_power2_divisions:[" + ",".join(
                    f"{k}:{v}" for k, v in self.roundup_power2_divisions) + "]")
        return out


@dataclass(frozen=True, slots=True)
class StepFigures:
    """One completed training step as the agent measured it at the step boundary (bytes, ms)."""

    step: int
    epoch: int | None
    peak_allocated: int  # the allocator's peak counter over the step (reset at each boundary)
    peak_reserved: int
    allocated: int  # memory_allocated() at the boundary that ended the step
    reserved: int
    retries: int = 0
    ms: float | None = None
    tokens: int | None = None  # the step's input size, when the job passed mark_step(tokens=)
    span: int = 1  # boundaries the figure covers (the agent thins its reads on very fast steps)
    time: float | None = None  # unix seconds at the boundary, when the agent sent it


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What the memq agent embeds in each snapshot it sends (`memq_agent`); every field optional,
    older agents send only run/rank/trigger/step/epoch/time."""

    run: str | None = None
    rank: int | None = None
    trigger: str | None = None
    step: int | None = None  # envelope step: for an `oom` snapshot of a newer agent, the step in progress
    epoch: int | None = None
    time: float | None = None
    step_figures: tuple[StepFigures, ...] = ()  # oldest first
    step_in_progress: int | None = None
    step_completed: int | None = None
    steps_source: str | None = None  # "mark_step" | "optimizer_hook" | None
    recording_on: bool | None = None
    recording_since_step: int | None = None
    recording_reason: str | None = None
    comparable: bool = False  # taken at the same point of a step on purpose (leak comparisons)
    optimizer: str | None = None
    model: str | None = None
    # Python stack of the failing allocation, taken by the agent's OOM observer in the allocating
    # thread (innermost first): the allocating line when recording was paused. Empty when unknown.
    oom_frames: tuple = ()
    #: What the allocator may reserve as the agent read it at its last step boundary (the cap, else the
    #: device): the limit of a running run whose cap was set after agent.start.
    limit_bytes: int | None = None
    #: Storages whose role the agent knew when it took the snapshot: (address, nbytes, role index in
    #: AGENT_ROLES), sorted by address; empty when it sent none (an older agent, no optimizer seen).
    roles: tuple = ()
    #: At the first forward (a module forward pre-hook, once): CUDA autocast's dtype ("bfloat16",
    #: "float16") or "off"; None when the agent did not see a forward (an older agent, no nn.Module).
    autocast: str | None = None
    #: The first forward's tensor arguments' shapes (the input of the measured run) and its module.
    input_shapes: tuple = ()
    input_dtypes: tuple = ()  # their dtypes ("int64", "float32"), in the same order
    input_module: str | None = None
    #: The first forward's saved attention scores, (..., t, t) with t its input's length (agent/scores.py):
    #: (file, line, bytes) of the line that made each; empty when none was seen or nothing was sent.
    square_sites: tuple = ()


@dataclass(slots=True)
class Snapshot:
    segments: list[Segment]
    traces: list[list[TraceEvent]]  # per device ordinal, oldest first
    settings: AllocatorSettings
    torch_format: str  # which layout the parser recognised, e.g. "2.3+", "2.1", "2.0-history"
    annotations: list[dict] = field(default_factory=list)
    host_segment_count: int = 0
    warnings: list[str] = field(default_factory=list)
    unknown_keys: list[str] = field(default_factory=list)
    trace_overflowed: bool | None = None  # True when the ring buffer is known to have wrapped
    agent: AgentInfo | None = None  # the memq agent's `memq_agent` dict, when it sent this snapshot
    # Results of pure passes over this snapshot, kept with it so that a run-level diagnosis over
    # snapshots already analysed (a worker's cache) does not redo them. Keyed by pass and version.
    memo: dict = field(default_factory=dict, repr=False, compare=False)
    # Frames lists the parser dropped for equal ones (snapshot._Frames): freed with the snapshot, or
    # by `release_held` when it is kept for long (a worker's cache).
    held: list = field(default_factory=list, repr=False, compare=False)

    def release_held(self) -> None:
        self.held.clear()

    @property
    def trace_device(self) -> int:
        """The device whose trace describes these segments: the segments' device when they are all on
        one (a DDP rank's snapshot lists every device, and another device's trace may hold a few
        events of the process-group setup), else the first device with a trace."""
        devs = {s.device for s in self.segments}
        if len(devs) == 1:
            d = next(iter(devs))
            if 0 <= d < len(self.traces) and self.traces[d]:
                return d
        for d, t in enumerate(self.traces):
            if t:
                return d
        return next(iter(devs)) if len(devs) == 1 else 0

    @property
    def trace(self) -> list[TraceEvent]:
        """Events of the device that owns the segments (see trace_device)."""
        d = self.trace_device
        return self.traces[d] if 0 <= d < len(self.traces) else []

    @property
    def expandable_segments(self) -> bool | None:
        if any(s.is_expandable for s in self.segments):
            return True
        if self.settings.known:
            return self.settings.expandable_segments
        return None if not self.segments else False

    def oom_event(self) -> TraceEvent | None:
        """The last `oom` entry of the trace (memoised: a scan of a million events, asked for often)."""
        key = ("oom_event", self.trace_device)
        if key not in self.memo:
            self.memo[key] = next((ev for ev in reversed(self.trace) if ev.action == "oom"), None)
        return self.memo[key]


@dataclass(frozen=True, slots=True)
class OomMessage:
    """What a `CUDA out of memory` message says. Every field may be missing."""

    requested_bytes: int | None = None
    device_index: int | None = None
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    process_in_use_bytes: int | None = None
    allowed_bytes: int | None = None
    allocated_bytes: int | None = None
    private_pool_bytes: int | None = None  # inside allocated_bytes (torch prints allocated + private pools)
    reserved_unallocated_bytes: int | None = None
    text: str = ""
    # Which message it is (oom_message.py): the allocator's layout, or a failure outside it.
    layout: str | None = None
    kind: str = "allocator"  # allocator | cuda_error | cublas | cudnn | mps | block_limit | server_warmup
    platform: str = "cuda"  # cuda | hip | xpu | mps
    other_processes: tuple[tuple[int, int], ...] = ()  # (pid, bytes) of processes other than this one
    other_allocations_bytes: int | None = None  # MPS: "other allocations"
    server: str | None = None  # an inference server named in the pasted text (vllm, sglang)
    truncated: bool = False
    notes: tuple[str, ...] = ()  # figures the message prints but that cannot hold, and why they were dropped

    @property
    def reserved_bytes(self) -> int | None:
        # torch >= 2.4 prints "allocated" as allocated + private pools and "unallocated" as reserved
        # minus both (c10/cuda/CUDACachingAllocator.cpp): reserved is their sum, pools never added again.
        if self.allocated_bytes is None or self.reserved_unallocated_bytes is None:
            return None
        return self.allocated_bytes + self.reserved_unallocated_bytes

    @property
    def non_pytorch_bytes(self) -> int | None:
        if self.process_in_use_bytes is None or self.reserved_bytes is None:
            return None
        return max(0, self.process_in_use_bytes - self.reserved_bytes)


@dataclass(frozen=True, slots=True)
class OomContext:
    """Facts about the failure that come from outside the snapshot (CLI flags, message, observer)."""

    requested_bytes: int | None = None
    limit_bytes: int | None = None  # a per-process cap (set_per_process_memory_fraction) or --limit
    device_total_bytes: int | None = None
    device_free_bytes: int | None = None
    message: OomMessage | None = None


# Causes (docs/causes.md), classes and what-if outcomes, as a reader says them (every screen, and the
# analysis' own sentences). The identifiers stay in JSON,
# CSV and the CLI's filter options (`--cause external_memory`).
WORDS = {
    "external_memory": "external memory",
    "leak": "leak",
    "optimizer_state": "optimizer state",
    "activation_spike": "activation spike",
    "workspace": "workspace",
    "allocator_config": "allocator settings",
    "fragmentation": "fragmentation",
    "capacity": "capacity",
    "healthy": "healthy",
    "oom": "OOM",
    "fits": "fits",
    "survives_window": "survives the window",
    "not_assessable": "not assessable",
}


def said(value: object) -> str:
    """An enum as words; "-" for none; an unknown identifier with its underscores as spaces."""
    if value is None or value == "":
        return "-"
    text = str(value)
    return WORDS.get(text, text.replace("_", " "))
