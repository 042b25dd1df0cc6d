"""The agents' inbox and its relay (profiler/redis_functions.py, profiler/memq_functions.lua) on a
private redis-server started with deploy/'s ACL file.

The agent user can only RPUSH the inbox; whatever it pushes there, the relay (run by the services'
user) cannot be made to trim, delete or block the stream: other jobs' entries stay, the last ID stays
ordinary, later messages still go through, and the real dispatcher dead-letters the junk with its
reason. The real agent (ReplaySource) delivers snapshots and stats through the inbox as that user."""

from __future__ import annotations

import json
import re
import time

import pytest
import redis

from memq import codec, envelope, redis_functions
from memq.redis_functions import Relay, doctor_checks, ensure_library, loaded_version
from tests.ops.acl_redis import acl_redis

STREAM, INBOX = "memq:ingest", "memq:ingest:inbox"
LUA = redis_functions.SOURCE


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with acl_redis(tmp_path_factory.mktemp("relay")) as srv:
        yield srv


def _settings(tmp_path, redis_url: str, **extra):
    from memq.config import load_settings

    env = {"MEMQ_REDIS_URL": redis_url, "MEMQ_DATABASE_URL": f"sqlite:///{tmp_path}/h.db",
           "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_BLOB_DIR": str(tmp_path / "blobs"),
           "MEMQ_SPOOL_DIR": str(tmp_path / "spool"), "MEMQ_CONFIG": str(tmp_path / "none.toml"),
           "MEMQ_MAX_DELIVERIES": "2", "MEMQ_CLAIM_IDLE_S": "1", **extra}
    return load_settings(env)


def _relay(memq, **kw) -> Relay:
    kw = {"stream": STREAM, "key_prefix": "memq:", "maxlen": 100_000, "blob_ttl_s": 7 * 24 * 3600, **kw}
    return Relay(memq, **kw)


def _ids(memq) -> list[bytes]:
    return [i for i, _ in memq.xrange(STREAM)] if memq.exists(STREAM) else []


def _good(run: str, i: int = 0) -> str:
    return redis_functions.encode_fields(envelope.build(
        "stats", run=run, cluster="c", rank=0, payload={"samples": [{"t": time.time(), "allocated_bytes": i}]}))


def _hostile() -> list[bytes]:
    """What an attacker holding the agent's password can put in the inbox."""
    snap = envelope.build("snapshot", run="evil", cluster="c", sha256="ab" * 32, size=1, codec="zstd",
                          trigger="manual")
    return [
        b"not json",
        b"",
        b"{}",
        b'{"v": "1", "kind": "stats"}',
        b"[]",
        b'["v"]',
        b"[1, 2]",
        b'["v", 1]',
        b"[null, null]",
        b'[["MAXLEN", "0"], "x"]',
        b"[" * 5000 + b"]" * 5000,
        b'["v", "\xff\xfe"]',
        json.dumps(["MAXLEN", "0", "*", "x"]).encode(),  # trim options as field names
        json.dumps(["18446744073709551615-18446744073709551614", "x"]).encode(),  # an explicit ID as a name
        json.dumps(["v", "1", "id", "18446744073709551615-18446744073709551614"]).encode(),
        json.dumps([f"f{i}" for i in range(200)]).encode(),  # 100 fields
        json.dumps(["payload", "x" * 1_200_000]).encode(),  # a value over the cap
        b'["v", "' + b"y" * (3 << 20) + b'"]',  # an element over the cap
        json.dumps(["n" * 100, "long name"]).encode(),
        redis_functions.encode_fields({**snap, "sha256": "../../etc/passwd"}).encode(),  # bad sha256
        redis_functions.encode_fields({**snap, "size": str(1 << 80), "rank": "-1"}).encode(),
    ]


def test_lua_and_python_library_versions_agree():
    m = re.search(r"^local VERSION = (\d+)", LUA.read_text(), re.M)
    assert m and int(m.group(1)) == redis_functions.VERSION
    assert LUA.read_text().startswith(f"#!lua name={redis_functions.LIBRARY}\n")


