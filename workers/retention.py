"""The daily retention run: a Celery task on the memq.report queue, started by beat at a UTC time.

- `gc(dry_run=False)`: `memq.store.retention.collect` with the policy from the settings
  (MEMQ_RETENTION_DAYS, MEMQ_RETENTION_CLUSTERS): raw blobs and stat samples past retention go;
  blobs of OOM / diagnosed snapshots and every still-referenced blob stay. The same as `memq gc`.
  Idempotent: a second run (two beats by mistake, a redelivery) finds nothing more to remove.
- `trim_stream()`: every MEMQ_STREAM_TRIM_INTERVAL_S, `XTRIM <stream> MINID <floor>` where the floor
  is the oldest entry some consumer group still needs (its oldest pending entry, else the first one
  after its last-delivered id). The dispatcher acknowledges but never deletes, and the agents' `XADD
  MAXLEN ~ N` alone would keep N entries (3.6 GB at the default N, deploy/CAPACITY.md) and, in an outage
  longer than N entries, trim entries nobody has read. With this task the stream holds the backlog plus
  the acknowledged entries of the last MEMQ_STREAM_KEEP_S seconds (for `memq status` and debugging).
  A stream without a consumer group is left alone (nobody has read anything yet).
- `expire_untimed_blobs()`: on the same tick as the trim, blob keys without a TTL (written by an
  agent, never named by a relayed envelope) get MEMQ_BLOB_TTL_S, a bounded SCAN step at a time.
- `clean_dead_blobs()`: on the same tick (and in `memq gc`), the blob files of dead-lettered snapshots
  whose grace (MEMQ_DEAD_BLOB_GRACE_S) has passed go, unless a row names them.
- `beat_entries(settings)`: what `memq.workers.app.beat_schedule` adds: the daily gc (crontab at
  MEMQ_GC_HOUR_UTC:MEMQ_GC_MINUTE_UTC) and the stream trim. An outage is not retried: the next tick is
  the retry.
"""

from __future__ import annotations

import logging

from celery.schedules import crontab

from memq.config import Settings
from memq.errors import ConfigError
from memq.pipeline.dead_blobs import clean
from memq.store.retention import Policy, collect
from memq.workers import runtime
from memq.workers.app import app, settings_of
from memq.workers.base import MemqTask

log = logging.getLogger("memq.workers.retention")

TASK_NAME = "workers.retention.gc"
TRIM_TASK_NAME = "workers.retention.trim_stream"


