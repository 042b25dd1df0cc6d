"""The need of a training step that the OOM cut off (ARCHITECTURE.md, causes 4 and 7).

At agent defaults the OOM snapshot has no trace of the failing step: only what it holds so far
(its live blocks) and the request that failed. When the OOM comes early in the step, live + request
still fits the limit although the whole step would not. The projection compares the failing step's
blocks with an earlier recorded step of the same run: a larger input makes the same tensors
several times larger, and the step's transient memory (its peak above the live floor) grows with
them, so the step reaches the same share of its transient at the same point (k of its largest
tensors live). projected = floor now + (live + request - floor now) / that share, never less
than live + request. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Projection:
    need: int  # projected peak live bytes of the failing step
    scale: float  # its largest block / the earlier step's largest allocation
    progress: float  # how far into the earlier step the same point was (share of its transient)
    floor_now: int  # live bytes the failing step started from (parameters, state, ...)
    ref_peak: int  # the earlier step's peak live bytes
    ref_transient: int  # the earlier step's peak above its floor
    largest_step_block: int
    largest_ref_alloc: int
    ref_source: str  # where the earlier step was seen


BIG = 0.9  # same size class as a step's largest tensor (timeline.BIG)


def project_step_need(A: int, S: int, step_blocks: list[int], floor_now: int, ref: dict | None,
                      ref_source: str) -> Projection | None:
    """`step_blocks`: sizes of the live blocks the failing step allocated so far; `ref`: an earlier
    complete step (timeline.last_cycle). None when not projectable.

    Its largest tensors mark how far a step has got: in the earlier step, when k of them were live,
    live bytes had reached a known share of that step's transient. The failing step holds k of
    its own (the request included): its transient so far is that share of its whole transient."""
    if not ref or not ref.get("largest") or not ref.get("big"):
        return None
    transient = ref["peak"] - ref["floor"]
    if transient <= 0:
        return None
    largest = max([S, *step_blocks])
    scale = largest / ref["largest"]
    if scale < BIG:
        # Cut off before its largest tensors: no point of the earlier step to align with. That step
        # ran with its own peak, which is the least this one needs.
        return Projection(need=max(A + S, floor_now + transient), scale=round(scale, 2), progress=0.0,
                          floor_now=floor_now, ref_peak=ref["peak"], ref_transient=transient,
                          largest_step_block=largest, largest_ref_alloc=ref["largest"], ref_source=ref_source)
    k = sum(1 for b in [S, *step_blocks] if b >= BIG * largest)
    shares = [(lvl - ref["floor"]) / transient for n, lvl in ref["big"] if n == k]
    if not shares:  # more of them than the earlier step ever held at once: past its last one
        shares = [(ref["big"][-1][1] - ref["floor"]) / transient] if k > ref["big"][-1][0] else []
    # Where several points of the earlier step match, the furthest one: the smaller projection.
    progress = min(1.0, max(0.2, max(shares))) if shares else 1.0
    need = max(A + S, floor_now + int((A + S - floor_now) / progress))
    return Projection(need=need, scale=round(scale, 2), progress=round(progress, 2), floor_now=floor_now,
                      ref_peak=ref["peak"], ref_transient=transient, largest_step_block=largest,
                      largest_ref_alloc=ref["largest"], ref_source=ref_source)
