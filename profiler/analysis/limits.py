"""What the allocator was allowed to reserve, and what the failed request was.

Definitions (ARCHITECTURE.md, "Causes"): S = the failed request; LIMIT = `--limit` (a per-process
cap compared with reserved bytes), else the message's "N allowed", else device total - non-PyTorch
memory; non-PyTorch = device total - device free - R. Each value records where it came from, so
evidence lines can say so, and stays None when nothing tells it.
"""

from __future__ import annotations

from dataclasses import dataclass

from profiler.model import OomContext, Snapshot, TraceEvent


@dataclass(frozen=True)
class Limits:
    requested: int | None
    requested_source: str | None
    limit: int | None
    limit_source: str | None
    device_total: int | None
    device_free: int | None
    non_pytorch: int | None
    oom_event: TraceEvent | None

    @property
    def has_oom(self) -> bool:
        return self.requested is not None


def resolve_limits(snap: Snapshot | None, ctx: OomContext | None, reserved: int | None) -> Limits:
    ctx = ctx or OomContext()
    msg = ctx.message
    ev = snap.oom_event() if snap is not None else None
    requested = src = None
    if ev is not None and ev.size:
        requested, src = ev.size, "the snapshot's OOM trace entry"
    elif ctx.requested_bytes:
        requested, src = ctx.requested_bytes, "the OOM observer"
    elif msg and msg.requested_bytes:
        requested, src = msg.requested_bytes, "the OOM message"

    device_total = ctx.device_total_bytes or (msg.device_total_bytes if msg else None)
    device_free = None
    if ev is not None and ev.device_free is not None:
        device_free = ev.device_free
    elif ctx.device_free_bytes is not None:
        device_free = ctx.device_free_bytes
    elif msg and msg.device_free_bytes is not None:
        device_free = msg.device_free_bytes
    if reserved is None and msg is not None:
        reserved = msg.reserved_bytes
    non_pytorch = None
    if device_total is not None and device_free is not None and reserved is not None:
        non_pytorch = max(0, device_total - device_free - reserved)

    limit = lsrc = None
    if ctx.limit_bytes:
        limit, lsrc = ctx.limit_bytes, "--limit"
    elif msg and msg.allowed_bytes:
        limit, lsrc = msg.allowed_bytes, "the OOM message's 'allowed'"
    elif device_total is not None and non_pytorch is not None:
        limit, lsrc = device_total - non_pytorch, "device total - non-PyTorch memory"
    return Limits(requested, src, limit, lsrc, device_total, device_free, non_pytorch, ev)
