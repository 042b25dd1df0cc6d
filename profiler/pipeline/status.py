"""The status of the Redis -> Celery -> SQL path, as one document (`memq status`, the exporter's
queue and heartbeat figures): stream length and consumer-group lag, queue depths, dead letters,
heartbeats, snapshot states. A use case: the CLI and the exporter both call it."""

from __future__ import annotations

import json
import time

from memq.config import redact_url
from memq.errors import MemqError
from memq.queues import GROUP, QUEUES
from memq.redis_client import shared_client
from memq.redis_functions import inbox_key
from memq.store.connection import open_store
from memq.store.metric_queries import state_counts

# A consumer idle longer than this is gone (a dispatcher that was killed, or stopped before it could
# leave the group): a live one attempts a read at least every --block-ms, at most 60 s (memq dispatcher),
# and Redis counts a consumer's idle time from its last read attempt; ten such waits leave room for a
# slow batch.
CONSUMER_GONE_S = 600


def consumer_gone(idle_s: float, gone_after_s: float = CONSUMER_GONE_S) -> bool:
    return idle_s > gone_after_s


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _queue_depth(r, prefix: str, queue: str) -> int:
    # kombu keeps a queue as one list per priority step: name, name\x06\x163, \x06\x166, \x06\x169
    keys = [queue] + [f"{queue}\x06\x16{p}" for p in (3, 6, 9)]
    return sum(int(r.llen(prefix + k)) for k in keys)


def collect_status(st, with_db: bool = True, gone_after_s: float = CONSUMER_GONE_S) -> dict:
    """What `memq status` shows, as one dict (byte-free: counts and ages only)."""
    r = shared_client(st.redis_url, timeout_s=5)
    now = time.time()
    doc: dict = {"redis": redact_url(st.redis_url), "stream": {"key": st.stream_key}, "queues": {},
                 "dead_letters": {"key": st.dead_letter_key}, "workers": [], "dispatchers": []}
    s = doc["stream"]
    s["length"] = int(r.xlen(st.stream_key))
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
            idle_s = round(int(c.get("idle", 0)) / 1000, 1)
            s["consumers"].append({"name": _text(c["name"]), "pending": int(c.get("pending", 0)),
                                   "idle_s": idle_s, "gone": consumer_gone(idle_s, gone_after_s)})
    bprefix = st.broker_key_prefix
    broker = r if (st.broker_url or st.redis_url) == st.redis_url else shared_client(st.broker_url, timeout_s=5)
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
    try:
        store = open_store(st)
        try:
            with store.session() as s:
                return state_counts(s)
        finally:
            store.close()
    except MemqError as exc:
        return {"error": str(exc)}
