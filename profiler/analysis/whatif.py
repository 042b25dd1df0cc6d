"""What-if: replay a recorded allocator trace through `allocator_model` under other settings. Pure.

    run_whatif(snapshot, limit_bytes, confs) -> list[WhatIfResult]
    simulate_whatif(snapshot, limit_bytes, confs=None) -> list[dict]   (JSON-ready; confs=None: the sweep)

`conf` strings are what a user would put in PYTORCH_CUDA_ALLOC_CONF for the rerun (several settings
joined by commas; keys not named take torch's defaults); `""` is the configuration the snapshot
recorded (`allocator_settings`).

How a replay is built (`compile_trace`, by `_TraceCompiler`: one `_on_*` method per kind of entry):
1. The program: the trace's `alloc` (requested bytes, stream), `free_completed` and `oom` entries in
   order. `free_requested` is ignored (the block returns to the pool at free_completed). A run of
   `segment_free`/`segment_unmap` entries that no request follows (the next entry is not a
   `segment_alloc`, `segment_map` or `oom`) is a `torch.cuda.empty_cache()` and becomes one op.
2. The start state. The ring buffer rarely reaches back to the start of the process, so the state at
   the first trace entry is rebuilt from the snapshot taken at its end:
   - segments: those of the snapshot whose `segment_alloc` is not in the trace, plus those the trace
     frees (`segment_free`) without having allocated them; for expandable segments, the mapped ranges
     at the end with the trace's `segment_map`/`segment_unmap` undone in reverse order;
   - live blocks: blocks live in the snapshot that the trace did not allocate (exact addresses and
     sizes), plus blocks the trace frees without having allocated them (address and requested size
     from the free entry; size = the rounded request, extended over a following gap too small to
     have been split off: <= 1 MiB in the large pool, which no block can be);
   - everything else inside those segments is cached free memory.
3. The recorded configuration replays from that state, with the recorded segment addresses reused
   where the model asks for a segment of the size the trace asked for next (best fit breaks ties by
   address), and is checked against the trace: the share of segment events the model reproduces at
   the same request, the reserved bytes after every entry, and the share of allocations placed at
   the recorded address.
4. Another configuration cannot start from the recorded segments (they were cut under the recorded
   settings), so it starts "compact": the live blocks of step 2 are allocated afresh, in address
   order, under that configuration, then the program runs. The recorded configuration is also run
   that way (`baseline`): when the recorded run's OOM only reproduces from the recorded state, the
   trace is too short to rebuild the fragmentation that caused it, and alternatives that "succeed"
   are reported with that caveat (`confidence: low`).
A configuration OOMs when the model cannot serve a request under the limit; the replay stops at the
first such request, unless the recorded run failed it too and carried on.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import asdict, dataclass, field, replace

from memq.analysis.alloc_conf import parse_alloc_conf
from memq.analysis.allocator_model import (
    EV_SEGMENT_ALLOC,
    EV_SEGMENT_FREE,
    EV_SEGMENT_MAP,
    EV_SEGMENT_UNMAP,
    EVENT_NAMES,
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    N_INTERVALS,
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FOREIGN,
    OP_FREE,
    OP_OOM,
    SIZE_MAX,
    AllocatorConfig,
    AllocatorModel,
    Program,
    SegmentSpec,
    SimResult,
    allocation_size,
    round_size,
)
from memq.analysis.confidence import replay_confidence
from memq.analysis.memory import smallest_request_rounding_to
from memq.analysis.rules import REPLAY_EVENT_SHARE, REPLAY_RESERVED_TOLERANCE, TRACE_TIME_SLACK_US
from memq.errors import BadInput
from memq.model import INACTIVE, AllocatorSettings, Snapshot, frame_name
from memq.units import fmt_bytes

SWEEP = (
    "",
    "expandable_segments:True",
    "max_split_size_mb:128",
    "max_split_size_mb:512",
    "garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.8",
    "roundup_power2_divisions:4",
    "max_split_size_mb:128,garbage_collection_threshold:0.6",
    "garbage_collection_threshold:0.6,max_split_size_mb:256",
)
TORCH_VERSION_MODELLED = "2.11"
#: Part of the key of stored sweeps (profiler/store/sweeps.py): bump when the replay's answers change.
WHATIF_MODEL_VERSION = "4"  # 4: a device-bound replay limit is said as such in the reasons


@dataclass
class Replay:
    """A compiled trace: the program and what the recorded run did, for checking the model."""

    program: Program
    start_segments: list  # SegmentSpec, for the recorded start state
    start_live: list  # (address, handle id, requested bytes, stream) sorted by address
    recorded_events: list  # (op index, EV_*, bytes)
    recorded_reserved_start: int
    recorded_alloc_addr: list  # per op: recorded address of OP_ALLOC, else None
    op_event: list  # per op: index of the trace entry it came from
    addr_hints: list  # (size, address) of recorded segment_alloc entries, in order
    map_hints: list  # addresses of recorded segment_map entries, in order
    recorded_config: AllocatorConfig
    recorded_oom_ops: list  # op indices of the trace's oom entries
    foreign_start: int  # reserved bytes of private pools at the first entry (counted, never modelled)
    trace_entries: int
    streams: dict  # raw stream -> index
    warnings: list = field(default_factory=list)

    def recorded_reserved_after(self) -> list:
        """Reserved bytes after every op, from the start state and the recorded segment events."""
        out = []
        r = self.recorded_reserved_start
        ev = self.recorded_events
        j = 0
        for i in range(len(self.program.ops)):
            while j < len(ev) and ev[j][0] <= i:
                k, s = ev[j][1], ev[j][2]
                r += s if k in (EV_SEGMENT_ALLOC, EV_SEGMENT_MAP) else -s
                j += 1
            out.append(r)
        return out


#: What a result says (`verdict`); `predicted_oom` is True, False, None respectively.
VERDICT_OOM = "oom"  # the model cannot serve a request under this setting
VERDICT_FITS = "fits"  # every request served, and the replay covers what the question needs
VERDICT_WINDOW = "survives_window"  # served to the end of the trace; the run after it is not in any trace
VERDICT_NOT_ASSESSABLE = "not_assessable"  # the snapshot(s) cannot answer: see `reason`


@dataclass
class WhatIfResult:
    conf: str  # as given ("" = recorded)
    effective: str  # the settings the model ran with (non-default ones), "" = all defaults
    predicted_oom: bool | None  # None: not assessable (`reason` says why)
    peak_reserved_bytes: int
    headroom_bytes: int | None  # limit - peak reserved
    limit_bytes: int | None
    fails_recorded_request: bool | None  # None when the recorded run did not OOM
    first_failure: dict | None  # {"trace_index", "requested_bytes"} of the first request it cannot serve
    start_state: str  # "recorded" | "compact" | "seeded" | "none"
    start_reserved_bytes: int
    final_reserved_bytes: int
    segment_allocs: int
    segment_frees: int
    alloc_retries: int
    confidence: str  # confidence.REPLAY_LEVELS: "high" | "medium" | "low" | "none" (not assessable)
    shortfall_bytes: int | None = None  # OOM: reserved at the failure + the segment it needed - limit
    fidelity: dict | None = None  # recorded configuration only
    notes: list = field(default_factory=list)
    verdict: str = VERDICT_FITS  # VERDICT_*: oom | fits | survives_window | not_assessable
    coverage: str = "window"  # "from_start": the replay starts at an empty allocator; "window"; "none"
    reason: str | None = None  # one line: why not assessable, or the caveat of a window-only success
    inputs: dict = field(default_factory=dict)  # what the replay was built from (snapshots, trace entries)

    def to_dict(self) -> dict:
        return asdict(self)


# ----- configuration ---------------------------------------------------------------------------------
def config_from_settings(settings: AllocatorSettings) -> tuple[AllocatorConfig, list[str]]:
    """The snapshot's `allocator_settings` -> AllocatorConfig (the raw conf string fills what the
    structured fields do not carry: max_non_split_rounding_mb, large_segment_size_mb)."""
    notes: list[str] = []
    if not settings.known:
        notes.append("the snapshot has no allocator_settings (torch < 2.3): the recorded run is assumed "
                     "to use the default settings, unless its segments say otherwise")
        return AllocatorConfig(), notes
    base = AllocatorConfig()
    if settings.conf:
        try:
            base = parse_alloc_conf(settings.conf)
        except BadInput:
            notes.append(f"the recorded PYTORCH_CUDA_ALLOC_CONF {settings.conf!r} does not parse; "
                         "using the structured allocator_settings only")
    divs = [0] * N_INTERVALS
    for interval_mib, d in settings.roundup_power2_divisions:
        idx = max(0, int(interval_mib).bit_length() - 1)
        if idx < N_INTERVALS:
            divs[idx] = int(d)
    mss = settings.max_split_size if settings.max_split_size and settings.max_split_size > 0 else SIZE_MAX
    cfg = AllocatorConfig(
        max_split_size=mss,
        max_non_split_rounding_size=base.max_non_split_rounding_size,
        garbage_collection_threshold=float(settings.garbage_collection_threshold or 0.0),
        expandable_segments=bool(settings.expandable_segments),
        roundup_power2_divisions=tuple(divs),
        large_segment_size=base.large_segment_size,
    )
    return cfg, notes


# ----- compiling a trace -----------------------------------------------------------------------------
def _device_index(snap: Snapshot) -> int:
    return snap.trace_device  # the segments' device (a DDP rank's snapshot lists other devices' traces too)


def _is_empty_cache(frames: list) -> bool:
    for f in frames:
        name = frame_name(f)
        if "emptyCache" in name or name == "empty_cache":
            return True
    return False


def compile_trace(snap: Snapshot, limit_bytes: int | None = None) -> Replay:
    """`limit_bytes` (the per-process cap, when known) tells releases inside a request from
    empty_cache() calls when the trace has no frames to say which is which."""
    return _TraceCompiler(snap, limit_bytes).compile()


class _TraceCompiler:
    """Steps 1 and 2 of the module docstring, for one snapshot. `compile()` once:

    - `_program()`: one pass over the trace, one `_on_*` method per kind of entry, appending ops through
      `_emit` and collecting what the start state needs (blocks freed but never allocated in the trace,
      segments freed but never created, expandable map/unmap entries);
    - `_start_segments()` and `_start_live()`: the allocator as it was at the first trace entry.
    Segment releases are held in `pending` until the next entry says whether they were an empty_cache()
    of their own or the release-and-retry inside a request (`_attach_pending`).
    """

    def __init__(self, snap: Snapshot, limit_bytes: int | None):
        self.snap = snap
        self.limit_bytes = limit_bytes
        self.warnings: list[str] = []
        self.device = _device_index(snap)
        self.trace = snap.traces[self.device] if self.device < len(snap.traces) else []
        self.cfg = self._recorded_config()
        self._split_private_pools()
        self.rec_reserved = self._reserved_before_trace()
        raw_streams = sorted({s.stream for s in self.segments} | {e.stream for e in self.trace} | {0})
        self.smap = {s: i for i, s in enumerate(raw_streams)}

        self.prog = Program()
        self.op_event: list[int] = []
        self.rec_alloc_addr: list = []
        self.rec_events: list = []
        self.pending: list = []  # segment releases not yet tied to a request: (kind, bytes)
        self.pending_empty_cache = False  # the pending releases' frames say emptyCache
        self.pending_reserved_before = 0  # reserved bytes before the first pending release
        self.live: dict[int, int] = {}  # address -> handle of blocks allocated in the trace and not freed
        self.pre_freed: list = []  # (address, handle, requested, stream) freed in the trace, allocated before it
        self.seg_created: dict[int, int] = {}  # segments allocated in the trace, still alive
        self.seg_freed_pre: list = []  # (address, size, stream) segments the trace frees that existed before it
        self.exp_changes: list = []  # (kind, address, size, stream) map/unmap entries, in order
        self.hints: list = []
        self.map_hints: list = []
        self.oom_ops: list = []
        self.priv_created: set = set()
        self.n = 0  # handles handed out so far

    # --- set-up
    def _recorded_config(self) -> AllocatorConfig:
        snap = self.snap
        cfg, notes = config_from_settings(snap.settings)
        self.warnings += notes
        if not snap.settings.known and any(s.is_expandable for s in snap.segments):
            cfg = AllocatorConfig(expandable_segments=True)
            self.warnings.append("the snapshot's segments are expandable: the recorded run is taken to use "
                                 "expandable_segments:True")
        return cfg

    def _split_private_pools(self) -> None:
        segments = [s for s in self.snap.segments if s.device == self.device]
        self.private = [s for s in segments if tuple(s.pool_id) != (0, 0)]
        self.priv_starts: list = []
        self.priv_ends: list = []
        if self.private:
            self.warnings.append(f"{len(self.private)} segments belong to private pools (CUDA graphs / MemPool): "
                                 "left out of the model, with the trace entries inside them")
            segments = [s for s in segments if tuple(s.pool_id) == (0, 0)]
            for seg in sorted(self.private, key=lambda x: x.address):
                self.priv_starts.append(seg.address)
                self.priv_ends.append(seg.address + seg.total_size)
        self.segments = segments
        self.priv_set = {seg.address for seg in self.private}

    def _reserved_before_trace(self) -> int:
        """Reserved bytes the recorded run had at the first entry (for telling empty_cache from a
        release inside a request): the end's reserved bytes minus the trace's net segment change."""
        net = 0
        for e in self.trace:
            if e.action in ("segment_alloc", "segment_map"):
                net += e.size
            elif e.action in ("segment_free", "segment_unmap"):
                net -= e.size
        return sum(s.total_size for s in self.segments) + sum(s.total_size for s in self.private) - net

    def _in_private(self, addr) -> bool:
        if not self.priv_starts or addr is None:
            return False
        j = bisect_right(self.priv_starts, addr) - 1
        return j >= 0 and addr < self.priv_ends[j]

    def _new_handle(self) -> int:
        h = self.n
        self.n += 1
        return h

    def _emit(self, op: int, handle: int, size: int, stream: int, ev_index: int, recorded_addr=None) -> int:
        """Append one op to the program; returns its index."""
        p = self.prog
        i = len(p.ops)
        p.ops.append(op)
        p.hid.append(handle)
        p.size.append(size)
        p.stream.append(stream)
        self.op_event.append(ev_index)
        self.rec_alloc_addr.append(recorded_addr)
        return i

    # --- segment releases: an empty_cache() of their own, or part of the next request
    def _flush_as_empty_cache(self, ev_index: int) -> None:
        if self.pending:
            i = self._emit(OP_EMPTY_CACHE, -1, 0, 0, ev_index)
            self.rec_events.extend((i, k, s) for k, s in self.pending)
            self.pending = []

    def _attach_pending(self, ev_index: int, next_segment: int | None) -> None:
        """Releases right before a segment_alloc/map or an oom: inside the request (release and retry,
        GC) unless the frames say empty_cache, or the limit shows the request did not need them."""
        if not self.pending:
            return
        empty = self.pending_empty_cache
        limit = self.limit_bytes
        if not empty and limit is not None and next_segment is not None:
            before = self.pending_reserved_before
            needed = before + next_segment > limit
            gc_thr = self.cfg.garbage_collection_threshold
            gc = gc_thr > 0 and before > gc_thr * limit
            empty = not needed and not gc
        if empty:
            self._flush_as_empty_cache(ev_index)
            return
        i = len(self.prog.ops)
        self.rec_events.extend((i, k, s) for k, s in self.pending)
        self.pending = []

    # --- step 1: the program
    def _program(self) -> None:
        for ei, e in enumerate(self.trace):
            a = e.action
            if self.private and self._in_private(e.addr):
                if a in ("segment_alloc", "segment_free") and e.addr in self.priv_set:
                    self._on_private_segment(ei, e)
                continue
            if a == "segment_alloc" or a == "segment_map":
                self._on_segment_added(ei, e)
            elif a == "segment_free" or a == "segment_unmap":
                self._on_segment_released(e)
            elif a == "oom":
                self._on_oom(ei, e)
            else:
                self._flush_as_empty_cache(ei)
                if a == "alloc":
                    self._on_alloc(ei, e)
                elif a == "free_completed":
                    self._on_free(ei, e)
        self._flush_as_empty_cache(len(self.trace))

    def _on_private_segment(self, ei: int, e) -> None:
        """A private pool's segment: its bytes count against the limit, nothing else is modelled."""
        created = e.action == "segment_alloc"
        if created:
            self._attach_pending(ei, None)
        i = self._emit(OP_FOREIGN, -1, e.size if created else -e.size, 0, ei)
        self.rec_events.append((i, EV_SEGMENT_ALLOC if created else EV_SEGMENT_FREE, e.size))
        if created:
            self.priv_created.add(e.addr)
        self.rec_reserved += e.size if created else -e.size

    def _on_segment_added(self, ei: int, e) -> None:
        self._attach_pending(ei, e.size)
        self.rec_reserved += e.size
        if e.action == "segment_alloc":
            self.rec_events.append((len(self.prog.ops), EV_SEGMENT_ALLOC, e.size))
            self.seg_created[e.addr] = e.size
            self.hints.append((e.size, e.addr))
        else:
            self.rec_events.append((len(self.prog.ops), EV_SEGMENT_MAP, e.size))
            self.exp_changes.append((EV_SEGMENT_MAP, e.addr, e.size, e.stream))
            self.map_hints.append(e.addr)

    def _on_segment_released(self, e) -> None:
        if not self.pending:
            self.pending_empty_cache = False
            self.pending_reserved_before = self.rec_reserved
        self.pending_empty_cache = self.pending_empty_cache or _is_empty_cache(e.frames)
        self.rec_reserved -= e.size
        if e.action == "segment_free":
            self.pending.append((EV_SEGMENT_FREE, e.size))
            if e.addr in self.seg_created:
                del self.seg_created[e.addr]
            else:
                self.seg_freed_pre.append((e.addr, e.size, e.stream))
        else:
            self.pending.append((EV_SEGMENT_UNMAP, e.size))
            self.exp_changes.append((EV_SEGMENT_UNMAP, e.addr, e.size, e.stream))

    def _on_oom(self, ei: int, e) -> None:
        self._attach_pending(ei, None)
        self.oom_ops.append(len(self.prog.ops))
        self._emit(OP_OOM, self._new_handle(), e.size, self.smap.get(e.stream, 0), ei)

    def _on_alloc(self, ei: int, e) -> None:
        if e.addr is None:
            return
        h = self._new_handle()
        self.live[e.addr] = h
        self._emit(OP_ALLOC, h, e.size, self.smap.get(e.stream, 0), ei, e.addr)

    def _on_free(self, ei: int, e) -> None:
        if e.addr is None:
            return
        h = self.live.pop(e.addr, None)
        if h is None:  # allocated before the trace began: part of the start state
            h = self._new_handle()
            self.pre_freed.append((e.addr, h, e.size, self.smap.get(e.stream, 0)))
        self._emit(OP_FREE, h, 0, 0, ei)

    # --- step 2: the start state
    def _start_segments(self) -> tuple[list[SegmentSpec], int]:
        """Segments at the first trace entry, and the private pools' bytes then (counted, not modelled)."""
        smap = self.smap
        start_segs: list[SegmentSpec] = []
        for s in self.segments:
            if s.is_expandable or s.address in self.seg_created:
                continue
            start_segs.append(SegmentSpec(s.address, s.total_size, s.segment_type == "small",
                                          smap.get(s.stream, 0), False, []))
        for addr, size, stream in self.seg_freed_pre:
            start_segs.append(SegmentSpec(addr, size, size == K_SMALL_BUFFER, smap.get(stream, 0), False, []))
        start_segs += _expandable_start(self.segments, self.exp_changes, smap, self.warnings)
        start_segs.sort(key=lambda s: s.address)
        foreign_start = sum(seg.total_size for seg in self.private if seg.address not in self.priv_created)
        return start_segs, foreign_start

    def _start_live(self, start_segs: list[SegmentSpec]) -> list:
        """Blocks live at the first trace entry, placed into `start_segs`: (address, handle, requested,
        stream) sorted by address."""
        starts = [s.address for s in start_segs]
        start_live: list = []

        def owner(addr: int):
            j = bisect_right(starts, addr) - 1
            if j >= 0 and addr < start_segs[j].address + start_segs[j].size:
                return start_segs[j]
            return None

        for s in self.segments:
            for b in s.blocks:
                if b.state == INACTIVE or b.address in self.live:
                    continue
                seg = owner(b.address)
                if seg is None:
                    continue
                h = self._new_handle()
                seg.blocks.append((b.address, b.size, h, b.requested_size))
                start_live.append((b.address, h, b.requested_size, self.smap.get(s.stream, 0)))
        lost = 0
        for addr, h, req, stream in self.pre_freed:
            seg = owner(addr)
            if seg is None:
                lost += 1
                continue
            seg.blocks.append((addr, round_size(req, self.cfg.roundup_power2_divisions), h, req))
            start_live.append((addr, h, req, stream))
        if lost:
            self.warnings.append(f"{lost} blocks freed in the trace lie in no segment known at its start: ignored")
        self._settle_estimated_sizes(start_segs)
        start_live.sort()
        return start_live

    def _settle_estimated_sizes(self, start_segs: list[SegmentSpec]) -> None:
        """Blocks known only from their free entry get the bytes no split could have left beside them."""
        estimated = {h for _a, h, _r, _s in self.pre_freed}
        free_op: dict = {}
        first_alloc: dict = {}  # recorded address -> first op that allocated there
        if estimated:
            for i, (o, h) in enumerate(zip(self.prog.ops, self.prog.hid, strict=True)):
                if o == OP_FREE and h in estimated:
                    free_op[h] = i
            for i, a in enumerate(self.rec_alloc_addr):
                if a is not None and a not in first_alloc:
                    first_alloc[a] = i
        allocs = (sorted(first_alloc), first_alloc)
        for seg in start_segs:
            seg.blocks.sort()
            if not seg.small and not seg.expandable:
                _absorb_unsplittable_gaps(seg, estimated, free_op, allocs)

    def compile(self) -> Replay:
        self._program()
        start_segs, foreign_start = self._start_segments()
        reserved_start = sum(s.size for s in start_segs) + foreign_start
        start_live = self._start_live(start_segs)
        self.prog.n_handles = self.n
        if not self.trace:
            self.warnings.append("the snapshot has no trace (record_memory_history was off): nothing to replay")
        return Replay(program=self.prog, start_segments=start_segs, start_live=start_live,
                      recorded_events=self.rec_events, recorded_reserved_start=reserved_start,
                      recorded_alloc_addr=self.rec_alloc_addr, op_event=self.op_event, addr_hints=self.hints,
                      map_hints=self.map_hints, recorded_config=self.cfg, recorded_oom_ops=self.oom_ops,
                      foreign_start=foreign_start, trace_entries=len(self.trace), streams=self.smap,
                      warnings=self.warnings)


