"""Reconnect back-off with full jitter (issue 15): agents that lose Redis together come back spread
out, and nothing they sent meanwhile is lost.

benchmarks/bench_reconnect.py at a smaller N: real transports, a private redis-server (AOF) that is
stopped and started again while every agent keeps submitting in lockstep."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

from memq.backoff import JitteredBackoff, full_jitter

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_reconnect.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_reconnect", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_backoff_waits_are_random_below_the_doubling_ceiling():
    random.seed(7)
    b = JitteredBackoff(0.5, 30.0)
    waits = [b.next() for _ in range(10)]
    ceilings = [min(30.0, 0.5 * 2**n) for n in range(10)]
    assert all(0 <= w <= c for w, c in zip(waits, ceilings, strict=True))
    assert len({round(w, 6) for w in waits}) == 10  # not a fixed schedule
    b.reset()
    assert b.failures == 0 and b.next() <= 0.5
    fixed = JitteredBackoff(0.5, 30.0, jitter=False)
    assert [fixed.next() for _ in range(8)] == [0.5, 1, 2, 4, 8, 16, 30, 30]
    assert all(0 <= full_jitter(2.0) <= 2.0 for _ in range(100)) and full_jitter(-1) == 0


def test_a_hundred_agents_reconnect_spread_out_after_a_restart_and_lose_nothing():
    bench = _bench()
    jit = bench.simulate(100, jitter=True, deadline_s=40)
    assert jit["missing"] == 0 and jit["found"] == jit["submitted"] == 400 and jit["dropped"] == 0, jit
    # (an agent whose first send after the stop came only after the restart may be reconnected by
    # redis-py's pool without a back-off: it is not among the planned reconnects)
    assert jit["reconnected"] >= 90 and jit["all_stopped"], jit
    # full jitter: no 100 ms window holds more than a quarter of the fleet's planned reconnects
    assert jit["max_planned_per_bucket_fraction"] <= 0.25 and jit["planned_span_s"] >= 2.0, jit
    lockstep = bench.simulate(100, jitter=False, deadline_s=40)
    assert lockstep["missing"] == 0, lockstep
    # without jitter the same fleet plans its reconnects together (here: usually all in one bucket;
    # this process's own lag running the threads spreads them somewhat)
    assert lockstep["max_planned_per_bucket"] > jit["max_planned_per_bucket"], (lockstep, jit)
