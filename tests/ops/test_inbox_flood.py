"""Inbox starvation (benchmarks/bench_inbox_flood.py): junk that the agent user pushes into the inbox
must not delay another job's entries. A private redis-server with deploy/'s ACL users, the real
dispatcher (SQLite history), RPUSH as `memq-agent`.

Before the relay dropped junk in bulk, 200,000 one-byte elements were relayed as stub entries and
dead-lettered one by one: the victim's entry behind them was not stored within 120 s."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from memq import redis_functions
from tests.ops.acl_redis import acl_redis

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.bench_inbox_flood import burst, dispatcher, settings, sustained  # noqa: E402


@pytest.fixture(scope="module")
def flood(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("flood")
    with acl_redis(tmp) as srv:
        st = settings(tmp, srv["memq_url"])
        d = dispatcher(st)
        d.step()  # the consumer group
        yield srv, st, d, redis_functions.inbox_key(st.stream_key)


def test_a_burst_of_200k_junk_elements_delays_another_job_by_seconds_not_minutes(flood):
    srv, st, d, inbox = flood
    got = burst(srv["agents"]["file"], d, inbox, 200_000, timeout_s=15)
    assert got["stored"] and got["victim_wait_s"] < 10, got
    assert d.relay.counts["refused"] >= 200_000 and srv["memq"].llen(inbox) == 0
    # counted in a few dead letters, not 200,000 (the dead stream keeps its room for real ones)
    dead = [f for _, f in srv["memq"].xrange(st.dead_letter_key) if f.get(b"relay_error")]
    assert sum(int(f[b"dropped"]) for f in dead) == 200_000 and len(dead) < 50
    assert int(srv["memq"].get(st.dead_letter_key + ":total")) >= 200_000


def test_a_sustained_flood_is_cleared_as_fast_as_it_is_pushed(flood):
    srv, st, d, inbox = flood
    got = sustained(srv["agent_url"], srv["agents"]["file"], d, inbox, 4.0, timeout_s=20)
    assert got["victims_stored"] == got["victims_sent"] >= 5, got
    assert got["victim_wait_max_s"] < 3.0, got
    assert got["inbox_left"] <= 100_000, got  # the inbox did not grow with the flood


def test_an_idle_dispatcher_blocks_on_its_stream_again_after_a_flood(flood):
    """Reads without waiting only while the relay clears the inbox: once it is empty the dispatcher
    blocks on its stream again (no busy loop burning a core)."""
    srv, st, d, inbox = flood
    srv["agents"]["file"].rpush(inbox, *([b"x"] * 1000))
    d.step()
    assert srv["memq"].llen(inbox) == 0
    d.step()
    assert not d.relay.hurry
    t0 = time.perf_counter()
    d.step()  # nothing anywhere: one blocking read of block_ms (200 ms)
    assert time.perf_counter() - t0 >= 0.15


def test_a_sustained_flood_of_wellformed_unsigned_envelopes_is_dropped_by_the_relay(tmp_path):
    """Round 5: junk the relay cannot tell from real entries (complete, unsigned stats envelopes) while the
    dispatcher holds a keyring. Before the relay knew the key ids, each was relayed and refused at the
    dispatcher's door (a dead letter each, ~1,300 a second here): a 5 s flood of 1,030,000 delayed the
    signed victim's entries past 120 s (3 of 16 stored). Now they are dropped in the relay."""
    import benchmarks.bench_inbox_flood as bench

    ring, bench.VICTIM_KEY = bench.keyring()
    try:
        with acl_redis(tmp_path) as srv:
            st = settings(tmp_path, srv["memq_url"], MEMQ_AGENT_KEYRING=ring)
            d = dispatcher(st)
            d.step()
            inbox = redis_functions.inbox_key(st.stream_key)
            got = sustained(srv["agent_url"], srv["agents"]["file"], d, inbox, 4.0, timeout_s=20, wellformed=True)
    finally:
        bench.VICTIM_KEY = None
    assert got["victims_stored"] == got["victims_sent"] >= 5, got
    assert got["victim_wait_max_s"] < 3.0 and got["refused_at_door"] == 0, got
    assert got["inbox_left"] <= 100_000, got
