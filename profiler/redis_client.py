"""Redis connections, in one place.

- `make_client(url, timeout_s)`: hard timeouts and no hidden retries, for callers that handle a
  failure themselves (the agent's transport spools, `memq push` reports it).
- `shared_client(url, timeout_s)`: one client per URL per process, kept (the services: dispatcher,
  workers, status); `forget_shared()` after a fork so a child never uses its parent's sockets.
"""

from __future__ import annotations

from typing import Any

_shared: dict[str, Any] = {}


def make_client(url: str, timeout_s: float):
    """A redis-py client with hard timeouts and no hidden retries."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    return redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                retry=Retry(NoBackoff(), 0), health_check_interval=0)


def shared_client(url: str, timeout_s: float = 10.0):
    import redis

    c = _shared.get(url)
    if c is None:
        c = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                 health_check_interval=30)
        _shared[url] = c
    return c


def forget_shared() -> None:
    _shared.clear()
