"""A model of PyTorch's CUDA caching allocator, written from its source. Pure: plain ints in and out.

Version followed: torch 2.11 (the real fixtures were captured with 2.11.0+cu130). Sources read:
`c10/core/CachingDeviceAllocator.h` (the device-generic `CachingDeviceAllocatorImpl` that 2.10+ share
with the CUDA allocator: malloc, free, alloc_block, get_free_block, should_split, release_*,
garbage_collect_cached_blocks, the expandable-segment functions), `c10/cuda/CUDACachingAllocator.cpp`
(the same logic before the move, 2.1 .. 2.9) and `c10/core/AllocatorConfig.{h,cpp}` (settings).
Every rule below names the function it comes from.

Sizes (`get_round_size`, `get_allocation_size`)
- R1 round: a request below kMinBlockSize (512 B) becomes 512 B; otherwise it is rounded up to a multiple
  of 512 B, unless `roundup_power2_divisions` gives N > 1 divisions for the request's power-of-two
  interval and size > 512 * N: then it is rounded up to the next of N equal steps between the two
  powers of two around it (`roundup_power2_next_division`; powers of two stay as they are). The 16
  intervals start at 1 MiB, 2 MiB, ... (requests below 1 MiB use the first, above 32 GiB the last).
- R2 pool: rounded size <= kSmallSize (1 MiB) -> small pool, else large pool. Pools are separate per
  stream: a block is only reused on the stream that allocated it (private pools / CUDA graphs are not
  modelled: the traces we replay carry only pool (0, 0)).
- R3 segment size when the pool has no fit: small -> kSmallBuffer (2 MiB); large below kMinLargeAlloc
  (10 MiB) -> large_segment_size (kLargeBuffer, 20 MiB, `large_segment_size_mb` in 2.11); else the
  rounded size rounded up to kRoundLarge (2 MiB).

Finding a block (`get_free_block`)
- R4 best fit: the smallest cached free block of the pool and stream with size >= the rounded size;
  ties by address (the pool is a std::set ordered by (stream, size, address)).
- R5 oversize: with `max_split_size` M set, a request < M never takes a block >= M, and a request >= M
  only takes a block smaller than request + max_non_split_rounding_size (default kLargeBuffer, 20 MiB;
  before 2.6 that slack was the constant kLargeBuffer).
- R6 expandable blocks in best fit: a free block of an expandable segment followed by its unmapped tail
  counts with the size it could grow to; the search moves on to the next block while that block's
  growable size is smaller.

Splitting (`should_split`, `alloc_found_block`)
- R7 a found block is split when the remainder is >= 512 B in the small pool or whenever expandable
  segments are on; in the large pool otherwise only when the request is < max_split_size and the
  remainder is > kSmallSize (1 MiB). The allocation takes the front, the remainder stays cached.
- R8 a freed block merges with free neighbours of its own segment (`free_block`, `try_merge`);
  blocks of different segments never merge; mapped and unmapped expandable blocks never merge.

No fit: getting memory (`malloc`, `alloc_block`)
- R9 garbage collection runs first when `garbage_collection_threshold` T > 0 and a per-process limit
  is set (set_fraction): if reserved > T * limit it releases whole cached large-pool segments (unsplit
  free blocks, not expandable) whose age (get_free_block calls on the pool since the block was cached)
  is >= the mean age, repeating until reserved - T * limit is reclaimed or nothing more goes.
- R10 the limit: with a per-process limit, a new segment (or, expandable, a new mapping) is refused when
  reserved + the R3 segment size > limit. The limit is compared with reserved bytes, as torch does
  (`total_allocated_memory + size > allowed_memory_maximum`).
- R11 on refusal: `release_available_cached_blocks` (only with max_split_size set: release the
  smallest cached oversize block >= max(request, M), or else the largest oversize blocks until that
  many bytes are released) and retry; then `release_cached_blocks` (every unsplit cached block of both
  pools, large first, in pool order; free expandable pages are unmapped) and retry. A third refusal
  is the out-of-memory error.
- R12 expandable segments (`try_allocate_expandable_block`, `map_block`, `unmap_block`): one growable
  segment per (pool, stream) with 2 MiB pages (small pool) or 20 MiB pages (large pool). A request
  that finds no cached fit maps pages at the lowest address where free and unmapped space together
  can hold it (normally the end of the segment, right after a free tail), and merges them with free
  neighbours. Pages are unmapped only by release_cached_blocks (out-of-memory path, empty_cache):
  every whole free page inside a free block. GC does not touch expandable segments.

Addresses
- R13 a segment the recorded run also allocated keeps its recorded address (the replay passes them as
  hints); any other segment gets an address below every known one, because the CUDA driver hands out
  cudaMalloc addresses from the top down (seen in the captured traces) and best fit (R4) breaks ties
  by address, so the newest of several equal free blocks is the one reused.
- R14 private pools (CUDA graphs, MemPool) are not placed, but their segments' bytes count against the
  limit (`OP_FOREIGN`), as torch counts them in reserved bytes.

What is not modelled: events of blocks used on other streams (record_stream: the free completes when
the trace says free_completed), CUDA graph private pools, the cudaMalloc of other processes (the
limit stands for all of it), and a device that fills before the limit.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
SIZE_MAX = (1 << 64) - 1
N_INTERVALS = 16

# Block record: a plain list, mutated in place (no per-event objects besides the split remainder).
ADDR, SIZE, PREV, NEXT, ALLOC, POOL, STREAM, ES, MAPPED, GCBASE, REQ = range(11)

# Program ops (see `Program`).
OP_ALLOC, OP_FREE, OP_OOM, OP_EMPTY_CACHE, OP_FOREIGN = 0, 1, 2, 3, 4
# Segment events the model emits.
EV_SEGMENT_ALLOC, EV_SEGMENT_FREE, EV_SEGMENT_MAP, EV_SEGMENT_UNMAP = 0, 1, 2, 3
EVENT_NAMES = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")

_SH = 60  # free-list key = size << _SH | address (addresses stay below 2**60)
_MASK = (1 << _SH) - 1


@dataclass(frozen=True)
class AllocatorConfig:
    """Settings of the caching allocator that change where memory goes (defaults = torch defaults)."""

    max_split_size: int = SIZE_MAX
    max_non_split_rounding_size: int = K_LARGE_BUFFER
    garbage_collection_threshold: float = 0.0
    expandable_segments: bool = False
    roundup_power2_divisions: tuple = (0,) * N_INTERVALS
    large_segment_size: int = K_LARGE_BUFFER

    def describe(self) -> str:
        parts = []
        if self.max_split_size != SIZE_MAX:
            parts.append(f"max_split_size_mb:{self.max_split_size >> 20}")
        if self.max_non_split_rounding_size != K_LARGE_BUFFER:
            parts.append(f"max_non_split_rounding_mb:{self.max_non_split_rounding_size >> 20}")
        if self.garbage_collection_threshold:
            parts.append(f"garbage_collection_threshold:{self.garbage_collection_threshold:g}")
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        if any(self.roundup_power2_divisions):
            d = self.roundup_power2_divisions
            if len(set(d)) == 1:
                parts.append(f"roundup_power2_divisions:{d[0]}")
            else:
                parts.append("roundup_power2_divisions:[" + ",".join(f"{1 << i}:{v}" for i, v in enumerate(d)) + "]")
        if self.large_segment_size != K_LARGE_BUFFER:
            parts.append(f"large_segment_size_mb:{self.large_segment_size >> 20}")
        return ",".join(parts)


def roundup_power2_next_division(size: int, divisions: int) -> int:
    if size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, divisions: tuple = (0,) * N_INTERVALS) -> int:
    """R1 (`get_round_size`)."""
    if size < K_MIN_BLOCK:
        return K_MIN_BLOCK
    idx = size.bit_length() - 21
    d = divisions[0 if idx < 0 else (idx if idx < N_INTERVALS else N_INTERVALS - 1)]
    if d > 1 and size > K_MIN_BLOCK * d:
        return roundup_power2_next_division(size, d)
    return (size + K_MIN_BLOCK - 1) & ~(K_MIN_BLOCK - 1)


def allocation_size(size: int, large_segment_size: int = K_LARGE_BUFFER) -> int:
    """R3 (`get_allocation_size`)."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return large_segment_size
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


