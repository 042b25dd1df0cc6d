"""Growth of live memory across comparable snapshots of one run.

A leak (ARCHITECTURE.md cause 2): live bytes at comparable points grow in at least two consecutive
intervals, each by more than max(64 MiB, 1% of LIMIT or of A), after warm-up (points before the
first optimizer state exists are warm-up), and the growth is blocks that stay live at later points.
Optimizer state that grows because new parameters start training (progressive unfreezing) stays
within 2x the parameters' bytes; state beyond that for the same parameters is a leak.
"""

from __future__ import annotations

from collections import Counter

from memq.analysis import frames as fr
from memq.analysis.rules import (
    LEAK_FIGURE_POINTS,
    LEAK_FIGURES_FALLBACK_SHARE,
    LEAK_MIN_GROWTH_BYTES,
    LEAK_MIN_GROWTH_SHARE,
    LEAK_MIN_INTERVALS,
    LEAK_MIN_POINTS,
    LEAK_PERSIST_SHARE,
    UNFREEZE_OPT_SHARE,
    UNFREEZE_STATE_MULTIPLE,
)
from memq.units import fmt_bytes

HOW_TO_GET_FRAMES = ("the agent records Python stacks for the next window by itself when live bytes grow "
                     "between comparable points (memq agent from this version), so its next comparable "
                     "snapshot names the line; or start it with history=\"on\" to record them throughout")


def live_blocks(snap) -> dict[tuple[int, int], str]:
    """(address, size) -> allocation site of every live block (the user's line where frames show it)."""
    return {(b.address, b.size): fr.allocation_site(b.frames) for s in snap.segments for b in s.blocks
            if b.is_live}


def appeared(before: dict, after: dict) -> list[tuple[int, int]]:
    """Blocks live at `after` that were not live at `before`. The caching allocator hands a freed
    block's address and size to the next request that fits, so (address, size) alone would take a
    tensor freed and another allocated in its place for one that stayed: a block is the same only
    when its allocation site is the same too. (Two tensors of one line at one address and size stay
    one block: the snapshot keeps no allocation time.)"""
    return [k for k, site in after.items() if before.get(k) != site]  # a site is always a string


def detect_leak(points: list[dict], limit: int | None) -> dict:
    """`points`: per comparable snapshot, in time order: {"name", "active", "composition", "blocks"}
    (blocks from `live_blocks`). Returns {"holds", "evidence", "growth_by_site", "intervals", ...}."""
    result = {"holds": False, "evidence": [], "growth_by_site": [], "allocating_site": None, "intervals": [],
              "points": len(points),
              "settled": True}
    warm = [i for i, p in enumerate(points) if p["composition"].get(fr.OPTIMIZER_STATE, 0) > 0]
    start = warm[0] if warm else 0
    pts = points[start:]
    if len(pts) < LEAK_MIN_POINTS:
        result["settled"] = False
        result["evidence"].append(
            f"{len(pts)} comparable snapshot(s) after warm-up: leak detection needs at least {LEAK_MIN_POINTS} "
            "(snapshots at the same point of successive epochs or every N steps)")
        return result
    def stays(j: int, a: dict, b: dict, grow: int, thresh: int) -> bool:
        # Growth counts only when what appeared is still live at the later point (not churn).
        return sum(k[1] for k in appeared(a["blocks"], b["blocks"])) >= grow * LEAK_PERSIST_SHARE

    best = _longest_growth_streak(pts, limit, stays, result["intervals"])
    if best < LEAK_MIN_INTERVALS:
        return result
    first, last = pts[0], pts[-1]
    # Blocks that appeared after the first point and are live at the last: attribute by site.
    kept = appeared(first["blocks"], last["blocks"])
    sites: Counter = Counter()
    for key in kept:
        sites[last["blocks"][key]] += key[1]
    growth_cat = {c: last["composition"].get(c, 0) - first["composition"].get(c, 0) for c in fr.CATEGORIES}
    params = last["composition"].get(fr.PARAMETERS, 0)
    opt = last["composition"].get(fr.OPTIMIZER_STATE, 0)
    total_growth = last["active"] - first["active"]
    only_opt = growth_cat[fr.OPTIMIZER_STATE] >= UNFREEZE_OPT_SHARE * total_growth
    if only_opt and params and opt <= UNFREEZE_STATE_MULTIPLE * params:
        result["evidence"].append(
            f"optimizer state grew by {_g(growth_cat[fr.OPTIMIZER_STATE])} but stays within 2x the "
            f"parameters ({_g(opt)} for {_g(params)} of parameters): new parameters started training "
            "(progressive unfreezing), not a leak")
        return result
    result["holds"] = True
    result["growth_by_site"] = [{"site": s, "bytes": n} for s, n in sites.most_common(5)]
    per = total_growth / max(1, len(pts) - 1)
    result["evidence"].append(
        f"live bytes grew from {_g(first['active'])} at {first['name']} to {_g(last['active'])} at "
        f"{last['name']} ({_g(per)} per interval, {best} consecutive intervals above threshold)")
    framed = [x for x in result["growth_by_site"] if x["site"] != fr.NO_FRAMES]
    unframed = sum(x["bytes"] for x in result["growth_by_site"] if x["site"] == fr.NO_FRAMES)
    if framed:
        top = framed[0]
        result["allocating_site"] = top["site"]
        result["evidence"].append(f"{_g(top['bytes'])} of blocks still live at {last['name']} were allocated "
                                  f"at {top['site']}")
    if unframed and (not framed or unframed > framed[0]["bytes"]):
        result["evidence"].append(
            f"{_g(unframed)} of the growth carries no allocation frames (allocated while history recording "
            f"was paused), so its line is not known from these snapshots: {HOW_TO_GET_FRAMES}")
    if only_opt and params and opt > UNFREEZE_STATE_MULTIPLE * params:
        result["evidence"].append(
            f"optimizer state is {_g(opt)}, more than 2x the {_g(params)} of parameters: an optimizer was "
            "re-created while the old one is still referenced")
    return result


