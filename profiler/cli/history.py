"""`memq runs`, `memq history`, `memq compare`, `memq versions`: questions to the run history."""

from __future__ import annotations

import time

import click
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table

from memq.analysis.frames import CATEGORIES
from memq.cli._listing import (
    Col,
    cell,
    console,
    emit,
    open_cli_store,
    out_format,
    output_options,
    parse_labels,
    parse_since,
    table,
    write_csv,
    write_json,
)
from memq.model import CAUSE_NAMES, RUN_STATUSES
from memq.pipeline.history import RunFilter, compare_runs, list_runs, run_history, torch_versions
from memq.playbook_doc import doc_link
from memq.render.fit_text import own_fit_line
from memq.render.forecast_text import forecast_line
from memq.render.reasons import changes_once, panel_cause_lines, said_once
from memq.render.safe import rich_text
from memq.render.step_need_text import step_need_line
from memq.render.words import labelled, plural, said, verdict_head, verdict_headline
from memq.units import fmt_bytes, sparkline

RUN_COLS = [Col("run", "run"), Col("job", "job"), Col("cluster", "cluster"), Col("status", "status"),
            Col("cause_shown", "cause"), Col("cause_confidence", "conf", "conf"),
            Col("peak_reserved_bytes", "peak reserved", "bytes"),
            Col("peak_allocated_bytes", "peak allocated", "bytes"),
            Col("pieces_share", "pieces", "ratio"), Col("snapshot_count", "snaps", "int"),
            Col("oom_forecast_at", "OOM due (UTC)", "time"), Col("torch_version", "torch"),
            Col("started_at", "started (UTC)", "time")]
RUN_CSV = ["run", "job", "cluster", "host", "status", "primary_cause", "undetermined", "cause_confidence",
           "peak_reserved_bytes",
           "peak_allocated_bytes", "pieces_share", "fragmentation_ratio", "oom_count", "snapshot_count",
           "torch_version",
           "cuda_version", "gpu_model", "memory_limit_bytes", "optimizer", "started_at", "ended_at", "labels"]


@click.command()
@click.option("--cluster")
@click.option("--job")
@click.option("--torch-version", help="Exact, or a prefix such as 2.11.")
@click.option("--status", type=click.Choice(RUN_STATUSES))
@click.option("--cause", type=click.Choice(CAUSE_NAMES), help="Run-level primary cause.")
@click.option("--since", help="Started within (7d, 24h, 30m) or since a date (2026-11-01).")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Repeatable; all must match.")
@click.option("--rows", "-n", "limit", type=click.IntRange(1, 100_000), default=50, show_default=True,
              help="How many runs to list.")
@click.option("--limit", "memory_limit", hidden=True, expose_value=False, callback=lambda ctx, p, v: _no_limit(v))
@output_options()
def runs(cluster, job, torch_version, status, cause, since, labels, limit, as_json, as_csv):
    """List runs, newest first.

    `pieces`: at the OOM, the share of reserved memory that was free in pieces (outside the largest free
    block); - for a run without an OOM."""
    fmt = out_format(as_json, as_csv)
    f = RunFilter(cluster=cluster, job=job, torch_version=torch_version, status=status, cause=cause,
                  since=parse_since(since), labels=parse_labels(labels), limit=limit)
    store = open_cli_store()
    with store.session() as s:
        rows = list_runs(s, f)
    emit(fmt, {"runs": rows, "count": len(rows)}, shown_runs(rows), RUN_COLS, title=plural(len(rows), "run"),
         csv_keys=RUN_CSV, empty="no runs match")


def shown_runs(rows: list[dict]) -> list[dict]:
    """The rows a RUN_COLS table prints (`memq runs`, the demo): the cause cell in words, and
    "undetermined" where the run page says so (the candidate stays in the JSON's primary_cause)."""
    return [r | {"cause_shown": "undetermined" if r.get("undetermined") else said(r.get("primary_cause"))}
            for r in rows]


def _no_limit(value):
    # everywhere else --limit is a memory size; a row count under the same name would be read as one
    if value is not None:
        raise click.UsageError(f"--limit is a memory limit in memq; to list {value} runs use --rows {value} "
                               f"(or -n {value})")