def test_hostile_inbox_cannot_trim_delete_or_block_the_stream(server):
    memq, agent = server["memq"], server["agents"]["file"]
    relay = _relay(memq)
    for i in range(5):  # another job's entries, waiting for the dispatcher
        agent.rpush(INBOX, _good("other-job", i))
    assert relay.step() == 5
    before = _ids(memq)
    hostile = _hostile()
    for raw in hostile:
        agent.rpush(INBOX, raw)
    moved = relay.step()
    # 6 pass as odd fields (the dispatcher's envelope check refuses them): the MAXLEN- and ID-like
    # names, a stray "id", non-UTF-8 bytes, a bad sha256 and out-of-range numbers; the junk is
    # dropped by the relay, counted, never an entry
    assert moved == 6 and relay.counts["refused"] == len(hostile) - 6 and memq.llen(INBOX) == 0
    after = _ids(memq)
    assert after[:len(before)] == before  # nothing trimmed or deleted
    assert len(after) == len(before) + 6
    # every entry got a server-chosen ID near now: the last ID is ordinary, nowhere near exhaustion
    now_ms = int(memq.time()[0]) * 1000
    for eid in after[len(before):]:
        assert abs(int(eid.split(b"-")[0]) - now_ms) < 60_000
    new = memq.xrange(STREAM, min=after[len(before)])
    assert not [f for _, f in new if f.get(b"v") == b"0"]
    assert not any(len(f) > 32 for _, f in new) and max(len(v) for _, f in new for v in f.values()) <= 1_100_000
    # later messages still go through, with IDs after the hostile ones
    agent.rpush(INBOX, _good("after-the-attack"))
    assert relay.step() == 1
    last = _ids(memq)[-1]
    assert last > after[-1] and memq.xrange(STREAM, min=last)[0][1][b"run"] == b"after-the-attack"


def test_relay_refuses_bad_arguments_and_keeps_what_the_stream_refuses(server):
    memq = server["memq"]
    memq.delete("memq:t:inbox", "memq:t")
    memq.rpush("memq:t:inbox", _good("x"), _good("y"))
    for args in (("0", "10", "memq:", "10"), ("-5", "10", "memq:", "10"), ("abc", "10", "memq:", "10"),
                 ("1", "0", "memq:", "10"), ("1", "10", "memq:", "-1")):
        with pytest.raises(redis.ResponseError):
            memq.fcall("memq_relay", 2, "memq:t:inbox", "memq:t", *args)
    assert memq.llen("memq:t:inbox") == 2 and not memq.exists("memq:t")
    # a stream the relay cannot append to (here: a string): the inbox is left as it was
    memq.set("memq:t", b"not a stream")
    relay = Relay(memq, stream="memq:t", key_prefix="memq:", maxlen=10, blob_ttl_s=10)
    assert relay.step() == 0 and relay.counts["errors"] == 1 and "WRONGTYPE" in relay.last_error
    assert [json.loads(e)[5] for e in memq.lrange("memq:t:inbox", 0, -1)] == ["x", "y"]  # kept, in order
    memq.delete("memq:t:inbox", "memq:t")


def test_one_relay_call_moves_a_bounded_number_of_bytes(server):
    """Redis serves nobody while a function runs: a call stops after 16 MiB, the next goes on."""
    memq, agent = server["memq"], server["agents"]["file"]
    big = json.dumps(["v", "1", "kind", "stats", "run", "big", "payload", "z" * 1_000_000])
    for _ in range(40):
        agent.rpush(INBOX, big)
    relay = _relay(memq)
    first = relay.step()
    assert 10 <= first < 40 and memq.llen(INBOX) == 40 - first
    while relay.step():
        pass
    assert memq.llen(INBOX) == 0 and relay.counts["moved"] == 40
    memq.xtrim(STREAM, maxlen=100)