def _g(n: float) -> str:
    return fmt_bytes(n, "brief")


def figure_points(figs: list[dict]) -> list[dict]:
    """Comparable points from the agent's per-step figures: live bytes (memory_allocated) at step
    boundaries, the same point of every step. One per epoch (its last step) where the figures span
    three epochs or more, else every k-th step (about six points). The first step, where gradients and
    optimizer state are created, is warm-up."""
    after = figs[1:]
    by_epoch: dict = {}
    for f in after:
        if f.get("epoch") is not None:
            by_epoch[f["epoch"]] = f
    if len(by_epoch) >= 3:
        picked = [by_epoch[e] for e in sorted(by_epoch)]
        return [{"name": f"the end of epoch {f['epoch']} (step {f['step']})", "active": f["allocated"]}
                for f in picked]
    k = max(1, len(after) // LEAK_FIGURE_POINTS)
    picked = after[::k] if after else []
    if after and picked[-1] is not after[-1]:
        picked.append(after[-1])
    return [{"name": f"the end of step {f['step']}", "active": f["allocated"]} for f in picked]


def detect_leak_from_figures(points: list[dict], limit: int | None) -> dict:
    """The leak test on `figure_points`: live bytes grow in at least two consecutive intervals, each by
    more than max(64 MiB, 1% of LIMIT or of A), and never fall back below what an interval reached
    (the growth stays live: the figures have no blocks to check it by)."""
    result = {"holds": False, "evidence": [], "growth_by_site": [], "allocating_site": None, "intervals": [],
              "points": len(points), "settled": len(points) >= LEAK_MIN_POINTS,
              "source": "the agent's per-step figures"}
    if len(points) < LEAK_MIN_POINTS:
        return result

    def stays(j: int, a: dict, b: dict, grow: int, thresh: int) -> bool:
        return min(p["active"] for p in points[j + 1:]) >= b["active"] - int(thresh * LEAK_FIGURES_FALLBACK_SHARE)

    best = _longest_growth_streak(points, limit, stays, result["intervals"])
    if best < LEAK_MIN_INTERVALS:
        return result
    first, last = points[0], points[-1]
    result["holds"] = True
    per = (last["active"] - first["active"]) / max(1, len(points) - 1)
    result["evidence"].append(
        f"live bytes at step boundaries (the agent's per-step figures) grew from {_g(first['active'])} at "
        f"{first['name']} to {_g(last['active'])} at {last['name']} ({_g(per)} per interval, {best} "
        "consecutive intervals above threshold, never falling back)")
    result["evidence"].append(f"which line allocates the growth is not known from the figures: {HOW_TO_GET_FRAMES}")
    return result


def _longest_growth_streak(points: list[dict], limit: int | None, stays, intervals: list[dict]) -> int:
    """The longest run of consecutive intervals whose live bytes grew by more than max(64 MiB, 1% of
    LIMIT or of A) and whose growth `stays(j, a, b, grow, thresh)` live; each interval is recorded."""
    streak = best = 0
    for j, (a, b) in enumerate(zip(points, points[1:], strict=False)):
        grow = b["active"] - a["active"]
        thresh = growth_threshold(limit, b["active"])
        ok = grow > thresh and stays(j, a, b, grow, thresh)
        intervals.append({"from": a["name"], "to": b["name"], "growth_bytes": grow,
                          "threshold_bytes": thresh, "grew": ok})
        streak = streak + 1 if ok else 0
        best = max(best, streak)
    return best


def growth_threshold(limit: int | None, active: int) -> int:
    """ARCHITECTURE.md cause 2: an interval grows when live bytes rise by more than max(64 MiB, 1% of
    LIMIT or of A)."""
    return max(LEAK_MIN_GROWTH_BYTES, int(LEAK_MIN_GROWTH_SHARE * (limit or active)))
