"""Single-step recordings derived from real whole-run traces, as a snapshot dumped at that moment would
look: the trace up to the cut, and the segments with the blocks live at the cut (replayed from the
trace's own segment and block entries). Used by the tests of `memq fit` on one step or part of one and by
benchmarks/fit_one_step.py.

- `cut_points(snap)`: trace indices where the first training step's forward ends (its backward begins)
  and where its backward ends (the first optimizer-code entry).
- `cut(snap, at)`: the snapshot as dumped just before trace entry `at`.

Only traces that start at an empty allocator can be cut this way (every segment and block at the cut
is made in the trace); the calibration traces all do (recording began before the model was built).
"""

from __future__ import annotations

import dataclasses

from memq.analysis import frames as fr
from memq.model import Block, Segment, Snapshot, frame_file, frame_name

MiB = 1 << 20


def _python(frames) -> list:
    return [f for f in frames or () if frame_file(f).endswith(".py")]


def _backward_call(frames) -> bool:
    """A Python `backward()` frame of torch (Tensor.backward, torch.autograd.backward)."""
    return any(frame_name(f) == "backward" and ("torch/_tensor.py" in frame_file(f)
                                               or "torch/autograd/" in frame_file(f)) for f in _python(frames))


def cut_points(snap: Snapshot) -> dict[str, int]:
    """{"forward": i, "backward": j}: the first step's forward ends before entry i (its first backward
    entry), its backward before entry j (its first optimizer-code entry)."""
    trace = snap.trace
    has_python = any(_python(e.frames) for e in trace[:200])
    fwd = bwd = None
    for i, ev in enumerate(trace):
        if ev.action not in ("alloc", "free_requested"):
            continue
        if fwd is None and (_backward_call(ev.frames) or (has_python and ev.action == "alloc" and ev.frames
                                                          and not _python(ev.frames) and i > 0
                                                          and _seen_forward(trace, i))):
            fwd = i
        if ev.frames and fr.is_optimizer(ev.frames):
            bwd = i
            break
    if fwd is None or bwd is None:
        raise ValueError("no first step's backward and optimizer step in this trace")
    return {"forward": fwd, "backward": bwd}


def _seen_forward(trace, i: int) -> bool:
    return any(fr.FORWARD_NAME.search(frame_name(f)) for e in trace[max(0, i - 50):i] for f in _python(e.frames))


def cut(snap: Snapshot, at: int) -> Snapshot:
    """`snap` as a snapshot taken just before trace entry `at` would hold it."""
    trace = snap.trace[:at]
    segs: dict[int, tuple[int, int, object]] = {}  # address -> (size, stream, frames)
    live: dict[int, tuple[int, str, object]] = {}  # address -> (size, state, frames)
    for ev in trace:
        if ev.action == "segment_alloc":
            segs[ev.addr] = (ev.size, ev.stream, ev.frames)
        elif ev.action == "segment_free":
            segs.pop(ev.addr, None)
        elif ev.action == "alloc":
            live[ev.addr] = (ev.size, "active_allocated", ev.frames)
        elif ev.action == "free_requested" and ev.addr in live:
            size, _st, frames = live[ev.addr]
            live[ev.addr] = (size, "active_pending_free", frames)
        elif ev.action == "free_completed":
            live.pop(ev.addr, None)
        elif ev.action in ("segment_map", "segment_unmap"):
            raise ValueError("expandable segments: not cut here")
    orig = {s.address: s for s in snap.segments}
    req = {b.address: b.requested_size for s in snap.segments for b in s.blocks if b.state != "inactive"}
    addrs = sorted(live)
    segments = []
    import bisect

    for base in sorted(segs):
        size, stream, frames = segs[base]
        blocks, pos = [], base
        j = bisect.bisect_left(addrs, base)
        while j < len(addrs) and addrs[j] < base + size:
            a = addrs[j]
            bsize, state, bframes = live[a]
            if a > pos:
                blocks.append(Block(pos, a - pos, 0, "inactive", []))
            r = req.get(a, bsize)
            blocks.append(Block(a, bsize, r if r <= bsize else bsize, state, bframes))
            pos = a + bsize
            j += 1
        if pos < base + size:
            blocks.append(Block(pos, base + size - pos, 0, "inactive", []))
        o = orig.get(base)
        kind = o.segment_type if o is not None else ("small" if size == 2 * MiB and all(
            b.size <= MiB for b in blocks if b.state != "inactive") else "large")
        segments.append(Segment(device=0, address=base, total_size=size, stream=stream, segment_type=kind,
                                pool_id=(0, 0), is_expandable=False, blocks=blocks, frames=frames or []))
    return dataclasses.replace(snap, segments=segments, traces=[trace], trace_overflowed=False, memo={}, held=[])
