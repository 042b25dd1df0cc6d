"""Version-tolerant parsing of allocator snapshots (torch 2.0 .. 2.14 and newer) into `model` types.

All drift between torch versions is absorbed here; analysis never reads raw dict keys.
Unknown keys are kept in `Snapshot.unknown_keys` and otherwise ignored. Anything that is not a
snapshot at all raises `SnapshotError` with a message that names the problem.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from itertools import chain, compress, repeat
from operator import itemgetter, le, methodcaller
from sys import getrefcount
from typing import Any

from memq.errors import SnapshotError
from memq.model import (
    ACTIVE_ALLOCATED,
    ACTIVE_PENDING_FREE,
    AGENT_ROLES,
    INACTIVE,
    SMALL_SIZE,
    SQUARE_SITES_MAX,
    AgentInfo,
    AllocatorSettings,
    Block,
    Segment,
    Snapshot,
    StepFigures,
    TraceEvent,
)

KNOWN_TOP = {"segments", "device_traces", "allocator_settings", "external_annotations", "host_segments",
             "host_traces", "memq_agent"}
MAX_STEP_FIGURES = 512  # the agent sends at most this many; more is not a snapshot of ours
_STATES = {
    "active_allocated": ACTIVE_ALLOCATED,
    "active_pending_free": ACTIVE_PENDING_FREE,
    "active_awaiting_free": ACTIVE_PENDING_FREE,
    "inactive": INACTIVE,
}
_ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map",
            "segment_unmap", "oom", "snapshot", "annotate"}


#: The most bytes a snapshot may claim in all: each of its segments' sizes and their sum, each trace
#: entry's size and the sum over a device's trace. 2**56 bytes (64 PiB) is ~500,000 times an H200's
#: 141 GB, and leaves a factor of 128 below PostgreSQL's BIGINT (2**63 - 1) for what the analysis
#: derives from them (sums of peaks, what-if scalings), so a hostile size is refused here, as bad
#: input (never retried), instead of overflowing a column in the worker.
MAX_FIGURE_BYTES = 2**56


def _bytes_total(values, what: str) -> None:
    """Refuse a negative size or sizes summing past MAX_FIGURE_BYTES (each is then below it too)."""
    total = sum(values)
    if total > MAX_FIGURE_BYTES:
        raise SnapshotError(f"{what} sum to {total} bytes, over the {MAX_FIGURE_BYTES} a snapshot may claim")


def _int(v: Any, what: str, default: int | None = None) -> int:
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if v is None and default is not None:
        return default
    raise SnapshotError(f"{what} is not an integer ({type(v).__name__})")


def _pool(v: Any) -> tuple:
    if isinstance(v, (list, tuple)):
        return tuple(v)
    return (0, 0)


def parse_snapshot(raw: Any, *, consume: bool = False, nbytes: int | None = None) -> Snapshot:
    """Raw decoded data (dict from `_snapshot()`, or the bare list of `memory_snapshot()`) -> Snapshot.

    Any other shape raises SnapshotError: foreign data must never surface as a TypeError. `consume`
    lets the parser release the trace entries of `raw` as it reads them (a decoder's own output);
    `nbytes`, the size of the input `raw` came from, bounds the frame references the trace may make
    (unbounded when None: data built in this process)."""
    try:
        return _parse(raw, consume, nbytes)
    except SnapshotError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError, RecursionError) as exc:
        raise SnapshotError(f"malformed snapshot ({type(exc).__name__}: {str(exc)[:100]})") from exc


def _parse(raw: Any, consume: bool, nbytes: int | None) -> Snapshot:
    if isinstance(raw, list):
        raw = {"segments": raw}
        fmt_hint = "segments-only"
    elif isinstance(raw, dict):
        fmt_hint = None
    else:
        raise SnapshotError(f"expected a snapshot dict or a segment list, got {type(raw).__name__}")
    if "segments" not in raw:
        raise SnapshotError("no 'segments' key: this is not an allocator snapshot")
    seg_list = raw["segments"]
    if not isinstance(seg_list, list):
        raise SnapshotError("'segments' is not a list")

    warnings: list[str] = []
    legacy_history = False
    segments = []
    for i, s in enumerate(seg_list):
        seg, legacy = _parse_segment(s, i)
        legacy_history |= legacy
        segments.append(seg)
    _bytes_total((seg.total_size for seg in segments), "the segments' sizes")

    traces_raw = raw.get("device_traces", [])
    if not isinstance(traces_raw, list):
        raise SnapshotError("'device_traces' is not a list")
    frames_seen = _Frames(nbytes + 1024 if nbytes is not None else 2**62)
    traces = [_parse_trace(t, d, frames_seen, consume) for d, t in enumerate(traces_raw)]
    frames_seen.check()

    settings_raw = raw.get("allocator_settings")
    settings = _parse_settings(settings_raw) if isinstance(settings_raw, dict) else AllocatorSettings()

    annotations = raw.get("external_annotations") or []
    if not isinstance(annotations, list):
        annotations = []
    host = raw.get("host_segments") or []
    overflowed = None
    if isinstance(settings_raw, dict) and "trace_alloc_overflowed" in settings_raw:
        overflowed = bool(settings_raw.get("trace_alloc_overflowed"))

    has_time = any(ev.time_us is not None for t in traces for ev in t[:1])
    if fmt_hint:
        fmt = fmt_hint
    elif legacy_history:
        fmt = "2.0"
    elif settings.known:
        fmt = "2.3+"
    elif not any(traces):
        fmt = "segments-only"
    elif not has_time:
        fmt = "2.1"
    else:
        fmt = "2.2"

    for kind in _frames_missing_reason(segments, any(traces)):
        warnings.append(kind)

    return Snapshot(
        segments=segments,
        traces=traces,
        settings=settings,
        torch_format=fmt,
        annotations=[a for a in annotations if isinstance(a, dict)],
        host_segment_count=len(host) if isinstance(host, list) else 0,
        warnings=warnings,
        unknown_keys=sorted(str(k) for k in raw if k not in KNOWN_TOP),
        trace_overflowed=overflowed,
        agent=parse_agent_info(raw.get("memq_agent")),
        held=frames_seen.held,
    )


def _parse_segment(s: Any, i: int) -> tuple[Segment, bool]:
    if not isinstance(s, dict):
        raise SnapshotError(f"segment {i} is not a dict")
    address = _int(s.get("address"), f"segment {i} address", 0)
    total = _int(s.get("total_size"), f"segment {i} total_size")
    blocks_raw = s.get("blocks", [])
    if not isinstance(blocks_raw, list):
        raise SnapshotError(f"segment {i} blocks is not a list")
    blocks = []
    legacy = False
    cursor = address
    for j, b in enumerate(blocks_raw):
        if not isinstance(b, dict):
            raise SnapshotError(f"segment {i} block {j} is not a dict")
        size = _int(b.get("size"), f"segment {i} block {j} size")
        st = b.get("state")
        state = _STATES.get(st) if isinstance(st, str) else None
        if state is None:
            raise SnapshotError(f"segment {i} block {j} has unknown state {b.get('state')!r}")
        frames = b.get("frames")
        if "history" in b and frames is None:
            # torch 2.0: the block's allocation context sits in its history list.
            legacy = True
            hist = b.get("history") or []
            frames = hist[-1].get("frames", []) if hist and isinstance(hist[-1], dict) else []
        blk_addr = b.get("address")
        if isinstance(frames, list):
            _cut_long_text(frames)
        else:
            frames = []
        blocks.append(Block(
            address=_int(blk_addr, "block address") if blk_addr is not None else cursor,
            size=size,
            requested_size=_int(b.get("requested_size"), f"segment {i} block {j} requested_size", size),
            state=state,
            frames=frames,
        ))
        cursor += size
    sizes = [total, *(b.size for b in blocks), *(b.requested_size for b in blocks)]
    if min(sizes) < 0:
        raise SnapshotError(f"segment {i} has a negative size")
    _bytes_total(sizes[:1], f"segment {i} total_size")
    _bytes_total((b.size for b in blocks), f"segment {i} block sizes")
    _bytes_total((b.requested_size for b in blocks), f"segment {i} requested sizes")
    seg_type = s.get("segment_type")
    if seg_type not in ("small", "large"):
        seg_type = "small" if total <= 2 * SMALL_SIZE and total == 2 * SMALL_SIZE else "large"
    frames = s.get("frames")
    if isinstance(frames, list):
        _cut_long_text(frames)
    return Segment(
        device=_int(s.get("device"), "segment device", 0),
        address=address,
        total_size=total,
        stream=_int(s.get("stream"), "segment stream", 0),
        segment_type=seg_type,
        pool_id=_pool(s.get("segment_pool_id")),
        is_expandable=bool(s.get("is_expandable", False)),
        blocks=blocks,
        frames=frames if isinstance(frames, list) else [],
    ), legacy


_PLAIN = frozenset((str, int, float, bool, type(None)))
# Frame text is cut here, where it is read, so that no later pass (the stack rules' regexes, site
# names, the report) can take time or space that grows with one name's length: a 1.7 MB snapshot of
# 127 KB frame names took 18 s to analyse. 512 characters hold every Python path and function name
# and the part of a demangled C++ symbol that the rules and the site names read (its namespace and
# function, before the argument list); the longest real name seen, in the stacks="all" capture of
# tests/fixtures/captured/cudnn_workspace, is 1,473 characters of template arguments. A cut text
# ends with FRAME_TEXT_CUT and says how much was cut (docs/analysis.md, "Frame text").
MAX_FRAME_TEXT = 512
FRAME_TEXT_CUT = "…[cut: {} more chars]"
_FRAME_TEXT_KEYS = ("name", "filename")


def cut_frame_text(text: str) -> str:
    """`text` as it is kept: whole up to MAX_FRAME_TEXT characters, else its first MAX_FRAME_TEXT and
    the marker."""
    if len(text) <= MAX_FRAME_TEXT:
        return text
    return text[:MAX_FRAME_TEXT] + FRAME_TEXT_CUT.format(len(text) - MAX_FRAME_TEXT)


def _cut_long_text(frames: list) -> None:
    """Cut the names and file names of `frames` (a list of frames, changed in place) past
    MAX_FRAME_TEXT. The common case, dict frames of short text, is one C pass per field."""
    if not frames:
        return
    if all(type(f) is dict for f in frames):
        for key in _FRAME_TEXT_KEYS:
            texts = [v for v in map(methodcaller("get", key), frames) if type(v) is str]
            if texts and max(map(len, texts)) > MAX_FRAME_TEXT:
                for f in frames:
                    v = f.get(key)
                    if type(v) is str and len(v) > MAX_FRAME_TEXT:
                        f[key] = cut_frame_text(v)
        return
    for i, f in enumerate(frames):  # legacy tuple frames (filename, line, name): rebuilt when too long
        if type(f) is dict:
            _cut_long_text([f])
        elif type(f) in (list, tuple) and any(type(v) is str and len(v) > MAX_FRAME_TEXT for v in f):
            frames[i] = type(f)(cut_frame_text(v) if type(v) is str else v for v in f)
_EMPTY_FRAMES: list = []  # shared by every entry recorded without a stack (most of them); never mutated
MAX_USER_METADATA = 200


class _Frames:
    """Interns trace entries' frame lists by what they say: entries whose frames read the same
    (filename, line, name) share one list, so passes can cache per list; the lists dropped for it are
    freed as the entries are parsed, or held by the snapshot when their frames would die with them
    (`Snapshot.held`). The real 100k-entry H200 snapshot holds 55,150 lists of 486,682 frame dicts
    (no two of them the same object) that say 34 different things; the real 1M-entry capture keeps
    27 lists of its 293,691. Each kept frame is checked once, at the end (`check`); a list that is
    dropped for another is checked as it is dropped. The trace is not shape-checked as a whole
    (`load.decode_snapshot_bytes`), so the frame references counted here are what bounds the work
    of every later walk: a list shared by a million entries costs a million references, as in
    `codec.check_shape`."""

    def __init__(self, budget: int) -> None:
        self._lists: dict[tuple, list] = {}
        # A list of frames of its own that later entries share is remembered by its identity
        # (id -> (list, kept list)) while entries still to come hold it: held meanwhile, so its id
        # stays its own, and let go by `sweep` once no entry holds it, so that memory follows the
        # entries still to come. Lists of shared frames (torch's one list per allocation, read
        # again by its frees) are found again by their frames' identities instead: cheaper than
        # remembering them.
        self._by_list: dict[int, tuple[list, list]] = {}
        self._by_ids: dict[tuple, list[tuple[list, list]]] = {}
        self._by_middle: dict[tuple, list[tuple[list, list]]] = {}  # (length, id of the middle frame) -> tried
        self._odd: dict[int, list] = {}  # lists of frames that have no text key (legacy tuples, odd dicts)
        self.held: list[list] = []  # lists dropped for an equal one, freed with the snapshot
        self._next_sweep = _SWEEP_MIN
        self.refs = 0
        self._budget = budget

    def intern(self, f: Any) -> list:
        """The kept list that reads like `f`, an entry's frames (empty for no list)."""
        if type(f) is not list or not f:
            return _EMPTY_FRAMES
        self.count_refs(len(f))
        seen = self._by_list.get(id(f))
        return seen[1] if seen is not None else self.first_sight(f)

    def count_refs(self, n: int, exact: Callable[[], int] | None = None) -> None:
        """Count `n` more frame references that entries make (each entry its list's length): an
        upper bound, when `exact()` gives the count itself, which is taken only if the bound would
        pass the budget."""
        if exact is not None and self.refs + n > self._budget:
            n = exact()
        self.refs += n
        if self.refs > self._budget:
            raise SnapshotError(f"data reuses containers ({self.refs} frame references from a "
                                f"{self._budget}-byte input); snapshots are plain trees")

    def first_sight(self, f: Any) -> list:
        """`intern` of a non-empty `f` that is not remembered by its identity: the kept list that
        reads like it. The parser calls it with f held by the entry's dict and its own name only
        (what _LIST_UNSHARED_REFS counts); a list of frames of its own that entries still to be
        read hold is remembered (found again by its text, it would cost a tuple of its frames).

        Lists of frame objects that other lists share too (torch pickles one dict per distinct
        frame) are found by identities and confirmed by list equality (identity first, in C): a
        fixed cost per list, and a C comparison per frame reference, as the unpickler's own. First
        among the lists of the same length and middle frame (one identity: real stacks that agree
        there differ elsewhere in a few ways, 1.3-1.7 comparisons a list on the real 1M capture and
        the C++ shape of benchmarks/trace_shapes.py), then, past _SAME_ENDS of those, among the
        lists tried for five frames' identities (first, quarter, middle, three quarters, last). The
        rest, whose frames are their own, by their text, once per list. At most _SAME_ENDS lists
        are tried per key; past both (lists crafted to agree there) a list is found by its text,
        which costs more but stays linear."""
        if type(f) is not list:
            return _EMPTY_FRAMES
        first = f[0]
        if getrefcount(first) > _UNSHARED_REFS:
            # Not remembered by its identity: found again this way when an entry reads it later
            # (costs about what remembering and letting go of it would)
            n = len(f)
            near = (n, id(f[n >> 1]))
            tried = self._by_middle.get(near)
            if tried is None:
                tried = self._by_middle[near] = []
            for seen in tried:
                if seen[0] == f:
                    return seen[1]
            if len(tried) < _SAME_ENDS:
                c = self._by_text(f)
                tried.append((f, c))  # f held: the ids in the keys stay its frames'
                return c
            key = (n, id(first), id(f[n >> 2]), id(f[n >> 1]), id(f[(3 * n) >> 2]), id(f[-1]))
            tried = self._by_ids.get(key)
            if tried is None:
                tried = self._by_ids[key] = []
            for seen in tried:
                if seen[0] == f:
                    return seen[1]
            c = self._by_text(f)
            if len(tried) < _SAME_ENDS:
                tried.append((f, c))
            elif c is not f:
                self.held.append(f)
            return c
        remember = getrefcount(f) > _LIST_UNSHARED_REFS  # before the look-up: it may keep f
        c = self._by_text(f)
        if c is not f:
            # Its frames die with it: freed here one by one, 486k frame dicts cost the 100k
            # snapshot 0.03-0.05 s; held, they go with the snapshot (a command exits without
            # freeing it, a worker frees it whole when the analysis is done).
            self.held.append(f)
        if remember:  # entries still to be read hold it: found by its identity until the last
            self._by_list[id(f)] = (f, c)
            if len(self._by_list) >= self._next_sweep:
                self.sweep()
        return c

    def longest(self) -> int:
        """The length of the longest list kept (every entry's list is one of them, or empty)."""
        return max(map(len, chain(self._lists.values(), self._odd.values())), default=0)

    def sweep(self) -> None:
        """Let go of the remembered lists that nothing but the memo holds any more (no entry to come
        reads them). Run when the memo has doubled since the last sweep: linear in all."""
        by_list = self._by_list
        gone = list(compress(list(by_list), map(le, map(getrefcount, map(_FIRST, by_list.values())),
                                                repeat(_LIST_MEMO_ONLY_REFS))))
        for i in gone:
            del by_list[i]
        self._next_sweep = max(_SWEEP_MIN, 2 * len(by_list))

    def _by_text(self, f: list) -> list:
        try:
            key = tuple(map(_FRAME_TEXT, f))
            c = self._lists.get(key)
        except (KeyError, TypeError):  # not dicts of the three fields, or a field that is no scalar
            return self._odd.setdefault(id(f), f)  # held, so its id is not reused while remembered
        if c is None:
            self._lists[key] = c = f
        elif c is not f and any(map(gc.is_tracked, f)):  # reads the same, holds containers
            c = self._odd.setdefault(id(f), f)  # kept as itself, to be refused by check()
        return c

    def check(self) -> None:
        """Every kept frame is flat: a dict of scalars (torch >= 2.1) or a tuple of scalars (the
        readers, `model.frame_file` and the hot paths in analysis/frames.py, take any scalar).

        One C-level pass over all of them at the end. CPython tracks a dict for the cyclic GC exactly
        when a container went into it, so an untracked frame dict holds only scalars."""
        frames = list(chain.from_iterable(chain(self._lists.values(), self._odd.values())))
        kinds = set(map(type, frames))
        if kinds == {dict}:
            _cut_long_text(frames)  # the frame dicts are shared by the lists: cut once, read cut by all
        else:
            for kept in chain(self._lists.values(), self._odd.values()):
                _cut_long_text(kept)
        if kinds == {dict}:
            plain = not any(map(gc.is_tracked, frames))
        else:
            plain = kinds <= {dict, list, tuple, *_PLAIN} and all(map(_flat_frame, frames))
        if not plain:
            raise SnapshotError("a trace entry has a frame that is not flat data (frames are dicts of "
                                "filename, line and name)")


_FRAME_TEXT = itemgetter("filename", "line", "name")
# References to a list's first frame while first_sight() reads it when no other list holds it: the
# list, the local name and getrefcount's own argument.
_UNSHARED_REFS = 3
# References to a frames list while first_sight() reads it when no entry still to be read holds it:
# the entry's dict, the parser's local name, first_sight's argument and getrefcount's own.
_LIST_UNSHARED_REFS = 4
# References to a remembered list in sweep() when nothing else holds it: the memo's tuple and the
# argument (a list kept for its stack, or held, has more and stays remembered: it stays in memory anyway).
_LIST_MEMO_ONLY_REFS = 2
_SWEEP_MIN = 4096  # lists remembered before the first sweep
_FIRST = itemgetter(0)
# Lists tried per key (a length and a middle frame; then five frame identities). Real stacks that
# agree there differ elsewhere in a few ways: the stacks="all" cuDNN capture
# (tests/fixtures/captured/cudnn_workspace) has 64 stacks, at most 8 per length and middle frame;
# the real 1M capture at most 5. Each try is one C list comparison.
_SAME_ENDS = 32


def _flat_frame(f: Any) -> bool:
    if type(f) is dict:
        return all(type(v) in _PLAIN for v in f.values()) and all(type(k) is str for k in f)
    if type(f) in (list, tuple):
        return all(type(v) in _PLAIN for v in f)
    return True


def _parse_trace(t: Any, device: int, frames_seen: _Frames, consume: bool) -> list[TraceEvent]:
    """Entries -> TraceEvents. With `consume`, each entry's dict is released as it is read, so the
    decoded trace and its parsed form are never both whole in memory. The hot loop of a decode (a
    million entries): plain entries take the straight path, anything else `_odd_entry`."""
    if not isinstance(t, list):
        raise SnapshotError(f"device_traces[{device}] is not a list")
    out = []
    append = out.append
    plain = _PLAIN_ACTIONS
    by_list = frames_seen._by_list
    remembered = by_list.get
    first_sight = frames_seen.first_sight
    empty = _EMPTY_FRAMES
    make = tuple.__new__
    te = TraceEvent
    fields = _entry_fields(t)
    seen = None
    # The list of the entry before and what it was interned to: torch pickles one list per
    # allocation, and its frees follow it often enough (a third of the C++ capture's entries, half
    # of the real 1M capture's) that an identity test spares them any look-up. Held only after
    # first_sight has counted the list's references.
    last_raw: Any = None
    last_kept = empty
    total = 0  # of the sizes' magnitudes, so a negative size cannot cancel a hostile one
    most = MAX_FIGURE_BYTES
    for k, e in enumerate(t):
        if consume:
            t[k] = None
        if type(e) is not dict:
            raise SnapshotError(f"trace entry {k} of device {device} is not a dict")
        try:
            action, addr, size, stream, t_us, f = fields(e)  # one C call for the six fields
        except KeyError:
            action = f = None
        if (action in plain and type(size) is int and type(addr) is int and type(stream) is int
                and type(t_us) is int):
            # the frames list: the entry before's, one dict look-up when an earlier entry had it
            # (lists of frames of their own), else interned at its first sight
            if f:
                if f is not last_raw:
                    seen = remembered(id(f)) if by_list else None  # none for lists of shared frames
                    last_kept = seen[1] if seen is not None else first_sight(f)
                    last_raw = f
                f = last_kept
            else:
                f = empty
            total += size if size >= 0 else -size
            if total > most:  # at once: a sum past it would only grow, each addition costing more
                _bytes_total((total,), f"device_traces[{device}] entry sizes")
            append(make(te, (action, addr, size, stream, t_us, f, None, None, "")))
        else:
            f = e.get("frames")
            if f:
                if f is not last_raw:
                    seen = remembered(id(f)) if by_list else None  # none for lists of shared frames
                    last_kept = seen[1] if seen is not None else first_sight(f)
                    last_raw = f
                f = last_kept
            else:
                f = empty
            ev = _odd_entry(e, k, device, f)
            if ev is not None:
                total += abs(ev[2])
                if total > most:
                    _bytes_total((total,), f"device_traces[{device}] entry sizes")
                append(ev)
    e = seen = last_raw = None  # the last entry and its list are read: nothing here holds them
    frames_seen.sweep()  # what no entry holds any more
    # the frame references the entries make, each its list's length (a kept list is as long as the
    # entry's own): counted when as many entries as the trace has, each with the longest list kept,
    # could pass the budget
    frames_seen.count_refs(len(out) * frames_seen.longest(), lambda: sum(map(len, map(_EVENT_FRAMES, out))))
    return out


_EVENT_FRAMES = itemgetter(5)


_ENTRY_FIELDS = itemgetter("action", "addr", "size", "stream", "time_us", "frames")
_FIELD_NAMES = ("action", "addr", "size", "stream", "time_us", "frames")


def _entry_fields(t: list):
    """_ENTRY_FIELDS with the key objects of the trace's first entry, when they are its names: the
    unpickler gives every entry those same string objects (the pickle's memo), and a dict finds a
    key that is the same object without comparing its text (a tenth of the parse loop)."""
    first = t[0] if t else None
    if type(first) is dict:
        own = {k: k for k in first if type(k) is str and k in _FIELD_NAMES}
        if len(own) == len(_FIELD_NAMES):
            return itemgetter(*(own[k] for k in _FIELD_NAMES))
    return _ENTRY_FIELDS


# Entries whose fields need no second look when their types are right (every entry of a real trace
# but oom, annotate and the segment events of torch < 2.1): the rest go through _odd_entry.
_PLAIN_ACTIONS = frozenset(("alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
                            "segment_map", "segment_unmap"))


def _odd_entry(e: dict, k: int, device: int, frames: list) -> TraceEvent | None:
    get = e.get
    action = get("action")
    if type(action) is not str or action not in _ACTIONS:
        if isinstance(action, str):
            return None  # a newer torch may add actions: skip what we cannot interpret
        raise SnapshotError(f"trace entry {k} of device {device} has no action")
    size = get("size", 0)
    if type(size) is not int:
        size = _int(size, f"trace entry {k} size", 0)
    addr = get("addr")
    stream = get("stream", 0)
    t_us = get("time_us")
    stream = stream if type(stream) is int else 0
    t_us = t_us if type(t_us) is int else None
    if action == "oom":  # one tuple made, not three: a cuDNN plan search records thousands of these
        # For OOM the addr slot carries the CUDA-reported free bytes in some versions.
        dfree = get("device_free", addr)
        pool = get("pool_id")
        ok_pool = type(pool) in (list, tuple) and all(type(v) is int for v in pool[:4])
        return tuple.__new__(TraceEvent, (action, None, size, stream, t_us, frames,
                                          dfree if type(dfree) is int else None,
                                          tuple(pool[:4]) if ok_pool else None, ""))
    ev = TraceEvent(action, addr if type(addr) is int else None, size, stream, t_us, frames)
    if action == "annotate":
        meta = get("user_metadata")
        if type(meta) is str:
            ev = ev._replace(user_metadata=meta[:MAX_USER_METADATA])
    return ev


def _parse_settings(d: dict) -> AllocatorSettings:
    rp = d.get("roundup_power2_divisions")
    divisions: list[tuple[int, int]] = []
    if isinstance(rp, dict):
        for k, v in rp.items():
            try:
                if int(v) > 0:
                    divisions.append((int(k), int(v)))
            except (TypeError, ValueError):
                continue
    elif isinstance(rp, int) and rp > 0:
        divisions.append((0, rp))
    mss = d.get("max_split_size", -1)
    try:
        mss = int(mss)
    except (TypeError, ValueError):
        mss = -1
    # torch reports "unlimited" as -1 in recent versions and as SIZE_MAX in older ones.
    if mss >= 2**62:
        mss = -1
    try:
        gc = float(d.get("garbage_collection_threshold") or 0.0)
    except (TypeError, ValueError):
        gc = 0.0
    conf = d.get("PYTORCH_ALLOC_CONF") or d.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    return AllocatorSettings(
        conf=str(conf),
        max_split_size=mss,
        garbage_collection_threshold=gc,
        expandable_segments=bool(d.get("expandable_segments", False)),
        roundup_power2_divisions=tuple(sorted(divisions)),
        known=True,
    )


def _frames_missing_reason(segments: list[Segment], traced: bool) -> list[str]:
    live = [b for s in segments for b in s.blocks if b.is_live]
    if live and not any(b.frames for b in live):
        if traced:
            # provenance reads the classes from the trace's order where it holds the whole job
            return ["no block carries frames (history was not recorded with stacks): the composition is read "
                    "from the trace's order where it holds the whole job, else 'unknown'"]
        # no trace either: the composition reads the model's state from the layout where it shows (untraced.py)
        return ["no block carries frames and there is no trace (history was not recorded): the composition is "
                "inferred from sizes and addresses where the layout shows the model, else 'unknown'"]
    return []


def _opt_int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return int(v) if not isinstance(v, float) or v.is_integer() else None


def _opt_str(v: Any, n: int = 200) -> str | None:
    return v[:n] if isinstance(v, str) and v else None


def _step_figures(v: Any) -> tuple[StepFigures, ...]:
    if not isinstance(v, list):
        return ()
    out = []
    for d in v[-MAX_STEP_FIGURES:]:
        if not isinstance(d, dict):
            continue
        step, peak, alloc = _opt_int(d.get("step")), _opt_int(d.get("peak_allocated")), _opt_int(d.get("allocated"))
        if step is None or peak is None or alloc is None:
            continue  # a figure without its step or bytes says nothing
        ms = d.get("ms")
        out.append(StepFigures(step=step, epoch=_opt_int(d.get("epoch")), peak_allocated=peak,
                               peak_reserved=_opt_int(d.get("peak_reserved")) or 0, allocated=alloc,
                               reserved=_opt_int(d.get("reserved")) or 0, retries=_opt_int(d.get("retries")) or 0,
                               ms=float(ms) if isinstance(ms, (int, float)) and not isinstance(ms, bool) else None,
                               tokens=_opt_int(d.get("tokens")), span=max(1, _opt_int(d.get("span")) or 1),
                               time=_opt_float(d.get("t"))))
    return tuple(out)


def _opt_float(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


MAX_OOM_FRAMES = 64


def _oom_frames(v: Any) -> tuple:
    """The observer's frames as the snapshot's own frame dicts; malformed entries are dropped."""
    if not isinstance(v, list):
        return ()
    out = []
    for d in v[:MAX_OOM_FRAMES]:
        if isinstance(d, dict) and isinstance(d.get("filename"), str) and isinstance(d.get("name"), str):
            out.append({"filename": d["filename"][:500], "line": _opt_int(d.get("line")) or 0,
                        "name": d["name"][:200]})
    return tuple(out)


def parse_agent_info(v: Any) -> AgentInfo | None:
    """The agent's `memq_agent` dict (ARCHITECTURE.md, agent/analysis contract); tolerant: a field of
    the wrong type is dropped, never an error (the rest of the snapshot is still good evidence)."""
    if not isinstance(v, dict):
        return None
    rec = v.get("recording") if isinstance(v.get("recording"), dict) else {}
    on = rec.get("on")
    t = v.get("time")
    return AgentInfo(
        run=_opt_str(v.get("run")), rank=_opt_int(v.get("rank")), trigger=_opt_str(v.get("trigger"), 40),
        step=_opt_int(v.get("step")), epoch=_opt_int(v.get("epoch")),
        time=float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None,
        step_figures=_step_figures(v.get("step_figures")),
        step_in_progress=_opt_int(v.get("step_in_progress")), step_completed=_opt_int(v.get("step_completed")),
        steps_source=_opt_str(v.get("steps_source"), 40),
        recording_on=on if isinstance(on, bool) else None,
        recording_since_step=_opt_int(rec.get("since_step")), recording_reason=_opt_str(rec.get("reason"), 40),
        comparable=v.get("comparable") is True,
        optimizer=_opt_str(v.get("optimizer"), 80), model=_opt_str(v.get("model"), 80),
        oom_frames=_oom_frames(v.get("oom_frames")),
        limit_bytes=_opt_int(v.get("limit_bytes")) if (_opt_int(v.get("limit_bytes")) or 0) > 0 else None,
        roles=_roles(v.get("roles")),
        **_first_input(v.get("first_input")),
    )


MAX_ROLE_RANGES = 200_000  # the agent sends at most this many (agent/roles.py MAX_RANGES)


def _roles(v: Any) -> tuple:
    """The agent's role ranges ([address, nbytes, role index] each), sorted; a malformed entry is
    dropped, a malformed list is none (the snapshot stays good evidence without them)."""
    if not isinstance(v, dict) or not isinstance(v.get("ranges"), list):
        return ()
    out = []
    for r in v["ranges"][:MAX_ROLE_RANGES]:
        if (isinstance(r, (list, tuple)) and len(r) == 3 and all(type(x) is int for x in r)
                and r[0] > 0 and r[1] > 0 and 0 <= r[2] < len(AGENT_ROLES)):
            out.append((r[0], r[1], r[2]))
    out.sort()
    return tuple(out)


def _first_input(v: Any) -> dict:
    """The agent's `first_input` ({"autocast", "shapes", "module", "square"}), tolerant: a field of the wrong
    type is dropped, and a `square` entry that is not [file, line, bytes]."""
    if not isinstance(v, dict):
        return {}
    shapes = v.get("shapes")
    ok = isinstance(shapes, list) and all(isinstance(sh, list) and all(type(d) is int and d >= 0 for d in sh)
                                          for sh in shapes)
    square = v.get("square")
    entries = (square if isinstance(square, list) else [])[:SQUARE_SITES_MAX]
    sites = tuple((e[0][:MAX_FRAME_TEXT], e[1], e[2]) for e in entries
                  if isinstance(e, list) and len(e) == 3 and isinstance(e[0], str) and type(e[1]) is int
                  and type(e[2]) is int and e[1] >= 0 and e[2] > 0)
    dtypes = v.get("dtypes")
    dtypes = tuple(d[:20] for d in dtypes[:4]) if isinstance(dtypes, list) and all(
        isinstance(d, str) for d in dtypes) else ()
    return {"autocast": _opt_str(v.get("autocast"), 20), "input_module": _opt_str(v.get("module"), 80),
            "input_shapes": tuple(tuple(sh) for sh in shapes[:4]) if ok else (), "input_dtypes": dtypes,
            "square_sites": sites}


def check_invariants(snap: Snapshot) -> list[str]:
    """Conservation checks. Returns human-readable violations (empty when consistent)."""
    problems = []
    for i, s in enumerate(snap.segments):
        total = sum(b.size for b in s.blocks)
        if s.blocks and total != s.total_size:
            problems.append(f"segment {i}: blocks sum to {total} bytes, segment is {s.total_size}")
        for b in s.blocks:
            if b.requested_size > b.size and b.state == ACTIVE_ALLOCATED:
                problems.append(f"segment {i}: block at {b.address:#x} requested {b.requested_size} > size {b.size}")
                break
    return problems
