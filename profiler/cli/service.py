"""`memq worker`, `memq dispatcher`, `memq status`: run and watch the Redis -> Celery -> SQL path.

- `memq worker [CELERY WORKER OPTIONS]`: Celery's own worker for `workers.app` (the same as
  `celery -A workers.app worker ...`); memq adds defaults for the queues and the prefork pool.
- `memq dispatcher`: the stream consumer (workers/dispatcher.py) until SIGTERM or SIGINT.
- `memq status [--json]`: stream length, consumer-group lag and pending entries, queue depths,
  dead letters (with the latest reasons), heartbeats of workers and dispatchers, snapshot states.
"""

from __future__ import annotations

import json
import logging
import sys
import time

import click


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("-Q", "--queues", default="memq.ingest,memq.analyze,memq.report", show_default=True)
@click.option("-c", "--concurrency", type=int, help="Pool processes (default: Celery's, the CPU count).")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-B", "--beat", is_flag=True, help="Also run the beat scheduler (run exactly one beat).")
@click.pass_context
def worker(ctx, queues, concurrency, loglevel, beat):
    """Run a Celery worker for memq (other options go to `celery worker` unchanged)."""
    from workers.app import app

    argv = ["worker", "-Q", queues, "-l", loglevel, "-P", "prefork"]
    if concurrency:
        argv += ["-c", str(concurrency)]
    if beat:
        argv.append("-B")
    argv += list(ctx.args)
    app.worker_main(argv=argv)


@click.command()
@click.option("--consumer", help="Consumer name in the group (default: host-pid).")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Stream entries read at once.")
@click.option("--block-ms", type=click.IntRange(10, 60_000), default=1000, show_default=True)
@click.option("-l", "--loglevel", default="INFO", show_default=True)
def dispatcher(consumer, batch, block_ms, loglevel):
    """Move the agents' stream into the history and enqueue analyses, until SIGTERM."""
    from profiler.config import load_settings
    from workers.dispatcher import Dispatcher

    logging.basicConfig(level=loglevel.upper(), stream=sys.stderr,
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    st = load_settings()
    Dispatcher(st, consumer=consumer, batch=batch, block_ms=block_ms).run()


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _queue_depth(r, prefix: str, queue: str) -> int:
    # kombu keeps a queue as one list per priority step: name, name\x06\x163, \x06\x166, \x06\x169
    keys = [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
    return sum(int(r.llen(prefix + k)) for k in keys)


def collect_status(st, with_db: bool = True) -> dict:
    """What `memq status` shows, as one dict (byte-free: counts and ages only)."""
    from profiler.config import redact_url
    from workers.runtime import GROUP, QUEUES, redis_client

    r = redis_client(st.redis_url, timeout_s=5)
    now = time.time()
    doc: dict = {"redis": redact_url(st.redis_url), "stream": {"key": st.stream_key}, "queues": {},
                 "dead_letters": {"key": st.dead_letter_key}, "workers": [], "dispatchers": []}
    s = doc["stream"]
    s["length"] = int(r.xlen(st.stream_key))
    from profiler.redis_functions import inbox_key

    # what agents appended through the inbox and the relay has not moved yet (an outage backlog)
    s["inbox"] = int(r.llen(inbox_key(st.stream_key)))
    groups = []
    try:
        groups = r.xinfo_groups(st.stream_key)
    except Exception:  # noqa: BLE001 - no stream yet
        pass
    g = next((x for x in groups if _text(x.get("name")) == GROUP), None)
    s["group"] = GROUP if g else None
    s["pending"] = int(g.get("pending", 0)) if g else 0
    s["lag"] = g.get("lag") if g else None
    s["consumers"] = []
    if g:
        for c in r.xinfo_consumers(st.stream_key, GROUP):
            s["consumers"].append({"name": _text(c["name"]), "pending": int(c.get("pending", 0)),
                                   "idle_s": round(int(c.get("idle", 0)) / 1000, 1)})
    bprefix = st.broker_key_prefix
    broker = r if (st.broker_url or st.redis_url) == st.redis_url else redis_client(st.broker_url, timeout_s=5)
    for q in QUEUES:
        doc["queues"][q] = _queue_depth(broker, bprefix, q)
    doc["queues_unacked"] = int(broker.hlen(bprefix + "unacked"))
    dl = doc["dead_letters"]
    dl["count"] = int(r.xlen(st.dead_letter_key))
    dl["total"] = int(r.get(st.dead_letter_total_key) or 0)  # never trimmed, unlike the stream
    dl["latest"] = []
    for eid, fields in r.xrevrange(st.dead_letter_key, count=5):
        f = {k.decode(): v.decode("utf-8", "replace") for k, v in fields.items()}
        dl["latest"].append({"id": eid.decode(), "reason": f.get("reason", "")[:300], "run": f.get("run"),
                             "kind": f.get("kind"), "stage": f.get("stage")})
    for key in r.scan_iter(match=f"{st.key_prefix}heartbeat:*", count=1000):
        try:
            info = json.loads(r.get(key) or b"{}")
        except ValueError:
            continue
        info["age_s"] = round(now - float(info.get("last", now)), 1)
        (doc["workers"] if info.get("kind") == "worker" else doc["dispatchers"]).append(info)
    doc["workers"].sort(key=lambda x: str(x.get("name")))
    doc["dispatchers"].sort(key=lambda x: str(x.get("name")))
    if with_db:
        doc["snapshots"] = _db_states(st)
    return doc


def _db_states(st) -> dict:
    from sqlalchemy import func, select

    from profiler.errors import MemqError
    from profiler.store.connection import open_store
    from profiler.store.orm import Snapshot

    try:
        store = open_store(st)
        try:
            with store.session() as s:
                rows = s.execute(select(Snapshot.state, func.count()).group_by(Snapshot.state)).all()
        finally:
            store.close()
    except MemqError as exc:
        return {"error": str(exc)}
    return {"pending": 0, "running": 0, "done": 0, "failed": 0} | {k: int(v) for k, v in rows}


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
@click.option("--no-db", is_flag=True, help="Do not query the database for snapshot states.")
def status(as_json, no_db):
    """Backlog and health of the ingest path: stream, queues, dead letters, workers."""
    from profiler.config import load_settings, redact_url
    from profiler.errors import BrokerUnavailable

    st = load_settings()
    try:
        doc = collect_status(st, with_db=not no_db)
    except Exception as exc:  # noqa: BLE001 - redis-py errors: one line, no password
        import redis

        if isinstance(exc, redis.RedisError):
            raise BrokerUnavailable(f"Redis {redact_url(st.redis_url)} unavailable: {type(exc).__name__}: {exc}",
                                    hint="check MEMQ_REDIS_URL and that Redis is running") from exc
        raise
    if as_json:
        from profiler.cli._listing import write_json

        write_json(doc)
        return
    _print(doc)


def _print(doc: dict) -> None:
    """The human view. Names, ids and reasons come from Redis, written by any job: each value goes
    through rich_text (control characters escaped, no markup)."""
    from profiler.cli._listing import console
    from profiler.render.safe import rich_text as v

    con = console()
    s = doc["stream"]
    con.print(f"[bold]stream[/bold] {v(s['key'])} at {v(doc['redis'])}: {s['length']} entries, "
              f"{s['pending']} pending, lag {s['lag'] if s['lag'] is not None else '-'}")
    for c in s["consumers"]:
        con.print(f"  consumer {v(c['name'])}: {c['pending']} pending, idle {c['idle_s']} s")
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
