"""Redis connections, in one place.

- `make_client(url, timeout_s)`: hard timeouts and no hidden retries, for callers that handle a
  failure themselves (the agent's transport spools, `memq push` and `memq doctor` report it); the
  dispatcher's long-blocking reader passes its own timeouts and keeps redis-py's retries.
- `shared_client(url, timeout_s)`: one client per URL per process, kept (the services: dispatcher,
  workers, status); `forget_shared()` after a fork so a child never uses its parent's sockets.
"""

from __future__ import annotations

from typing import Any

_shared: dict[str, Any] = {}


def make_client(url: str, timeout_s: float, *, connect_timeout_s: float | None = None,
                retries: bool = False, health_check_s: int = 0):
    """A redis-py client with hard timeouts; no hidden retries unless `retries` (redis-py's own, for a
    long-lived reader that reconnects by itself: the dispatcher)."""
    import redis  # the agent imports this module and runs without redis-py (spool only)
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    extra = {} if retries else {"retry": Retry(NoBackoff(), 0)}
    return redis.Redis.from_url(url, socket_timeout=timeout_s, health_check_interval=health_check_s,
                                socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
                                **extra)


def shared_client(url: str, timeout_s: float = 10.0):
    c = _shared.get(url)
    if c is None:
        c = make_client(url, timeout_s, retries=True, health_check_s=30)
        _shared[url] = c
    return c


def forget_shared() -> None:
    _shared.clear()