def _absorb_unsplittable_gaps(seg: SegmentSpec, estimated: set, free_op: dict, allocs: tuple) -> None:
    """Sizes of large-pool blocks known only from their free entry. A large-pool block keeps a remainder
    of <= 1 MiB instead of splitting it off (R7), and no free large-pool block is that small, so:
    - a gap of <= 1 MiB between such a block and the next live block belongs to the block;
    - an allocation the trace places within 1 MiB after the block's estimated end, while the block is
      still live, starts the free block that follows it: the bytes before it are the block's."""
    out = []
    blocks = seg.blocks
    end = seg.address + seg.size
    for i, (addr, size, h, req) in enumerate(blocks):
        if h in estimated:
            nxt = blocks[i + 1][0] if i + 1 < len(blocks) else end
            gap = nxt - (addr + size)
            if 0 < gap <= K_SMALL_SIZE:
                size += gap
            elif gap > K_SMALL_SIZE:
                addrs, first = allocs
                j = bisect_right(addrs, addr + size)
                limit_op = free_op.get(h, 1 << 62)
                while j < len(addrs) and addrs[j] <= addr + size + K_SMALL_SIZE:
                    if first[addrs[j]] < limit_op:
                        size = addrs[j] - addr
                        break
                    j += 1
        out.append((addr, size, h, req))
    seg.blocks[:] = out


