"""`memq ingest FILE... --run R` (analyse inline and store) and `memq reanalyze [--run R]`.

Both work with no Redis and no worker: the files are read here, kept in the blob store, analysed
in this process and written to the history database (the embedded SQLite one by default).
"""

from __future__ import annotations

from pathlib import Path

import click
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from memq.cli import SIZE
from memq.cli._listing import Col, console, open_cli_store, out_format, parse_labels, table, write_json
from memq.model import RUN_STATUSES, TRIGGERS
from memq.names import check_name
from memq.pipeline import analyse
from memq.pipeline import ingest as ingesting
from memq.render.reasons import panel_cause_lines
from memq.render.safe import rich_text as v
from memq.render.terminal import recommendation_lines
from memq.render.words import said, verdict_head
from memq.store.repository import RunMeta


def _progress(total: int, enabled: bool):
    """A rich progress bar on stderr (stdout stays clean for --json); None when not wanted."""
    if not enabled:
        return None, None
    prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console(stderr=True), transient=True)
    task = prog.add_task("ingest", total=total)

    def advance(message: str) -> None:
        prog.update(task, advance=1, description=message[-60:])

    return prog, advance


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--run", "run_name", required=True, help="Run id: snapshots of one run share it.")
@click.option("--cluster")
@click.option("--job")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE", help="Repeatable.")
@click.option("--rank", type=int, default=0, show_default=True, help="Rank that took these snapshots.")
@click.option("--step", type=int, help="Training step (one file only; else taken from names like step0040).")
@click.option("--epoch", type=int, help="Epoch (one file only; else taken from names like epoch2).")
@click.option("--trigger", type=click.Choice(TRIGGERS),
              help="Why the snapshots were taken (default: from the file name, else manual).")
@click.option("--limit", type=SIZE, help="What the allocator may reserve (per-process cap), e.g. 16GiB.")
@click.option("--device-total", type=SIZE, help="Device memory, e.g. 139.8GiB.")
@click.option("--oom-message", metavar="TEXT", help="The 'CUDA out of memory' text (applies to the last file).")
@click.option("--stats", "stats_path", type=click.Path(dir_okay=False, exists=True),
              help="stats.jsonl of memory_stats() samples for the timeline (fields t, step, epoch).")
@click.option("--status", type=click.Choice(RUN_STATUSES),
              help="Run status, set as given (default: oom when the run diagnosis of the files finds one, "
                   "else completed for new runs; a status only moves up running < completed < crashed < oom).")
@click.option("--host")
@click.option("--user", "username")
@click.option("--project")
@click.option("--torch-version")
@click.option("--cuda-version")
@click.option("--driver-version")
@click.option("--gpu", "gpu_model", help="GPU model, e.g. 'NVIDIA H200'.")
@click.option("--optimizer", help="Optimizer class, e.g. AdamW.")
@click.option("--params", "param_count", type=int, help="Parameter count.")
@click.option("--world-size", type=int)
@click.option("--alloc-conf", "allocator_conf", help="PYTORCH_CUDA_ALLOC_CONF of the run.")
@click.option("--json", "as_json", is_flag=True, help="Print what was stored as one JSON document.")
def ingest(files, run_name, cluster, job, labels, rank, step, epoch, trigger, limit, device_total, oom_message,
           stats_path, status, host, username, project, torch_version, cuda_version, driver_version, gpu_model,
           optimizer, param_count, world_size, allocator_conf, as_json):
    """Analyse snapshot FILEs of one run (in time order) and store them in the run history."""
    if len(files) > 1 and (step is not None or epoch is not None):
        raise click.UsageError("--step/--epoch describe one snapshot; give one file, or name files "
                               "like step0040.pickle.gz / epoch2.pickle.gz")
    # the dispatcher's rule for agents' envelopes, so that SQLite (no String(N) limit) and PostgreSQL agree
    check_name("run", run_name)
    for field, value in (("cluster", cluster), ("job", job), ("host", host)):
        check_name(field, value, required=False)
    meta = RunMeta(name=run_name, job=job, cluster=cluster, host=host, username=username, project=project,
                   labels=parse_labels(labels), torch_version=torch_version, cuda_version=cuda_version,
                   driver_version=driver_version, gpu_model=gpu_model, optimizer=optimizer,
                   param_count=param_count, world_size=world_size, allocator_conf=allocator_conf,
                   status=status)
    inputs = [ingesting.SnapshotInput(path=f, step=step, epoch=epoch, trigger=trigger,
                                    oom_message=oom_message if i == len(files) - 1 else None)
              for i, f in enumerate(files)]
    store = open_cli_store()
    prog, advance = _progress(len(files) + 1, enabled=len(files) > 1)
    try:
        if prog is not None:
            prog.start()
        report = ingesting.ingest_files(store, meta, inputs, rank=rank, limit_bytes=limit,
                                      device_total_bytes=device_total, progress=advance)
        n_stats = ingesting.ingest_stats(store, run_name, ingesting.iter_stats_jsonl(stats_path), rank) \
            if stats_path else 0
    finally:
        if prog is not None:
            prog.stop()
    doc = report.as_dict() | {"stat_samples": n_stats, "database": store.url}
    if out_format(as_json) == "json":
        write_json(doc)
        return
    _print_report(doc)