SNAP_COLS = [Col("rank", "rank", "int"), Col("step", "step", "int"), Col("epoch", "epoch", "int"),
             Col("trigger", "trigger"), Col("taken_at", "taken (UTC)", "time"),
             Col("reserved_bytes", "reserved", "bytes"), Col("allocated_bytes", "allocated", "bytes"),
             Col("free_in_pieces_bytes", "free in pieces", "bytes"),
             Col("largest_free_block_bytes", "largest free", "bytes"),
             Col("cause_shown", "diagnosis"), Col("confidence", "conf", "conf")]
SNAP_CSV = ["id", "rank", "step", "epoch", "trigger", "taken_at", "sha256", "size_bytes", "state", "analyzer_version",
            "reserved_bytes", "allocated_bytes", "active_bytes", "fragmentation_ratio", "free_in_pieces_bytes",
            "largest_free_block_bytes",
            "cause", "confidence"]


def _flat(s: dict) -> dict:
    d = s.get("diagnosis") or {}
    return s | {"cause": d.get("primary_cause"), "confidence": d.get("confidence"),
                "cause_shown": verdict_head(d)[0] if d.get("primary_cause") else None}


@click.command()
@click.option("--run", "run_name", required=True)
@click.option("--rank", type=int, help="Only this rank (default: all ranks).")
@click.option("--points", type=click.IntRange(2, 1000), default=60, show_default=True,
              help="Buckets of the stat-sample timeline.")
@output_options()
def history(run_name, rank, points, as_json, as_csv):
    """A run's snapshots in time order, its diagnosis, what changed, and a memory timeline."""
    fmt = out_format(as_json, as_csv)
    store = open_cli_store()
    with store.session() as s:
        doc = run_history(s, run_name, rank, points=points)
    rows = [_flat(x) for x in doc["snapshots"]]
    if fmt == "json":
        write_json(doc)
        return
    if fmt == "csv":
        write_csv(rows, SNAP_CSV)
        return
    _print_history(doc, rows)


def _print_history(doc: dict, rows: list[dict]) -> None:
    con = console()
    run = doc["run"]
    lim = doc["limit"]
    if lim["bytes"] is None and lim.get("at_least"):
        limit = f"unknown, at least {cell(lim['at_least'], 'bytes')} (the allocator held that much)"
    else:
        limit = cell(lim["bytes"], "bytes") + (f" ({lim['source']})" if lim["source"] else "")
    head = [f"job {run['job'] or '-'}  cluster {run['cluster'] or '-'}  status {run['status']}  "
            f"torch {run['torch_version'] or '-'}  limit {limit}",
            f"peak reserved {cell(run['peak_reserved_bytes'], 'bytes')}  "
            f"peak allocated {cell(run['peak_allocated_bytes'], 'bytes')}  snapshots {run['snapshot_count']}"]
    d = doc.get("diagnosis")
    if d:
        head.append("[bold]{}[/bold] ({})".format(*(rich_text(x) for x in verdict_head(d))))
        need = step_need_line(d)
        if need:
            head.append(rich_text(need))
        # one line per cause, not the need again (a spike's or fragmentation's evidence holds it)
        head += [f"  {rich_text(line)}" for line in panel_cause_lines(d.get("causes") or [], skip=need)]
        for r in d.get("recommendations", [])[:2]:
            link = doc_link(r.get("playbook"))  # "" for a diagnosis stored before recommendations had one
            head.append(f"-> {r['action']}" + (f"\n   playbook: {link}" if link else ""))
    fc_line = forecast_line(doc.get("forecast"), time.time())
    if fc_line and (run["status"] == "running" or (doc.get("forecast") or {}).get("oom_expected")):
        head.append(rich_text(labelled("forecast" if run["status"] == "running" else "forecast while it ran", fc_line)))
    fit_line = own_fit_line(doc.get("fit")) or (f"fit: none ({doc['fit_reason']})" if doc.get("fit_reason") else None)
    if fit_line:
        head.append(rich_text(fit_line))
    con.print(Panel("\n".join(head), title=f"run {rich_text(run['run'])}", expand=False))  # titles are markup
    con.print(table("snapshots", SNAP_COLS, rows) if rows else "no snapshots stored")
    _print_ranks(con, doc.get("ranks"))
    _print_whatif(con, doc["snapshots"])
    if doc["changes"]:
        con.print("[bold]what changed[/bold]")
        for line in changes_once(doc["changes"]):
            con.print(f"  {rich_text(line)}")
    st = doc["stats"]
    if st["count"]:
        ser = st["series"]
        top = max((x["reserved_bytes"] or 0 for x in ser), default=0)
        con.print(f"[bold]memory timeline[/bold] (rank {st['rank']}, {st['count']} samples, "
                  f"{st['first'][:19]} .. {st['last'][:19]} UTC, scale 0 .. {fmt_bytes(top)})")
        con.print(f"  reserved  {sparkline([x['reserved_bytes'] for x in ser], base=0, top=top)}  "
                  f"max {cell(st['peak_reserved_bytes'], 'bytes')}")
        con.print(f"  allocated {sparkline([x['allocated_bytes'] for x in ser], base=0, top=top)}  "
                  f"max {cell(st['peak_allocated_bytes'], 'bytes')}")
        ooms = st["oom_count"] or 0
        if not ooms and run["status"] == "oom":
            # the allocator's counter in the samples: the OOM that ended the run came after the last one
            con.print(f"  retries {st['alloc_retries'] or 0}; the run ended in an OOM after its last stat sample")
        else:
            con.print(f"  retries {st['alloc_retries'] or 0}, OOMs {ooms} (the allocator's count in the samples)")
    else:
        con.print("no stat samples for this run (ingest --stats FILE, or the agent, adds them)")


