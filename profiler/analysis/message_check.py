"""An OOM message given with a snapshot (`memq analyze FILE --oom-message TEXT`) is checked against it
before it is used: a log holds several OOMs (`grep -m1` picks the first), and a message of another OOM
would lend its request, cap and device to this one ("exceeds the limit by -8.27 GiB"). Where they
disagree, the snapshot's own figures win and the mismatch is said."""

from __future__ import annotations

from dataclasses import replace

from memq.analysis.classify import g
from memq.analysis.rules import PRINTED_ROUNDING, SAME_REQUEST_BYTES
from memq.model import OomContext, Snapshot


def _differs(a: int | None, b: int | None, slack: int = 0) -> bool:
    return a is not None and b is not None and abs(a - b) > max(slack, PRINTED_ROUNDING * max(a, b))


def reconcile(ctx: OomContext, snap: Snapshot) -> tuple[OomContext, list[str]]:
    """(the context to analyse with, what disagreed). A message that disagrees with the snapshot on the
    request, the cap or the device is left out; one that agrees is kept."""
    msg = ctx.message
    if msg is None:
        return ctx, []
    ev = snap.oom_event()
    snap_request = ev.size if ev is not None and ev.size else ctx.requested_bytes
    found = []
    if _differs(msg.requested_bytes, snap_request, SAME_REQUEST_BYTES):
        found.append(f"it asks for {g(msg.requested_bytes)}, the snapshot's OOM for {g(snap_request)}")
    if _differs(msg.allowed_bytes, ctx.limit_bytes):
        found.append(f"its cap is {g(msg.allowed_bytes)} allowed, --limit is {g(ctx.limit_bytes)}")
    if _differs(msg.device_total_bytes, ctx.device_total_bytes):
        found.append(f"its device has {g(msg.device_total_bytes)}, --device-total says {g(ctx.device_total_bytes)}")
    if ev is None and snap_request is None and msg.requested_bytes:
        found.append("the snapshot recorded no OOM to compare it with")
    if not found:
        return ctx, []
    return replace(ctx, message=None), [
        "the --oom-message is not this snapshot's OOM (" + "; ".join(found) + "): it was left out and the "
        "snapshot's own figures are used (a log with several OOMs: pass the message of the one this snapshot "
        "recorded, not the first one grep finds)"]