def test_relayed_snapshot_blob_gets_the_deployment_ttl(server):
    memq, agent = server["memq"], server["agents"]["file"]
    shas = ["c1" * 32, "c2" * 32]
    agent.set(f"memq:blob:{shas[0]}", b"no ttl")  # the agent may leave out EX ...
    agent.set(f"memq:blob:{shas[1]}", b"long ttl", ex=10**8)  # ... or choose a huge one
    for sha in shas:
        agent.rpush(INBOX, redis_functions.encode_fields(envelope.build(
            "snapshot", run="ttl", cluster="c", sha256=sha, size=6, codec="zstd", trigger="manual")))
    assert _relay(memq, blob_ttl_s=100).step() == 2
    for sha in shas:
        assert 0 < memq.ttl(f"memq:blob:{sha}") <= 100


def test_real_agent_delivers_through_the_inbox_and_the_dispatcher_ingests(server, tmp_path):
    """memq.agent with a ReplaySource of real snapshots, as memq-agent; an attacker's junk in the
    same inbox; the real dispatcher (as the memq user) relays, ingests the agent's messages and
    drops the junk, counted in a dead letter."""
    from memq.workers.dispatcher import Dispatcher
    from tests.agent.conftest import make_agent

    memq, agent_user = server["memq"], server["agents"]["doc"]
    st = _settings(tmp_path, server["memq_url"])
    d = Dispatcher(st, consumer="relay-test", batch=50, block_ms=50, enqueue=(enqueued := []).append)
    dead_before = memq.xlen(st.dead_letter_key) if memq.exists(st.dead_letter_key) else 0
    for raw in _hostile()[:6]:
        agent_user.rpush(INBOX, raw)
    a = make_agent(run="inbox-run", redis_url=server["agent_url"], spool_dir=str(tmp_path / "spool"),
                   stats_interval_s=0.05, stats_flush_s=0.1, settings=st)
    for step in range(3):
        a.mark_step(step, 0)
        time.sleep(0.1)
    a.mark_epoch(0)
    assert a.flush(20)
    a.stop(10)
    c = a.counters()
    assert c["sent"] >= 3 and c["via_inbox"] == c["sent"] + c["replayed"] and c["spooled"] == 0, c
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (memq.llen(INBOX) or _lag(memq, st)):
        d.step()
    assert memq.llen(INBOX) == 0 and _lag(memq, st) == 0
    reasons = [f.get(b"reason") for _, f in memq.xrange(st.dead_letter_key)][dead_before:]
    assert d.counts["snapshots"] >= 1 and d.counts["samples"] >= 1 and d.counts["runs"] >= 1, (d.counts, reasons)
    assert len(enqueued) == d.counts["snapshots"]
    dead = [f for _, f in memq.xrange(st.dead_letter_key)][dead_before:]
    # the six junk elements: dropped by the relay, one dead letter per step counting them
    assert all(f.get(b"reason") for f in dead)
    assert sum(int(f.get(b"dropped", 0)) for f in dead if b"relay_error" in f) == 6