def _print_report(doc: dict) -> None:
    con = console()
    rows = [{"file": Path(s["file"]).name, "sha256": s["sha256"][:12], "step": s["step"], "epoch": s["epoch"],
             "trigger": s["trigger"], "stored": "new" if s["created"] else "already stored",
             "analysis": "analysed" if s["analysed"] else "reused",
             "cause": "undetermined" if s.get("undetermined") else said(s["primary_cause"])}
            for s in doc["snapshots"]]
    cols = [Col("file", "file"), Col("sha256", "sha256"), Col("step", "step", "int"), Col("epoch", "epoch", "int"),
            Col("trigger", "trigger"), Col("stored", "row"), Col("analysis", "analysis"), Col("cause", "cause")]
    con.print(table(f"run {doc['run']} ({doc['status']})", cols, rows))
    if doc.get("stat_samples"):
        con.print(f"{doc['stat_samples']} stat samples stored")
    res = doc.get("diagnosis")
    if res:
        d = res["diagnosis"]
        lines = ["[bold]{}[/bold] ({})".format(*(v(x) for x in verdict_head(d)))]
        lines += [f"  {v(line)}" for line in panel_cause_lines(d.get("causes") or [], evidence_max=2)]
        for r in d.get("recommendations", [])[:3]:
            lines += recommendation_lines(r)
        con.print(Panel("\n".join(lines), title="run diagnosis", expand=False))
    con.print(f"stored in {doc['database']}; see `memq history --run {doc['run']}`")


@click.command()
@click.option("--run", "run_name", help="Only this run (default: every run).")
@click.option("--force", is_flag=True, help="Also recompute run-level diagnoses that are already current.")
@click.option("--limit", "limit_bytes", type=SIZE,
              help="The run's limit, given after the fact (a cap its agent could not read): stored with the run, "
                   "whose diagnosis and forecast are made again under it. Needs --run.")
@click.option("--json", "as_json", is_flag=True)
def reanalyze(run_name, force, limit_bytes, as_json):
    """Recompute stored results from the raw snapshots with this memq's analyzer version."""
    store = open_cli_store()
    report = analyse.reanalyze(store, run_name, force=force, limit_bytes=limit_bytes)
    doc = report.as_dict()
    if as_json:
        write_json(doc)
        return
    con = console()
    con.print(f"analyzer {doc['analyzer_version']}: {doc['snapshots_considered']} snapshots behind; "
              f"{doc['analysed']} analysed, {doc['reused']} reused existing results, "
              f"{doc['missing_blobs']} without a stored blob, {doc['failed']} failed; "
              f"{doc['runs_recomputed']} run diagnoses recomputed")
    for e in doc["errors"][:20]:
        con.print(f"  {e}")
