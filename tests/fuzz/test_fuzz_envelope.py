"""Fuzzing the envelope door (issue 13): random bytes, huge and negative integers, odd unicode in every
field, first against `envelope.parse` alone, (800 examples), then through the real dispatcher
on a private redis-server and a SQLite history.

Asserted: `parse` raises nothing but EnvelopeError, and what it accepts keeps the schema's promises
(names printable and within their columns, integers within their ranges, ts within the window); a
dead letter can hold any entry (`dead_letter_fields` gives text, never raises). Through the
dispatcher: nothing stays pending, every entry the door refuses is in the dead stream with its entry
id and a reason, no bad entry is taken for an outage, and a good entry sent after them is stored.
"""

from __future__ import annotations

import itertools
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memq import envelope, names
from memq.envelope import EnvelopeError

SHA = "b" * 64
NOW_MS = int(time.time() * 1000)
LIMITS = envelope.Limits(now_ms=NOW_MS)

ODD = ["", " ", "\x00", "\x1b]0;TITLE\x07", "\x1b[2J", "\u202e", "\ud800", "\udcff", "\u2028", "\x85", "\x9b",
       "\ufeff", "𝔘𝔫𝔦", "e\u0301", "\U0010ffff", "null", "[]", "{}", "NaN", "-0", "1e18", "0x10", "1_000",
       " 12", "١٢", "+5", "007"]
BIG = [0, -1, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30)]

ints = st.one_of(st.sampled_from(BIG), st.integers(min_value=-(2**70), max_value=2**70))
texts = st.one_of(st.sampled_from(ODD), st.text(max_size=40),
                  st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=40))
values = st.one_of(
    st.binary(max_size=60),
    texts,
    ints.map(str),
    texts.map(lambda s: s.encode("utf-8", "surrogatepass")),
    st.sampled_from(["x" * 201, "y" * 10_000, b"\xff" * 900]),
)
json_leaf = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=True, allow_infinity=True), texts)
json_doc = st.recursive(json_leaf, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                           st.dictionaries(texts, inner, max_size=4)), max_leaves=12)


def _payload(draw_samples):
    import json

    return st.one_of(
        json_doc.map(lambda d: json.dumps(d, allow_nan=True)),
        st.lists(st.dictionaries(st.sampled_from(["t", "step", "epoch", "allocated_bytes", "num_ooms",
                                                  "reserved_bytes.all.current", "device_metadata"]),
                                 json_leaf, max_size=5), max_size=4)
        .map(lambda s: json.dumps({"samples": s}, allow_nan=True)),
        st.sampled_from(['{"oom": {"alloc": 18446744073709551616}}', '{"status": "🙂"}', "[" * 5000, "{" * 50]),
    )


def _base(kind: str) -> dict:
    kw: dict = {"run": "fuzz-run", "cluster": "c", "rank": 1, "ts": NOW_MS - 1000}
    if kind == "stats":
        kw["payload"] = {"samples": [{"t": NOW_MS / 1000.0, "allocated_bytes": 5}]}
    if kind == "snapshot":
        kw.update(sha256=SHA, size=100, codec="zstd", trigger="manual", step=1, epoch=0)
    return envelope.build(kind, **kw)


FIELD_NAMES = ["v", "kind", "run", "cluster", "job", "host", "rank", "ts", "payload", "sha256", "size", "codec",
               "trigger", "step", "epoch"]


@st.composite
def entries(draw) -> dict:
    """A valid envelope of some kind with a few fields replaced by hostile values, some removed,
    and sometimes extra fields (names as bytes or text, possibly not UTF-8)."""
    kind = draw(st.sampled_from(envelope.KINDS))
    fields: dict = {k.encode(): v.encode() for k, v in _base(kind).items()}
    for name in draw(st.lists(st.sampled_from(FIELD_NAMES), max_size=3, unique=True)):
        what = draw(st.sampled_from(["value", "payload", "drop"]))
        if what == "drop":
            fields.pop(name.encode(), None)
        elif what == "payload" or name == "payload":
            fields[b"payload"] = draw(_payload(None)).encode("utf-8", "surrogatepass")
        else:
            v = draw(values)
            fields[name.encode()] = v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
    for k, v in draw(st.dictionaries(st.one_of(st.binary(min_size=1, max_size=10), st.text(min_size=1, max_size=10)),
                                     values, max_size=2)).items():
        key = k if isinstance(k, bytes) else k.encode("utf-8", "surrogatepass")
        fields[key] = v if isinstance(v, bytes) else v.encode("utf-8", "surrogatepass")
    return fields


