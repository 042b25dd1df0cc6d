"""The leak verdict: the growth model (growth.py) on a run's series, with the blocks that make it.

ARCHITECTURE.md cause 2. Whether live bytes grow is growth.py's alone; this module picks the series
(`series`: the agent's per-step figures where it has them, else comparable snapshots), keeps the
exceptions that need the snapshots (optimizer state of parameters that start training; growth that is
not blocks staying live), and attributes the growth to the lines that allocated it.
"""

from __future__ import annotations

from collections import Counter

from memq.analysis import frames as fr
from memq.analysis import growth as gm
from memq.analysis.rules import (
    GROWTH_FEW_POINTS,
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


def figure_series(figures: list[dict]) -> tuple[list[gm.Point], str]:
    """The agent's per-step figures as growth points and their unit: live bytes at every step boundary
    after the first optimizer step (step 0's boundary is where gradients and optimizer state appear:
    warm-up), x = step; where live bytes move only between epochs, each epoch's last boundary, x = epoch
    (a step series would be a staircase whose pairwise slopes are mostly zero: pairs inside one epoch).
    Figures come from other people's jobs: one with a field of another type is left out."""
    out, seen = [], set()
    for f in figures:
        step, live = f.get("step"), f.get("allocated")
        if not (_int(step) and _int(live)) or step < 1 or live < 0 or step in seen:
            continue
        seen.add(step)
        ep = f.get("epoch") if _int(f.get("epoch")) else None
        t = f.get("t") if isinstance(f.get("t"), (int, float)) and not isinstance(f.get("t"), bool) else None
        out.append(gm.Point(x=float(step), live=int(live), label=f"step {step}", step=step, epoch=ep, t=t))
    out.sort(key=lambda p: p.x)
    if grows_between_epochs(figures):
        last: dict[int, gm.Point] = {}
        for p in out:
            if p.epoch is not None:
                last[p.epoch] = p
        if len(last) >= GROWTH_FEW_POINTS:
            return [gm.Point(x=float(e), live=p.live, label=f"the end of epoch {e} (step {p.step})", step=p.step,
                             epoch=e, t=p.t) for e, p in sorted(last.items())], "epoch"
    return out, "step"


def grows_between_epochs(figures: list[dict]) -> bool:
    """True when live bytes move only from one epoch to the next (validation, a checkpoint copy, a new
    optimizer), not from step to step inside an epoch."""
    within = between = 0
    figures = [f for f in figures if _int(f.get("allocated")) and _int(f.get("step"))]
    for a, b in zip(figures, figures[1:], strict=False):
        if a.get("epoch") is None or b.get("epoch") is None or a.get("step", 0) < 1:
            continue
        d = abs(int(b["allocated"]) - int(a["allocated"]))
        if a["epoch"] == b["epoch"]:
            within += d
        else:
            between += d
    return between > 4 * within





def snapshot_series(points: list[dict]) -> tuple[list[gm.Point], str]:
    """Comparable snapshots as growth points, and their unit: epochs for epoch-end snapshots (numbered
    in order where the files do not say), else steps where every one knows its step, else the order."""
    if points and all(p.get("epoch_end") for p in points):
        known = all(_int(p.get("epoch")) for p in points)
        return [gm.Point(x=float(p["epoch"] if known else i), live=int(p["active"]), label=p["name"],
                         epoch=p["epoch"] if known else i, step=p.get("step") if _int(p.get("step")) else None,
                         t=p.get("t")) for i, p in enumerate(points)], "epoch"
    if points and all(_int(p.get("step")) for p in points):
        return [gm.Point(x=float(p["step"]), live=int(p["active"]), label=p["name"], step=p["step"],
                         epoch=p.get("epoch"), t=p.get("t")) for p in points], "step"
    return [gm.Point(x=float(i), live=int(p["active"]), label=p["name"], t=p.get("t"))
            for i, p in enumerate(points)], "point"


def after_warmup(points: list[dict]) -> list[dict]:
    """Comparable snapshots from the first that holds optimizer state on (the first optimizer step
    creates gradients and state: growth up to it is not a leak)."""
    warm = [i for i, p in enumerate(points) if p["composition"].get(fr.OPTIMIZER_STATE, 0) > 0]
    return points[warm[0] if warm else 0:]


def choose_series(snap_points: list[dict], figures: list[dict]) -> tuple[list[gm.Point], str, str]:
    """(points, unit, source): the per-step figures where they hold enough points (every step boundary
    is a comparable point, and there are many more of them), else the comparable snapshots."""
    figs, unit = figure_series(figures)
    if len(figs) >= GROWTH_FEW_POINTS:
        return figs, unit, "the agent's figures at every step boundary"
    pts, unit = snapshot_series(after_warmup(snap_points))
    return pts, unit, "comparable snapshots"


def detect_leak(points: list[dict], limit: int | None, figures: list[dict] | None = None,
                headroom: int | None = None, at_oom: bool = False) -> dict:
    """`points`: per comparable snapshot, in time order: {"name", "active", "composition", "blocks"}
    (blocks from `live_blocks`) and, where known, "step", "epoch", "epoch_end", "t". `figures`: the
    agent's per-step figures. Returns {"holds", "settled", "evidence", "growth", "growth_by_site",
    "allocating_site", "points", "source"}."""
    series, unit, source = choose_series(points, figures or [])
    g = gm.assess(series, unit, limit=limit, headroom=headroom, at_oom=at_oom)
    result = {"holds": False, "evidence": [], "growth_by_site": [], "allocating_site": None,
              "points": len(series), "settled": g.state != "too_few", "source": source, "growth": g.as_json()}
    if not result["settled"]:
        result["evidence"].append(f"leak: not settled: {g.why} ({source})")
        return result
    snaps = after_warmup(points)
    if not g.leak:
        if g.state == "plateau":
            result["evidence"].append(f"not a leak: {g.why}")
        return result
    if len(snaps) >= 2:
        first, last = snaps[0], snaps[-1]
        growth_cat = {c: last["composition"].get(c, 0) - first["composition"].get(c, 0) for c in fr.CATEGORIES}
        params = last["composition"].get(fr.PARAMETERS, 0)
        opt = last["composition"].get(fr.OPTIMIZER_STATE, 0)
        total_growth = last["active"] - first["active"]
        only_opt = total_growth > 0 and growth_cat[fr.OPTIMIZER_STATE] >= UNFREEZE_OPT_SHARE * total_growth
        if only_opt and params and opt <= UNFREEZE_STATE_MULTIPLE * params:
            result["evidence"].append(
                f"optimizer state grew by {_g(growth_cat[fr.OPTIMIZER_STATE])} but stays within 2x the "
                f"parameters ({_g(opt)} for {_g(params)} of parameters): new parameters started training "
                "(progressive unfreezing), not a leak")
            return result
        kept = appeared(first["blocks"], last["blocks"])
        kept_bytes = sum(k[1] for k in kept)
        if source == "comparable snapshots" and total_growth > 0 and kept_bytes < LEAK_PERSIST_SHARE * total_growth:
            result["evidence"].append(
                f"live bytes grew by {_g(total_growth)}, but only {_g(kept_bytes)} of it is blocks that stay "
                "live from one point to the next (the rest is a step's own churn): not a leak")
            return result
        sites: Counter = Counter()
        for key in kept:
            sites[last["blocks"][key]] += key[1]
        result["growth_by_site"] = [{"site": s, "bytes": n} for s, n in sites.most_common(5)]
        if only_opt and params and opt > UNFREEZE_STATE_MULTIPLE * params:
            result["evidence"].append(
                f"optimizer state is {_g(opt)}, more than 2x the {_g(params)} of parameters: an optimizer was "
                "re-created while the old one is still referenced")
    result["holds"] = True
    result["evidence"].insert(0, f"{g.why} ({source})")
    framed = [x for x in result["growth_by_site"] if x["site"] != fr.NO_FRAMES]
    unframed = sum(x["bytes"] for x in result["growth_by_site"] if x["site"] == fr.NO_FRAMES)
    last_name = snaps[-1]["name"] if snaps else None
    if framed:
        top = framed[0]
        result["allocating_site"] = top["site"]
        result["evidence"].append(f"{_g(top['bytes'])} of blocks still live at {last_name} were allocated "
                                  f"at {top['site']}")
    if unframed and (not framed or unframed > framed[0]["bytes"]):
        result["evidence"].append(
            f"{_g(unframed)} of the growth carries no allocation frames (allocated while history recording "
            f"was paused), so its line is not known from these snapshots: {HOW_TO_GET_FRAMES}")
    if not framed and not unframed:
        result["evidence"].append(f"which line allocates the growth is not known from the figures: "
                                  f"{HOW_TO_GET_FRAMES}")
    return result


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _g(n: float) -> str:
    return fmt_bytes(n, "brief")