def _expandable_start(segments, changes, smap, warnings) -> list:
    """Mapped ranges of expandable segments at the first trace entry: the end state with the trace's
    map/unmap entries undone, newest first."""
    exp = [s for s in segments if s.is_expandable]
    if not exp and not changes:
        return []
    ranges = sorted((s.address, s.address + s.total_size) for s in exp)
    pool_of = {s.address: (s.segment_type == "small", smap.get(s.stream, 0)) for s in exp}
    for kind, addr, size, _stream in reversed(changes):
        if kind == EV_SEGMENT_MAP:
            ranges = _subtract(ranges, addr, addr + size)
        else:
            ranges = _add(ranges, addr, addr + size)
    out = []
    anchors = sorted(pool_of)
    for lo, hi in ranges:
        if anchors:
            nearest = min(anchors, key=lambda a: abs(a - lo))
            small, stream = pool_of[nearest]
        else:
            small, stream = (hi - lo) % K_LARGE_BUFFER != 0, 0
        out.append(SegmentSpec(lo, hi - lo, small, stream, True, []))
    return out


def _subtract(ranges, lo, hi):
    out = []
    for a, b in ranges:
        if b <= lo or a >= hi:
            out.append((a, b))
            continue
        if a < lo:
            out.append((a, lo))
        if b > hi:
            out.append((hi, b))
    return out


