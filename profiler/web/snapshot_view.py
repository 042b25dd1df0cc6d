"""What the snapshot page draws, as plain JSON-ready data: pure (a parsed Snapshot and its analysis in,
dicts out), so `memq serve` and `memq view` draw exactly the same page.

- `segment_map(snap)`: every segment with its blocks (offset, size, state, category, stranded flag,
  an index into a shared table of deduplicated stacks).
- `category_timeline(snap, start_live)`: live bytes of the trace replayed per category, downsampled.
- `fit_test(analysis)`: the two tests of the OOM request (largest free block; live + request vs limit).
- `snapshot_view(snap, analysis)`: all of the above plus the verdict, for one page.
"""

from __future__ import annotations

from typing import Any

from profiler.analysis import frames as fr
from profiler.model import INACTIVE, Snapshot, frame_file, frame_line, frame_name

MAX_FRAMES = 48  # innermost frames kept per stack: the deep tail is interpreter plumbing
MAX_POINTS = 600  # timeline samples sent to the browser; the peak and the OOM are always kept
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


def segment_map(snap: Snapshot, stacks: _Stacks) -> dict[str, Any]:
    segs = []
    stranded_total = 0
    for seg in sorted(snap.segments, key=lambda s: (s.device, s.address)):
        live = any(b.is_live for b in seg.blocks)
        blocks = []
        for b in seg.blocks:
            k = stacks.add(b.frames)
            stranded = live and b.state == INACTIVE
            if stranded:
                stranded_total += b.size
            blocks.append({"o": b.address - seg.address, "s": b.size, "r": b.requested_size, "st": b.state,
                           "c": stacks.category(k) if b.is_live else None, "k": k, "x": stranded})
        segs.append({"address": seg.address, "size": seg.total_size, "stream": seg.stream,
                     "pool": seg.segment_type, "private": seg.is_private_pool, "expandable": seg.is_expandable,
                     "device": seg.device, "blocks": blocks})
    return {"segments": segs, "stranded_bytes": stranded_total}


def category_timeline(snap: Snapshot, stacks: _Stacks, start_live: int | None) -> dict[str, Any]:
    """Live bytes per category over the trace (alloc +size, free_completed -size, as the analysis
    counts them). Blocks freed that the trace never saw allocated come out of the `before_trace` band,
    whose start level is the analysis' own anchor (`details.timeline.start_live_bytes`)."""
    trace = snap.trace
    cats = [BEFORE, *fr.CATEGORIES]
    if not trace:
        return {"categories": cats, "t": [], "levels": [], "events": 0, "oom_index": None, "time_unit": None}
    level = dict.fromkeys(cats, 0)
    level[BEFORE] = max(0, start_live or 0)
    live_cat: dict[int, str] = {}
    has_time = all(ev.time_us is not None for ev in trace[:1]) and trace[-1].time_us is not None
    rows: list[list[int]] = []
    ts: list[int] = []
    oom_i = None
    frame_cat: dict[int, str] = {}  # id(frames) -> category: entries often share one frames list
    for i, ev in enumerate(trace):
        a = ev.action
        if a == "alloc":
            f = ev.frames
            c = frame_cat.get(id(f)) if f else fr.UNKNOWN
            if c is None:
                c = stacks.category(stacks.add(f))
                frame_cat[id(f)] = c
            level[c] += ev.size
            if ev.addr is not None:
                live_cat[ev.addr] = c
        elif a == "free_completed":
            c = live_cat.pop(ev.addr, BEFORE) if ev.addr is not None else BEFORE
            level[c] = max(0, level[c] - ev.size)
        elif a == "oom" and oom_i is None:
            oom_i = i
        rows.append([level[c] for c in cats])
        ts.append(ev.time_us if has_time and ev.time_us is not None else i)
    totals = [sum(r) for r in rows]
    peak = max(range(len(totals)), key=totals.__getitem__)
    step = max(1, len(rows) // MAX_POINTS)
    keep = sorted({*range(0, len(rows), step), len(rows) - 1, peak, *([oom_i] if oom_i is not None else [])})
    return {"categories": cats, "t": [ts[i] for i in keep], "levels": [rows[i] for i in keep],
            "events": len(trace), "peak_index": keep.index(peak),
            "oom_index": keep.index(oom_i) if oom_i is not None else None,
            "time_unit": "us" if has_time else "event"}


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
        "diagnosis": analysis.get("diagnosis"), "oom": analysis.get("oom"), "fit": fit_test(analysis),
        "limits": details.get("limits"), "allocator_settings": details.get("allocator_settings"),
        "whatif": analysis.get("whatif") or details.get("whatif"),
        "segments": None, "timeline": None, "stacks": [], "stack_categories": [],
        "stranded_bytes": None, "torch_format": None, "settings_conf": None,
    }
    if snap is not None:
        sm = segment_map(snap, stacks)
        start = (details.get("timeline") or {}).get("start_live_bytes")
        view["segments"] = sm["segments"]
        view["stranded_bytes"] = sm["stranded_bytes"]
        view["timeline"] = category_timeline(snap, stacks, start)
        view["torch_format"] = snap.torch_format
        view["settings_conf"] = snap.settings.conf
    view["stacks"] = stacks.table
    view["stack_categories"] = stacks.categories
    return view
