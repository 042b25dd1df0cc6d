"""What the snapshot page draws, as plain JSON-ready data: pure (a parsed Snapshot and its analysis in,
dicts out), so `memq serve` and `memq view` draw exactly the same page.

- `segment_map(snap)`: every segment with its blocks (offset, size, state, category, stranded flag,
  an index into a shared table of deduplicated stacks).
- `category_timeline(snap, start_live)`: live bytes of the trace replayed per category, downsampled.
- `fit_test(analysis)`: the two tests of the OOM request (largest free block; live + request vs limit).
- `snapshot_view(snap, analysis)`: all of the above plus the verdict, for one page.
"""

from __future__ import annotations

import base64
import gzip
import sys
from array import array
from bisect import bisect_left
from typing import Any

from memq.analysis import frames as fr
from memq.analysis.provenance import SOURCE_WORDS, SOURCES, block_classes, cache_sites, freed_class, origin
from memq.model import INACTIVE, Snapshot, frame_file, frame_line, frame_name

MAX_FRAMES = 48  # innermost frames kept per stack: the deep tail is interpreter plumbing
BEFORE = "before_trace"  # live bytes the trace did not see allocated


class _Stacks:
    """Deduplicated stacks: blocks and trace entries refer to them by index."""

    def __init__(self) -> None:
        self.table: list[list[list]] = []
        self.categories: list[str] = []
        self._index: dict[tuple, int] = {}

    def add(self, frames: list) -> int:
        if not frames:
            return -1
        key = tuple((frame_file(f), frame_line(f), frame_name(f)) for f in frames[:MAX_FRAMES])
        i = self._index.get(key)
        if i is None:
            i = len(self.table)
            self._index[key] = i
            self.table.append([list(k) for k in key])
            self.categories.append(fr.categorize(frames))
        return i

    def category(self, i: int) -> str:
        return self.categories[i] if i >= 0 else fr.UNKNOWN


# The segment map draws every segment up to these counts; past them the largest segments are drawn and
# the rest are counted in one line (a 100,000-block map makes a page that takes seconds to lay out).
MAX_SEGMENTS_DRAWN = 1500
MAX_BLOCKS_DRAWN = 40_000


def segment_map(snap: Snapshot, stacks: _Stacks, trace_frames: dict | None = None) -> dict[str, Any]:
    """`trace_frames` maps (address, requested size) of the trace's allocations to their frames: a live
    block the snapshot lists without frames takes those of the allocation that made it."""
    segs = []
    stranded_total = 0
    trace_frames = trace_frames or {}
    classes = block_classes(snap)  # the class the composition counts: one class per block on every screen
    ordered = sorted(snap.segments, key=lambda s: (s.device, s.address))
    drawn = _segments_drawn(ordered)
    omitted = {"segments": 0, "blocks": 0, "bytes": 0}
    for seg in ordered:
        live = any(b.is_live for b in seg.blocks)
        if live:
            stranded_total += sum(b.size for b in seg.blocks if b.state == INACTIVE)
        if id(seg) not in drawn:
            omitted["segments"] += 1
            omitted["blocks"] += len(seg.blocks)
            omitted["bytes"] += seg.total_size
            continue
        blocks = []
        for b in seg.blocks:
            frames, from_trace = b.frames, 0
            if not frames and b.is_live:
                frames = trace_frames.get((b.address, b.requested_size)) or []
                from_trace = 1 if frames else 0
            k = stacks.add(frames)
            bc = classes.get(b.address) if b.is_live else None
            blocks.append({"o": b.address - seg.address, "s": b.size, "r": b.requested_size, "st": b.state,
                           "c": (bc.cls if bc is not None else fr.UNKNOWN) if b.is_live else None, "k": k,
                           "x": live and b.state == INACTIVE, "kt": from_trace,
                           "v": bc.source if bc is not None else None})
        segs.append({"address": seg.address, "size": seg.total_size, "stream": seg.stream,
                     "pool": seg.segment_type, "private": seg.is_private_pool, "expandable": seg.is_expandable,
                     "device": seg.device, "blocks": blocks})
    return {"segments": segs, "stranded_bytes": stranded_total, "omitted": omitted if omitted["segments"] else None}


def _segments_drawn(ordered: list) -> set[int]:
    if len(ordered) <= MAX_SEGMENTS_DRAWN and sum(len(s.blocks) for s in ordered) <= MAX_BLOCKS_DRAWN:
        return {id(s) for s in ordered}
    keep, blocks = set(), 0
    for seg in sorted(ordered, key=lambda s: (-s.total_size, s.address)):
        if len(keep) >= MAX_SEGMENTS_DRAWN or blocks + len(seg.blocks) > MAX_BLOCKS_DRAWN:
            continue
        keep.add(id(seg))
        blocks += len(seg.blocks)
    return keep


