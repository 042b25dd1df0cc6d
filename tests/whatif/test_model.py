"""The allocator model's rules on small hand-made programs (each names the torch rule it checks)."""

from __future__ import annotations

from memq.analysis.alloc_conf import parse_alloc_conf
from memq.analysis.allocator_model import (
    K_LARGE_BUFFER,
    K_SMALL_BUFFER,
    OP_ALLOC,
    OP_EMPTY_CACHE,
    OP_FREE,
    AllocatorConfig,
    AllocatorModel,
    Program,
    allocation_size,
    round_size,
    roundup_power2_next_division,
)

MiB = 1 << 20


def prog(*steps) -> Program:
    """steps: ("a", handle, bytes) | ("f", handle) | ("e",)"""
    p = Program()
    for s in steps:
        if s[0] == "a":
            p.ops.append(OP_ALLOC)
            p.hid.append(s[1])
            p.size.append(s[2])
        elif s[0] == "f":
            p.ops.append(OP_FREE)
            p.hid.append(s[1])
            p.size.append(0)
        else:
            p.ops.append(OP_EMPTY_CACHE)
            p.hid.append(-1)
            p.size.append(0)
        p.stream.append(0)
    p.n_handles = max([h for h in p.hid if h >= 0] + [0]) + 1
    return p


def run(p: Program, conf: str = "", limit: int | None = None, record: bool = True):
    m = AllocatorModel(parse_alloc_conf(conf), limit, record=record, n_handles=p.n_handles)
    r = m.run(p)
    assert m.check() == []
    return m, r


def test_round_size_r1():
    assert round_size(1) == 512
    assert round_size(513) == 1024
    assert round_size(4 * MiB + 1) == 4 * MiB + 512
    d4 = (4,) * 16
    # 1.1 GiB with 4 divisions between 1 GiB and 2 GiB rounds up to 1.25 GiB
    assert round_size(int(1.1 * 1024 * MiB), d4) == 1280 * MiB
    assert round_size(1024 * MiB, d4) == 1024 * MiB  # powers of two stay
    assert round_size(1000, d4) == 1024  # 1000 <= 512 * 4: plain 512 rounding
    assert roundup_power2_next_division(3 * MiB, 8) == 3 * MiB


def test_allocation_size_r3():
    assert allocation_size(512) == K_SMALL_BUFFER
    assert allocation_size(MiB) == K_SMALL_BUFFER
    assert allocation_size(MiB + 512) == K_LARGE_BUFFER
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(10 * MiB + 1) == 12 * MiB


def test_small_requests_share_a_2mib_segment_and_split_r7():
    m, r = run(prog(("a", 0, 1000), ("a", 1, 5000), ("a", 2, 700 * 1024)))
    assert r.num_device_alloc == 1
    assert r.peak_reserved == K_SMALL_BUFFER


def test_mid_requests_split_a_20mib_segment_and_remainder_rule_r7():
    # 3 MiB from a 20 MiB segment: remainder 17 MiB > 1 MiB -> split; the next 16.5 MiB fits the rest
    m, r = run(prog(("a", 0, 3 * MiB), ("a", 1, 16 * MiB + 512 * 1024)))
    assert r.num_device_alloc == 1
    # remainder of 0.5 MiB is not split off: the 16.5 MiB block keeps all 17 MiB
    assert m.handles[1][1] == 17 * MiB


def test_free_merges_neighbours_r8():
    m, r = run(prog(("a", 0, 3 * MiB), ("a", 1, 3 * MiB), ("f", 0), ("f", 1), ("a", 2, 19 * MiB)))
    assert r.num_device_alloc == 1  # the 20 MiB block came back whole


def test_best_fit_r4():
    m, _ = run(prog(("a", 0, 40 * MiB), ("a", 1, 30 * MiB), ("f", 0), ("f", 1), ("a", 2, 25 * MiB)))
    seg30 = m.handles[2][0]
    m2, _ = run(prog(("a", 0, 40 * MiB), ("a", 1, 30 * MiB)))
    assert seg30 == m2.handles[1][0]  # placed in the smaller block that fits (30 MiB), not the 40 MiB one


def test_limit_release_and_retry_r10_r11():
    # 60 MiB cached in one segment, then a 70 MiB request under a 100 MiB cap: cudaMalloc refused,
    # release_cached_blocks frees the unsplit 60 MiB segment, the retry succeeds.
    m, r = run(prog(("a", 0, 60 * MiB), ("f", 0), ("a", 1, 70 * MiB)), limit=100 * MiB)
    assert r.oom_op is None
    assert [e[1:] for e in r.segment_events] == [(0, 60 * MiB), (1, 60 * MiB), (0, 70 * MiB)]
    assert r.num_alloc_retries == 1