def test_another_job_cannot_overwrite_a_blob_in_flight(server, tmp_path):
    """Every agent shares the memq-agent user, which may SET memq:blob:*. A victim's snapshot waits in
    the inbox; the attacker knows its sha256 (a common model's snapshot is public knowledge) and SETs
    junk at every key it can name. The blob's key carries the envelope's random nonce, which the agent
    user cannot read back, so the victim's snapshot is still ingested intact."""
    from memq.agent.transport import Item, Transport, append_fields
    from memq.workers.dispatcher import Dispatcher
    from tests.agent.conftest import REAL

    memq, attacker = server["memq"], server["agents"]["file"]
    victim = redis.Redis.from_url(server["agent_url"])
    st = _settings(tmp_path, server["memq_url"])
    snap = codec.decompress((REAL / "capacity" / "oom.pickle.gz").read_bytes())
    tr = Transport.__new__(Transport)  # serialize() needs only these: no thread, no connection
    tr.identity, tr.codec, tr.key_prefix = {"run": "victim", "cluster": "c", "rank": 0}, "gzip", "memq:"
    msgs = [tr.serialize(Item("run_start", payload={})), tr.serialize(Item("snapshot", obj=snap, trigger="oom"))]
    env = envelope.parse(msgs[1].fields)
    assert env.nonce and msgs[1].blob_key == f"memq:blob:{env.sha256}:{env.nonce}"
    for m in msgs:
        if m.blob_key:
            victim.set(m.blob_key, m.blob, ex=3600)
        append_fields(victim, m.fields, stream=STREAM, maxlen=100_000)
    # the attacker: the bare key, the key with a guessed nonce, and it cannot list keys to find the real one
    attacker.set(f"memq:blob:{env.sha256}", b"junk")
    attacker.set(f"memq:blob:{env.sha256}:{'0' * 32}", b"junk")
    with pytest.raises(redis.exceptions.NoPermissionError):
        attacker.scan(match="memq:blob:*")
    with pytest.raises(redis.exceptions.NoPermissionError):
        attacker.lrange(INBOX, 0, -1)
    d = Dispatcher(st, consumer="nonce-test", batch=50, block_ms=50, enqueue=(enqueued := []).append)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (memq.llen(INBOX) or _lag(memq, st)):
        d.step()
    assert d.counts["snapshots"] == 1 and len(enqueued) == 1, d.counts
    assert d.store.blobs.ref(env.sha256) is not None
    assert not memq.exists(msgs[1].blob_key)  # moved to the blob store, then deleted from Redis


def _lag(memq, st) -> int:
    groups = memq.xinfo_groups(st.stream_key)
    return int(groups[0]["lag"] or 0) + int(groups[0]["pending"]) if groups else 1


def test_library_is_loaded_upgraded_and_reported_by_doctor(server, tmp_path):
    memq, op, agent = server["memq"], server["op"], server["agents"]["file"]
    st = _settings(tmp_path, server["memq_url"])

    def status() -> dict:
        return {name: (level, detail) for name, level, detail, _fix in doctor_checks(memq, st)}

    op.function_flush()
    assert loaded_version(memq) is None
    assert status()["redis-functions"][0] == "info"  # missing, but nothing waits for it
    agent.rpush(INBOX, _good("waiting"))
    assert status()["redis-functions"][0] == "warning" and status()["inbox"][0] == "info"
    old = LUA.read_text().replace(f"local VERSION = {redis_functions.VERSION}", "local VERSION = 0")
    memq.function_load(old, replace=True)
    assert loaded_version(memq) == 0 and "version 0" in status()["redis-functions"][1]
    assert status()["redis-functions"][0] == "warning"
    assert _relay(memq).step() == 1  # the dispatcher's relay upgrades it
    assert loaded_version(memq) == redis_functions.VERSION and status()["redis-functions"][0] == "ok"
    assert ensure_library(memq) == "current"
    # a message nobody relays for over a minute
    old_ts = envelope.build("stats", run="stale", cluster="c", ts=envelope.now_ms() - 120_000)
    agent.rpush(INBOX, redis_functions.encode_fields(old_ts))
    level, detail = status()["inbox"]
    assert level == "warning" and "no dispatcher is relaying" in detail
    assert _relay(memq).step() == 1 and "inbox" not in status()
    # a newer library (a newer memq's dispatcher) is left alone
    memq.function_load(LUA.read_text().replace(f"local VERSION = {redis_functions.VERSION}", "local VERSION = 99"),
                       replace=True)
    assert ensure_library(memq) == "newer" and loaded_version(memq) == 99
    op.function_flush()
    assert ensure_library(memq) == "loaded"


