"""`memq fit`'s text: the prediction, whether it fits, the largest batch, what dominates the peak."""

from __future__ import annotations

from memq.render.safe import safe_text
from memq.units import fmt_bytes


def _shape(doc: dict) -> str:
    parts = []
    if doc.get("batch") is not None:
        parts.append(f"batch {doc['from_batch']} -> {doc['batch']}")
    if doc.get("seq") is not None:
        parts.append(f"length {doc['from_seq']} -> {doc['seq']}")
    opt = doc.get("optimizer") or {}
    if opt.get("predicted") and opt.get("predicted") != opt.get("recorded"):
        parts.append(f"optimizer {opt.get('recorded')} -> {opt['predicted']}")
    return ", ".join(parts) or "the measured shape"


def _span(doc: dict, unit: str, suffix: str = "") -> str:
    """The interval of a largest batch, length or scale: always said, even when both ends agree."""
    lo, hi = doc.get(f"max_{unit}_low"), doc.get(f"max_{unit}_high")
    if lo is None or hi is None:
        return ""
    return f" ({lo:g}{suffix}-{hi:g}{suffix} within the interval)"


def fits_word(v: bool | None) -> str:
    return {True: "yes", False: "no", None: "undetermined (the interval straddles the limit)"}[v]


CLI_LIMIT_HOW = "give --limit SIZE or --gpu NAME"
WEB_LIMIT_HOW = "give a limit or a GPU"


def answer_line(doc: dict, limit_how: str = CLI_LIMIT_HOW) -> str:
    """`memq fit` in one line: does the asked shape fit, with what headroom, and the largest that does (the
    same words on the terminal and the web page; `limit_how` says how each screen takes a limit)."""
    lim, shape = doc.get("limit_bytes"), _shape(doc)
    largest = ""
    for unit, name in (("batch", "batch"), ("seq", "sequence length")):
        if doc.get(f"max_{unit}") is not None:
            largest = f"; largest {name} that fits: {doc[f'max_{unit}'] or 'none'}{_span(doc, unit)}"
            break
    if lim is None:
        return f"answer: {shape} needs about {fmt_bytes(doc['peak_bytes'])}; whether it fits is undetermined " \
               f"(no limit known: {limit_how})"
    if doc["fits"] is True:
        room = doc.get("headroom_bytes")
        if room is not None and room < 0:  # over the limit uncapped, served under the cap
            return f"answer: {shape} fits the {fmt_bytes(lim)} limit (the allocator frees its cache under the " \
                   f"cap){largest}"
        return (f"answer: {shape} fits the {fmt_bytes(lim)} limit, {fmt_bytes(room)} "
                f"headroom{largest}")
    if doc["fits"] is False:
        return f"answer: {shape} does not fit the {fmt_bytes(lim)} limit (needs about " \
               f"{fmt_bytes(doc['peak_bytes'])}){largest}"
    return f"answer: {shape} may or may not fit the {fmt_bytes(lim)} limit (the interval straddles it){largest}"


def render_fit(doc: dict) -> str:
    lines = [answer_line(doc), f"measured: {safe_text(doc.get('source') or '')}"]
    lim = doc.get("limit_bytes")
    lines.append(f"{_shape(doc)} ({doc['scale']:g}x the measured input-sized tensors)")
    lines.append(f"  predicted peak reserved  {fmt_bytes(doc['peak_bytes'])} ({fmt_bytes(doc['low'])} - "
                 f"{fmt_bytes(doc['high'])}), peak allocated {fmt_bytes(doc['peak_allocated_bytes'])}")
    if doc.get("margin") is not None:
        lines.append(f"  interval +/-{doc['margin']:.0%}: {safe_text(doc.get('margin_reason') or '')}")
    if lim is None:
        lines.append("  fits: undetermined: no limit known (give --limit SIZE or --gpu NAME)")
    else:
        lines.append(f"  limit {fmt_bytes(lim)} ({safe_text(doc.get('limit_source') or '')})")
        room = doc.get("headroom_bytes")
        tail = ""
        if doc["fits"] and room is not None and room >= 0:
            lo, hi = doc.get("headroom_low"), doc.get("headroom_high")
            tail = f", {fmt_bytes(room)} headroom" + (f" ({fmt_bytes(lo)} - {fmt_bytes(hi)})" if lo is not None else "")
        lines.append(f"  fits: {fits_word(doc['fits'])}{tail}")
        if doc.get("fits_reason"):
            lines.append(f"    because {safe_text(doc['fits_reason'])}")
        for unit in ("batch", "seq"):
            v = doc.get(f"max_{unit}")
            if v is None:
                continue
            name = "batch" if unit == "batch" else "sequence length"
            lines.append(f"  largest {name} that fits: {v}{_span(doc, unit)}" if v else
                         f"  largest {name} that fits: none (even 1 does not fit){_span(doc, unit)}")
        if doc.get("max_scale") is not None:
            lines.append(f"  headroom in input units: {doc['max_scale']:g}x the measured input fits"
                         f"{_span(doc, 'scale', 'x')}")
    dom = doc.get("dominant") or []
    if dom:
        lines.append("  the peak: " + ", ".join(f"{d['kind']} {fmt_bytes(d['bytes'])} ({d['share']:.0%})" for d in dom))
    lines.append("  " + measured_line(doc))
    lines.append(f"basis: {doc['basis']}")
    for part in doc.get("inferred") or []:
        lines.append(f"inferred: {safe_text(part)}")
    for n in doc.get("notes") or []:
        lines.append(f"note: {n}")
    return "\n".join(lines) + "\n"


def measured_line(doc: dict) -> str:
    """What was measured: the recorded peak over whole steps, or the modelled one of a part of the first step."""
    meas = doc.get("measured") or {}
    if meas.get("partial_step"):
        return (f"modelled peak reserved {fmt_bytes(meas.get('peak_bytes'))} at the measured shape: the trace "
                f"holds the first step's {meas['partial_step']} only")
    if meas.get("autotuning_left_out") and meas.get("recorded_peak_bytes"):
        return (f"measured peak reserved {fmt_bytes(meas['recorded_peak_bytes'])} over "
                f"{meas.get('optimizer_steps')} optimizer steps, a first run that autotuned; a restart's at that "
                f"shape (the autotuning left out) {fmt_bytes(meas.get('peak_bytes'))}")
    return (f"measured peak reserved {fmt_bytes(meas.get('peak_bytes'))} over {meas.get('optimizer_steps')} "
            "optimizer steps")


def own_fit_line(fit: dict | None) -> str | None:
    """The history panel's line for a run's own `fit` (None when the run has none)."""
    if not fit:
        return None
    head = f"fit: peak {fmt_bytes(fit['peak_bytes'])} reserved at its own batch"
    if fit.get("recorded_peak_bytes"):  # a compiled run that autotuned: the figure above is a restart's
        head = (f"fit: peak {fmt_bytes(fit['recorded_peak_bytes'])} reserved at its own batch, a first run that "
                f"autotuned; a restart's {fmt_bytes(fit['peak_bytes'])}")
    if fit.get("limit_bytes") is None:
        return head + " (no limit known: `memq fit --run R --limit SIZE` for the largest batch)"
    if fit.get("max_scale") is None:
        return head
    return head + (f"; {fit['max_scale']:g}x its batch fits the {fmt_bytes(fit['limit_bytes'])} limit "
                   "(`memq fit --run R --batch B --from-batch B0` for one size)")
