"""What contains the agent's failures: every part calls the job's objects and torch through a `Guard`,
which counts a failure in the counters' `errors` and logs it at debug level, so that no exception
of the agent's work reaches the training loop."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

from memq.agent.transport import Counters

log = logging.getLogger("memq.agent")
T = TypeVar("T")


class Guard:
    def __init__(self, counters: Counters):
        self.counters = counters

    def error(self) -> None:
        """One failure absorbed."""
        self.counters.add("errors")

    def call(self, fn: Callable[[], T], default: Any = None) -> T | Any:
        """`fn()`, or `default` when it raises (counted)."""
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            self.error()
            log.debug("memq agent: %s failed: %s", getattr(fn, "__name__", fn), exc)
            return default
