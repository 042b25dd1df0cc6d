"""Reconnect back-off with full jitter, for the agent's transport and the dispatcher.

Without jitter, every client that lost Redis at the same moment (a restart) retries at the same
moments (0.5, 1, 2, 4 s ...), and 10,000 agents arrive together each time. Full jitter waits a
uniform random time in [0, min(cap, base * 2**failures)], which spreads the retries over the whole
window (measured: benchmarks/bench_reconnect.py, benchmarks/RESULTS.md). redis-py's
FullJitterBackoff computes it; the formula is repeated for the agent without redis-py.
"""

from __future__ import annotations

import random


def full_jitter(delay: float) -> float:
    """A uniform random wait in [0, delay]: for loops that keep their own doubling delay."""
    return random.uniform(0.0, max(0.0, delay))


class JitteredBackoff:
    """`next()` after each failure gives the wait before the next try; `reset()` after a success."""

    def __init__(self, base: float, cap: float, jitter: bool = True):
        self.base, self.cap, self.jitter = base, cap, jitter
        self.failures = 0
        try:
            from redis.backoff import FullJitterBackoff
        except ImportError:  # the agent runs without redis-py (spool only)
            self._redis = None
        else:
            self._redis = FullJitterBackoff(cap=cap, base=base)

    def ceiling(self) -> float:
        """The wait without jitter: base doubling per failure, capped."""
        return min(self.cap, self.base * 2 ** min(self.failures, 64))

    def next(self) -> float:
        if not self.jitter:
            delay = self.ceiling()
        elif self._redis is not None:
            delay = self._redis.compute(min(self.failures, 64))
        else:
            delay = full_jitter(self.ceiling())
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0