@dataclass
class Program:
    """What the replay feeds the model: one op per trace event that matters, in order.

    op OP_ALLOC: hid = handle id (index into the handle table), size = requested bytes, stream = index.
    op OP_FREE: hid = the handle of the allocation being freed (free_completed).
    op OP_OOM: a request the recorded run failed (the trace's `oom` entry); size, stream.
    op OP_EMPTY_CACHE: torch.cuda.empty_cache() (seen as segment_free events outside any request).
    op OP_FOREIGN: size = bytes (signed) reserved or released outside the modelled pools (a CUDA graph's
      private pool): they count against the limit but are never handed out.
    """

    ops: list = field(default_factory=list)
    hid: list = field(default_factory=list)
    size: list = field(default_factory=list)
    stream: list = field(default_factory=list)
    n_handles: int = 0


@dataclass
class SegmentSpec:
    """A segment present when the replay starts: blocks = [(address, size, handle id or -1, requested)]."""

    address: int
    size: int
    small: bool
    stream: int
    expandable: bool
    blocks: list


@dataclass
class SimResult:
    peak_reserved: int
    start_reserved: int
    final_reserved: int
    oom_op: int | None  # index of the first op the model could not serve
    oom_request: int | None  # its requested bytes
    failed_ops: list  # every op the model could not serve (replay continues past recorded OOMs only)
    segment_events: list  # (op index, EV_*, bytes) when recorded
    reserved_after: list  # reserved bytes after each op, when recorded
    alloc_addr: list  # model address of each OP_ALLOC (None elsewhere), when recorded
    num_alloc_retries: int
    num_device_alloc: int
    num_device_free: int
    ops_done: int