def test_split_blocks_cannot_be_released_oom_r11():
    # a live 10 MiB block pins its 20 MiB segment... a request needing a new segment beyond the cap fails
    m, r = run(prog(("a", 0, 4 * MiB), ("a", 1, 80 * MiB)), limit=90 * MiB)
    assert r.oom_op == 1


def test_max_split_size_oversize_blocks_r5():
    conf = "max_split_size_mb:64"
    # a 100 MiB block is oversize: a 30 MiB request may not take it, a 90 MiB one may (within 20 MiB)
    m, r = run(prog(("a", 0, 100 * MiB), ("f", 0), ("a", 1, 30 * MiB), ("a", 2, 90 * MiB)), conf)
    assert m.handles[1][1] == 30 * MiB and m.handles[2][1] == 100 * MiB
    assert r.num_device_alloc == 2
    # beyond the rounding slack (100 >= 70 + 20) it needs its own segment
    m, r = run(prog(("a", 0, 100 * MiB), ("f", 0), ("a", 1, 70 * MiB)), conf)
    assert r.num_device_alloc == 2


def test_release_available_cached_blocks_frees_one_oversize_block_r11():
    conf = "max_split_size_mb:64"
    m, r = run(prog(("a", 0, 100 * MiB), ("a", 1, 200 * MiB), ("f", 0), ("f", 1), ("a", 2, 150 * MiB)),
               conf, limit=310 * MiB)
    # 200 MiB block cannot serve 150 MiB (200 >= 150 + 20); the cap refuses a new 150 MiB segment;
    # release_available_cached_blocks frees the smallest oversize block >= 150 MiB (the 200 MiB one)
    assert [e[1:] for e in r.segment_events][-2:] == [(1, 200 * MiB), (0, 150 * MiB)]
    assert r.oom_op is None


def test_garbage_collection_r9():
    # threshold 0.5 of 100 MiB: the old cached 40 MiB segment is collected before the next cudaMalloc
    conf = "garbage_collection_threshold:0.5"
    steps = [("a", 0, 40 * MiB), ("a", 1, 30 * MiB), ("f", 0)]
    steps += [("a", 2, 12 * MiB)]  # fits no cached block? it fits the 40 MiB one: no malloc, no GC
    m, r = run(prog(*steps, ("a", 3, 25 * MiB)), conf, limit=100 * MiB)
    assert r.oom_op is None
    without, r2 = run(prog(*steps, ("a", 3, 25 * MiB)), "", limit=100 * MiB)
    assert r.peak_reserved <= r2.peak_reserved


def test_gc_needs_a_per_process_limit_r9():
    m = AllocatorModel(parse_alloc_conf("garbage_collection_threshold:0.5"), None)
    assert m.gc_on is False
    m = AllocatorModel(parse_alloc_conf("garbage_collection_threshold:0.5"), 100, per_process_limit=False)
    assert m.gc_on is False


def test_expandable_segments_grow_in_pages_and_tile_r12():
    conf = "expandable_segments:True"
    m, r = run(prog(("a", 0, 30 * MiB), ("a", 1, 30 * MiB), ("a", 2, 500)), conf)
    # 30 MiB maps two 20 MiB pages; the second 30 MiB maps one more page after the 10 MiB left over
    assert [e[1:] for e in r.segment_events] == [(2, 40 * MiB), (2, 20 * MiB), (2, K_SMALL_BUFFER)]
    assert r.peak_reserved == 62 * MiB


def test_expandable_pages_unmapped_by_empty_cache_r12():
    conf = "expandable_segments:True"
    m, r = run(prog(("a", 0, 30 * MiB), ("a", 1, 30 * MiB), ("f", 1), ("e",)), conf)
    assert r.final_reserved == 40 * MiB  # pages wholly inside the free tail are unmapped
    assert r.segment_events[-1][1:] == (3, 20 * MiB)


def test_expandable_avoids_the_fragmentation_oom():
    # the classic: growing batch sizes leave slivers in fixed segments; expandable tiles them
    steps = []
    h = 0
    for k in range(8):
        steps.append(("a", h, (100 + 10 * k) * MiB))
        steps.append(("f", h))
        h += 1
    steps.append(("a", h, 300 * MiB))
    _, plain = run(prog(*steps), "", limit=1000 * MiB)
    _, exp = run(prog(*steps), "expandable_segments:True", limit=1000 * MiB)
    assert exp.peak_reserved < plain.peak_reserved


def test_defaults_equal_dataclass():
    assert AllocatorConfig() == parse_alloc_conf("expandable_segments:False")
