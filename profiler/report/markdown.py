"""The report as Markdown (chat, mail, the webhook): the summary and the tables, no plots."""

from __future__ import annotations

from typing import Any

from memq.analysis.rules import NEAR_MISS_SHARE
from memq.playbook_doc import doc_link
from memq.render.words import said
from memq.report.data import simulated_outcome
from memq.units import fmt_bytes


def _b(v) -> str:
    return fmt_bytes(v, unknown="-")


def _share(v) -> str:
    return "-" if v is None else f"{v:.2f}"


def _sim(r: dict) -> str:
    sim = r.get("simulated") or {}
    if "predicted_oom" not in sim:
        return "-"
    out = simulated_outcome(sim)
    if sim["predicted_oom"] is not None:
        out += f", peak reserved {_b(sim['peak_reserved_bytes'])}"
    return out + (f": {sim['reason']}" if sim.get("reason") else "")


def _with_playbook(text: Any, entry_id: Any) -> Any:
    """The advice and the playbook entry that measures it (nothing added for a report stored before
    recommendations named one)."""
    link = doc_link(entry_id)
    return f"{text} (playbook: {link})" if link and text else text


def _cell(v: Any) -> str:
    return str("-" if v is None or v == "" else v).replace("|", "\\|").replace("\n", " ")


def _table(head: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out + [""]


def render_markdown(doc: dict[str, Any], *, summary_only: bool = False) -> str:
    L = [f"# memq report {doc['date']} ({doc['scope_label']})", ""]
    L += [f"- {line}" for line in doc["summary"]] + [""]
    if summary_only:
        return "\n".join(L)
    t = doc["totals"]
    L += _table(["runs", "OOM runs", "near misses", "completed", "crashed", "running"],
                [[t["runs"], t["oom_runs"], t["near_misses"], t["completed"], t["crashed"], t["running"]]])
    L += ["## OOMs and near misses by root cause", ""]
    if doc["breakdown"]["by_cause"]:
        L += _table(["cause", "OOM runs", "near misses"],
                    [[said(r["cause"]), r["ooms"], r["near_misses"]] for r in doc["breakdown"]["by_cause"]])
        L += _table(["cluster", "OOM runs", "near misses"],
                    [[r["cluster"], r["ooms"], r["near_misses"]] for r in doc["breakdown"]["by_cluster"]])
        L += _table(["job", "OOM runs", "near misses"],
                    [[r["job"], r["ooms"], r["near_misses"]] for r in doc["breakdown"]["by_job"]])
    else:
        L += ["No OOM and no near miss.", ""]
    if doc["ooms"]["runs"]:
        L += ["### OOM runs", ""]
        L += _table(["run", "job", "cluster", "torch", "cause", "request", "limit", "recommendation"],
                    [[r["run"], r["job"], r["cluster"], r["torch_version"],
                      said(r["primary_cause"]) + (f" ({r['step_need']})" if r.get("step_need") else ""),
                      _b(r["requested_bytes"]),
                      _b(r["limit_bytes"]), _with_playbook(r["recommendation"], r.get("recommendation_playbook"))]
                     for r in doc["ooms"]["runs"]])
    if doc["near_misses"]["runs"]:
        L += [f"### Near misses (headroom under {NEAR_MISS_SHARE:.0%} of the limit)", ""]
        L += _table(["run", "job", "cluster", "peak reserved", "limit", "headroom"],
                    [[r["run"], r["job"], r["cluster"], _b(r["peak_reserved_bytes"]), _b(r["limit_bytes"]),
                      f"{_b(r['headroom_bytes'])} ({100 * r['headroom_ratio']:.1f}%)"]
                     for r in doc["near_misses"]["runs"]])
    L += ["## Regressions by torch version", ""]
    if doc["regressions"]:
        L += _table(["job", "torch", "OOM rate", "mean peak reserved", "what got worse", "new"],
                    [[r["job"], f"{r['previous_version']} -> {r['torch_version']}",
                      f"{100 * r['previous_oom_rate']:.0f}% -> {100 * r['oom_rate']:.0f}%",
                      f"{_b(r['previous_mean_peak_reserved_bytes'])} -> {_b(r['mean_peak_reserved_bytes'])}",
                      "; ".join(r["reasons"]), "new" if r["new"] else ""] for r in doc["regressions"]])
    else:
        L += ["None.", ""]
    L += ["## Most fragmented runs", ""]
    if doc["fragmented"]:
        L += _table(["run", "job", "cause", "pieces", "free in pieces", "setting that would help",
                     "allocator model with it"],
                    [[r["run"], r["job"], said(r["primary_cause"]), _share(r.get("share_of_reserved")),
                      _b(r["fragmented_free_bytes"]),
                      _with_playbook(f"`{r['setting']}`" if r["setting"] else "-", r.get("playbook")), _sim(r)]
                     for r in doc["fragmented"]])
    else:
        L += ["None.", ""]
    L += ["## Memory that grows across epochs", ""]
    if doc["growing"]:
        L += _table(["run", "job", "cause", "growth", "source"],
                    [[g["run"], g["job"], said(g["primary_cause"]), "+" + _b(g["growth_bytes"]),
                      g["source"] + (f"; forecast: {g['forecast']}" if g.get("forecast") else "")]
                     for g in doc["growing"]])
    else:
        L += ["None.", ""]
    L += ["## Changes since the previous report", ""]
    ch = doc.get("changes")
    if ch:
        L += [f"Against {ch['previous_date']} ({ch['previous_source']}):", ""] + [f"- {x}" for x in ch["lines"]] + [""]
    else:
        L += ["No earlier report.", ""]
    return "\n".join(L)