class AllocatorModel:
    """One device's caching allocator (default pools, any number of streams)."""

    def __init__(self, config: AllocatorConfig, limit_bytes: int | None = None, *,
                 record: bool = False, n_handles: int = 0, addr_hints: list | None = None,
                 base_address: int = 1 << 46, per_process_limit: bool = True, map_hints: list | None = None):
        self.cfg = config
        self.limit = limit_bytes
        self.record = record
        self.mss = config.max_split_size
        self.mnsr = config.max_non_split_rounding_size
        self.divs = tuple(config.roundup_power2_divisions)
        self.no_divs = not any(self.divs)
        self.exp = bool(config.expandable_segments)
        # GC runs only under a per-process fraction (set_fraction), never against the device's own size
        self.gc_on = config.garbage_collection_threshold > 0.0 and limit_bytes is not None and per_process_limit
        self.lss = config.large_segment_size
        self.blocks: dict = {}  # address -> block (free, allocated and unmapped)
        self.free: dict = {}  # (pool, stream) -> sorted keys of cached mapped free blocks
        self.unmapped: dict = {}  # (pool, stream) -> sorted addresses of unmapped expandable blocks
        self.es_of: dict = {}  # (pool, stream) -> expandable segment [base, page, va_size]
        self.gc_calls = [0, 0]  # get_free_blocks_call_count per pool (small, large)
        self.reserved = 0
        self.peak = 0
        self.events: list = []
        self.op_index = -1
        self.handles: list = [None] * n_handles
        self.retries = 0
        self.n_dev_alloc = 0
        self.n_dev_free = 0
        self.hints = addr_hints or []  # [(size, address)] of the recorded segment_alloc events, in order
        self.hint_i = 0
        self.map_hints = map_hints or []  # addresses of the recorded segment_map events, in order
        self.map_hint_i = 0
        # New segments get addresses below everything known: the CUDA driver hands out segment
        # addresses from the top down (the captured traces show each new cudaMalloc below the last), and
        # best fit breaks ties between equal blocks by address, so newer segments win ties.
        self.low = base_address
        self.live_segments: dict = {}  # segment start -> end (plain segments and expandable reservations)
        self.seg_starts: list = []  # sorted starts of live_segments

    # ----- state -----------------------------------------------------------------------------------
    def _add_segment(self, start: int, end: int) -> None:
        self.live_segments[start] = end
        insort(self.seg_starts, start)
        if start < self.low:
            self.low = start

    def _drop_segment(self, start: int) -> None:
        if self.live_segments.pop(start, None) is not None:
            del self.seg_starts[bisect_left(self.seg_starts, start)]

    def _overlaps(self, start: int, end: int) -> bool:
        st = self.seg_starts
        i = bisect_left(st, end)
        return i > 0 and self.live_segments[st[i - 1]] > start

    def _make_room(self, addr: int) -> bool:
        """True when `addr` lies in no live segment, trimming the unmapped tail of an expandable
        segment's address reservation (the model reserves more address space than CUDA did) if needed."""
        st = self.seg_starts
        i = bisect_left(st, addr + 1) - 1
        if i < 0 or self.live_segments[st[i]] <= addr:
            return True
        start = st[i]
        for key, es in self.es_of.items():
            if es[0] != start:
                continue
            ul = self.unmapped.get(key, [])
            if not ul:
                return False
            tail = self.blocks[ul[-1]]
            if tail[NEXT] is not None or tail[ADDR] >= addr:
                return False
            cut = (addr - tail[ADDR]) // es[1] * es[1]
            if cut <= 0:
                return False
            tail[SIZE] = cut
            es[2] = tail[ADDR] + cut - es[0]
            self.live_segments[start] = tail[ADDR] + cut
            return True
        return False

    def _synthetic_address(self, size: int) -> int:
        addr = (self.low - size - (32 << 20)) & ~((2 << 20) - 1)
        self.low = addr
        return addr

    def load(self, segments: list) -> None:
        """Install the segments (with their live blocks) present when the replay starts."""
        groups: dict = {}
        for seg in segments:
            if seg.expandable:
                groups.setdefault((0 if seg.small else 1, seg.stream), []).append(seg)
                continue
            self._load_range(seg, 0 if seg.small else 1, None, seg.address, seg.address + seg.size)
            self._add_segment(seg.address, seg.address + seg.size)
            self.reserved += seg.size
        for (pool, stream), segs in groups.items():
            segs.sort(key=lambda s: s.address)
            page = K_SMALL_BUFFER if pool == 0 else self.lss
            base = segs[0].address
            va = self._va_size(page)
            es = [base, page, va]
            self.es_of[(pool, stream)] = es
            cursor = base
            last = None
            for seg in segs:
                if seg.address > cursor:
                    last = self._new_unmapped(es, pool, stream, cursor, seg.address - cursor, last)
                first, last2 = self._load_range(seg, pool, es, seg.address, seg.address + seg.size, last)
                last = last2
                cursor = seg.address + seg.size
                self.reserved += seg.size
            end = base + va
            if end > cursor:
                self._new_unmapped(es, pool, stream, cursor, end - cursor, last)
            self._add_segment(base, max(end, cursor))
        self.peak = self.reserved

    def _va_size(self, page: int) -> int:
        # ExpandableSegment reserves address space for 1 1/8 of the device; the device size is not in
        # the trace, so reserve 256 GiB worth of pages (never the constraint in practice).
        return (256 << 30) // page * page

    def _new_unmapped(self, es, pool, stream, addr, size, prev):
        b = [addr, size, prev, None, False, pool, stream, es, False, 0, 0]
        if prev is not None:
            prev[NEXT] = b
        self.blocks[addr] = b
        insort(self.unmapped.setdefault((pool, stream), []), addr)
        return b

    def _load_range(self, seg, pool, es, lo, hi, prev=None):
        """Blocks of [lo, hi): live ones from the spec, free runs between them. Returns (first, last)."""
        stream = seg.stream
        fl = self.free.setdefault((pool, stream), [])
        first = None
        cursor = lo
        live = sorted((b for b in seg.blocks if b[2] >= 0), key=lambda b: b[0])

        def add(addr, size, hid, req):
            nonlocal prev, first
            b = [addr, size, prev, None, hid >= 0, pool, stream, es, True, 0, req]
            if prev is not None:
                prev[NEXT] = b
            prev = b
            if first is None:
                first = b
            self.blocks[addr] = b
            if hid >= 0:
                if hid >= len(self.handles):
                    self.handles.extend([None] * (hid + 1 - len(self.handles)))
                self.handles[hid] = b
            else:
                insort(fl, size << _SH | addr)

        for addr, size, hid, req in live:
            if addr < cursor or addr + size > hi:
                continue  # overlapping or outside: inconsistent input, skip the block
            if addr > cursor:
                add(cursor, addr - cursor, -1, 0)
            add(addr, size, hid, req)
            cursor = addr + size
        if cursor < hi:
            add(cursor, hi - cursor, -1, 0)
        return first, prev

    # ----- events ----------------------------------------------------------------------------------
    def _event(self, kind: int, size: int) -> None:
        if self.record:
            self.events.append((self.op_index, kind, size))

    def _new_segment_address(self, size: int) -> int:
        hints = self.hints
        if self.hint_i < len(hints):
            hsize, haddr = hints[self.hint_i]
            if hsize == size and not self._overlaps(haddr, haddr + size):
                # the segment the recorded run got next: keep its address (ties in best fit go by address)
                self.hint_i += 1
                return haddr
        return self._synthetic_address(size)

    # ----- malloc ----------------------------------------------------------------------------------
    def malloc(self, orig: int, stream: int):
        """Returns the allocated block, or None for out of memory (`DeviceCachingAllocator::malloc`)."""
        if orig < K_MIN_BLOCK:
            size = K_MIN_BLOCK
        elif self.no_divs:
            size = (orig + K_MIN_BLOCK - 1) & ~(K_MIN_BLOCK - 1)
        else:
            size = round_size(orig, self.divs)
        pool = 0 if size <= K_SMALL_SIZE else 1
        key = (pool, stream)
        fl = self.free.get(key)
        if fl is None:
            fl = self.free[key] = []
        if self.gc_on:
            self.gc_calls[pool] += 1
        # best fit, fast path: the smallest block that fits is a plain one and no max_split_size rule applies
        i = bisect_left(fl, size << _SH)
        blk = None
        if i < len(fl):
            blk = self.blocks[fl[i] & _MASK]
            if blk[ES] is None and self.mss == SIZE_MAX:
                del fl[i]
            else:
                blk = self._get_free_block(fl, size)
        if blk is None:
            asize = allocation_size(size, self.lss)
            if self.gc_on:
                self._garbage_collect()
            blk = self._alloc_block(pool, stream, size, asize)
            if blk is None:
                if self._release_available_cached_blocks(fl, size):
                    blk = self._alloc_block(pool, stream, size, asize)
                if blk is None:
                    self._release_cached_blocks()
                    self.retries += 1
                    blk = self._alloc_block(pool, stream, size, asize)
                    if blk is None:
                        return None
        remaining = blk[SIZE] - size
        if pool == 0 or self.exp:
            split = remaining >= K_MIN_BLOCK
        else:
            split = size < self.mss and remaining > K_SMALL_SIZE
        if split:
            addr = blk[ADDR]
            prev = blk[PREV]
            new = [addr, size, prev, blk, True, pool, stream, blk[ES], True, 0, orig]
            if prev is not None:
                prev[NEXT] = new
            blk[PREV] = new
            blk[ADDR] = addr + size
            blk[SIZE] = remaining
            if self.gc_on:
                blk[GCBASE] = self.gc_calls[pool]
            blocks = self.blocks
            blocks[addr] = new
            blocks[addr + size] = blk
            insort(fl, remaining << _SH | (addr + size))
            return new
        blk[ALLOC] = True
        blk[REQ] = orig
        return blk

    def _get_free_block(self, fl: list, size: int):
        i = bisect_left(fl, size << _SH)
        n = len(fl)
        if i == n:
            return None
        blocks = self.blocks
        blk = blocks[fl[i] & _MASK]
        if blk[ES] is not None:
            if self.exp:
                while blk[ES] is not None and i + 1 < n:
                    nb = blocks[fl[i + 1] & _MASK]
                    # compare the sizes the blocks could grow to (a free tail followed by unmapped pages)
                    nx = nb[NEXT]
                    g_nb = nb[SIZE] + (nx[SIZE] if nx is not None and not nx[MAPPED] else 0)
                    nx = blk[NEXT]
                    g_blk = blk[SIZE] + (nx[SIZE] if nx is not None and not nx[MAPPED] else 0)
                    if g_nb < g_blk:
                        i += 1
                        blk = nb
                    else:
                        break
            else:
                i += 1
                while i < n and blocks[fl[i] & _MASK][ES] is not None:
                    i += 1
                if i == n:
                    return None
                blk = blocks[fl[i] & _MASK]
        bsize = blk[SIZE]
        mss = self.mss
        if size < mss:
            if bsize >= mss:
                return None
        elif bsize >= size + self.mnsr:
            return None
        del fl[i]
        return blk

    def _alloc_block(self, pool: int, stream: int, size: int, asize: int):
        if self.limit is not None and self.reserved + asize > self.limit:
            return None
        if self.exp:
            return self._try_allocate_expandable(pool, stream, size)
        addr = self._new_segment_address(asize)
        blk = [addr, asize, None, None, False, pool, stream, None, True, 0, 0]
        self.blocks[addr] = blk
        self._add_segment(addr, addr + asize)
        self.reserved += asize
        if self.reserved > self.peak:
            self.peak = self.reserved
        self.n_dev_alloc += 1
        self._event(EV_SEGMENT_ALLOC, asize)
        return blk

    # ----- release ---------------------------------------------------------------------------------
    def _release_block(self, blk, fl=None) -> None:
        """`release_block`: cudaFree a whole cached segment (an unsplit free block)."""
        if fl is None:
            fl = self.free[(blk[POOL], blk[STREAM])]
        k = blk[SIZE] << _SH | blk[ADDR]
        i = bisect_left(fl, k)
        if i < len(fl) and fl[i] == k:
            del fl[i]
        del self.blocks[blk[ADDR]]
        self._drop_segment(blk[ADDR])
        self.reserved -= blk[SIZE]
        self.n_dev_free += 1
        self._event(EV_SEGMENT_FREE, blk[SIZE])

    def _release_available_cached_blocks(self, fl: list, size: int) -> bool:
        mss = self.mss
        if mss == SIZE_MAX:
            return False
        ksize = size if size >= mss else mss
        blocks = self.blocks
        i = bisect_left(fl, ksize << _SH)
        if i < len(fl) and blocks[fl[i] & _MASK][ES] is None:
            self._release_block(blocks[fl[i] & _MASK], fl)
            return True
        if i == 0:
            return False
        i -= 1
        total = 0
        while total < ksize and i >= 0:
            b = blocks[fl[i] & _MASK]
            if b[SIZE] < mss:
                break
            if b[ES] is None:
                total += b[SIZE]
                self._release_block(b, fl)
            i -= 1
        return total >= ksize

    def _release_cached_blocks(self) -> None:
        """`release_cached_blocks`: free every unsplit cached block (large pool first), unmap free pages."""
        blocks = self.blocks
        for pool in (1, 0):
            to_unmap = []
            for key in sorted(k for k in self.free if k[0] == pool):
                fl = self.free[key]
                for k in list(fl):
                    b = blocks[k & _MASK]
                    if b[ES] is not None:
                        to_unmap.append(b)
                    elif b[PREV] is None and b[NEXT] is None:
                        self._release_block(b, fl)
            for b in to_unmap:
                self._unmap_block(b)

    def empty_cache(self) -> None:
        self._release_cached_blocks()

    def add_foreign(self, nbytes: int) -> None:
        """Reserved bytes of pools the model does not place blocks in (private pools)."""
        self.reserved += nbytes
        if self.reserved > self.peak:
            self.peak = self.reserved
        self._event(EV_SEGMENT_ALLOC if nbytes >= 0 else EV_SEGMENT_FREE, abs(nbytes))

    def _garbage_collect(self) -> None:
        """`garbage_collect_cached_blocks` (R9)."""
        thr = int(self.cfg.garbage_collection_threshold * self.limit)
        if self.reserved <= thr:
            return
        target = self.reserved - thr
        calls = self.gc_calls[1]
        blocks = self.blocks
        lists = [self.free[k] for k in sorted(self.free) if k[0] == 1]
        cand = [blocks[k & _MASK] for fl in lists for k in fl]
        total_age = 0
        count = 0
        for b in cand:
            if b[PREV] is None and b[NEXT] is None:
                total_age += calls - b[GCBASE]
                count += 1
        if count == 0:
            return
        reclaimed = 0
        freed = True
        while reclaimed < target and freed and count > 0:
            age_thr = total_age / count
            freed = False
            for fl in lists:
                for k in list(fl):
                    b = blocks[k & _MASK]
                    if b[PREV] is None and b[NEXT] is None and b[ES] is None and calls - b[GCBASE] >= age_thr:
                        freed = True
                        reclaimed += b[SIZE]
                        total_age -= calls - b[GCBASE]
                        count -= 1
                        self._release_block(b, fl)

    # ----- free ------------------------------------------------------------------------------------
    def free_block(self, blk) -> None:
        """`free_block`: back into the pool, merged with free neighbours of the same segment."""
        blk[ALLOC] = False
        blocks = self.blocks
        pool = blk[POOL]
        fl = self.free[(pool, blk[STREAM])]
        p = blk[PREV]
        if p is not None and not p[ALLOC] and p[MAPPED]:
            k = p[SIZE] << _SH | p[ADDR]
            i = bisect_left(fl, k)
            del fl[i]
            del blocks[blk[ADDR]]
            blk[ADDR] = p[ADDR]
            blk[SIZE] += p[SIZE]
            pp = p[PREV]
            blk[PREV] = pp
            if pp is not None:
                pp[NEXT] = blk
            blocks[p[ADDR]] = blk
        nx = blk[NEXT]
        if nx is not None and not nx[ALLOC] and nx[MAPPED]:
            k = nx[SIZE] << _SH | nx[ADDR]
            i = bisect_left(fl, k)
            del fl[i]
            del blocks[nx[ADDR]]
            blk[SIZE] += nx[SIZE]
            nn = nx[NEXT]
            blk[NEXT] = nn
            if nn is not None:
                nn[PREV] = blk
        blk[GCBASE] = self.gc_calls[pool]
        insort(fl, blk[SIZE] << _SH | blk[ADDR])

    # ----- expandable segments ---------------------------------------------------------------------
    def _try_merge(self, b, c) -> None:
        """`DeviceBlock::try_merge`: b absorbs the adjacent candidate c when both are free and equally mapped."""
        if c is None or c[ALLOC] or c[MAPPED] != b[MAPPED]:
            return
        key = (c[POOL], c[STREAM])
        if c[MAPPED]:
            fl = self.free[key]
            k = c[SIZE] << _SH | c[ADDR]
            i = bisect_left(fl, k)
            del fl[i]
        else:
            ul = self.unmapped[key]
            i = bisect_left(ul, c[ADDR])
            del ul[i]
        del self.blocks[c[ADDR]]
        if b[PREV] is c:
            del self.blocks[b[ADDR]]
            b[ADDR] = c[ADDR]
            b[PREV] = c[PREV]
            if b[PREV] is not None:
                b[PREV][NEXT] = b
            self.blocks[b[ADDR]] = b
        else:
            b[NEXT] = c[NEXT]
            if b[NEXT] is not None:
                b[NEXT][PREV] = b
        b[SIZE] += c[SIZE]

    def _find_expandable_block(self, pool: int, stream: int, size: int):
        key = (pool, stream)
        ul = self.unmapped.setdefault(key, [])
        blocks = self.blocks
        for addr in ul:
            c = blocks[addr]
            p = c[PREV]
            if p is not None and not p[ALLOC]:
                c = p
            got = 0
            b = c
            while got < size and b is not None and not b[ALLOC]:
                got += b[SIZE]
                b = b[NEXT]
            if got >= size:
                return c
        page = K_SMALL_BUFFER if pool == 0 else self.lss
        va = self._va_size(page)
        base = None
        mh = self.map_hints
        while base is None and self.map_hint_i < len(mh):
            # a new expandable segment is first mapped at its base: the recorded run's next map that lies
            # outside every known segment (after trimming the unused address space of the others) is it
            a = mh[self.map_hint_i]
            self.map_hint_i += 1
            if self._make_room(a):
                base = a
        if base is None:
            base = self._synthetic_address(va)
        else:
            st = self.seg_starts
            j = bisect_left(st, base + 1)
            if j < len(st):
                va = min(va, (st[j] - base) // page * page)
        self._add_segment(base, base + va)
        es = [base, page, va]
        self.es_of[key] = es
        return self._new_unmapped(es, pool, stream, base, va, None)

    def _try_allocate_expandable(self, pool: int, stream: int, size: int):
        c = self._find_expandable_block(pool, stream, size)
        if not c[MAPPED]:
            self._map_block(c, min(c[SIZE], size))
        while c[SIZE] < size:
            nc = c[NEXT]
            self._map_block(nc, min(size - c[SIZE], nc[SIZE]))
            c = nc
        fl = self.free[(pool, stream)]
        k = c[SIZE] << _SH | c[ADDR]
        i = bisect_left(fl, k)
        del fl[i]
        return c

    def _map_block(self, b, size: int) -> None:
        base, page, _va = b[ES]
        begin = (b[ADDR] - base) // page
        end = -(-(b[ADDR] + size - base) // page)
        mapped = (end - begin) * page
        key = (b[POOL], b[STREAM])
        ul = self.unmapped[key]
        del ul[bisect_left(ul, b[ADDR])]
        b[MAPPED] = True
        if mapped < b[SIZE]:
            rest = [b[ADDR] + mapped, b[SIZE] - mapped, b, b[NEXT], False, b[POOL], b[STREAM], b[ES], False, 0, 0]
            if b[NEXT] is not None:
                b[NEXT][PREV] = rest
            b[NEXT] = rest
            self.blocks[rest[ADDR]] = rest
            insort(ul, rest[ADDR])
            b[SIZE] = mapped
        self._try_merge(b, b[PREV])
        self._try_merge(b, b[NEXT])
        b[GCBASE] = self.gc_calls[b[POOL]]
        insort(self.free.setdefault(key, []), b[SIZE] << _SH | b[ADDR])
        self.reserved += mapped
        if self.reserved > self.peak:
            self.peak = self.reserved
        self.n_dev_alloc += 1
        self._event(EV_SEGMENT_MAP, mapped)

    def _unmap_block(self, b) -> None:
        base, page, _va = b[ES]
        lo = b[ADDR] - base
        hi = lo + b[SIZE]
        ub = -(-lo // page) * page
        ue = hi // page * page
        if ub >= ue:
            return
        key = (b[POOL], b[STREAM])
        fl = self.free[key]
        k = b[SIZE] << _SH | b[ADDR]
        i = bisect_left(fl, k)
        del fl[i]
        del self.blocks[b[ADDR]]
        pool, stream, es = b[POOL], b[STREAM], b[ES]
        if ub > lo:
            before = [b[ADDR], ub - lo, b[PREV], b, False, pool, stream, es, True, self.gc_calls[pool], 0]
            if b[PREV] is not None:
                b[PREV][NEXT] = before
            b[PREV] = before
            self.blocks[before[ADDR]] = before
            insort(fl, before[SIZE] << _SH | before[ADDR])
        if hi > ue:
            after = [base + ue, hi - ue, b, b[NEXT], False, pool, stream, es, True, self.gc_calls[pool], 0]
            if b[NEXT] is not None:
                b[NEXT][PREV] = after
            b[NEXT] = after
            self.blocks[after[ADDR]] = after
            insort(fl, after[SIZE] << _SH | after[ADDR])
        b[ADDR] = base + ub
        b[SIZE] = ue - ub
        b[MAPPED] = False
        self.blocks[b[ADDR]] = b
        self._try_merge(b, b[PREV])
        self._try_merge(b, b[NEXT])
        insort(self.unmapped.setdefault(key, []), b[ADDR])
        self.reserved -= ue - ub
        self.n_dev_free += 1
        self._event(EV_SEGMENT_UNMAP, ue - ub)
        if b[PREV] is None and b[NEXT] is None:
            # release_expandable_segment: the whole segment is unmapped; drop it
            ul = self.unmapped[key]
            del ul[bisect_left(ul, b[ADDR])]
            del self.blocks[b[ADDR]]
            if self.es_of.get(key) is es:
                del self.es_of[key]
            self._drop_segment(es[0])

    # ----- replay ----------------------------------------------------------------------------------
    def run(self, prog: Program, stop_at_oom: bool = True) -> SimResult:
        """Drive the model with a program. Stops at the first request it cannot serve, unless the
        recorded run failed that request too (an OP_OOM the program survived)."""
        ops, hids, sizes, streams = prog.ops, prog.hid, prog.size, prog.stream
        handles = self.handles
        if len(handles) < prog.n_handles:
            handles.extend([None] * (prog.n_handles - len(handles)))
        malloc = self.malloc
        free_block = self.free_block
        record = self.record
        reserved_after: list = []
        alloc_addr: list = []
        failed: list = []
        oom_op = None
        oom_req = None
        start_reserved = self.reserved
        n = len(ops)
        done = n
        if not record:
            # the fast loop (no per-op bookkeeping): same semantics as the recording loop below
            i = -1
            for op, h, sz, st in zip(ops, hids, sizes, streams, strict=True):
                i += 1
                if op == OP_FREE:
                    b = handles[h]
                    if b is not None:
                        handles[h] = None
                        free_block(b)
                elif op == OP_ALLOC or op == OP_OOM:
                    b = malloc(sz, st)
                    if b is None:
                        failed.append(i)
                        if oom_op is None:
                            oom_op, oom_req = i, sz
                        if stop_at_oom and op == OP_ALLOC:
                            done = i
                            break
                    else:
                        handles[h] = b
                elif op == OP_EMPTY_CACHE:
                    self._release_cached_blocks()
                else:
                    self.add_foreign(sz)
            n = 0
        for i in range(n):
            op = ops[i]
            if record:
                self.op_index = i
            if op == OP_ALLOC:
                b = malloc(sizes[i], streams[i])
                if b is None:
                    failed.append(i)
                    if oom_op is None:
                        oom_op, oom_req = i, sizes[i]
                    if stop_at_oom:
                        done = i
                        if record:
                            reserved_after.append(self.reserved)
                            alloc_addr.append(None)
                        break
                handles[hids[i]] = b
                if record:
                    alloc_addr.append(b[ADDR] if b is not None else None)
            elif op == OP_FREE:
                b = handles[hids[i]]
                if b is not None:
                    handles[hids[i]] = None
                    free_block(b)
                if record:
                    alloc_addr.append(None)
            elif op == OP_OOM:
                b = malloc(sizes[i], streams[i])
                if b is None:
                    failed.append(i)
                    if oom_op is None:
                        oom_op, oom_req = i, sizes[i]
                else:
                    handles[hids[i]] = b  # served here: it stays live (the recorded run never freed it)
                if record:
                    alloc_addr.append(None)
            elif op == OP_EMPTY_CACHE:
                self._release_cached_blocks()
                if record:
                    alloc_addr.append(None)
            else:
                self.add_foreign(sizes[i])
                if record:
                    alloc_addr.append(None)
            if record:
                reserved_after.append(self.reserved)
        if self.reserved > self.peak:
            self.peak = self.reserved
        return SimResult(
            peak_reserved=self.peak, start_reserved=start_reserved, final_reserved=self.reserved,
            oom_op=oom_op, oom_request=oom_req, failed_ops=failed, segment_events=list(self.events),
            reserved_after=reserved_after, alloc_addr=alloc_addr, num_alloc_retries=self.retries,
            num_device_alloc=self.n_dev_alloc, num_device_free=self.n_dev_free, ops_done=done)

    # ----- inspection (tests) ----------------------------------------------------------------------
    def check(self) -> list:
        """Invariant violations (empty when consistent): chains are contiguous, free lists agree."""
        problems = []
        in_lists = set()
        for fl in self.free.values():
            for k in fl:
                in_lists.add(k & _MASK)
                b = self.blocks.get(k & _MASK)
                if b is None or b[SIZE] != k >> _SH or b[ALLOC] or not b[MAPPED]:
                    problems.append(f"free list entry {k & _MASK:#x} does not match a free block")
        for addr, b in self.blocks.items():
            if b[ADDR] != addr:
                problems.append(f"block at {addr:#x} says {b[ADDR]:#x}")
            nx = b[NEXT]
            if nx is not None and (nx[PREV] is not b or nx[ADDR] != b[ADDR] + b[SIZE]):
                problems.append(f"block at {addr:#x}: next is not adjacent")
            if not b[ALLOC] and b[MAPPED] and addr not in in_lists:
                problems.append(f"free block at {addr:#x} is not in its pool")
        return problems