RANK_COLS = [Col("rank", "rank", "int"), Col("status", "status"), Col("cause", "cause"),
             Col("oom_step", "OOM step", "int"),
             Col("last_step", "last step", "int"), Col("peak_allocated_bytes", "peak allocated", "bytes"),
             Col("peak_reserved_bytes", "peak reserved", "bytes"), Col("need_bytes", "step need", "bytes"),
             Col("parameters_bytes", "parameters", "bytes"), Col("optimizer_state_bytes", "optimizer", "bytes"),
             Col("activations_bytes", "activations", "bytes")]


def _print_ranks(con, ranks: dict | None) -> None:
    """Ranks side by side, then which one failed first and why that one (several ranks only)."""
    if not ranks or ranks.get("world", 0) < 2:
        return
    con.print(table("ranks side by side", RANK_COLS, ranks["ranks"]))
    for ev in ranks.get("evidence") or []:
        con.print(f"  {escape(ev)}")
    for r in (ranks.get("recommendations") or [])[:1]:
        con.print(f"  -> {escape(r['action'])}")
        link = doc_link(r.get("playbook"))
        if link:
            con.print(f"     playbook: {escape(link)}")


def _print_whatif(con, snaps: list[dict]) -> None:
    """The stored what-if sweep of each OOM snapshot: every setting's outcome with its reason."""
    for s in snaps:
        w = s.get("whatif")
        if not w:
            continue
        where = " ".join(x for x in (f"step {s['step']}" if s.get("step") is not None else "",
                                      f"epoch {s['epoch']}" if s.get("epoch") is not None else "") if x)
        seeds = len(w.get("seeds") or []) + len(w.get("joined") or [])
        limit = ("no limit known" if w.get("limit_bytes") is None else
                 f"limit {cell(w['limit_bytes'], 'bytes')} from {escape(str(w.get('limit_source') or '-'))}")
        con.print(f"[bold]what-if at the {escape(s['trigger'])} snapshot[/bold] (rank {s['rank']}"
                  f"{', ' + where if where else ''}; {limit}; {seeds} earlier snapshot(s) used)")
        reasons = {r.get("reason") for r in w["results"]}
        if all(r.get("predicted_oom") is None for r in w["results"]) and len(reasons) == 1:
            con.print(f"  every setting: not assessable ({escape(str(reasons.pop()))})")  # e.g. no trace
            continue
        for r, why in zip(w["results"], said_once(w["results"]), strict=True):
            outcome = said(r.get("verdict")) if r.get("verdict") else str(r.get("predicted_oom"))
            line = f"  {escape(r['conf'] or '(recorded)')}: {outcome}"
            if r.get("predicted_oom") is not None:
                line += f", confidence {r['confidence']}, peak reserved {cell(r['peak_reserved_bytes'], 'bytes')}"
            if why:
                line += f" [dim]({escape(why)})[/dim]"
            con.print(line)