def _add(ranges, lo, hi):
    out = []
    for a, b in sorted(ranges + [(lo, hi)]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


# ----- running -----------------------------------------------------------------------------------------
def _simulate(rep: Replay, cfg: AllocatorConfig, limit: int | None, start: str, record: bool = False,
              per_process: bool = True, limit_from: int = 0) -> SimResult:
    """`limit_from`: the op from which the limit holds (the run set its cap inside the trace)."""
    prog = rep.program
    later = limit if limit_from else None
    if limit_from:
        limit = None
    if start == "recorded":
        m = AllocatorModel(cfg, limit, record=record, n_handles=prog.n_handles, addr_hints=rep.addr_hints,
                           per_process_limit=per_process, map_hints=rep.map_hints)
        m.load(rep.start_segments)
        if rep.foreign_start:
            m.add_foreign(rep.foreign_start)
            m.events.clear()
            m.peak = m.reserved
        return _run_phased(m, prog, later, limit_from, per_process)
    m = AllocatorModel(cfg, limit, record=record, n_handles=prog.n_handles, per_process_limit=per_process)
    handles = m.handles
    if rep.foreign_start:
        m.add_foreign(rep.foreign_start)
    for _addr, h, req, stream in rep.start_live:
        b = m.malloc(req, stream)
        if b is None:
            r = m.run(Program(n_handles=prog.n_handles))
            r.oom_op, r.oom_request, r.failed_ops, r.ops_done = -1, req, [-1], 0
            return r
        handles[h] = b
    m.events.clear()
    m.peak = m.reserved
    return _run_phased(m, prog, later, limit_from, per_process)


def _slice(prog: Program, a: int, b: int) -> Program:
    return Program(ops=prog.ops[a:b], hid=prog.hid[a:b], size=prog.size[a:b], stream=prog.stream[a:b],
                   n_handles=prog.n_handles)


def _run_phased(m: AllocatorModel, prog: Program, limit: int | None, limit_from: int, per_process: bool) -> SimResult:
    """Run `prog`, with `limit` (and garbage collection, which needs it) in force from op `limit_from` on."""
    if not limit_from:
        return m.run(prog)
    first = m.run(_slice(prog, 0, limit_from))
    n_events = len(m.events)
    m.limit = limit
    m.gc_on = m.cfg.garbage_collection_threshold > 0.0 and limit is not None and per_process
    second = m.run(_slice(prog, limit_from, len(prog.ops)))
    k = limit_from
    second.start_reserved = first.start_reserved
    second.oom_op = None if second.oom_op is None else second.oom_op + k
    second.failed_ops = first.failed_ops + [i + k for i in second.failed_ops]
    if first.oom_op is not None:
        second.oom_op, second.oom_request = first.oom_op, first.oom_request
    second.segment_events = (second.segment_events[:n_events]
                             + [(i + k, kind, size) for i, kind, size in second.segment_events[n_events:]])
    second.reserved_after = first.reserved_after + second.reserved_after
    second.alloc_addr = first.alloc_addr + second.alloc_addr
    second.ops_done = second.ops_done + k
    return second


def fidelity(rep: Replay, sim: SimResult) -> dict:
    """How closely the model reproduced the recorded run (recorded configuration, recorded start)."""
    rec = {}
    for i, k, s in rep.recorded_events:
        rec[(i, k, s)] = rec.get((i, k, s), 0) + 1
    mod = {}
    for i, k, s in sim.segment_events:
        mod[(i, k, s)] = mod.get((i, k, s), 0) + 1
    matched = sum(min(c, mod.get(key, 0)) for key, c in rec.items())
    n_rec, n_mod = len(rep.recorded_events), len(sim.segment_events)
    denom = max(n_rec, n_mod)
    share = 1.0 if denom == 0 else matched / denom
    rec_res = rep.recorded_reserved_after()
    worst = 0.0
    worst_at = None
    for i, (r, m) in enumerate(zip(rec_res, sim.reserved_after, strict=False)):
        dev = abs(m - r) / r if r else (0.0 if m == 0 else 1.0)
        if dev > worst:
            worst, worst_at = dev, i
    compared = min(len(rec_res), len(sim.reserved_after))
    n_alloc = same = 0
    for ra, ma in zip(rep.recorded_alloc_addr, sim.alloc_addr, strict=False):
        if ra is not None:
            n_alloc += 1
            same += ra == ma
    by_kind = {}
    for _i, k, _s in rep.recorded_events:
        by_kind[EVENT_NAMES[k]] = by_kind.get(EVENT_NAMES[k], 0) + 1
    return {
        "segment_events_recorded": n_rec,
        "segment_events_model": n_mod,
        "segment_events_matched": matched,
        "segment_event_share": round(share, 6),
        "recorded_by_kind": by_kind,
        "reserved_points_compared": compared,
        "reserved_points_total": len(rep.program.ops),
        "max_reserved_deviation": round(worst, 6),
        "max_reserved_deviation_at_trace_index": rep.op_event[worst_at] if worst_at is not None else None,
        "reserved_within_5pct": worst <= REPLAY_RESERVED_TOLERANCE and compared == len(rep.program.ops),
        "alloc_address_share": round(same / n_alloc, 6) if n_alloc else 1.0,
        "allocations": n_alloc,
    }


def reproduces(fid: dict) -> bool:
    """The recorded settings' replay reproduces the recorded run (its confidence `reproduced`): enough of
    the segment events at the same request, and the reserved bytes within tolerance throughout."""
    return fid["segment_event_share"] >= REPLAY_EVENT_SHARE and bool(fid["reserved_within_5pct"])


def _result(conf: str, cfg: AllocatorConfig, rep: Replay, sim: SimResult, limit: int | None, start: str,
            confidence: str, notes: list) -> WhatIfResult:
    rec_oom = rep.recorded_oom_ops
    fails_rec = None
    if rec_oom:
        first_rec = rec_oom[0]
        fails_rec = first_rec in sim.failed_ops or (sim.oom_op is not None and sim.oom_op < first_rec)
    first = None
    if sim.oom_op is not None:
        idx = rep.op_event[sim.oom_op] if sim.oom_op >= 0 else None
        first = {"trace_index": idx, "requested_bytes": sim.oom_request,
                 "at": "trace start (the live set does not fit)" if sim.oom_op < 0 else
                 ("the recorded OOM request" if sim.oom_op in rec_oom else "an earlier request")}
    shortfall = None
    if sim.oom_op is not None and limit is not None and sim.oom_request is not None:
        need = allocation_size(round_size(sim.oom_request, cfg.roundup_power2_divisions), cfg.large_segment_size)
        shortfall = int(sim.final_reserved + need - limit)
    return WhatIfResult(
        shortfall_bytes=shortfall,
        conf=conf, effective=cfg.describe(), predicted_oom=sim.oom_op is not None,
        peak_reserved_bytes=int(sim.peak_reserved),
        headroom_bytes=None if limit is None else int(limit - sim.peak_reserved),
        limit_bytes=limit, fails_recorded_request=fails_rec, first_failure=first, start_state=start,
        start_reserved_bytes=int(sim.start_reserved), final_reserved_bytes=int(sim.final_reserved),
        segment_allocs=sim.num_device_alloc, segment_frees=sim.num_device_free,
        alloc_retries=sim.num_alloc_retries, confidence=confidence, notes=list(notes))


# ----- several snapshots of one run ----------------------------------------------------------------------
def _event_key(e) -> tuple:
    return (e.action, e.addr, e.size, e.stream)


def _same_entry(a, b) -> bool:
    return (_event_key(a) == _event_key(b) and a.time_us is not None and b.time_us is not None
            and abs(a.time_us - b.time_us) <= TRACE_TIME_SLACK_US)


def stitch_traces(earlier: list[Snapshot], last: Snapshot) -> tuple[Snapshot, list[int]]:
    """Join the traces of earlier snapshots (time order) that overlap the last one's: a ring buffer
    that kept recording between two snapshots holds the same entries at the end of the first and
    the start of the second (same action, address, size, stream and time). Returns the last snapshot
    with the joined trace (its segments are still the end state the start is rebuilt from) and the
    indices into `earlier` that were joined. Stops at the first snapshot that does not overlap:
    without common entries nothing proves that no entry is missing in between."""
    dev = _device_index(last)
    trace = list(last.traces[dev]) if dev < len(last.traces) else []
    if not trace or trace[0].time_us is None:
        return last, []
    used: list[int] = []
    for k in range(len(earlier) - 1, -1, -1):
        prev = earlier[k].trace
        if not prev:
            continue
        head = trace[0]
        j = next((i for i in range(len(prev) - 1, -1, -1) if _same_entry(prev[i], head)), None)
        tail = len(prev) - j if j is not None else 0
        if j is None or tail > len(trace) or not all(_same_entry(prev[j + i], trace[i]) for i in range(tail)):
            break
        if j > 0:
            trace = list(prev[:j]) + trace
            used.append(k)
    if not used:
        return last, []
    traces = [list(t) for t in last.traces]
    traces[dev] = trace
    return replace(last, traces=traces, memo={}), sorted(used)


def _seedable(rep: Replay, streams: dict) -> bool:
    return (bool(rep.program.ops) and not rep.foreign_start and rep.streams == streams
            and OP_FOREIGN not in rep.program.ops)


def _live_at_end(w: Replay, handles: list) -> list:
    """((recorded address, requested bytes), model block) of the allocations live after a window."""
    info = {h: (a, req) for a, h, req, _s in w.start_live}
    prog = w.program
    for i, op in enumerate(prog.ops):
        if op == OP_ALLOC:
            info[prog.hid[i]] = (w.recorded_alloc_addr[i], prog.size[i])
    return [(info.get(h), b) for h, b in enumerate(handles) if b is not None]


def _simulate_seeded(seeds: list, rep: Replay, cfg: AllocatorConfig, limit: int | None,
                     per_process: bool = True) -> tuple[SimResult | None, dict | None]:
    """Replay earlier snapshots' windows (time order), then the last one, on one model: the cache
    this setting would have cut in the earlier windows is what the last window starts from. Between
    windows the live set is carried over: blocks live at the next window's start that the model
    holds (same recorded address and requested size) stay where the model put them, the others are
    freed, and the next window's live blocks the model lacks are allocated in address order (what
    the run did between windows is in no trace). Returns (the last window's result, None), or
    (None, where it failed) when the setting cannot serve a request before the last window."""
    m = AllocatorModel(cfg, limit, per_process_limit=per_process)
    carried: dict = {}
    windows = list(seeds) + [rep]
    for k, w in enumerate(windows):
        handles: list = [None] * w.program.n_handles
        for a, h, req, _s in w.start_live:
            b = carried.pop((a, req), None)
            if b is not None:
                handles[h] = b
        for b in carried.values():
            m.free_block(b)
        for _a, h, req, stream in w.start_live:
            if handles[h] is None:
                b = m.malloc(req, stream)
                if b is None:
                    return None, {"window": k, "trace_index": None, "requested_bytes": req,
                                  "at": "the live set carried into this window"}
                handles[h] = b
        m.handles = handles
        if k == len(windows) - 1:
            m.peak = m.reserved
            m.retries = m.n_dev_alloc = m.n_dev_free = 0
            return m.run(w.program), None
        r = m.run(w.program)
        if r.ops_done < len(w.program.ops):
            return None, {"window": k, "trace_index": w.op_event[r.oom_op], "requested_bytes": r.oom_request,
                          "at": "a request of an earlier snapshot's window"}
        carried = {}
        for key, b in _live_at_end(w, m.handles):
            if key is None or key[0] is None or key in carried:
                m.free_block(b)
            else:
                carried[key] = b
    raise AssertionError("unreachable")


def _with_oom_requests(rep: Replay, size: int) -> Replay:
    """The same replay with the recorded OOM requests asking for `size` bytes."""
    sizes = list(rep.program.size)
    for i in rep.recorded_oom_ops:
        sizes[i] = size
    prog = Program(ops=rep.program.ops, hid=rep.program.hid, size=sizes, stream=rep.program.stream,
                   n_handles=rep.program.n_handles)
    return replace(rep, program=prog)


def _live_bytes_before(rep: Replay, op_index: int, cfg: AllocatorConfig) -> int:
    """Bytes of the blocks live just before op `op_index` (rounded as `cfg` rounds them)."""
    divs = cfg.roundup_power2_divisions
    live = {h: round_size(req, divs) for _a, h, req, _s in rep.start_live}
    prog = rep.program
    for i in range(op_index):
        op = prog.ops[i]
        if op == OP_ALLOC:
            live[prog.hid[i]] = round_size(prog.size[i], divs)
        elif op == OP_FREE:
            live.pop(prog.hid[i], None)
    return sum(live.values())


# ----- running the settings ------------------------------------------------------------------------------
def _fmt(n: int | None) -> str:
    return fmt_bytes(n, "GiB", unknown="unknown")


def _not_assessable(conf: str, cfg: AllocatorConfig, rep: Replay, limit: int | None, reason: str, notes: list,
                    sim: SimResult | None = None, start: str = "none", coverage: str = "none",
                    inputs: dict | None = None) -> WhatIfResult:
    if sim is not None:
        r = _result(conf, cfg, rep, sim, limit, start, replay_confidence("not_assessable"), notes)
    else:
        end = rep.recorded_reserved_after()[-1] if rep.program.ops else rep.recorded_reserved_start
        r = WhatIfResult(conf=conf, effective=cfg.describe(), predicted_oom=None, peak_reserved_bytes=int(end),
                         headroom_bytes=None, limit_bytes=limit, fails_recorded_request=None, first_failure=None,
                         start_state=start, start_reserved_bytes=int(rep.recorded_reserved_start),
                         final_reserved_bytes=int(end), segment_allocs=0, segment_frees=0, alloc_retries=0,
                         confidence=replay_confidence("not_assessable"), notes=list(notes))
    r.predicted_oom = None
    r.confidence = replay_confidence("not_assessable")
    r.verdict = VERDICT_NOT_ASSESSABLE
    r.coverage = coverage
    r.reason = reason
    r.notes.append("not assessable: " + reason)
    r.inputs = dict(inputs or {})
    return r


def run_whatif(snapshot: Snapshot, limit_bytes: int | None, confs: list[str] | tuple[str, ...],
               replay: Replay | None = None, *, earlier: list | tuple = (),
               recorded_oom: bool | None = None) -> list[WhatIfResult]:
    """One result per conf, in the order given. `""` is the recorded configuration.

    `earlier`: the same process's earlier snapshots (or objects with `.snapshot`), oldest first:
    traces that overlap the last one's are joined to it (`stitch_traces`), and the windows of the
    others seed the cache that settings other than the recorded one start from (`_simulate_seeded`).
    `recorded_oom`: True when it is known from outside the snapshot (the agent's trigger, the OOM
    message) that the run ran out of memory there; the agent's own `memq_agent` trigger counts too.

    `predicted_oom` is None ("not assessable", `reason` says why) when there is no trace, when the
    trace does not reach the recorded OOM, when the recorded settings do not reproduce the recorded
    outcome, when no limit is known, or when a success under another setting would say nothing
    (the recorded settings also succeed from the same start). A success that covers the recorded
    window only (the run went on, or would have, after the trace) is `survives_window`, never a
    high-confidence `fits`. Raises BadInput for a conf string torch would refuse."""
    parsed = [(c, None if c == "" else parse_alloc_conf(c)) for c in confs]  # fail before any work
    earlier_snaps = [getattr(x, "snapshot", x) for x in earlier or ()]
    snap, stitched = snapshot, []
    if replay is None and earlier_snaps:
        snap, stitched = stitch_traces(earlier_snaps, snapshot)
    rep = replay or compile_trace(snap, limit_bytes)
    common = list(rep.warnings)
    inputs = {"snapshots": 1 + len(earlier_snaps), "trace_entries": rep.trace_entries,
              "joined": stitched, "seeds": []}
    if stitched:
        common.append(f"the trace is joined with {len(stitched)} earlier snapshot(s) whose traces overlap it: "
                      f"{rep.trace_entries} entries replayed")
    agent = getattr(snapshot, "agent", None)
    rec_oom = bool(rep.recorded_oom_ops) or bool(recorded_oom) or getattr(agent, "trigger", None) == "oom"
    rec_cfg = rep.recorded_config
    from_start = not rep.start_segments and not rep.foreign_start and not rep.start_live
    coverage = "from_start" if from_start else "window"

    def all_na(reason: str, rec_sim: SimResult | None = None, fid: dict | None = None) -> list[WhatIfResult]:
        out = []
        for conf, cfg in parsed:
            r = _not_assessable(conf, cfg or rec_cfg, rep, limit_bytes, reason, common,
                                sim=rec_sim if cfg is None else None,
                                start="recorded" if cfg is None and rec_sim is not None else "none",
                                coverage=coverage if rec_sim is not None else "none", inputs=inputs)
            if cfg is None:
                r.fidelity = fid
            out.append(r)
        return out

    if not rep.program.ops:
        reason = ("no trace: memory history was not being recorded when the snapshot was taken (at its defaults "
                  "the agent records the warm-up steps and one step per periodic snapshot), so there is no "
                  "alloc/free sequence to replay")
        if rec_oom:
            reason += ("; the request that failed and the cache it met are known, but not the order of the "
                       "requests that cut that cache, which any other setting would have cut differently")
        return all_na(reason)
    if rec_oom and not rep.recorded_oom_ops:
        return all_na(f"the trace ({rep.trace_entries} entries) ends before the recorded OOM: the failing request "
                      "and the requests before it are not in it (recording was paused or the ring buffer was read "
                      "earlier)")
    per_process = True
    if limit_bytes is None:
        limit_bytes = device_bound_limit(snap, rep)
        if limit_bytes is not None:
            per_process = False
            common.append(f"no limit given: using the device-bound limit {fmt_bytes(limit_bytes)} "
                          "(reserved bytes at the recorded OOM + the free bytes CUDA reported there); pass --limit "
                          "for a per-process cap (set_per_process_memory_fraction), which also enables garbage "
                          "collection")
        else:  # still replayed: the peaks and the model check hold without a limit
            reason = ("no limit known: without the per-process cap (--limit, or the run's limit in the history) "
                      "nothing can run out of memory in the model; peak reserved is still predicted")
            rec_sim = _simulate(rep, rec_cfg, None, "recorded", record=True)
            out = []
            for conf, cfg in parsed:
                sim = rec_sim if cfg is None else _simulate(rep, cfg, None, "recorded" if from_start else "compact")
                r = _not_assessable(conf, cfg or rec_cfg, rep, None, reason, common, sim=sim,
                                    start="recorded" if cfg is None or from_start else "compact",
                                    coverage=coverage, inputs=inputs)
                if cfg is None:
                    r.fidelity = fidelity(rep, rec_sim)
                out.append(r)
            return out
    # A cap set (or lowered) inside the trace: the recorded run reserved more than it before that point,
    # which it could not have under the cap. It holds from the first entry after the last such point.
    # Without a recorded OOM, a limit the recorded run exceeded is a hypothetical cap ("what if the cap
    # were N"): the replay then predicts, it does not reproduce.
    limit_from = 0
    rec_reserved = rep.recorded_reserved_after()
    hypothetical = not rec_oom and max(rec_reserved, default=0) > limit_bytes
    if per_process and rep.recorded_oom_ops:
        over = [i for i, v in enumerate(rec_reserved[:rep.recorded_oom_ops[0]]) if v > limit_bytes]
        if over:
            limit_from = over[-1] + 1
            common.append(f"the recorded run reserved more than the limit of {fmt_bytes(limit_bytes)} until "
                          f"trace entry {rep.op_event[over[-1]]} (the cap was set or lowered later in the run): "
                          "the limit is applied from there on")
    rec_sim = _simulate(rep, rec_cfg, limit_bytes, "recorded", record=True, per_process=per_process,
                        limit_from=limit_from)
    fid = fidelity(rep, rec_sim)
    first_rec = rep.recorded_oom_ops[0] if rep.recorded_oom_ops else None
    if rec_oom and rec_sim.oom_op != first_rec:
        what = ("serves every request" if rec_sim.oom_op is None else
                f"fails an earlier request (trace entry {rep.op_event[rec_sim.oom_op]})")
        if per_process:
            return all_na(f"the recorded settings do not reproduce the recorded OOM: under the limit of "
                          f"{fmt_bytes(limit_bytes)} the model {what}; the limit must be the per-process cap the "
                          "run had", rec_sim, fid)
        # no limit was known: say that this one is the device's, or the screen's "limit unknown" above
        # this line and "the limit of 139 GiB" in it read as two limits
        return all_na(f"the recorded settings do not reproduce the recorded OOM: with no limit known, the replay "
                      f"used the device-bound {fmt_bytes(limit_bytes)}, under which the model {what}: the run had a "
                      "lower per-process cap (--limit)", rec_sim, fid)
    if hypothetical:
        common.append(f"the recorded run reserved up to {fmt_bytes(max(rec_reserved))}, more than this limit: "
                      "the replay predicts what a lower cap would have done")
    if not rec_oom and rec_sim.oom_op is not None and not hypothetical:
        return all_na(f"under the recorded settings the model runs out of memory at trace entry "
                      f"{rep.op_event[rec_sim.oom_op] if rec_sim.oom_op >= 0 else 0} where the recorded run did "
                      f"not: the limit of {fmt_bytes(limit_bytes)} is below what the run had", rec_sim, fid)

    def matches_record(sim: SimResult | None) -> bool:
        if sim is None or hypothetical:  # under a hypothetical cap there is no recorded outcome to match
            return False
        return sim.oom_op == first_rec if rec_oom else sim.oom_op is None

    # The start other settings replay from. From an empty allocator it is exact; mid-run it is rebuilt
    # (seeded by earlier windows, else compact) and trusted only when the recorded settings, replayed
    # from the same rebuilt start, give the recorded outcome (`calibrated`).
    start, seeds, calibrated = "recorded", [], True
    if not from_start:
        start, calibrated = "compact", False
        joined = set(stitched)
        cand = [i for i, s in enumerate(earlier_snaps) if i not in joined and (not stitched or i < min(stitched))]
        seed_reps = []
        for i in cand:
            w = compile_trace(earlier_snaps[i], limit_bytes)
            if _seedable(w, rep.streams):
                seed_reps.append((i, w))
        if rep.foreign_start or OP_FOREIGN in rep.program.ops or limit_from:
            seed_reps = []  # private pools (CUDA graphs) are only counted, never carried across windows
        if seed_reps:
            base, failed = _simulate_seeded([w for _i, w in seed_reps], rep, rec_cfg, limit_bytes, per_process)
            if failed is None and matches_record(base):
                start, seeds, calibrated = "seeded", [w for _i, w in seed_reps], True
                inputs["seeds"] = [i for i, _w in seed_reps]
                common.append(f"other settings start from the cache they would have cut in {len(seeds)} earlier "
                              "snapshot window(s), with the live set carried over between windows (the recorded "
                              "settings replayed the same way give the recorded outcome)")
            else:
                common.append(f"{len(seed_reps)} earlier snapshot window(s) were tried as the start of other "
                              "settings, but the recorded settings replayed through them do not give the recorded "
                              "outcome: not used")
        if start == "compact":
            calibrated = matches_record(_simulate(rep, rec_cfg, limit_bytes, "compact", per_process=per_process,
                                                  limit_from=limit_from))
            common.append("the trace starts mid-run: other settings start from the live blocks at the first trace "
                          "entry, allocated afresh, without the cache history before it"
                          + ("" if calibrated else "; the recorded settings replayed from that start do not give "
                             "the recorded outcome"))
    inputs["start"] = start
    divs = rec_cfg.roundup_power2_divisions
    s_rec = rep.program.size[first_rec] if first_rec is not None else None
    s_min = smallest_request_rounding_to(s_rec, divs) if s_rec is not None and any(divs) else s_rec

    def simulate(cfg: AllocatorConfig, r: Replay) -> SimResult:
        if start == "seeded":
            sim, failed = _simulate_seeded(seeds, r, cfg, limit_bytes, per_process)
            if sim is not None:
                return sim
            # failed in an earlier window: an OOM before the last snapshot's trace
            out = _simulate(r, cfg, limit_bytes, "compact", per_process=per_process)
            out.oom_op, out.oom_request, out.failed_ops = -1, failed["requested_bytes"], [-1]
            return out
        return _simulate(r, cfg, limit_bytes, "recorded" if from_start else "compact", per_process=per_process,
                         limit_from=limit_from)

    out = []
    for conf, cfg in parsed:
        notes = list(common)
        if cfg is None or cfg == rec_cfg:  # (or the recorded settings under another name): the recorded replay
            r = _result(conf, rec_cfg, rep, rec_sim, limit_bytes, "recorded",
                        replay_confidence("reproduced" if reproduces(fid) else "approximate"), notes)
            if cfg is None:
                r.fidelity = fid
            r.coverage, r.inputs = coverage, dict(inputs)
            if hypothetical:  # a prediction under a lower cap, not a reproduction
                oom = rec_sim.oom_op is not None
                r.verdict = VERDICT_OOM if oom else (VERDICT_FITS if from_start else VERDICT_WINDOW)
                if not from_start:
                    r.confidence = replay_confidence("window_only")
                    r.reason = "a cap below what the recorded run reserved, replayed over a window that starts mid-run"
            else:
                r.verdict = VERDICT_OOM if rec_oom else VERDICT_FITS
                if not rec_oom and not from_start:
                    r.reason = "the recorded run itself, replayed over its window"
            out.append(r)
            continue
        sim = simulate(cfg, rep)
        r = _result(conf, cfg, rep, sim, limit_bytes, start, replay_confidence("from_start"), notes)
        r.coverage, r.inputs = coverage, dict(inputs)
        if sim.oom_op is not None and s_min is not None and s_min != s_rec and sim.oom_op == first_rec \
                and tuple(cfg.roundup_power2_divisions) != tuple(divs):
            lo = simulate(cfg, _with_oom_requests(rep, s_min))
            if lo.oom_op is None or lo.oom_op != first_rec:
                out.append(_not_assessable(
                    conf, cfg, rep, limit_bytes, f"the trace keeps the failing request only after rounding "
                    f"({_fmt(s_rec)} under roundup_power2_divisions); the request before rounding was between "
                    f"{_fmt(s_min)} and that, and this setting serves the smaller and fails the larger",
                    notes, sim=sim, start=start, coverage=coverage, inputs=inputs))
                continue
        if sim.oom_op is not None:
            if from_start:
                r.verdict, r.confidence = VERDICT_OOM, replay_confidence("from_start")
                out.append(r)
                continue
            live = _live_bytes_before(rep, sim.oom_op, cfg) if sim.oom_op >= 0 else None
            need = round_size(sim.oom_request or 0, cfg.roundup_power2_divisions)
            if live is not None and live + need + rep.foreign_start > limit_bytes:
                r.verdict, r.confidence = VERDICT_OOM, replay_confidence("live_over_limit")
                r.reason = (f"live blocks {_fmt(live)} + the request {_fmt(need)} exceed the limit "
                            f"{_fmt(limit_bytes)} at trace entry {r.first_failure['trace_index']}: no cache layout "
                            "could serve it")
                out.append(r)
                continue
            out.append(_not_assessable(
                conf, cfg, rep, limit_bytes, "from the rebuilt start of this mid-run window the request "
                + ("of an earlier snapshot's window" if sim.oom_op < 0
                   else f"at trace entry {r.first_failure['trace_index']}")
                + " fails for want of one free block, not of bytes (live + request fit the limit): whether this "
                "setting's own cache, cut over the whole run, would have had that block is in no trace",
                notes, sim=sim, start=start, coverage=coverage, inputs=inputs))
            continue
        if from_start:
            r.verdict = VERDICT_WINDOW if rec_oom else VERDICT_FITS
            r.confidence = replay_confidence("past_recorded_oom" if rec_oom else "from_start")
            if rec_oom:
                r.reason = ("serves the request the recorded run failed and every request before it, from the first "
                            "allocation; the run after that request is in no trace, so it may still fail later")
            out.append(r)
            continue
        if rec_oom and not calibrated:
            out.append(_not_assessable(
                conf, cfg, rep, limit_bytes, "the recorded settings too get through this window from the rebuilt "
                "start (the OOM reproduces only from the recorded segments): the trace is too short to rebuild the "
                "fragmentation that caused the OOM, so a success under another setting says nothing",
                notes, sim=sim, start=start, coverage=coverage, inputs=inputs))
            continue
        r.verdict, r.confidence = VERDICT_WINDOW, replay_confidence("window_only")
        r.reason = (f"survives the recorded window only ({rep.trace_entries} trace entries"
                    + (", through the request the recorded run failed" if rec_oom else "")
                    + f"), from a {start} start: the cache history before the window and the run after it are "
                    "in no trace")
        out.append(r)
    return out


def device_bound_limit(snapshot: Snapshot, rep: Replay) -> int | None:
    """What the process could reserve at its recorded OOM: reserved bytes there + the device's free bytes."""
    if not rep.recorded_oom_ops:
        return None
    op = rep.recorded_oom_ops[0]
    ev = snapshot.traces[_device_index(snapshot)][rep.op_event[op]]
    if ev.device_free is None:
        return None
    return rep.recorded_reserved_after()[op] + ev.device_free


def sweep_confs(snapshot: Snapshot) -> list[str]:
    """The standard list, plus the all-default settings when the recorded run used others."""
    confs = list(SWEEP)
    if snapshot.settings.known and snapshot.settings.non_default:
        confs.insert(1, "expandable_segments:False")
    return confs


def simulate_whatif(snapshot: Snapshot, limit_bytes: int | None, confs: list[str] | None = None,
                    earlier: list | tuple = (), recorded_oom: bool | None = None) -> list[dict]:
    """JSON-ready results for the analysis recommendations: [{"conf", "predicted_oom", "verdict",
    "reason", "peak_reserved_bytes", "headroom_bytes", ...}]. `confs=None` runs the sweep."""
    return [r.to_dict() for r in run_whatif(snapshot, limit_bytes, confs if confs is not None
                                             else sweep_confs(snapshot), earlier=earlier,
                                             recorded_oom=recorded_oom)]


run_whatif_dicts = simulate_whatif  # the name memq.cli.analyze looks up

__all__ = ["SWEEP", "TORCH_VERSION_MODELLED", "WHATIF_MODEL_VERSION", "stitch_traces", "Replay", "WhatIfResult",
           "compile_trace", "config_from_settings",
           "fidelity", "run_whatif", "run_whatif_dicts", "simulate_whatif", "sweep_confs", "K_SMALL_SIZE"]