def _drain(memq, relay, group: str, stream: str, per_read: int = 100) -> list[dict]:
    """What a dispatcher does, step by step: relay, read what it can (XREADGROUP COUNT per_read), ack."""
    got = []
    relay.max_unread = 0
    while True:
        relay.step()
        lag = memq.xinfo_groups(stream)[0]["lag"]
        relay.max_unread = max(relay.max_unread, lag if lag is not None else memq.xlen(stream))
        batch = memq.xreadgroup(group, "c1", {stream: ">"}, count=per_read)
        entries = batch[0][1] if batch else []
        for eid, fields in entries:
            got.append(fields)
            memq.xack(stream, group, eid)
        if not entries and not memq.llen(relay.inbox):
            return got


def test_a_flood_in_the_inbox_cannot_trim_other_jobs_unread_entries(server):
    """Junk pushed ahead of and behind 500 other jobs' entries, 1.2x MAXLEN on each side, with the
    dispatcher reading 100 at a time while the relay moves up to 1000: the relay moves only what the
    stream has room for beside its unread entries, so every other job's entry is read (the relay's own
    MAXLEN ~ trimmed them all before)."""
    memq = agent = server["memq"]  # the agent user may push only to memq:ingest:inbox (ACL tests)
    stream, group, maxlen = "memq:flood", "memq-flood", 5_000
    memq.delete(stream, stream + ":inbox")
    memq.xgroup_create(stream, group, id="0", mkstream=True)
    relay = Relay(memq, stream=stream, key_prefix="memq:", maxlen=maxlen, blob_ttl_s=3600)
    junk = json.dumps(["v", "1", "kind", "stats", "run", "junk"])
    pipe = agent.pipeline(transaction=False)
    for _ in range(int(1.2 * maxlen)):
        pipe.rpush(relay.inbox, junk)
    for i in range(500):
        pipe.rpush(relay.inbox, _good(f"victim-{i % 5}", i))
    for _ in range(int(1.2 * maxlen)):
        pipe.rpush(relay.inbox, junk)
    pipe.execute()
    got = _drain(memq, relay, group, stream)
    victims = [f for f in got if f.get(b"run", b"").startswith(b"victim-")]
    assert len(victims) == 500
    assert len(got) == 500 + 2 * int(1.2 * maxlen)  # nothing lost at all: every element was read once
    # the relay kept pace with the readers (100 a step) instead of moving its 1000 and trimming
    assert 0.8 * maxlen < relay.max_unread <= maxlen


def test_relay_holds_the_inbox_while_the_stream_is_full_of_unread_entries(server):
    """An outage backlog (no dispatcher reading): the relay stops at MAXLEN unread entries and the rest
    waits in the inbox, counted and logged, until readers catch up."""
    memq = agent = server["memq"]  # the agent user may push only to memq:ingest:inbox (ACL tests)
    stream, group, maxlen = "memq:backlog", "memq-backlog", 300
    memq.delete(stream, stream + ":inbox")
    memq.xgroup_create(stream, group, id="0", mkstream=True)
    relay = Relay(memq, stream=stream, key_prefix="memq:", maxlen=maxlen, blob_ttl_s=3600)
    for i in range(4 * maxlen):
        agent.rpush(relay.inbox, _good("backlog", i))
    for _ in range(10):
        relay.step()
    assert memq.xlen(stream) == maxlen and memq.llen(relay.inbox) == 3 * maxlen
    assert relay.waiting == 3 * maxlen and relay.counts["held"] >= 9
    got = _drain(memq, relay, group, stream)
    sent = sorted(int(json.loads(f[b"payload"])["samples"][0]["allocated_bytes"]) for f in got)
    assert sent == list(range(4 * maxlen))


