"""`memq status [--json]`: watch the Redis -> Celery -> SQL path: stream length, consumer-group lag and
pending entries, queue depths, dead letters (with the latest reasons), heartbeats of workers and
dispatchers, snapshot states."""

from __future__ import annotations

import click
import redis

from memq.cli._listing import console, write_json
from memq.config import load_settings, redact_url
from memq.errors import BrokerUnavailable
from memq.pipeline.status import CONSUMER_GONE_S, collect_status
from memq.render.safe import rich_text as v


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.option("--no-db", is_flag=True, help="Do not query the database for snapshot states.")
def status(as_json, no_db):
    """Backlog and health of the ingest path: stream, queues, dead letters, workers."""
    st = load_settings()
    try:
        doc = collect_status(st, with_db=not no_db)
    except Exception as exc:  # noqa: BLE001 - redis-py errors: one line, no password
        if isinstance(exc, redis.RedisError):
            raise BrokerUnavailable(f"Redis {redact_url(st.redis_url)} unavailable: {type(exc).__name__}: {exc}",
                                    hint="check MEMQ_REDIS_URL and that Redis is running") from exc
        raise
    if as_json:
        write_json(doc)
        return
    _print(doc)


def _print(doc: dict) -> None:
    """The human view. Names, ids and reasons come from Redis, written by any job: each value goes
    through rich_text (control characters escaped, no markup)."""
    con = console()
    s = doc["stream"]
    con.print(f"[bold]stream[/bold] {v(s['key'])} at {v(doc['redis'])}: {s['length']} entries, "
              f"{s['pending']} pending, lag {s['lag'] if s['lag'] is not None else '-'}")
    def fmt_duration(sec: float) -> str:
        return f"{sec / 3600:.1f} h" if sec >= 3600 else f"{sec / 60:.0f} min"

    live = [c for c in s["consumers"] if not c.get("gone")]
    gone = [c for c in s["consumers"] if c.get("gone")]
    for c in live:
        con.print(f"  consumer {v(c['name'])}: {c['pending']} pending, idle {c['idle_s']} s")
    if gone:
        held = sum(c["pending"] for c in gone)
        con.print(f"  {len(gone)} consumer(s) gone (idle over {fmt_duration(CONSUMER_GONE_S)}: stopped or killed "
                  f"dispatchers){f', holding {held} pending entries that live dispatchers reclaim' if held else ''}: "
                  + ", ".join(f"{v(c['name'])} ({fmt_duration(c['idle_s'])})" for c in gone[:5])
                  + (f" and {len(gone) - 5} more" if len(gone) > 5 else ""))
    con.print("[bold]queues[/bold] " + ", ".join(f"{v(q)} {n}" for q, n in doc["queues"].items())
              + f"; {doc['queues_unacked']} unacknowledged")
    dl = doc["dead_letters"]
    con.print(f"[bold]dead letters[/bold] {v(dl['key'])}: {dl['count']} kept, {dl.get('total', 0)} ever")
    for d in dl["latest"]:
        con.print(f"  {v(d['id'])} {v(d.get('kind') or '-')} run {v(d.get('run') or '-')}: {v(d['reason'])}")
    for kind in ("workers", "dispatchers"):
        items = doc[kind]
        con.print(f"[bold]{kind}[/bold] {len(items)} alive" + ("" if items else " (none: start one)"))
        for w in items:
            extra = f" queues {v(','.join(map(str, w.get('queues') or [])))}" if w.get("queues") else ""
            con.print(f"  {v(w.get('name'))} pid {v(w.get('pid'))} on {v(w.get('host'))}, "
                      f"last beat {v(w['age_s'])} s ago{extra}")
    snaps = doc.get("snapshots")
    if snaps:
        if "error" in snaps:
            con.print(f"[bold]snapshots[/bold] database: {v(snaps['error'])}")
        else:
            con.print("[bold]snapshots[/bold] " + ", ".join(f"{v(k)} {v(n)}" for k, n in snaps.items()))