def _sid(v) -> tuple[int, int]:
    text = v.decode() if isinstance(v, bytes) else str(v)
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def trim_floor(r, stream: str, keep_s: float = 0.0) -> str | None:
    """The id below which no consumer group needs the stream's entries and which is older than
    `keep_s` seconds (Redis server time), or None (no group: keep all)."""
    try:
        groups = r.xinfo_groups(stream)
    except Exception:  # noqa: BLE001 - no such stream
        return None
    if not groups:
        return None
    floor: tuple[int, int] | None = None
    for g in groups:
        name = g.get("name")
        pend = r.xpending(stream, name)
        if pend and int(pend.get("pending") or 0) > 0 and pend.get("min"):
            need = _sid(pend["min"])  # the oldest entry delivered but not acknowledged
        else:
            ms, seq = _sid(g.get("last-delivered-id") or b"0-0")
            need = (ms, seq + 1)  # everything up to the last delivered one is acknowledged
        floor = need if floor is None or need < floor else floor
    if keep_s > 0:
        sec, usec = r.time()
        floor = min(floor, (int(sec * 1000 + usec // 1000 - keep_s * 1000), 0))
    return f"{floor[0]}-{floor[1]}"


def trim_stream(st: Settings, r=None) -> dict:
    """XTRIM the ingest stream to the oldest entry a consumer group still needs. Returns what it did."""
    r = r or runtime.redis_client(st.redis_url)
    with runtime.redis_errors(st.redis_url):
        floor = trim_floor(r, st.stream_key, st.stream_keep_s)
        if floor is None:
            return {"stream": st.stream_key, "trimmed": 0, "floor": None}
        n = int(r.xtrim(st.stream_key, minid=floor, approximate=False))
    if n:
        log.info("stream %s: trimmed %d acknowledged entries (below %s)", st.stream_key, n, floor)
    return {"stream": st.stream_key, "trimmed": n, "floor": floor}


# Keys examined per tick: SCAN's cost is bounded; a cursor kept in Redis resumes the walk on the next
# tick, so any number of blob keys is covered within a few ticks.
BLOB_TTL_SCAN = 2000


def expire_untimed_blobs(st: Settings, r=None, budget: int = BLOB_TTL_SCAN) -> dict:
    """Give MEMQ_BLOB_TTL_S to blob keys that have no TTL. The agent user may SET `memq:blob:*` and
    the relay gives a blob its TTL when it relays the envelope that names it; a blob no envelope ever
    names (a job killed between the two writes, or a hostile one) would otherwise stay until
    `maxmemory` (deploy/SECURITY.md). Bounded work per call: `budget` keys, resumed from a cursor."""
    r = r or runtime.redis_client(st.redis_url)
    cursor_key = st.key_prefix + "blob-ttl-cursor"
    pattern = st.key_prefix + "blob:*"
    seen = given = 0
    with runtime.redis_errors(st.redis_url):
        cursor = int(r.get(cursor_key) or 0)
        while True:
            cursor, keys = r.scan(cursor=cursor, match=pattern, count=min(500, budget))
            if keys:
                pipe = r.pipeline(transaction=False)
                for k in keys:
                    pipe.ttl(k)
                untimed = [k for k, ttl in zip(keys, pipe.execute(), strict=True) if ttl == -1]
                if untimed:
                    pipe = r.pipeline(transaction=False)
                    for k in untimed:
                        pipe.expire(k, st.blob_ttl_s, nx=True)  # nx: a TTL the relay set meanwhile stays
                    given += sum(bool(x) for x in pipe.execute())
            seen += len(keys)
            if cursor == 0 or seen >= budget:
                break
        r.set(cursor_key, cursor)
    if given:
        log.warning("gave %d blob key(s) without a TTL the blob TTL (%d s): written but never relayed",
                    given, st.blob_ttl_s)
    return {"blobs_seen": seen, "blobs_given_ttl": given, "scan_done": cursor == 0}


def clean_dead_blobs(st: Settings, store=None, r=None, **kw) -> dict:
    """memq.pipeline.dead_blobs.clean with this process's store and Redis client (outages become
    BrokerUnavailable)."""
    r = r or runtime.redis_client(st.redis_url)
    with runtime.redis_errors(st.redis_url):
        return clean(st, store if store is not None else (lambda: runtime.store(st)), r, **kw)


def run_gc(st: Settings, store=None, *, dry_run: bool = False, grace_s: float | None = None) -> dict:
    """The work, as a plain function (tests and the task share it)."""
    if store is None:
        store = runtime.store(st)
    kw = {} if grace_s is None else {"grace_s": grace_s}
    summary = collect(store, Policy.from_settings(st), dry_run=dry_run,
                      partition_days_ahead=st.stat_partition_days_ahead, **kw)
    log.info("retention%s: %d stat samples, %d blobs (%d snapshots), %d orphans, %d bytes; kept %s",
             " (dry run)" if dry_run else "", summary["stat_samples_removed"], summary["blobs_removed"],
             summary["snapshots_unlinked"], summary["orphans_removed"], summary["bytes_freed"], summary["kept"])
    for err in summary["errors"]:
        log.warning("retention: %s", err)
    summary["dead_blobs"] = _dead_blobs_or_error(st, store, race_grace_s=grace_s, dry_run=dry_run)
    return summary


def _dead_blobs_or_error(st: Settings, store=None, **kw) -> dict:
    """clean_dead_blobs for the periodic tasks: a failure is logged and reported, never raised (the
    next tick retries; the records stay)."""
    try:
        return clean_dead_blobs(st, store, **kw)
    except Exception as exc:  # noqa: BLE001 - housekeeping must not fail the trim or the gc
        log.warning("dead-blob cleanup not run: %s: %s", type(exc).__name__, exc)
        return {"dead_blobs_error": f"{type(exc).__name__}: {exc}"[:500]}


def beat_entries(st: Settings) -> dict[str, dict]:
    """The daily retention entry (UTC); none when everything is kept forever."""
    if not (0 <= st.gc_hour_utc <= 23 and 0 <= st.gc_minute_utc <= 59):
        raise ConfigError("MEMQ_GC_HOUR_UTC must be 0..23 and MEMQ_GC_MINUTE_UTC 0..59")
    out: dict[str, dict] = {}
    if st.retention_days > 0 or "=" in (st.retention_clusters or ""):
        out["memq-retention"] = {
            "task": TASK_NAME,
            "schedule": crontab(minute=st.gc_minute_utc, hour=st.gc_hour_utc),
            "options": {"queue": "memq.report", "expires": 12 * 3600},
        }
    if st.stream_trim_interval_s > 0:
        out["memq-stream-trim"] = {
            "task": TRIM_TASK_NAME, "schedule": float(st.stream_trim_interval_s),
            "options": {"queue": "memq.ingest", "expires": float(st.stream_trim_interval_s)},
        }
    return out


def _bind():
    @app.task(base=MemqTask, bind=True, name=TASK_NAME, retry_on_outage=False)
    def gc(self, dry_run: bool = False) -> dict:
        return run_gc(settings_of(app), dry_run=bool(dry_run))

    @app.task(base=MemqTask, bind=True, name=TRIM_TASK_NAME, retry_on_outage=False)
    def trim(self) -> dict:
        st = settings_of(app)
        return trim_stream(st) | expire_untimed_blobs(st) | _dead_blobs_or_error(st, wait=False)

    return gc, trim


gc, trim = _bind()
