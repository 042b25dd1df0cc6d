"""What the allocator was allowed to reserve, and what the failed request was.

Definitions (ARCHITECTURE.md, "Causes"): S = the failed request; LIMIT = `--limit` (a per-process
cap compared with reserved bytes), else the message's "N allowed", else device total - non-PyTorch
memory; non-PyTorch = device total - device free - R. Each value records where it came from, so
evidence lines can say so, and stays None when nothing tells it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.model import OomContext, Snapshot, TraceEvent


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


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def real_cap(limit: Any, total: Any) -> int | None:
    """A limit is a cap only when it is below the device total (an uncapped process reports both
    equal, and the analysis then derives the limit from the device itself)."""
    if _int(limit) is None or limit <= 0:
        return None
    if _int(total) is not None and total > 0 and limit >= total:
        return None
    return limit


def observer_facts(oom: Mapping[str, Any], run_limit: int | None = None, run_total: int | None = None,
                   max_message: int = 4000) -> dict[str, Any]:
    """The analysis context stored with an agent's OOM snapshot (see pipeline.analyse.oom_context), from the
    observer's payload (`alloc`, `device_alloc`, `device_free`, `device_total`, `message`) and what the
    run announced: its cap wins, else the observer's device_alloc when it is below the device total."""
    total = _int(oom.get("device_total")) or run_total
    limit = run_limit or real_cap(_int(oom.get("device_alloc")), total)
    msg = oom.get("message")
    facts = {"limit_bytes": limit, "device_total_bytes": total, "requested_bytes": _int(oom.get("alloc")),
             "device_free_bytes": _int(oom.get("device_free")),
             "message": str(msg)[:max_message] if msg not in (None, "") else None}
    return {k: v for k, v in facts.items() if v not in (None, "")}