# The timeline's overview: at most this many points, each the highest total of its bucket of events
# (so no peak between points is lost) with the bucket's lowest total beside it (so the steps' troughs
# show where a million events fold into one column); the page zooms into any range at full detail
# from the packed per-event changes (`_detail`), starting from the level vector stored every
# DETAIL_CHECKPOINT events.
MAX_POINTS = 1000
DETAIL_CHECKPOINT = 4096
NO_CHANGE = 255  # category byte of an event that moves no level (free_requested, segment events, ...)


def category_timeline(snap: Snapshot, stacks: _Stacks, start_live: int | None,
                      trace_frames: dict | None = None) -> dict[str, Any]:
    """Live bytes per category over the trace (alloc +size, free_completed -size, as the analysis
    counts them). Blocks freed that the trace never saw allocated come out of the `before_trace` band,
    whose start level is the analysis' own anchor (`details.timeline.start_live_bytes`).
    `trace_frames`, when given, receives the frames of every allocation by (address, size)."""
    trace = snap.trace
    cats = [BEFORE, *fr.CATEGORIES]
    if not trace:
        return {"categories": cats, "t": [], "idx": [], "levels": [], "low": [], "events": 0,
                "oom_index": None, "peak_index": None, "time_unit": None, "detail": None}
    n = len(trace)
    ci = {c: i for i, c in enumerate(cats)}
    level = [0] * len(cats)
    level[0] = max(0, start_live or 0)
    total = level[0]
    live_cat: dict[int, int] = {}
    has_time = trace[0].time_us is not None and trace[-1].time_us is not None
    t0 = trace[0].time_us if has_time else 0
    cat_col = bytearray([NO_CHANGE]) * n
    delta = array("d", bytes(8 * n))
    times = array("d", bytes(8 * n))
    ckpt = array("d")
    bucket = max(1, -(-n // MAX_POINTS))
    rows: list[list[int]] = []
    idx: list[int] = []
    extra: list[tuple[int, list[int]]] = []
    best, best_i, best_row = -1, 0, level
    low: list[int] = []
    lo = None
    oom_i = None
    peak_i, peak = 0, -1
    frame_cat: dict[int, int] = {}  # id(frames) -> category: entries share interned frames lists
    unknown = ci[fr.UNKNOWN]
    # An allocation whose block is still live takes the block's class (the composition's), so a band
    # of the timeline and the segment map's block are one class.
    kept = {bc.event: ci[bc.cls] for bc in block_classes(snap).values() if bc.event >= 0}
    # an inference cache's earlier blocks (freed as it grew or was reordered) were the cache too
    cache_ids = cache_sites(snap)
    # recorded without stacks: what the trace's order says of the blocks freed in it, else unknown
    by_order = freed_class(snap)
    for i, ev in enumerate(trace):
        if not i % DETAIL_CHECKPOINT:
            ckpt.extend(level)
        a = ev.action
        if a == "alloc":
            f = ev.frames
            if f:
                c = frame_cat.get(id(f))
                if c is None:
                    c = ci[stacks.category(stacks.add(f))]
                    c = frame_cat[id(f)] = ci[fr.PARAMETERS] if id(f) in cache_ids else c
                if trace_frames is not None and ev.addr is not None:
                    trace_frames[(ev.addr, ev.size)] = f
            else:
                c = unknown if by_order is None else ci[by_order(i)]
            c = kept.get(i, c)
            level[c] += ev.size
            total += ev.size
            cat_col[i] = c
            delta[i] = ev.size
            if ev.addr is not None:
                live_cat[ev.addr] = c
        elif a == "free_completed":
            c = live_cat.pop(ev.addr, 0) if ev.addr is not None else 0
            d = min(ev.size, level[c])
            level[c] -= d
            total -= d
            cat_col[i] = c
            delta[i] = -d
        elif a == "oom" and oom_i is None:
            oom_i = i
        t = ev.time_us
        times[i] = (t - t0) if has_time and t is not None else i
        if total > peak:
            peak, peak_i = total, i
        if total > best:  # the bucket's highest point so far (first reached)
            best, best_i, best_row = total, i, list(level)
        if lo is None or total < lo:
            lo = total
        if i == oom_i:
            extra.append((i, list(level)))
        if i % bucket == bucket - 1 or i == n - 1:
            idx.append(best_i)
            rows.append(best_row)
            low.append(lo)
            best, lo = -1, None
    bucket_low = list(low)
    for i, row in extra:  # the OOM entry, where the bucket's high point is elsewhere
        if i not in idx:
            k = bisect_left(idx, i)
            idx.insert(k, i)
            rows.insert(k, row)
            low.insert(k, bucket_low[i // bucket])
    ts = [times[i] + (t0 if has_time else 0) for i in idx]
    return {"categories": cats, "t": ts, "idx": idx, "levels": rows, "low": low, "events": n,
            "peak_index": idx.index(peak_i) if peak_i in idx else None, "peak_event": peak_i, "peak_bytes": peak,
            "oom_index": idx.index(oom_i) if oom_i is not None and oom_i in idx else None, "oom_event": oom_i,
            "time_unit": "us" if has_time else "event",
            "detail": _detail(cat_col, delta, times, ckpt, len(cats))}


def _detail(cat_col: bytearray, delta: array, times: array, ckpt: array, ncats: int) -> dict[str, Any]:
    """The per-event changes packed for the page: little-endian float64 deltas, float64 times (us from
    the first event, or the event index), the checkpoints' level vectors, then one category byte per
    event; gzip-compressed (a 1M-event trace: 17 MB raw, about 2 MB packed), base64 for the JSON."""
    if sys.byteorder != "little":
        for a in (delta, times, ckpt):
            a.byteswap()
    raw = delta.tobytes() + times.tobytes() + ckpt.tobytes() + bytes(cat_col)
    return {"n": len(cat_col), "categories": ncats, "checkpoint": DETAIL_CHECKPOINT, "checkpoints": len(ckpt) // ncats,
            "gzip_b64": base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")}


def fit_test(analysis: dict[str, Any]) -> dict[str, Any] | None:
    """The OOM request against the largest usable free block, and live + request against the limit."""
    oom = analysis.get("oom")
    if not oom:
        return None
    m = analysis.get("metrics") or {}
    lim = (analysis.get("details") or {}).get("limits") or {}
    return {"requested_bytes": oom.get("requested_bytes"), "limit_bytes": oom.get("limit_bytes"),
            "limit_source": lim.get("limit_source"),
            "active_bytes": m.get("active_bytes"), "reserved_bytes": m.get("reserved_bytes"),
            "largest_free_block_bytes": m.get("largest_free_block_bytes"),
            "largest_usable_free_block_bytes": lim.get("largest_usable_free_block_bytes"),
            "fits_largest_free_block": oom.get("fits_largest_free_block"),
            "fits_if_compacted": oom.get("fits_if_compacted"),
            "non_pytorch_bytes": lim.get("non_pytorch_bytes"), "device_total_bytes": lim.get("device_total_bytes")}


def snapshot_view(snap: Snapshot | None, analysis: dict[str, Any] | None, *, title: str,
                  meta: dict[str, Any] | None = None, blob_error: str | None = None) -> dict[str, Any]:
    """Everything the snapshot page shows. `snap` is None when the blob cannot be read (`blob_error`
    says why): the stored analysis is still shown."""
    analysis = analysis or {}
    details = analysis.get("details") or {}
    stacks = _Stacks()
    view: dict[str, Any] = {
        "title": title, "meta": meta or {}, "blob_error": blob_error,
        "metrics": analysis.get("metrics"), "composition": analysis.get("composition"),
        # where each class came from (known from the job, inferred from the trace), and the words for
        # what decided one block's class (the segment map's "v") and its origin (provenance.origin's)
        "composition_origin": details.get("composition_origin"), "source_words": SOURCE_WORDS,
        "source_origins": {s: origin(s) for s in SOURCES},
        "diagnosis": analysis.get("diagnosis"), "oom": analysis.get("oom"), "fit": fit_test(analysis),
        "limits": details.get("limits"), "allocator_settings": details.get("allocator_settings"),
        "whatif": analysis.get("whatif") or details.get("whatif"),
        "segments": None, "segments_omitted": None, "timeline": None, "stacks": [], "stack_categories": [],
        "stranded_bytes": None, "torch_format": None, "settings_conf": None,
    }
    if snap is not None:
        start = (details.get("timeline") or {}).get("start_live_bytes")
        trace_frames: dict = {}
        view["timeline"] = category_timeline(snap, stacks, start, trace_frames)
        sm = segment_map(snap, stacks, trace_frames)
        view["segments"] = sm["segments"]
        view["segments_omitted"] = sm["omitted"]
        view["stranded_bytes"] = sm["stranded_bytes"]
        view["torch_format"] = snap.torch_format
        view["settings_conf"] = snap.settings.conf
    view["stacks"] = stacks.table
    view["stack_categories"] = stacks.categories
    return view