@click.command()
@click.argument("run_a")
@click.argument("run_b")
@output_options()
def compare(run_a, run_b, as_json, as_csv):
    """Two runs side by side: peaks, composition deltas, settings that differ, and what explains the gap."""
    fmt = out_format(as_json, as_csv)
    store = open_cli_store()
    with store.session() as s:
        doc = compare_runs(s, run_a, run_b)
    A, B = doc["a"], doc["b"]
    rows = []
    for k, label in (("peak_reserved_bytes", "peak reserved"), ("peak_allocated_bytes", "peak allocated")):
        p = doc["peaks"][k]
        rows.append({"what": label, "a": p["a"], "b": p["b"], "delta": p["delta"], "kind": "bytes"})
    for c in CATEGORIES:
        ca = (A["composition"] or {}).get(c)
        cb = (B["composition"] or {}).get(c)
        rows.append({"what": c, "a": ca, "b": cb,
                     "delta": (doc["composition_delta"] or {}).get(c), "kind": "bytes"})
    fr = doc["pieces"]
    rows.append({"what": "in pieces (share of reserved free in pieces at the OOM)", "a": fr["a"], "b": fr["b"],
                 "delta": fr["delta"], "kind": "ratio"})
    if fmt == "json":
        write_json(doc)
        return
    if fmt == "csv":
        write_csv(rows, ["what", "a", "b", "delta"])
        return
    con = console()
    t = Table(title=f"{run_a} vs {run_b}", header_style="bold")
    t.add_column("")
    t.add_column(run_a, justify="right")
    t.add_column(run_b, justify="right")
    t.add_column("delta", justify="right")
    for r in rows:
        kind = r["kind"]
        delta = "-" if r["delta"] is None else (("+" if r["delta"] >= 0 else "") + cell(r["delta"], kind)
                                                if kind == "ratio" else cell(r["delta"], "delta"))
        t.add_row(said(r["what"]), cell(r["a"], kind), cell(r["b"], kind), delta)  # the CSV keeps the key
    con.print(t)
    if doc["differences"]:
        con.print(table("settings and versions that differ", [Col("field", "field"), Col("a", run_a), Col("b", run_b)],
                        [_shown_difference(d) | {"field": said(d["field"])} for d in doc["differences"]]))
    else:
        con.print("no recorded setting or version differs")
    con.print(f"[bold]explanation[/bold]: {doc['explanation']['text']}")
    for side, name in ((A, run_a), (B, run_b)):
        if (side.get("ranks") or {}).get("world", 0) >= 2:
            con.print(table(f"{escape(name)}: ranks side by side", RANK_COLS, side["ranks"]["ranks"]))
    for side, name in ((A, run_a), (B, run_b)):
        d = side.get("diagnosis")
        if d:
            con.print(f"  {rich_text(name)}: {rich_text(verdict_headline(d))}")


VERSION_COLS = [Col("torch_version", "torch"), Col("runs", "runs", "int"), Col("oom_runs", "OOM runs", "int"),
                Col("oom_rate", "OOM rate", "ratio"), Col("mean_peak_reserved_bytes", "mean peak reserved", "bytes"),
                Col("max_peak_reserved_bytes", "max peak reserved", "bytes"),
                Col("mean_pieces_share", "pieces", "ratio"), Col("flag", "regression")]


@click.command()
@click.option("--job", required=True)
@output_options()
def versions(job, as_json, as_csv):
    """Peak memory, OOM rate and fragmentation of a job per torch version; regressions flagged.

    `pieces`: the runs list's column averaged over the version's OOM runs (at the OOM, the share of
    reserved memory free in pieces outside the largest free block); - for a version without an OOM."""
    fmt = out_format(as_json, as_csv)
    store = open_cli_store()
    with store.session() as s:
        doc = torch_versions(s, job)
    rows = [v | {"flag": "; ".join(v["regressions"]) or "-"} for v in doc["versions"]]
    emit(fmt, doc, rows, VERSION_COLS, title=f"job {job} by torch version",
         csv_keys=["torch_version", "runs", "oom_runs", "oom_rate", "mean_peak_reserved_bytes",
                   "max_peak_reserved_bytes", "mean_peak_allocated_bytes", "mean_pieces_share",
                   "mean_fragmentation_ratio", "regression", "flag"])


def _shown_difference(d: dict) -> dict:
    """A differing setting as the table shows it: sizes as sizes, a limit with where it came from
    ("unknown" where a run has none, never a bare "-" beside raw bytes)."""
    kind = d.get("kind") or ("bytes" if str(d["field"]).endswith("_bytes") else None)
    if kind != "bytes":
        return d
    out = dict(d)
    for side in ("a", "b"):
        v = d[side]
        src = d.get(f"{side}_source")
        out[side] = "unknown" if v is None else fmt_bytes(v) + (f" ({src})" if src else "")
    return out
