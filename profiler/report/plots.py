"""Plots for reports and `memq plot`, drawn with matplotlib's Agg backend (no display needed).

- `timeline_figure(tl)`: a run's memory over time: reserved and allocated (stat samples, else the
  snapshots), the limit, every snapshot as a marker, and the OOM (the failed request stacked on
  what was reserved).
- `cause_figure(breakdown)`: OOMs and near misses by root cause.
- `trend_figure(trend)`: fragmentation and OOMs per day.
`to_svg(fig)` gives inline SVG text (for a self-contained HTML file), `to_png(fig)` PNG bytes.
matplotlib is imported lazily: `memq report --format json` never loads it.
"""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

from memq.render.words import said

GiB = 1024**3
COLORS = {"reserved": "#4c72b0", "allocated": "#55a868", "limit": "#c44e52", "oom": "#c44e52",
          "snapshot": "#8172b2", "near": "#dd8452", "frag": "#937860"}


def _plt():
    import matplotlib  # when a chart is drawn, not when `memq serve` or a worker starts (pinned)

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    plt.rcParams.update({"svg.fonttype": "none", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "svg.hashsalt": "memq"})
    return plt


def plain(text: str) -> str:
    """Names from agents and users shown as typed: `$` would start matplotlib's mathtext."""
    return text.replace("$", r"\$")


def _t(s: str | None) -> dt.datetime | None:
    if not s:
        return None
    return dt.datetime.fromisoformat(s.replace("Z", "+00:00"))


def timeline_figure(tl: dict[str, Any], width: float = 9.0, height: float = 3.4):
    """A figure of one run's memory timeline (see module docstring). X: seconds since the first point."""
    plt = _plt()
    # Fixed margins, not layout="constrained": it costs ~40% of the drawing time, and a report
    # draws a dozen of these. The legend sits in the right margin.
    fig, ax = plt.subplots(figsize=(width, height))
    fig.subplots_adjust(left=0.07, right=0.80, bottom=0.16, top=0.90)
    times = [_t(p["t"]) for p in tl["series"]] + [_t(s["t"]) for s in tl["snapshots"]]
    times = [t for t in times if t is not None]
    t0 = min(times) if times else None

    span = (max(times) - t0).total_seconds() if times else 0.0
    unit, per = (("hours", 3600.0) if span > 3 * 3600 else ("minutes", 60.0) if span > 3 * 60 else ("seconds", 1.0))

    def x(s: str | None) -> float:
        t = _t(s)
        return (t - t0).total_seconds() / per if t is not None and t0 is not None else 0.0

    if tl["series"]:
        xs = [x(p["t"]) for p in tl["series"]]
        ax.step(xs, [(p["reserved_bytes"] or 0) / GiB for p in tl["series"]], where="post",
                color=COLORS["reserved"], label="reserved", lw=1.4)
        ax.step(xs, [(p["allocated_bytes"] or 0) / GiB for p in tl["series"]], where="post",
                color=COLORS["allocated"], label="allocated", lw=1.4)
        source = "stat samples (max per bucket)"
    else:
        snaps = [s for s in tl["snapshots"] if s["reserved_bytes"] is not None]
        xs = [x(s["t"]) for s in snaps]
        ax.plot(xs, [s["reserved_bytes"] / GiB for s in snaps], "-o", color=COLORS["reserved"], label="reserved",
                ms=3, lw=1.4)
        ax.plot(xs, [(s["allocated_bytes"] or 0) / GiB for s in snaps], "-o", color=COLORS["allocated"],
                label="allocated", ms=3, lw=1.4)
        source = "snapshots"
    snaps = [s for s in tl["snapshots"] if s["trigger"] != "oom" and not s.get("oom")]
    if snaps:
        ax.scatter([x(s["t"]) for s in snaps], [(s["reserved_bytes"] or 0) / GiB for s in snaps], marker="v",
                   color=COLORS["snapshot"], zorder=5, s=22, label="snapshot")
    if tl.get("limit_bytes"):
        ax.axhline(tl["limit_bytes"] / GiB, color=COLORS["limit"], ls="--", lw=1.1,
                   label=f"limit {tl['limit_bytes'] / GiB:.2f} GiB")
    oom = tl.get("oom")
    if oom:
        ox = x(oom["t"])
        base = (oom["reserved_bytes"] or 0) / GiB
        ax.axvline(ox, color=COLORS["oom"], lw=0.8, alpha=0.5)
        ax.scatter([ox], [base], marker="X", s=80, color=COLORS["oom"], zorder=6, label="OOM")
        if oom.get("requested_bytes"):
            req = oom["requested_bytes"] / GiB
            low = (oom["allocated_bytes"] or 0) / GiB
            ax.vlines([ox], [low], [low + req], color=COLORS["oom"], lw=7, alpha=0.35,
                      label=f"live + request {req:.2f} GiB")
    ax.set_ylim(bottom=0)
    if span > 0:
        ax.set_xlabel(f"{unit} since {t0.strftime('%Y-%m-%d %H:%M:%S') if t0 else '-'} UTC ({source})")
    else:
        # one moment (a run with one snapshot): a time axis would be matplotlib's +-1e-17 around 0, with
        # five identical tick labels; the point sits mid-plot under one tick that names the moment
        ax.set_xlim(-1.0, 1.0)
        ax.set_xticks([0.0], [t0.strftime("%H:%M:%S") if t0 else "-"])
        ax.set_xlabel(f"one moment, {t0.strftime('%Y-%m-%d') if t0 else '-'} UTC ({source})")
    ax.set_ylabel("GiB")
    cause = ("undetermined" if tl.get("undetermined") else said(tl.get("primary_cause"))) \
        if tl.get("primary_cause") else "not analysed"
    title = f"{tl['run']}  ({tl.get('job') or '-'} / {tl.get('cluster') or '-'}, {tl.get('status')}, {cause})"
    ax.set_title(plain(title), loc="left", fontsize=10)
    ax.grid(alpha=0.25)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, framealpha=0.8)
    return fig


