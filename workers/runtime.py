"""Per-process resources of the workers and the dispatcher, and the small Redis helpers they share.

- `store(settings)`: one `Store` (engine pool + blob store) per process; `reset()` after a fork.
- `redis_client(url)`: redis-py with socket timeouts; errors become `BrokerUnavailable` where the
  callers translate them (`redis_errors()`).
- `dead_letter(r, settings, fields, reason)`: `XADD <dead stream>` with the original fields plus
  `reason` (ARCHITECTURE.md, "Envelope"), trimmed to about 100,000 entries.
- `debounce(r, key, ttl_ms)`: SET NX PX; True when this caller should schedule the work.
- `is_transient(exc)`: the one answer to "outage or bad data?". Only connection and availability
  errors (Redis unreachable, loading, read-only, out of memory; the database unreachable, locked or
  restarting; the schema waiting for `memq db upgrade`) are transient: wait and retry. Everything else
  (a refused envelope or blob, a value the database refuses, a RecursionError, a MemoryError under
  the decode budget, a bug) is bad data for the entry or task in hand: dead letter / failed at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

import redis
from kombu.exceptions import OperationalError

from memq.config import Settings, load_settings, redact_url
from memq.envelope import dead_letter_fields
from memq.errors import (
    BadInput,
    BrokerUnavailable,
    DecodeUnavailable,
    SchemaOutOfDate,
    StorageError,
    StorageUnavailable,
)
from memq.queues import GROUP, QUEUE_ANALYZE, QUEUE_INGEST, QUEUE_REPORT, QUEUES  # noqa: F401 - named here too
from memq.redis_client import forget_shared, shared_client
from memq.store.connection import open_store
from memq.store.db import commit_asynchronously

log = logging.getLogger("memq.workers")

DEAD_MAXLEN = 100_000

_stores: dict[tuple, object] = {}
_settings: Settings | None = None


def settings() -> Settings:
    """The process's settings, read from the environment once (the default Celery app's too:
    `memq.workers.app.settings_of`)."""
    global _settings
    if _settings is None:
        _settings = load_settings()
    return _settings


def store(st: Settings | None = None, *, async_commit: bool = False):
    """The process's Store (the schema is checked once, when it is first opened).

    `async_commit=True` (the analysis workers) sets PostgreSQL's synchronous_commit off for their
    sessions: a commit returns before its WAL reaches the disk. A server crash can then forget the
    last fraction of a second of results; every such loss is re-driven (a snapshot whose `done`
    was forgotten is leased or pending again, and the reaper enqueues it; a lost run diagnosis is
    found stale). The dispatcher keeps synchronous commits: its row must be durable before XACK."""
    st = st or settings()
    key = (st.database_url, st.blob_dir, async_commit)
    found = _stores.get(key)
    if found is None:
        found = open_store(st)
        if async_commit:
            commit_asynchronously(found.engine)
        _stores[key] = found
    return found


def reset() -> None:
    """Forget connections inherited over fork (never close the parent's sockets from a child)."""
    for found in _stores.values():
        with contextlib.suppress(Exception):
            found.engine.dispose(close=False)
    _stores.clear()
    forget_shared()


def redis_client(url: str | None = None, timeout_s: float = 10.0):
    return shared_client(url or load_settings().redis_url, timeout_s)


@contextlib.contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Connection-level Redis errors -> BrokerUnavailable (retryable); the URL shown is redacted."""
    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
        raise BrokerUnavailable(f"Redis {redact_url(url)} unavailable: {type(exc).__name__}: {exc}",
                                hint="check that it is running and reachable; retry later") from exc
    except redis.ResponseError as exc:
        if _redis_not_ready(exc):
            raise BrokerUnavailable(f"Redis {redact_url(url)} not ready: {exc}") from exc
        raise


#: Redis error replies that say "not now" rather than "not this": a loading or failed-over server,
#: a replica, a full server (noeviction), a busy script, a cluster in transition.
_NOT_READY = ("LOADING", "MASTERDOWN", "READONLY", "OOM", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "NOREPLICAS",
              "MISCONF")


def _redis_not_ready(exc: BaseException) -> bool:
    return str(exc).split(" ", 1)[0] in _NOT_READY


def _db_limit(exc: BaseException) -> bool:
    """A database 'unavailable' error that is really this statement's data: PostgreSQL class 54
    (program limit exceeded: a row, an index entry, a statement too large), SQLite's size limits."""
    cause = exc.__cause__
    orig = getattr(cause, "orig", cause)
    code = str(getattr(orig, "sqlstate", "") or "")
    text = str(orig).lower()
    return code.startswith("54") or "too big" in text or "too many sql variables" in text


def is_transient(exc: BaseException) -> bool:
    """True for an outage (retry later), False for bad data (never retry). See the module docstring."""
    if isinstance(exc, (BrokerUnavailable, SchemaOutOfDate, DecodeUnavailable, redis.ConnectionError,
                        redis.TimeoutError, redis.BusyLoadingError)):
        return True
    if isinstance(exc, redis.ResponseError):
        return _redis_not_ready(exc)
    if isinstance(exc, StorageUnavailable):
        return not _db_limit(exc)
    if isinstance(exc, StorageError) and isinstance(exc.__cause__, OSError):
        return True  # the blob store's disk (full, unmounted, read-only): ours, not the input's
    return isinstance(exc, OperationalError)


def is_bad_input(exc: BaseException) -> bool:
    """Errors an input causes by itself, every time: never worth another attempt of the same work.
    (A bug or a soft time limit may be worth a bounded retry; these are not.)"""
    return isinstance(exc, (BadInput, RecursionError, MemoryError)) and not is_transient(exc)


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def dead_letter(r, st: Settings, fields: Mapping[Any, Any], reason: str, **extra: Any) -> str:
    """Append one dead letter: the original fields (any bytes: envelope.dead_letter_fields),
    `reason`, and `extra` (e.g. entry_id, stage)."""
    out = dead_letter_fields(fields)
    out.update({k: _text(v) for k, v in extra.items() if v is not None})
    out["reason"] = reason[:2000]
    out.setdefault("dead_at", str(int(time.time() * 1000)))
    with redis_errors(st.redis_url):
        pipe = r.pipeline(transaction=True)
        pipe.xadd(st.dead_letter_key, out, maxlen=DEAD_MAXLEN, approximate=True)
        pipe.incr(st.dead_letter_total_key)
        return _text(pipe.execute()[0])


def debounce(r, key: str, ttl_ms: int) -> bool:
    """True when no other caller holds `key` (then it is held for ttl_ms)."""
    return bool(r.set(key, b"1", nx=True, px=max(1, int(ttl_ms))))


def run_diag_key(st: Settings, run_id: int, rank: int) -> str:
    return f"{st.key_prefix}rundiag:{int(run_id)}:{int(rank)}"


def enqueue_key(st: Settings, snapshot_id: int) -> str:
    return f"{st.key_prefix}enqueued:{int(snapshot_id)}"