def test_a_group_whose_lag_redis_cannot_tell_counts_the_whole_stream(server):
    """After an XDEL inside the group's range Redis reports no lag; the relay then takes the whole
    stream as unread (it may wait longer, it never trims an unread entry)."""
    memq = agent = server["memq"]  # the agent user may push only to memq:ingest:inbox (ACL tests)
    stream, group = "memq:nolag", "memq-nolag"
    memq.delete(stream, stream + ":inbox")
    memq.xgroup_create(stream, group, id="0", mkstream=True)
    ids = [memq.xadd(stream, {"k": str(i)}) for i in range(10)]
    memq.xreadgroup(group, "c1", {stream: ">"}, count=3)
    memq.xdel(stream, ids[5])
    info = memq.xinfo_groups(stream)[0]
    assert info.get("lag") is None  # Redis 7: unknown after a deletion inside the range
    relay = Relay(memq, stream=stream, key_prefix="memq:", maxlen=9, blob_ttl_s=3600)
    agent.rpush(relay.inbox, _good("waits"))
    assert relay.step() == 0 and relay.waiting == 1  # 9 entries of which 6 unread; unknown: all 9
    memq.xreadgroup(group, "c1", {stream: ">"})
    memq.xtrim(stream, maxlen=0)  # the readers caught up and the read entries were trimmed
    assert relay.step() == 1


def test_with_a_keyring_the_relay_drops_what_no_known_key_signed(server):
    """Round 5 (the inbox bound turned against another team): well-formed but unsigned envelopes used to
    pass the relay and cost the dispatcher a dead letter each, so a flood of them delayed every signed
    job's entries without bound. With the keyring's key ids the relay drops them itself (counted, one dead
    letter per step), with an unsigned snapshot's own blob (nonce key); a bare key keeps its TTL. Elements
    of a known kid still go to the dispatcher, which checks the signature."""
    from memq import identity

    memq, agent = server["memq"], server["agents"]["file"]
    stream = "memq:kidfilter"
    inbox = redis_functions.inbox_key(stream)
    memq.delete(stream, inbox)
    key = identity.Key(kid="team-a-1", secret=b"s" * 32)
    relay = _relay(memq, stream=stream, kids=("team-a-1", "team-b-1"))
    signed = identity.sign(envelope.build("stats", run="ok", cluster="c", rank=0, payload={}), key)
    odd = identity.sign(envelope.build("stats", run="kid", cluster="c", rank=0, payload={}), key)  # a value "kid"
    forged = dict(signed, sig="0" * 64)  # a known kid, a wrong signature: the dispatcher's to refuse
    nonce = envelope.new_nonce()
    unsigned_snap = envelope.build("snapshot", run="u", cluster="c", sha256="cd" * 32, size=1, codec="zstd",
                                   trigger="manual", nonce=nonce)
    bare_snap = envelope.build("snapshot", run="u", cluster="c", sha256="ef" * 32, size=1, codec="zstd",
                               trigger="manual")
    agent.set(envelope.blob_key("cd" * 32, "memq:", nonce), b"x")
    agent.set(envelope.blob_key("ef" * 32, "memq:"), b"x")
    elements = [redis_functions.encode_fields(f) for f in (
        envelope.build("stats", run="nosig", cluster="c", rank=0, payload={}),
        dict(signed, kid="team-z-9"),  # an unknown key id
        dict(signed, sig="not-hex"),
        unsigned_snap, bare_snap, signed, odd, forged)]
    memq.rpush(inbox, *elements)  # what the agent user pushes to memq:ingest:inbox, on a stream of this test's
    assert relay.step() == 3
    got = [dict((k.decode(), v.decode()) for k, v in f.items()) for _, f in memq.xrange(stream)]
    assert [g["run"] for g in got] == ["ok", "kid", "ok"] and got[2]["sig"] == "0" * 64
    assert relay.counts["refused"] == 5
    assert not memq.exists(envelope.blob_key("cd" * 32, "memq:", nonce))
    assert memq.exists(envelope.blob_key("ef" * 32, "memq:"))
    # without a keyring (the default) every well-formed element goes, as before
    memq.rpush(inbox, elements[0])
    assert _relay(memq, stream=stream).step() == 1