def cause_figure(by_cause: list[dict], width: float = 6.0):
    plt = _plt()
    rows = list(reversed(by_cause)) or [{"cause": "none", "ooms": 0, "near_misses": 0}]
    h = 0.45 * len(rows) + 1.0
    fig, ax = plt.subplots(figsize=(width, h))
    fig.subplots_adjust(left=0.26, right=0.80, bottom=0.75 / h, top=1 - 0.35 / h)
    ys = range(len(rows))
    o = [r["ooms"] for r in rows]
    n = [r["near_misses"] for r in rows]
    ax.barh(ys, o, color=COLORS["oom"], label="OOM runs")
    ax.barh(ys, n, left=o, color=COLORS["near"], label="near misses")  # a legend names the series
    ax.set_yticks(list(ys), [said(r["cause"]) for r in rows])
    ax.set_xlabel("runs")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.set_title("OOMs and near misses by root cause", loc="left", fontsize=10)
    return fig


def trend_figure(trend: list[dict], width: float = 6.0):
    plt = _plt()
    fig, ax = plt.subplots(figsize=(width, 2.8))
    fig.subplots_adjust(left=0.11, right=0.89, bottom=0.12, top=0.89)
    dates = [p["date"][5:] for p in trend]
    xs = list(range(len(trend)))
    frag = [p["mean_pieces_share"] if p.get("mean_pieces_share") is not None else float("nan") for p in trend]
    ax.plot(xs, frag, "-o", color=COLORS["frag"], ms=4, label="mean pieces of flagged runs")
    ax.set_ylim(0, 1)
    ax.set_ylabel("pieces (share of reserved)")
    ax2 = ax.twinx()
    ax2.bar(xs, [p["oom_runs"] or 0 for p in trend], color=COLORS["oom"], alpha=0.25, width=0.5, label="OOM runs")
    ax2.set_ylabel("OOM runs")
    ax2.yaxis.get_major_locator().set_params(integer=True)
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    ax.set_xticks(xs, dates)
    ax.set_title("fragmentation trend", loc="left", fontsize=10)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="upper left", fontsize=8)
    return fig


def to_svg(fig) -> str:
    """The figure as an inline <svg> element (no XML prolog, no DOCTYPE), then closed."""
    plt = _plt()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def to_png(fig, dpi: int = 110) -> bytes:
    plt = _plt()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    plt.close(fig)
    return buf.getvalue()
