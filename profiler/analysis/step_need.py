"""The failing step's need (ARCHITECTURE.md "The failing step's need", causes 4, 7 and 8). Pure.

The OOM usually cuts the failing step off early, so whether the step would have fit depends on the
part of it that never ran. This module measures that part on an earlier complete step of the same run
(timeline.py's `last_cycle` of a recorded trace: its allocations in order, each with its size, whether
it is fixed-size and when it is freed) instead of extrapolating from one ratio:

1. Align. What the failing step holds at the OOM (its live blocks allocated since its boundary, and the
   failed request) is compared with what the earlier step held at each of its allocations of a size
   the request could be (the request's counterpart). Input-dependent tensors are k times larger, for
   one k (a larger batch or sequence); fixed-size ones (parameters' gradients, optimizer state and
   temporaries: whatever survives the step or was allocated in optimizer code) match at 1. Sizes
   match within MATCH_TOL. The alignment that matches the most bytes wins.
2. Replay. From the matched point on, the earlier step's remaining allocations and frees are replayed
   with their sizes times k (fixed ones unscaled), anchored at live + request: the need is that
   replay's peak (and never less than live + request). Before the matched point the same replay gives
   what the failing step already went through (its own peak so far, where a trace shows it, counts too).
3. Interval. `high` replays the rest at k x (1 + K_MARGIN_HIGH) and keeps every block the alignment did
   not explain; `low` at k x (1 - K_MARGIN_LOW), with those blocks freed when their counterparts are.
4. Gate. A projection is made only when the alignment explains at least MIN_MATCHED of the failing
   step's bytes; else bytes are null and `basis` says how much matched and what would settle it.

Where live + request already exceeds the limit, the step does not fit whatever the projection says.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.analysis.rules import (
    ALIGN_MIN_BYTES,
    ALIGN_SMALL_SHARE,
    K_MARGIN_HIGH,
    K_MARGIN_LOW,
    K_MAX,
    K_MIN,
    LARGE_ROUND,
    MATCH_TOL,
    MID_SEGMENT,
    MIN_MATCHED,
    RUN_NOISE,
)
from memq.units import fmt_bytes, fmt_need

# The thresholds, with their sources, are in rules.py (docs/analysis.md "The rules table").


def request_slack(S: int) -> int:
    """How much the reported request may exceed the bytes the failing block would have held."""
    if S > MID_SEGMENT:
        return min(S, LARGE_ROUND)
    if S > LARGE_ROUND:
        return S - (1 << 20)  # a 20 MiB segment holds any request of 1-10 MiB
    return S


# At most this many candidate points of the earlier step are aligned (evenly spread over the step when
# it has more): each costs a sort of what is live there, and a step of a large model has thousands of
# allocations the request could be (the calibration set's steps have under 600).
MAX_ALIGN_POINTS = 3000


# Optimizer frames, or what survives the step, are fixed-size; everything else scales with the input.
SCALED, FIXED, BEFORE = 0, 1, 2


@dataclass(frozen=True)
class StepNeed:
    bytes: int | None
    low: int | None
    high: int | None
    fits_limit: bool | None
    basis: str
    k: float | None = None  # the failing step's input-dependent tensors / the earlier step's
    matched_share: float | None = None  # of the failing step's bytes, explained by the alignment
    position: float | None = None  # how far into the earlier step the OOM came (share of its allocations)
    reference: str | None = None  # where the earlier step was seen
    limit: int | None = None  # the limit it was judged against
    held: int | None = None  # live + request at the OOM: what the step held for certain
    floor: int | None = None  # with no limit known: the peak reserved the allocator held, the least it can be

    def as_json(self) -> dict:
        return {"bytes": self.bytes, "limit_bytes": self.limit, "low": self.low, "high": self.high,
                "fits_limit": self.fits_limit, "basis": self.basis, "k": self.k,
                "matched_share": self.matched_share, "position": self.position, "reference": self.reference,
                "held_bytes": self.held, "limit_floor_bytes": self.floor}


#: How `basis` begins when live + request alone exceed the limit (the step does not fit: settled).
OVER_LIMIT = "live + request alone exceed the limit; "

_FITS = {True: "it fits in one piece", False: "it does not fit, whatever the allocator does",
         None: "the interval straddles the limit, so whether it fits is not settled"}


def need_sentence(n: Mapping[str, Any], *, with_basis: bool = True) -> str:
    """The failing step's need in one sentence, the same in the evidence and on every screen (from
    `StepNeed.as_json()` or a stored `diagnosis.step_need`). One number per figure: what the step held
    is live + request, the figure the capacity and fragmentation lines add up; a settled "does not fit"
    names nothing that would settle it; an unknown limit reads as unknown."""
    lim, held = n.get("limit_bytes"), n.get("held_bytes")
    basis = str(n.get("basis") or "no projection")
    against = f" against {fmt_bytes(lim, 'brief')}" if lim else " (limit unknown)"
    if n.get("bytes") is None:
        if n.get("fits_limit") is False and lim:
            alone = f" ({fmt_bytes(held, 'brief')})" if held else ""
            return (f"the failing step needed more than the {fmt_bytes(lim, 'brief')} limit: its live bytes and "
                    f"the request alone{alone} exceed it, whatever the rest of the step needs")
        rest = basis[len(OVER_LIMIT):] if basis.startswith(OVER_LIMIT) else basis
        if held:
            s = (f"the failing step held {fmt_bytes(held, 'brief')} with the request{against}; what the rest "
                 "of it needed is not known")
        else:
            s = f"the failing step needed {fmt_need(None, n.get('low'), None)}{against}: whether it fits is not known"
        return s + (f" ({rest})" if with_basis else "")
    verdict = _FITS[n.get("fits_limit")]
    floor, high = n.get("limit_floor_bytes"), n.get("high")
    if n.get("fits_limit") is None and not lim and floor and high is not None and high <= floor:
        # the fragmentation line beside it compares with this lower bound: never "not known" under it
        against, verdict = "", (f"under the {fmt_bytes(floor, 'brief')} the allocator held earlier, the least the "
                                "limit can be; the limit itself is not known (--limit, --oom-message or "
                                "--device-total would name it)")
    elif n.get("fits_limit") is None and not lim:
        against, verdict = "", ("the limit is not known, so whether it fits is not settled (--limit, --oom-message or "
                   "--device-total would settle it)")
    s = f"the failing step needed {fmt_need(n['bytes'], n.get('low'), n.get('high'))}{against}: {verdict}"
    return s + (f"; {basis}" if with_basis else "")


def fits(low: int | None, high: int | None, limit: int | None) -> bool | None:
    if limit is None:
        return None
    if high is not None and high <= limit:
        return True
    if low is not None and low > limit:
        return False
    return None


def _match(fail: list[int], want: list[float]) -> float:
    """Bytes of `fail` matched one for one to `want` within MATCH_TOL (both sorted ascending)."""
    i = j = 0
    got = 0.0
    while i < len(fail) and j < len(want):
        f, w = fail[i], want[j]
        if abs(f - w) <= MATCH_TOL * min(f, w):
            got += f
            i += 1
            j += 1
        elif f < w:
            i += 1
        else:
            j += 1
    return got


@dataclass(frozen=True)
class _Align:
    score: float  # matched bytes / max(failing bytes, expected bytes)
    matched: float  # matched bytes / failing bytes
    p: int  # event index of the request's counterpart in the reference
    k: float


def _scale_for(size: int, flag: int, S: int) -> float | None:
    """The k at which an allocation of the earlier step is the failing request's counterpart: S / size
    for an input-sized one within [K_MIN, K_MAX], 1 for a fixed-size one of the same size, else None."""
    if flag == SCALED:
        return S / size if K_MIN * size <= S <= K_MAX * size else None
    return 1.0 if abs(S - size) <= MATCH_TOL * min(S, size) else None


def align(ref: dict, fail_blocks: list[int], S: int) -> _Align | None:
    """The best (point, scale) of the earlier step for the failing step's live blocks + request."""
    sizes = [a[0] for a in ref["allocs"]]
    flags = [a[1] for a in ref["allocs"]]
    floor = max(ALIGN_MIN_BYTES, int(S * ALIGN_SMALL_SHARE))
    fail = sorted(b for b in [*fail_blocks, S] if b >= floor)
    fail_total = float(sum(fail)) or 1.0
    points = sum(1 for e in ref["events"] if e >= 0 and _scale_for(sizes[e], flags[e], S) is not None)
    stride = max(1, -(-points // MAX_ALIGN_POINTS))
    live: dict[int, None] = {}
    best: _Align | None = None
    seen = 0
    for pos, e in enumerate(ref["events"]):
        if e < 0:
            live.pop(-e - 1, None)
            continue
        r = sizes[e]
        k = _scale_for(r, flags[e], S)
        if k is not None:
            seen += 1
        cands = [k] if k is not None and (seen - 1) % stride == 0 else []
        for k in cands:
            want = sorted(w for w in ((sizes[n] * (k if flags[n] == SCALED else 1.0)) for n in live)
                          if w >= floor)
            want_s = r * (k if flags[e] == SCALED else 1.0)
            got = _match(fail, _insert(want, want_s))
            total = max(fail_total, sum(want) + want_s)
            a = _Align(score=got / total, matched=got / fail_total, p=pos, k=k)
            if best is None or a.score > best.score + 1e-9:
                best = a
        live[e] = None
    return best


def _insert(xs: list[float], x: float) -> list[float]:
    i = bisect_left(xs, x)
    return xs[:i] + [x] + xs[i:]


def replay_peak(ref: dict, p: int, k_before: float, k_after: float, unmatched_freed: int = 0) -> tuple[int, int]:
    """(max level before or at p, max level after p) of the earlier step relative to its level just
    after event p, with input-dependent sizes times k_before up to p and k_after for what is
    allocated after p. `unmatched_freed`: bytes subtracted from every level after p (low bound)."""
    sizes = [a[0] for a in ref["allocs"]]
    flags = [a[1] for a in ref["allocs"]]
    scale: dict[int, float] = {}
    lvl = 0.0
    levels = []
    for pos, e in enumerate(ref["events"]):
        if e >= 0:
            s = k_before if pos <= p else k_after
            scale[e] = s if flags[e] == SCALED else 1.0
            lvl += sizes[e] * scale[e]
        else:
            n = -e - 1
            lvl -= sizes[n] * scale.get(n, 1.0)
        levels.append(lvl)
    at = levels[p]
    before = max(levels[: p + 1]) - at
    after = max(levels[p + 1:], default=at) - at - unmatched_freed
    return int(before), int(max(0.0, after))


def project(ref: dict | None, ref_source: str | None, fail_blocks: list[int], S: int, A: int,
            limit: int | None, peak_so_far: int | None = None) -> StepNeed:
    """The failing step's need. `fail_blocks`: sizes of the live blocks the failing step allocated
    (from its boundary to the OOM); `A`: all live bytes at the OOM; `peak_so_far`: the step's own peak
    of live bytes before the OOM where a trace shows it."""
    floor_need = A + S
    # what the step holds for certain: the request at its smallest, less what another run may not hold
    least = int((A + S - request_slack(S)) * (1 - RUN_NOISE))
    over = limit is not None and least > limit
    if not ref or not ref.get("events"):
        basis = ("no complete earlier training step of this run was recorded, so the rest of the failing "
                 "step cannot be projected; a run whose warm-up the agent recorded (its defaults), or "
                 "history=\"on\", would settle it")
        if over:
            basis = f"{OVER_LIMIT}{basis}"
        return StepNeed(None, least, None, fits(least, None, limit), basis, held=floor_need)
    a = align(ref, fail_blocks, S)
    n_allocs = sum(1 for e in ref["events"] if e >= 0) or 1
    if a is None or a.matched < MIN_MATCHED:
        share = 0.0 if a is None else a.matched
        basis = (f"the allocations of the failing step match {100 * share:.0f}% of a training step's "
                 f"({ref_source}), under the {100 * MIN_MATCHED:.0f}% a projection needs: what it holds is "
                 "not an earlier step's pattern at any one scale (a different code path, or memory kept from "
                 "outside the step)")
        if over:
            basis = f"{OVER_LIMIT}{basis}"
        return StepNeed(None, least, None, fits(least, None, limit), basis,
                        matched_share=round(share, 3), reference=ref_source, held=floor_need)
    unmatched = int((1 - a.matched) * (sum(fail_blocks) + S))
    before, after = replay_peak(ref, a.p, a.k, a.k)
    _, after_hi = replay_peak(ref, a.p, a.k, a.k * (1 + K_MARGIN_HIGH))
    _, after_lo = replay_peak(ref, a.p, a.k, a.k * (1 - K_MARGIN_LOW), unmatched_freed=unmatched)
    so_far = max(floor_need + before, peak_so_far or 0)
    need = max(so_far, floor_need + after)
    high = max(so_far, floor_need + after_hi)
    low = max(least, int((min(need, floor_need + after_lo) - request_slack(S)) * (1 - RUN_NOISE)))
    pos = sum(1 for e in ref["events"][: a.p + 1] if e >= 0) / n_allocs
    basis = (f"aligned with {ref_source}: {100 * a.matched:.0f}% of the failing step's bytes match it at "
             f"{a.k:.2f}x its input-sized tensors; the OOM came {100 * pos:.0f}% of the way through that step, "
             "whose rest was replayed at that scale")
    return StepNeed(need, low, high, fits(low, high, limit), basis, k=round(a.k, 3),
                    matched_share=round(a.matched, 3), position=round(pos, 3), reference=ref_source, held=floor_need)

