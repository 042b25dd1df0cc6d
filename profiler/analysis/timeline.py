"""Replay of the trace ring buffer: live bytes over time, the peak, what was live at the peak,
and the training-step structure (where optimizer steps happened).

Live bytes follow the allocator's `active` accounting: +size at `alloc`, -size at `free_completed`
(a block awaiting a cross-stream free still holds its memory). Trace sizes are the sizes the caller
asked for, before rounding (checked on torch 2.11: an alloc's size equals the block's
`requested_size`), so the level is in requested bytes and is anchored on the requested bytes of the
snapshot's live blocks. The trace may start mid-run (the ring buffer keeps only the last entries),
so the level at its start is derived backwards from that anchor at its end.
"""

from __future__ import annotations

from collections import Counter
from itertools import islice

from memq.analysis import frames as fr
from memq.model import Snapshot

MAX_POINTS = 400  # samples kept for plots; the peak is always kept


def replay(snap: Snapshot, live_requested_end: int, reserved_end: int) -> dict:
    trace = snap.trace
    if not trace:
        return {"events": 0, "covers_whole_run": False, "peak_live_bytes": None, "series": [],
                "steps": [], "start_live_bytes": None}
    # Pass 1: net change and the running level; keep step boundaries and the peak position. The
    # per-event work is a few comparisons and an addition, whatever the frames: what depends on a
    # stack (is it optimizer code) is read once per frames list (entries with the same stack share
    # one: snapshot.py interns them) and looked up by the list's identity. No level is kept per
    # event: the series keeps every `every`-th, and each stretch between step starts its highest
    # and lowest (the level moves only at alloc and free_completed).
    n = len(trace)
    every = max(1, n // MAX_POINTS)
    samples: list[int] = []  # the level after events 0, every, 2 * every, ...
    sample_at = 0
    level = 0
    seg_level = seg_peak = 0
    peak = 0
    peak_i = -1
    allocs = frees = 0
    step_starts: list[int] = []  # index of the first optimizer-step event of each step
    stretches: list[tuple[int, int, int]] = []  # (first index, highest, lowest level) of each closed stretch
    lo = 0  # the open stretch: from event lo, its highest and lowest level so far
    first = trace[0]
    high = low = first[2] if first[0] == "alloc" else -first[2] if first[0] == "free_completed" else 0
    in_opt = False
    created: set = set()  # segments created inside the trace
    opt_of: dict[int, bool] = {}  # id(frames) -> is_optimizer; the trace holds every list it names
    opt_get = opt_of.get
    last_f = None
    opt = False
    is_opt = fr.is_optimizer
    i = -1
    for ev in trace:
        i += 1
        a = ev[0]
        if a == "alloc":
            level += ev[2]
            allocs += 1
            if level > peak or peak_i < 0:
                peak, peak_i = level, i
        elif a == "free_completed":
            level -= ev[2]
            frees += 1
            if level < low:
                low = level
            if i == sample_at:
                samples.append(level)
                sample_at += every
            continue
        elif a != "free_requested":
            if a in _SEG_UP:
                seg_level += ev[2]
                if seg_level > seg_peak:
                    seg_peak = seg_level
                created.add(ev[1])
            elif a in _SEG_DOWN:
                seg_level -= ev[2]
            if i == sample_at:
                samples.append(level)
                sample_at += every
            continue
        # alloc, free_requested: steps are delimited by entering optimizer code (allocations and
        # free requests: SGD's in-place updates allocate nothing after the first step, but frees
        # inside step() show).
        f = ev[5]
        if f:
            if f is not last_f:  # else `opt` is still this list's (a stack's entries come in runs)
                last_f = f
                opt = opt_get(id(f))
                if opt is None:
                    opt = opt_of[id(f)] = is_opt(f)
            if opt and not in_opt:
                step_starts.append(i)
                if i > lo:  # the stretch before it closes (this event's level is the next one's)
                    stretches.append((lo, high, low))
                lo, high, low = i, level, level
            in_opt = opt
        if level > high:  # an alloc (a free request leaves the level where the stretch had it)
            high = level
        if i == sample_at:
            samples.append(level)
            sample_at += every
    stretches.append((lo, high, low))
    start = live_requested_end - level
    reserved_start = reserved_end - seg_level
    # The trace saw the whole run when every segment alive at the end was created inside it.
    covers = bool(snap.segments) and all(s.address in created for s in snap.segments) and reserved_start == 0
    by_site, by_cat = _live_at(snap, peak_i)
    before = (start + peak) - sum(by_site.values())
    peak_ev = trace[peak_i] if peak_i >= 0 else None
    series = []
    for k, i in enumerate(range(0, n, every)):
        series.append([trace[i].time_us if trace[i].time_us is not None else i, start + samples[k]])
    if peak_i >= 0 and (peak_i % every):
        series.append([peak_ev.time_us if peak_ev.time_us is not None else peak_i, start + peak])
        series.sort(key=lambda p: p[0])
    # Peak of live bytes inside each completed step (boundaries = starts of optimizer steps).
    step_peaks = [start + hi for _lo, hi, _low in stretches]
    return {
        "last_cycle": _last_cycle(trace, stretches, start, step_starts),
        "current_step": _current_step(trace, stretches, start, step_starts),
        "events": len(trace),
        "has_frames": any(ev.frames for ev in trace[-2000:]),
        "allocs": allocs,
        "frees": frees,
        "covers_whole_run": covers,
        "start_live_bytes": start,
        "end_live_bytes": start + level,
        "peak_live_bytes": start + peak,
        "peak_index": peak_i,
        "peak_time_us": peak_ev.time_us if peak_ev else None,
        "peak_phase": _phase(peak_ev, any(ev.frames for ev in trace[-2000:])),
        "peak_reserved_bytes": reserved_start + seg_peak,
        "replayed_end_from_zero": level,
        "peak_site": fr.stack_signature(peak_ev.frames) if peak_ev else None,
        "live_at_peak": [{"site": s, "bytes": n} for s, n in by_site.most_common(8)]
        + ([{"site": "<allocated before the trace began>", "bytes": before}] if before > 0 else []),
        "live_at_peak_by_category": dict(by_cat),
        "optimizer_steps": len(step_starts),
        "step_start_indices": step_starts,
        "step_peaks": step_peaks,
        "series": series,
    }


def made_live_in(snap: Snapshot) -> dict[int, int]:
    """Address -> index of the `alloc` that made the block at it live at the end of the trace: the
    blocks allocated inside it and not freed by its end (an entry without an address touches no
    block). Memoised on the snapshot; the timeline's replay leaves it there on its way."""
    got = snap.memo.get("made_live")
    if got is None:
        got = snap.memo["made_live"] = _made_live(snap.trace, {}, -1)
    return got


def _made_live(trace, live: dict[int, int], i: int, stop: int | None = None) -> dict[int, int]:
    """`live` (the blocks allocated and not freed up to event i) carried on to event `stop` (exclusive;
    the end of `trace` when None). Events are read by position: a field read by name costs a descriptor
    call, and this reads two fields of a million events."""
    pop = live.pop
    for ev in islice(trace, i + 1, stop):
        i += 1
        a = ev[0]
        if a == "alloc":
            if ev[1] is not None:
                live[ev[1]] = i
        elif a == "free_completed":
            pop(ev[1], None)
    return live


_SEG_UP = frozenset(("segment_alloc", "segment_map"))
_SEG_DOWN = frozenset(("segment_free", "segment_unmap"))


def _live_at(snap: Snapshot, peak_i: int) -> tuple[Counter, Counter]:
    """Bytes by site and by category of the allocations made inside the trace and not yet freed at
    event `peak_i`. Sites and categories are read once per frames list, not once per live block.
    The same pass goes on to the end of the trace for made_live_in (what provenance reads)."""
    trace = snap.trace
    live = _made_live(trace, {}, -1, peak_i + 1)  # addr -> index of its alloc, up to the peak
    i = min(peak_i, len(trace) - 1)
    per_list: dict[int, list] = {}  # id(frames) -> [frames, bytes], in the order live blocks are
    for j in live.values():
        ev = trace[j]
        got = per_list.get(id(ev[5]))
        if got is None:
            per_list[id(ev[5])] = [ev[5], ev[2]]
        else:
            got[1] += ev[2]
    if "made_live" not in snap.memo:
        snap.memo["made_live"] = _made_live(trace, live, i)
    by_site: Counter = Counter()
    by_cat: Counter = Counter()
    for frames, size in per_list.values():
        by_site[fr.stack_signature(frames)] += size
        by_cat[fr.categorize(frames)] += size
    return by_site, by_cat


# A step with more allocations and frees than this is kept as no reference: the reference goes into
# the snapshot's stored digest (two small ints an event), and 100,000 events are ~1 MB of JSON.
MAX_REF_EVENTS = 100_000


def _last_cycle(trace, stretches: list[tuple[int, int, int]], start: int, step_starts: list[int]) -> dict | None:
    """The last complete training step of the trace (from one optimizer step to the next: the update,
    then a forward and backward), to which a later step cut off by an OOM is compared
    (step_need.py): its peak and floor of live bytes, and its allocations in order as
    `allocs` [[size, flag]] and `events` (i >= 0: allocs[i] is allocated; -(i+1): it is freed).
    Flags: FIXED for allocations in optimizer code or holding parameters/state, and for what
    survives the step (its parameters' gradients); BEFORE for blocks from before the step that it
    frees; SCALED (input-sized) for the rest."""
    if len(step_starts) < 2:
        return None
    lo, hi = step_starts[-2], step_starts[-1]
    if hi - lo > MAX_REF_EVENTS:
        return None
    from memq.analysis.step_need import BEFORE, FIXED, SCALED

    _lo, high, low = stretches[-2]  # from step_starts[-2] to step_starts[-1]
    allocs: list[list[int]] = []
    events: list[int] = []
    live: dict[int, int] = {}
    for i in range(lo, hi):
        ev = trace[i]
        if ev.action == "alloc" and ev.addr is not None:
            fixed = bool(ev.frames) and (fr.is_optimizer(ev.frames)
                                         or fr.categorize(ev.frames) in (fr.PARAMETERS, fr.OPTIMIZER_STATE))
            live[ev.addr] = len(allocs)
            events.append(len(allocs))
            allocs.append([ev.size, FIXED if fixed else SCALED])
        elif ev.action == "free_completed" and ev.addr is not None:
            n = live.pop(ev.addr, None)
            if n is None:
                n = len(allocs)
                allocs.append([ev.size, BEFORE])
            events.append(-n - 1)
    for n in live.values():
        allocs[n][1] = FIXED
    if not any(e >= 0 for e in events):
        return None
    return {"peak": start + high, "floor": start + low, "allocs": allocs, "events": events}


def _current_step(trace, stretches: list[tuple[int, int, int]], start: int, step_starts: list[int]) -> dict | None:
    """The trailing step of the trace (after its last optimizer step), when it ends in an OOM: its
    floor and the sizes of the blocks it allocated that are still live (what it holds so far)."""
    if not step_starts or not any(ev.action == "oom" for ev in trace[step_starts[-1]:]):
        return None
    lo = step_starts[-1]
    live: dict = {}
    for ev in trace[lo:]:
        if ev.action == "alloc" and ev.addr is not None:
            live[ev.addr] = ev.size
        elif ev.action == "free_completed":
            live.pop(ev.addr, None)
    _lo, high, low = stretches[-1]  # from step_starts[-1] to the end
    return {"floor": start + low, "blocks": sorted(live.values(), reverse=True), "peak_so_far": start + high}


def _phase(ev, trace_has_frames: bool = True) -> str | None:
    """The phase of the peak's entry (frames.event_phase): an entry without frames is backward only
    in a trace that records frames elsewhere (autograd's thread records no Python frames)."""
    if ev is None:
        return None
    ph = fr.event_phase(ev.frames, trace_has_frames)
    if ph == "backward" and not ev.frames:
        return "backward (no Python frames: autograd's thread)" if ev.action == "alloc" else None
    return ph