def _check_accepted(env: envelope.Envelope) -> None:
    assert names.check_name("run", env.run) and names.check_name("cluster", env.cluster)
    names.check_name("job", env.job, required=False)
    names.check_name("host", env.host, required=False)
    assert 0 <= env.rank <= envelope.MAX_RANK
    lo, hi = LIMITS.ts_window_ms()
    assert lo <= env.ts <= hi
    if env.kind == "snapshot":
        assert 1 <= env.size <= LIMITS.max_snapshot_bytes
        assert env.step is None or 0 <= env.step <= envelope.MAX_STEP
        assert env.epoch is None or 0 <= env.epoch <= envelope.MAX_EPOCH
    if env.kind == "stats":
        for smp in env.payload["samples"]:
            assert lo / 1000 <= smp["t"] <= hi / 1000


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(entries())
def test_parse_raises_only_envelope_errors_and_accepts_only_what_the_schema_allows(fields):
    dead = envelope.dead_letter_fields(fields)
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in dead.items())
    for k, v in dead.items():
        k.encode("utf-8"), v.encode("utf-8")  # a dead letter is always valid text
    try:
        env = envelope.parse(fields, LIMITS)
    except EnvelopeError as exc:
        assert str(exc) and all(ch.isprintable() for ch in str(exc)), str(exc)
        return
    _check_accepted(env)


# ------------------------------------------------------------------------------- the dispatcher


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    """A private redis-server and a SQLite history for the whole module (hypothesis runs many
    examples in one test function)."""
    import redis

    from memq.config import load_settings
    from tests.workers.stack import PrivateRedis

    tmp = tmp_path_factory.mktemp("fuzz-door")
    srv = PrivateRedis(tmp / "redis", aof=False).start()
    env = {"MEMQ_REDIS_URL": srv.url, "MEMQ_DATABASE_URL": f"sqlite:///{tmp}/h.db", "MEMQ_DATA_DIR": str(tmp),
           "MEMQ_BLOB_DIR": str(tmp / "blobs"), "MEMQ_CONFIG": str(tmp / "none.toml")}
    try:
        yield load_settings(env), redis.Redis.from_url(srv.url)
    finally:
        srv.kill()


_seq = itertools.count()


@pytest.mark.redis
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(batch=st.lists(entries(), min_size=1, max_size=6))
def test_fuzzed_entries_through_the_real_dispatcher(door, batch):
    from sqlalchemy import select

    from memq.store.orm import Run
    from memq.workers.dispatcher import Dispatcher

    stg, r = door
    before_dead = r.xlen(stg.dead_letter_key) if r.exists(stg.dead_letter_key) else 0
    ids = [r.xadd(stg.stream_key, f).decode() for f in batch]
    good = f"good-{next(_seq)}"
    r.xadd(stg.stream_key, {k: v for k, v in envelope.build("run_start", run=good, cluster="c").items()})
    d = Dispatcher(stg, consumer="fuzz", batch=4, block_ms=20, enqueue=lambda sid: None)
    counts = d.run(install_signals=False, idle_exit_s=0.1)

    assert counts["outages"] == 0, counts
    assert int(r.xpending(stg.stream_key, "memq-dispatch")["pending"]) == 0
    dead = {f[b"entry_id"].decode(): f for _i, f in r.xrange(stg.dead_letter_key)[before_dead:]}
    assert set(dead) <= set(ids)
    for eid, fields in zip(ids, batch, strict=True):
        try:
            envelope.parse(fields, envelope.Limits.of(stg))
        except EnvelopeError:
            assert eid in dead, (eid, fields)
            assert dead[eid][b"reason"].startswith(b"bad envelope: ")
    with d.store.session() as s:
        assert s.execute(select(Run.id).where(Run.name == good)).scalar() is not None
