"""workers.retention.trim_stream on a private redis-server: the ingest stream is trimmed to the oldest
entry a consumer group still needs; unread and pending (unacknowledged) entries always stay."""

from __future__ import annotations

import pytest
import redis

from memq.config import load_settings
from memq.workers.retention import beat_entries, trim_floor, trim_stream
from tests.ops.stackfile import Server


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("trim"), "--save", "").start()
    yield s
    s.kill()


def _st(srv, stream: str):
    return load_settings({"MEMQ_CONFIG": "/nonexistent.toml", "MEMQ_REDIS_URL": srv.url, "MEMQ_STREAM": stream,
                          "MEMQ_STREAM_KEEP_S": "0"})


def test_trim_keeps_what_a_group_still_needs(srv):
    r = redis.Redis.from_url(srv.url)
    st = _st(srv, "memq:trim1")
    ids = [r.xadd(st.stream_key, {"i": str(i)}) for i in range(10)]
    assert trim_floor(r, st.stream_key) is None  # no consumer group yet: nobody has read anything
    assert trim_stream(st, r)["trimmed"] == 0 and r.xlen(st.stream_key) == 10

    r.xgroup_create(st.stream_key, "memq-dispatch", id="0")
    got = r.xreadgroup("memq-dispatch", "c1", {st.stream_key: ">"}, count=6)[0][1]
    assert [e for e, _ in got] == ids[:6]
    r.xack(st.stream_key, "memq-dispatch", *ids[:4])  # entries 5 and 6 still pending
    out = trim_stream(st, r)
    assert out["trimmed"] == 4 and r.xlen(st.stream_key) == 6
    assert [e for e, _ in r.xrange(st.stream_key)] == ids[4:]
    # the pending ones can still be claimed (a dead dispatcher's work), the unread ones still read
    claimed = r.xautoclaim(st.stream_key, "memq-dispatch", "c2", min_idle_time=0, start_id="0-0")[1]
    assert [e for e, _ in claimed] == ids[4:6]
    r.xack(st.stream_key, "memq-dispatch", *ids[4:6])
    assert trim_stream(st, r)["trimmed"] == 2 and r.xlen(st.stream_key) == 4
    rest = r.xreadgroup("memq-dispatch", "c1", {st.stream_key: ">"})[0][1]
    r.xack(st.stream_key, "memq-dispatch", *[e for e, _ in rest])
    assert trim_stream(st, r)["trimmed"] == 4 and r.xlen(st.stream_key) == 0
    assert trim_stream(st, r)["trimmed"] == 0


def test_the_slowest_group_decides(srv):
    r = redis.Redis.from_url(srv.url)
    st = _st(srv, "memq:trim2")
    ids = [r.xadd(st.stream_key, {"i": str(i)}) for i in range(5)]
    r.xgroup_create(st.stream_key, "memq-dispatch", id="0")
    r.xgroup_create(st.stream_key, "other-tool", id="0")
    for e, _ in r.xreadgroup("memq-dispatch", "c", {st.stream_key: ">"})[0][1]:
        r.xack(st.stream_key, "memq-dispatch", e)
    r.xreadgroup("other-tool", "c", {st.stream_key: ">"}, count=2)  # read 2, acknowledged none
    assert trim_stream(st, r)["trimmed"] == 0 and r.xlen(st.stream_key) == 5
    r.xack(st.stream_key, "other-tool", ids[0])
    assert trim_stream(st, r)["trimmed"] == 1 and r.xrange(st.stream_key)[0][0] == ids[1]


def test_recent_acknowledged_entries_are_kept_for_a_while(srv):
    r = redis.Redis.from_url(srv.url)
    st = _st(srv, "memq:trim3")
    sec, _ = r.time()
    old = [r.xadd(st.stream_key, {"i": str(i)}, id=f"{(int(sec) - 3600) * 1000 + i}-0") for i in range(3)]
    new = [r.xadd(st.stream_key, {"i": str(i)}) for i in range(3)]
    r.xgroup_create(st.stream_key, "memq-dispatch", id="$")  # all read and acknowledged
    out = trim_stream(st.replace(stream_keep_s=600), r)
    assert out["trimmed"] == 3 and [e for e, _ in r.xrange(st.stream_key)] == new and old


def test_beat_entry():
    st = load_settings({"MEMQ_CONFIG": "/nonexistent.toml", "MEMQ_STREAM_TRIM_INTERVAL_S": "30"})
    e = beat_entries(st)["memq-stream-trim"]
    assert e["task"] == "workers.retention.trim_stream" and e["schedule"] == 30.0
    assert e["options"]["queue"] == "memq.ingest"
    assert "memq-stream-trim" not in beat_entries(st.replace(stream_trim_interval_s=0))


def test_blobs_without_a_ttl_get_one_in_bounded_steps(srv):
    """A blob the agent user SET without a TTL and no envelope ever named (the relay gives a blob its TTL
    when it relays the envelope) gets MEMQ_BLOB_TTL_S from the trim tick's sweep; a TTL already set
    stays as it is; the walk is bounded per call and resumes from its cursor."""
    from memq.workers.retention import expire_untimed_blobs

    r = redis.Redis.from_url(srv.url)
    st = load_settings({"MEMQ_CONFIG": "/nonexistent.toml", "MEMQ_REDIS_URL": srv.url,
                        "MEMQ_KEY_PREFIX": "ttlsweep:", "MEMQ_BLOB_TTL_S": "3600"})
    untimed = [f"ttlsweep:blob:{i:064x}:n{i}" for i in range(120)]
    for k in untimed:
        r.set(k, b"x")
    r.set("ttlsweep:blob:relayed", b"x", ex=60)  # the relay already gave it one
    r.set("ttlsweep:other", b"x")  # not a blob: left alone
    first = expire_untimed_blobs(st, r, budget=50)
    assert 50 <= first["blobs_seen"] < 121 and not first["scan_done"]
    for _ in range(10):
        if expire_untimed_blobs(st, r, budget=50)["scan_done"]:
            break
    assert all(0 < r.ttl(k) <= 3600 for k in untimed)
    assert 0 < r.ttl("ttlsweep:blob:relayed") <= 60 and r.ttl("ttlsweep:other") == -1
    again = expire_untimed_blobs(st, r, budget=1000)
    assert again["blobs_given_ttl"] == 0 and again["scan_done"]
