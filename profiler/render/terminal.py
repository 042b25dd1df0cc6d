"""The readable terminal report of `memq analyze` / `memq explain` (rich).

File names, frames and evidence come from foreign snapshots: every such value goes through
`rich_text` (control characters escaped, no markup), on a console that escapes the rest."""

from __future__ import annotations

from typing import TextIO

from rich.panel import Panel
from rich.table import Table

from memq.analysis.provenance import origin_words
from memq.analysis.recommend import stated_effect
from memq.playbook_doc import doc_link
from memq.render.reasons import split_unsettled, unsettled_lines
from memq.render.safe import rich_text as v
from memq.render.safe import safe_console
from memq.render.step_need_text import step_need_headline
from memq.render.words import pieces_text, said, verdict_head
from memq.units import fmt_bytes, sparkline


def render_analysis(r: dict, out: TextIO, width: int | None = None) -> None:
    con = safe_console(file=out, width=width or 110, highlight=False, soft_wrap=False)
    d = r["diagnosis"]
    det = r.get("details", {})
    m = r["metrics"]
    what, conf = verdict_head(d)
    head = f"[bold]{v(what)}[/bold] ({v(conf)})"
    files = v(", ".join(s["file"] for s in r["snapshots"]) or "OOM message")
    con.print(Panel(head, title="memq diagnosis", subtitle=files, expand=False))
    need = step_need_headline(d)
    if need:
        con.print(f"  [bold]{v(need)}[/bold]")
    for line in d["causes"][0]["evidence"]:
        con.print(f"  • {v(line)}")

    t = Table(title="Memory picture (last snapshot)" if r.get("snapshots") else "Memory picture (from the message)",
              show_header=True, header_style="bold")
    t.add_column("figure")
    t.add_column("value", justify="right")
    dm = det.get("metrics", {})
    rows = [
        ("reserved", m.get("reserved_bytes")), ("allocated", m.get("allocated_bytes")),
        ("active (allocated + awaiting free)", m.get("active_bytes")), ("requested", m.get("requested_bytes")),
        ("reserved but unallocated", m.get("reserved_unallocated_bytes")),
        ("rounding waste", dm.get("rounding_waste_bytes")),
        ("largest free block", m.get("largest_free_block_bytes")),
        ("stranded (free in segments with live blocks)", m.get("stranded_bytes")),
        ("private pools (CUDA graphs)", dm.get("private_pool_bytes")),
    ]
    for name, val in rows:
        if val is not None:
            t.add_row(name, fmt_bytes(val))
    # Free in pieces, as the lists, the report and the evidence say it; the fragmentation ratio (0.7-0.9 in
    # healthy runs and capacity OOMs alike) stays in the JSON only: shown here it read as a problem.
    if m.get("largest_free_block_bytes") is not None:
        t.add_row("free in pieces (outside the largest free block)", pieces_text(m))
    if dm.get("segment_count") is not None:
        t.add_row("segments", str(dm["segment_count"]))
        t.add_row("expandable segments", str(dm.get("expandable_segments")))
    con.print(t)

    pools = dm.get("pools") or []
    if pools:
        pt = Table(title="Free space by pool and stream", header_style="bold")
        for c in ("pool", "stream", "private pool", "segments", "reserved", "free", "largest free"):
            pt.add_column(c, justify="right" if c not in ("pool",) else "left")
        for p in pools[:8]:
            pt.add_row(v(p["pool"]), v(p["stream"]), v(tuple(p["pool_id"])), v(p["segments"]),
                       fmt_bytes(p["reserved_bytes"]), fmt_bytes(p["free_bytes"]),
                       fmt_bytes(p["largest_free_block_bytes"]))
        con.print(pt)

    oom = r.get("oom")
    if oom:
        lim = det.get("limits", {})
        ot = Table(title="OOM fit test", header_style="bold")
        ot.add_column("question")
        ot.add_column("answer")
        src = lim.get("requested_source") or ("the OOM message" if not r.get("snapshots") else None)
        ot.add_row("failed request", fmt_bytes(oom["requested_bytes"]) + (f" (from {v(src)})" if src else ""))
        floor = det.get("peak_reserved_bytes") if oom.get("limit_bytes") is None else None
        if floor:  # the fragmentation test's lower bound: the row says it, not a bare "unknown" beside it
            ot.add_row("limit", f"unknown; at least {fmt_bytes(floor)} (the allocator held that much earlier)")
        else:
            ot.add_row("limit", f"{fmt_bytes(oom['limit_bytes'])} ({v(lim.get('limit_source') or 'unknown')})")
        ot.add_row("fits the largest usable free block?",
                   _yn(oom["fits_largest_free_block"], lim.get("largest_usable_free_block_bytes"),
                       "unknown (a message does not give the free blocks)" if not r.get("snapshots")
                       else "unknown"))
        live = (r.get("metrics") or {}).get("active_bytes")
        if floor and live is not None and live + oom["requested_bytes"] <= floor:
            compacted = f"yes, under that lower bound ({fmt_bytes(live + oom['requested_bytes'])})"
        else:
            compacted = _yn(oom["fits_if_compacted"], None, "unknown (no limit)" if oom.get("limit_bytes") is None
                            else "unknown (the live bytes are not known)")
        ot.add_row("fits if the cache were compacted?", compacted)
        if lim.get("non_pytorch_bytes") is not None:
            ot.add_row("memory outside PyTorch", fmt_bytes(lim["non_pytorch_bytes"]))
        if lim.get("oom_site"):
            ot.add_row("where", v(lim["oom_site"]))
        con.print(ot)

    comp = r.get("composition") or {}
    if any(x for x in comp.values() if x):
        total = sum(x for x in comp.values() if x) or 1
        ct = Table(title="Composition of live memory", header_style="bold")
        ct.add_column("category")
        ct.add_column("bytes", justify="right")
        ct.add_column("share", justify="right")
        ct.add_column("top allocation site")
        ct.add_column("source")
        sites = det.get("composition_sites", {})
        origin = det.get("composition_origin") or {}
        for cat, val in sorted(comp.items(), key=lambda kv: -(kv[1] or 0)):
            if val:
                top = (sites.get(cat) or [{}])[0].get("site", "")
                ct.add_row(cat, fmt_bytes(val), f"{100 * val / total:.1f}%", v(top), origin_words(origin.get(cat)))
        con.print(ct)

    tl = det.get("timeline") or {}
    if tl.get("series"):
        con.print(f"[bold]Timeline[/bold] ({tl['events']} trace events, live bytes): "
                  f"{sparkline([p[1] for p in tl['series']], width=60)}")
        con.print(f"  peak {fmt_bytes(tl['peak_live_bytes'])} in phase {v(tl.get('peak_phase') or 'unknown')} "
                  f"at {v(tl.get('peak_site'))}; {tl.get('optimizer_steps', 0)} optimizer step(s) in the trace")
        for item in tl.get("live_at_peak", [])[:5]:
            con.print(f"    {fmt_bytes(item['bytes']):>12}  {v(item['site'])}")
    per = det.get("per_snapshot") or []
    if len(per) > 1:
        st = Table(title="Snapshots of the run", header_style="bold")
        for c in ("file", "active", "reserved", "peak live"):
            st.add_column(c, justify="left" if c == "file" else "right")
        for p in per:
            st.add_row(v(p["file"].rsplit("/", 1)[-1]), fmt_bytes(p["active_bytes"]), fmt_bytes(p["reserved_bytes"]),
                       fmt_bytes(p["peak_live_bytes"]))
        con.print(st)

    found, open_ = split_unsettled(d["causes"][1:])
    if found:
        con.print("[bold]Other causes considered[/bold]")
        for c in found:
            ev = "; ".join(c["evidence"]) or "-"
            con.print(f"  {v(said(c['cause']))} ({c['confidence']:.2f}): {v(ev)}")
    if open_:
        con.print("[bold]Not settled[/bold] (what would settle each)")
        for line in unsettled_lines(open_, d["causes"][0].get("evidence") or []):
            con.print(f"  {v(line)}")
    con.print("[bold]Recommendations[/bold]")
    for i, rec in enumerate(d["recommendations"], 1):
        effect = stated_effect(rec)
        con.print(f"  {i}. [bold]{v(rec['action'])}[/bold]\n     why: {v(rec['why'])}"
                  + (f"\n     effect: {v(effect)}" if effect else ""))
        link = doc_link(rec.get("playbook"))  # "" for a result stored before recommendations had one
        if link:
            con.print(f"     playbook: {v(link)}")
    # memq explain: the entries the message's figures point to, less those a recommendation above
    # already links (said once: the recommendation is that entry's advice)
    linked = {rec.get("playbook") for rec in d["recommendations"]}
    applies = [e for e in r.get("playbook") or [] if e.get("id") not in linked]
    if applies:
        con.print("[bold]Playbook[/bold] (also relevant)")
        for e in applies:
            con.print(f"  {v(doc_link(e['id']) or e['id'])} ({v(e['title'])}): {v(e['why'])}")
    for w in det.get("warnings", []):
        con.print(f"[yellow]note:[/yellow] {v(w)}")


def recommendation_lines(rec: dict) -> list[str]:
    """One recommendation as markup lines for a summary panel (memq ingest, memq demo): the action, its
    effect and its playbook link, every value escaped (actions name frames from the snapshot)."""
    effect = stated_effect(rec)
    lines = [f"-> {v(rec['action'])}" + (f": {v(effect)}" if effect else "")]
    link = doc_link(rec.get("playbook"))
    if link:
        lines.append(f"   playbook: {v(link)}")
    return lines


def _yn(v, figure, unknown: str) -> str:
    """yes / no, or why the answer is unknown (each question has its own reason)."""
    if v is None:
        return unknown
    s = "yes" if v else "no"
    return f"{s} (largest usable block {fmt_bytes(figure)})" if figure is not None else s
