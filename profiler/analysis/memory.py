"""The memory picture of one snapshot: totals, free-space shape, and the OOM fit test."""

from __future__ import annotations

from collections import Counter

from memq.analysis.provenance import composition as by_provenance
from memq.model import ACTIVE_ALLOCATED, INACTIVE, SMALL_SIZE, Snapshot

MiB = 1024 * 1024


def memory_metrics(snap: Snapshot) -> dict:
    """Contract `metrics` plus details. R = reserved, A = active (allocated + awaiting free)."""
    reserved = allocated = active = requested = free_total = largest = stranded = 0
    private_pool = 0
    pools: dict[tuple, dict] = {}
    seg_sizes: Counter = Counter()
    pending_free = 0
    live_requested = 0
    oversize_free = 0
    mss = snap.settings.max_split_size
    for seg in snap.segments:
        reserved += seg.total_size
        seg_sizes[seg.total_size] += 1
        seg_live = False
        seg_free = 0
        key = (seg.segment_type, seg.stream, tuple(seg.pool_id))
        pool = pools.setdefault(key, {"pool": seg.segment_type, "stream": seg.stream,
                                      "pool_id": list(seg.pool_id), "reserved_bytes": 0, "free_bytes": 0,
                                      "largest_free_block_bytes": 0, "segments": 0})
        pool["reserved_bytes"] += seg.total_size
        pool["segments"] += 1
        if seg.is_private_pool:
            private_pool += seg.total_size
        for b in seg.blocks:
            if b.state == INACTIVE:
                seg_free += b.size
                if b.size > pool["largest_free_block_bytes"]:
                    pool["largest_free_block_bytes"] = b.size
                if mss > 0 and b.size >= mss:
                    oversize_free += b.size
            else:
                seg_live = True
                active += b.size
                live_requested += b.requested_size
                if b.state == ACTIVE_ALLOCATED:
                    allocated += b.size
                    requested += b.requested_size
                else:
                    pending_free += b.size
        pool["free_bytes"] += seg_free
        free_total += seg_free
        if seg_live:
            stranded += seg_free
    for p in pools.values():
        largest = max(largest, p["largest_free_block_bytes"])
    frag = 0.0 if free_total == 0 else round(1.0 - largest / free_total, 6)
    return {
        "reserved_bytes": reserved,
        "allocated_bytes": allocated,
        "active_bytes": active,
        "requested_bytes": requested,
        "reserved_unallocated_bytes": reserved - allocated,
        "largest_free_block_bytes": largest,
        "fragmentation_ratio": frag,
        "stranded_bytes": stranded,
        # details beyond the contract
        "free_bytes": free_total,
        # The biggest cudaMalloc the cache made: what a step's largest block needs whole (the forecast).
        "largest_segment_bytes": max(seg_sizes) if seg_sizes else 0,
        "rounding_waste_bytes": allocated - requested,
        "pending_free_bytes": pending_free,
        "live_requested_bytes": live_requested,
        "private_pool_bytes": private_pool,
        "oversize_free_bytes": oversize_free,
        "segment_count": len(snap.segments),
        "segment_sizes": [{"size_bytes": s, "count": n} for s, n in sorted(seg_sizes.items(), reverse=True)[:12]],
        "pools": sorted(pools.values(), key=lambda p: -p["reserved_bytes"]),
        "expandable_segments": snap.expandable_segments,
    }


def segment_needed(size: int) -> int:
    """Bytes of a new segment the allocator would cudaMalloc for a request of `size` bytes
    (CUDACachingAllocator get_allocation_size: 2 MiB small, 20 MiB up to 10 MiB, else 2 MiB-rounded)."""
    if size <= SMALL_SIZE:
        return 2 * MiB
    if size < 10 * MiB:
        return 20 * MiB
    return -(-size // (2 * MiB)) * (2 * MiB)


def largest_usable_free_block(snap: Snapshot, size: int, stream: int | None, pool_id: tuple | None) -> int:
    """Largest inactive block the allocator could hand to a request of `size` on `stream`:
    same pool kind (large if size > 1 MiB), same stream and private pool; with max_split_size,
    oversize blocks serve only requests that are themselves oversize."""
    want_type = "large" if size > SMALL_SIZE else "small"
    mss = snap.settings.max_split_size
    best = 0
    for seg in snap.segments:
        if seg.segment_type != want_type:
            continue
        if stream is not None and seg.stream != stream:
            continue
        if pool_id is not None and tuple(seg.pool_id) != tuple(pool_id):
            continue
        for b in seg.blocks:
            if b.state != INACTIVE or b.size <= best:
                continue
            if mss > 0 and b.size >= mss and size < mss:
                continue
            best = b.size
    return best


def largest_oversize_free_block(snap: Snapshot, size: int) -> int:
    """Largest free block of the request's pool kind that max_split_size makes unsplittable (0 when
    max_split_size is not set): the bytes a max_split_size_mb setting keeps from a smaller request."""
    mss = snap.settings.max_split_size
    if mss <= 0:
        return 0
    want = "large" if size > SMALL_SIZE else "small"
    return max((b.size for seg in snap.segments if seg.segment_type == want
                for b in seg.blocks if b.state == INACTIVE and b.size >= mss), default=0)


def composition(snap: Snapshot) -> tuple[dict, dict]:
    """Live bytes by class, and the top allocation sites of each: provenance.block_classes decides
    every block's class, so the segment map and the composition never disagree."""
    return by_provenance(snap)


def smallest_request_rounding_to(size: int, divisions: tuple) -> int:
    """The smallest request the allocator would round up to `size` (torch's round_size is monotonic,
    so a binary search finds it). The trace records some requests only after rounding, e.g. the OOM
    entry under roundup_power2_divisions; this is the most the rounding can have added."""
    from memq.analysis.allocator_model import round_size  # only under roundup_power2_divisions

    if round_size(size, divisions) != size:
        return size  # not a size the allocator produces: take it as given
    lo, hi = 1, size
    while lo < hi:
        mid = (lo + hi) // 2
        if round_size(mid, divisions) >= size:
            hi = mid
        else:
            lo = mid + 1
    return lo


def free_in_pieces(free_bytes: int | None, largest_free_bytes: int | None) -> int | None:
    """Cached free memory in pieces: the free bytes outside the largest free block, what compacting the
    cache would add to that block. The one definition `memq analyze`, the report and the run lists use."""
    if free_bytes is None or largest_free_bytes is None:
        return None
    return max(0, int(free_bytes) - int(largest_free_bytes))


def pieces_share(result: dict | None) -> float | None:
    """The run lists' `in pieces` column: at the OOM, the share of reserved memory that was free in pieces
    (free_in_pieces / reserved, of the analysis' last snapshot); None for a run without an OOM (its free
    cache between steps says nothing about a failure) or without the figures."""
    res = result or {}
    m = res.get("metrics") or {}
    if not res.get("oom") or not m.get("reserved_bytes"):
        return None
    pieces = free_in_pieces(m.get("reserved_unallocated_bytes"), m.get("largest_free_block_bytes"))
    return None if pieces is None else round(pieces / int(m["reserved_bytes"]), 4)
