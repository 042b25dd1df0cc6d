"""`memq demo`: real snapshots shipped inside the package, analysed into the embedded history.

Needs no Redis, no worker and no server database: the runs go into a store of their own,
`<data dir>/demo.db` (never the user's history, never a shared server), unless `--database URL`
names another. Running it again stores nothing twice and analyses nothing twice.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import click
from rich.panel import Panel

from memq.cli._listing import console, table, write_json
from memq.cli.history import RUN_COLS, _flat, _print_history, shown_runs
from memq.config import load_settings
from memq.pipeline import ingest as ingesting
from memq.pipeline.history import RunFilter, compare_runs, list_runs, run_history
from memq.render.safe import rich_text as v
from memq.render.terminal import recommendation_lines
from memq.render.words import verdict_head
from memq.store.connection import open_store
from memq.store.repository import RunMeta


def demo_dir() -> Path:
    return Path(str(resources.files("memq") / "demo_data"))


def load_manifest() -> dict:
    return json.loads((demo_dir() / "manifest.json").read_text())


def demo_store(database_url: str | None = None):
    settings = load_settings()
    url = database_url or demo_database_url(settings)
    return open_store(settings, database_url=url)


def demo_database_url(settings) -> str:
    """The demo's own SQLite file beside the history: demo runs never land among the user's runs."""
    return f"sqlite:///{Path(settings.data_dir) / 'demo.db'}"


def run_demo(store) -> dict:
    """Ingest every demo run; returns {"runs": [...ingest reports...], "compare": ...}."""
    base = demo_dir()
    manifest = load_manifest()
    reports = []
    for r in manifest["runs"]:
        meta = RunMeta(name=r["run"], job=r.get("job"), cluster=r.get("cluster"), labels=r.get("labels", {}),
                       torch_version=r.get("torch_version"), cuda_version=r.get("cuda_version"),
                       gpu_model=r.get("gpu"), optimizer=r.get("optimizer"), param_count=r.get("params"))
        inputs = [ingesting.SnapshotInput(path=str(base / s["file"]), step=s.get("step"), epoch=s.get("epoch"),
                                        trigger=s.get("trigger"), oom_message=s.get("oom_message"))
                  for s in r["snapshots"]]
        rep = ingesting.ingest_files(store, meta, inputs, limit_bytes=r.get("limit"),
                                   device_total_bytes=r.get("device_total"))
        if r.get("stats"):
            ingesting.ingest_stats(store, r["run"], ingesting.iter_stats_jsonl(base / r["stats"]))
        reports.append(rep.as_dict() | {"about": r.get("about")})
    with store.session() as s:
        cmp = compare_runs(s, "demo-sgd", "demo-adamw")
        runs = list_runs(s, RunFilter(cluster="demo", limit=20))
    return {"database": store.url, "runs": reports, "history": runs, "compare_sgd_adamw": cmp}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Everything the demo stored and found, as JSON.")
@click.option("--database", "database_url", metavar="URL",
              help="Store the demo runs here instead of the demo's own <data dir>/demo.db.")
def demo(as_json: bool, database_url: str | None) -> None:
    """Analyse a few real H200 snapshots into the local history and show what memq finds."""
    store = demo_store(database_url)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(store.close)
    doc = run_demo(store)
    if as_json:
        write_json(doc)
        return
    con = console()
    con.print(f"memq demo: {len(doc['runs'])} real runs from an NVIDIA H200 (torch 2.11), stored apart from "
              f"your history in {v(doc['database'])}")
    for rep in doc["runs"]:
        res = rep.get("diagnosis") or {}
        d = res.get("diagnosis") or {}
        lines = [f"[dim]{v(rep['about'])}[/dim]",
                 "[bold]{}[/bold] ({})".format(*(v(x) for x in verdict_head(d)))]
        for c in d.get("causes", [])[:1]:
            for ev in c.get("evidence", [])[:3]:
                lines.append(f"  {v(ev)}")
        for rec in d.get("recommendations", [])[:2]:
            lines += recommendation_lines(rec)
        con.print(Panel("\n".join(lines), title=f"{rep['run']} ({rep['status']})", expand=False))
    con.print(table("history (memq runs --cluster demo)", RUN_COLS, shown_runs(doc["history"])))
    with store.session() as s:
        hist = run_history(s, "demo-sgd")
    con.print("[bold]memq history --run demo-sgd[/bold]")
    _print_history(hist, [_flat(x) for x in hist["snapshots"]])
    con.print(f"[bold]demo-sgd vs demo-adamw[/bold]: {doc['compare_sgd_adamw']['explanation']['text']}")
    env = f"MEMQ_DATABASE_URL={doc['database']}"
    con.print(f"next (the demo's store): {v(env)} memq history --run demo-fragmentation\n"
              f"  {v(env)} memq compare demo-sgd demo-adamw\n  {v(env)} memq serve")
