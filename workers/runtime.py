"""Per-process resources of the workers and the dispatcher, and the small Redis helpers they share.

- `store(settings)`: one `Store` (engine pool + blob store) per process; `reset()` after a fork.
- `redis_client(url)`: redis-py with socket timeouts; errors become `BrokerUnavailable` where the
  callers translate them (`redis_errors()`).
- `dead_letter(r, settings, fields, reason)`: `XADD <dead stream>` with the original fields plus
  `reason` (ARCHITECTURE.md, "Envelope"), trimmed to about 100,000 entries.
- `debounce(r, key, ttl_ms)`: SET NX PX; True when this caller should schedule the work.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from profiler.config import Settings, load_settings, redact_url
from profiler.errors import BrokerUnavailable

log = logging.getLogger("memq.workers")

DEAD_MAXLEN = 100_000
#: The dispatcher's consumer group on the ingest stream.
GROUP = "memq-dispatch"
QUEUE_INGEST = "memq.ingest"
QUEUE_ANALYZE = "memq.analyze"
QUEUE_REPORT = "memq.report"
QUEUES = (QUEUE_INGEST, QUEUE_ANALYZE, QUEUE_REPORT)

_store = None
_store_key: tuple | None = None
_clients: dict[str, Any] = {}


def settings() -> Settings:
    from workers.app import app, settings_of

    return settings_of(app)


def store(st: Settings | None = None):
    """The process's Store (the schema is checked once, when it is first opened)."""
    global _store, _store_key
    st = st or settings()
    key = (st.database_url, st.blob_dir)
    if _store is None or _store_key != key:
        from profiler.store.store import open_store

        _store = open_store(st)
        _store_key = key
    return _store


def reset() -> None:
    """Forget connections inherited over fork (never close the parent's sockets from a child)."""
    global _store, _store_key
    if _store is not None:
        with contextlib.suppress(Exception):
            _store.engine.dispose(close=False)
    _store, _store_key = None, None
    _clients.clear()


def redis_client(url: str | None = None, timeout_s: float = 10.0):
    import redis

    url = url or load_settings().redis_url
    c = _clients.get(url)
    if c is None:
        c = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                 health_check_interval=30)
        _clients[url] = c
    return c


@contextlib.contextmanager
def redis_errors(url: str) -> Iterator[None]:
    """Connection-level Redis errors -> BrokerUnavailable (retryable); the URL shown is redacted."""
    import redis

    try:
        yield
    except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
        raise BrokerUnavailable(f"Redis {redact_url(url)} unavailable: {type(exc).__name__}: {exc}",
                                hint="check that it is running and reachable; retry later") from exc
    except redis.ResponseError as exc:
        if "LOADING" in str(exc) or "MASTERDOWN" in str(exc) or "READONLY" in str(exc):
            raise BrokerUnavailable(f"Redis {redact_url(url)} not ready: {exc}") from exc
        raise


def _text(v: Any) -> str:
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


def dead_letter(r, st: Settings, fields: Mapping[Any, Any], reason: str, **extra: Any) -> str:
    """Append one dead letter: the original fields, `reason`, and `extra` (e.g. entry_id, stage)."""
    out = {_text(k): _text(v) for k, v in fields.items()}
    out.update({k: _text(v) for k, v in extra.items() if v is not None})
    out["reason"] = reason[:2000]
    out.setdefault("dead_at", str(int(time.time() * 1000)))
    with redis_errors(st.redis_url):
        return _text(r.xadd(st.dead_letter_key, out, maxlen=DEAD_MAXLEN, approximate=True))


def debounce(r, key: str, ttl_ms: int) -> bool:
    """True when no other caller holds `key` (then it is held for ttl_ms)."""
    return bool(r.set(key, b"1", nx=True, px=max(1, int(ttl_ms))))


def run_diag_key(st: Settings, run_id: int, rank: int) -> str:
    return f"{st.key_prefix}rundiag:{int(run_id)}:{int(rank)}"


def enqueue_key(st: Settings, snapshot_id: int) -> str:
    return f"{st.key_prefix}enqueued:{int(snapshot_id)}"
