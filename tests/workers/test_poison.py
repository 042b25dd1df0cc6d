"""Issue 13: the ingest path survives hostile entries (items 2, 3, 4, 8, 9 and the poison/batch rules).

Every case of the issue goes into a PRIVATE redis-server's stream next to good entries, and the real
dispatcher reads it: the bad entry is dead-lettered with its reason (original fields kept, bytes that
are not UTF-8 as base64), nothing waits on an outage back-off, the good entries behind it are stored,
and nothing is left pending. Crash loops run the dispatcher as a process that SIGKILLs itself on one
entry: delivery counts end it after MEMQ_MAX_DELIVERIES, without taking the other entries of its
batch, whether it restarts under the same consumer name or a new one. The end-to-end test adds a real
Celery worker: a good snapshot pushed after the poison is analysed within seconds, also after a
dispatcher restart on the same stream.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time

import pytest
import redis

from memq import envelope, names
from memq.config import load_settings
from memq.workers.dispatcher import Dispatcher
from tests.workers.stack import REAL, ROOT, Stack, fixture_bytes, sha, wait_for

pytestmark = pytest.mark.redis

SNAP = fixture_bytes("capacity", "oom.pickle.gz")


def _settings(tmp_path, url: str, **extra: str):
    env = {"MEMQ_REDIS_URL": url, "MEMQ_DATABASE_URL": f"sqlite:///{tmp_path}/h.db",
           "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_BLOB_DIR": str(tmp_path / "blobs"),
           "MEMQ_CONFIG": str(tmp_path / "none.toml"), "MEMQ_MAX_DELIVERIES": "5", "MEMQ_CLAIM_IDLE_S": "1"}
    env.update(extra)
    return env, load_settings(env)


@pytest.fixture
def world(tmp_path, private_redis):
    srv = private_redis(aof=False)
    env, st = _settings(tmp_path, srv.url)
    r = redis.Redis.from_url(srv.url)
    return env, st, r


def _fields(kind: str = "run_start", raw: dict | None = None, **over) -> dict:
    """Valid envelope fields of `kind` (as bytes, as Redis returns them), then `over` and `raw`
    (bytes keys) applied as they are (None removes a field)."""
    kw: dict = {"run": "good", "cluster": "c", "rank": 0}
    if kind == "stats":
        kw["payload"] = {"samples": [{"t": time.time(), "allocated_bytes": 1, "reserved_bytes": 2}]}
    if kind == "snapshot":
        kw.update(sha256=sha(SNAP), size=len(SNAP), codec="gzip", trigger="oom", step=3, epoch=1)
    f = {k.encode(): v.encode() for k, v in envelope.build(kind, **kw).items()}
    for k, v in {**over, **(raw or {})}.items():
        key = k.encode() if isinstance(k, str) else k
        if v is None:
            f.pop(key, None)
        else:
            f[key] = v.encode() if isinstance(v, str) else v
    return f


def _stats_payload(**sample) -> str:
    return json.dumps({"samples": [{"t": time.time(), "allocated_bytes": 1, **sample}]})


#: name -> (fields, a fragment its dead letter's reason must hold). Names are the issue's cases.
POISON = {
    "non-UTF-8 value": (lambda: _fields(run=b"\xff\xfe run"), "is not UTF-8"),
    "non-UTF-8 field name": (lambda: _fields(raw={b"\xc3\x28": b"x"}), "is not UTF-8"),
    "stats sample t=1e18": (lambda: _fields("stats", payload=_stats_payload(t=1e18)), ".t = 1e+18 is outside"),
    "size beyond int64": (lambda: _fields("snapshot", size=str(2**63)), "field size"),
    "step beyond int64": (lambda: _fields("snapshot", step=str(2**64 + 5)), "field step"),
    "epoch beyond int64": (lambda: _fields("snapshot", epoch=str(-(2**63) - 1)), "field epoch"),
    "rank beyond int64": (lambda: _fields(rank=str(2**63)), "field rank"),
    "stat value beyond int64": (lambda: _fields("stats", payload=_stats_payload(reserved_bytes=2**64)),
                                "reserved_bytes is an integer outside int64"),
    "ts=0": (lambda: _fields(ts="0"), "field ts = 0 ms is outside"),
    "ts far future": (lambda: _fields(ts=str(int(time.time() * 1000) + 10 * 365 * 86_400_000)), "is outside"),
    "10,000-character name": (lambda: _fields(run="r" * 10_000), "over its limit"),
    "201-character cluster": (lambda: _fields(cluster="c" * 201), "over the limit of 200"),
    "NUL in run name": (lambda: _fields(run="run\x00x"), "U+0000"),
    "terminal escape in name": (lambda: _fields(run="\x1b]0;TITLE\x07run"), "U+001B"),
    "NaN in payload": (lambda: _fields(payload='{"x": NaN}'), "not valid JSON"),
    "deep payload": (lambda: _fields(payload='{"a":' * 100 + "1" + "}" * 100), "nested deeper"),
    "unknown kind": (lambda: _fields(raw={"kind": "drop_table"}), "unknown kind"),
    "look-alike run name": (lambda: _fields(run="ll\u0430ma-sft"), "mixes the scripts CYRILLIC, LATIN"),
    "full-width job name": (lambda: _fields(job="\uff4c\uff4c\uff41\uff4d\uff41"), "not in Unicode NFKC form"),
}


def _dead(r, st) -> list[dict]:
    return [{k.decode(): v.decode() for k, v in f.items()} for _i, f in r.xrange(st.dead_letter_key)]


def _pending(r, st) -> int:
    return int(r.xpending(st.stream_key, "memq-dispatch")["pending"])


def _run_names(d: Dispatcher) -> set[str]:
    from sqlalchemy import select

    from memq.store.orm import Run

    with d.store.session() as s:
        return set(s.execute(select(Run.name)).scalars())


def test_names_match_the_schema_columns():
    from memq.store.orm import Run

    for field, n in names.MAX_LEN.items():
        assert Run.__table__.c["name" if field == "run" else field].type.length == n


@pytest.mark.parametrize("bad", ["a\x00b", "\x1b[31mred", "x\u202etxt", "\x9b1m", "a\u2028b", "", " ", "r" * 201,
                                 "\ud800"])
def test_name_rule_refuses(bad):
    with pytest.raises(names.BadName):
        names.check_name("run", bad)


def test_name_rule_keeps_printable_unicode():
    for ok in ("exp-42", "résumé/ü", "模型-训练", "a b", "r" * 200, "emoji \U0001f680", "日本語のモデル-v2",
               "한국어-model", "Ελληνικά"):
        assert names.check_name("run", ok) == ok


@pytest.mark.parametrize("bad", ["ll\u0430ma", "run-\u03b1", "\uff4c\uff4c\uff41\uff4d\uff41", "\ufb01ne",
                                 "re\u0301sume\u0301"])
def test_name_rule_refuses_look_alikes(bad):
    with pytest.raises(names.BadName, match="mixes the scripts|NFKC"):
        names.check_name("job", bad)
    assert names.check_name("host", bad) == bad  # host names are the machine's, not a job's choice


def test_every_case_of_the_issue_is_dead_lettered_and_the_good_entries_behind_it_go_through(world):
    env, st, r = world
    good_runs = []
    for i, (make, _why) in enumerate(POISON.values()):
        r.xadd(st.stream_key, make())
        good_runs.append(f"good-{i}")
        r.xadd(st.stream_key, _fields(run=f"good-{i}"))
        r.xadd(st.stream_key, _fields("stats", run=f"good-{i}"))
    enqueued: list[int] = []
    d = Dispatcher(st, consumer="c1", batch=7, block_ms=50, enqueue=enqueued.append)
    counts = d.run(install_signals=False, idle_exit_s=0.5)

    assert counts["outages"] == 0 and counts["errors"] == 0, counts  # bad data is never taken for an outage
    dead = _dead(r, st)
    assert len(dead) == len(POISON), [x["reason"] for x in dead]
    for (case, (_make, why)), letter in zip(POISON.items(), dead, strict=True):
        assert why in letter["reason"], (case, letter["reason"])
        assert letter["stage"] == "dispatch" and letter["entry_id"]
        assert all(ord(ch) >= 32 for ch in letter["reason"]), case  # reasons quote escaped text
    # the original fields are kept; bytes that are not UTF-8 as base64, named in b64_fields
    non_utf8 = dead[0]
    assert non_utf8["b64_fields"] == "run" and base64.b64decode(non_utf8["run"]) == b"\xff\xfe run"
    assert dead[1]["b64:" + base64.b64encode(b"\xc3\x28").decode()] == "x"  # a field name that is not UTF-8
    assert dead[6]["run"] == "good" and dead[3]["size"] == str(2**63)
    assert _run_names(d) == set(good_runs)
    assert counts["samples"] == len(POISON)
    assert _pending(r, st) == 0


def test_envelope_size_is_checked_against_the_blob(world):
    """The envelope's size must be what the blob inflates to (a smaller claim also caps inflation)."""
    env, st, r = world
    key = envelope.blob_key(sha(SNAP), st.key_prefix)
    gz = (REAL / "capacity" / "oom.pickle.gz").read_bytes()
    r.set(key, gz)
    r.xadd(st.stream_key, _fields("snapshot", run="small", size=str(len(SNAP) - 1)))
    r.xadd(st.stream_key, _fields("snapshot", run="large", size=str(len(SNAP) + 1)))
    r.xadd(st.stream_key, _fields("snapshot", run="right"))
    # the blob is in the store now: a later claim of another size is checked against the stored row
    r.xadd(st.stream_key, _fields("snapshot", run="later", size=str(len(SNAP) + 7)))
    enqueued: list[int] = []
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=enqueued.append)
    counts = d.run(install_signals=False, idle_exit_s=0.5)
    reasons = {x["run"]: x["reason"] for x in _dead(r, st)}
    assert set(reasons) == {"small", "large", "later"}, reasons
    assert f"past the {len(SNAP) - 1} bytes its envelope says" in reasons["small"]
    assert f"inflates to {len(SNAP)} bytes, not the {len(SNAP) + 1}" in reasons["large"]
    assert f"envelope size {len(SNAP) + 7} differs" in reasons["later"]
    assert counts["snapshots"] == 1 and len(enqueued) == 1 and counts["outages"] == 0
    assert _run_names(d) == {"right"} and _pending(r, st) == 0


def test_a_failing_batch_is_split_and_only_the_bad_entry_goes(world):
    """An error outside the per-entry guards (here: the database refuses one row of a stats batch)
    costs the batch one retry one entry at a time; the good snapshot and samples of the same batch
    are stored."""
    env, st, r = world
    r.set(envelope.blob_key(sha(SNAP), st.key_prefix), (REAL / "capacity" / "oom.pickle.gz").read_bytes())

    class Refusing(Dispatcher):
        def on_stats(self, items):
            if any(e.run == "refused" for e in items):
                from sqlalchemy.exc import IntegrityError

                from memq.store.db import translate

                raise translate(IntegrityError("INSERT", {}, Exception("refused row")), st.database_url)
            super().on_stats(items)

    for run in ("s1", "refused", "s2"):
        r.xadd(st.stream_key, _fields("stats", run=run))
    r.xadd(st.stream_key, _fields("snapshot", run="snap"))
    d = Refusing(st, consumer="c1", block_ms=50, enqueue=lambda sid: None)
    counts = d.run(install_signals=False, idle_exit_s=0.5)
    (letter,) = _dead(r, st)
    assert letter["run"] == "refused" and "refused by the database" in letter["reason"]
    assert counts["samples"] == 2 and counts["snapshots"] == 1 and counts["outages"] == 0
    assert _pending(r, st) == 0


CRASHER = r'''
import os, signal, sys
from memq.config import load_settings
from memq.workers.dispatcher import Dispatcher

class Crashing(Dispatcher):
    """A dispatcher that dies (SIGKILL, as the kernel's OOM killer does) on one entry."""
    def on_run_start(self, env):
        if env.run == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
        super().on_run_start(env)

d = Crashing(load_settings(), consumer=sys.argv[1], batch=100, block_ms=50, enqueue=lambda sid: None)
d.run(install_signals=False, idle_exit_s=float(sys.argv[2]))
'''


@pytest.mark.parametrize("consumer", ["same", "new"])
def test_an_entry_that_kills_the_dispatcher_ends_after_max_deliveries_alone(world, consumer):
    """Issue 13 item 5: a crash loop. Restarted under the same name the dispatcher re-reads its own
    pending entries; under a new name it claims them from the dead one. Either way the killer is
    dead-lettered after MEMQ_MAX_DELIVERIES deliveries, and the 10 entries read in the same batch
    are all stored (not dead-lettered with it)."""
    env, st, r = world
    order = [f"ok{i}" for i in range(5)] + ["crash"] + [f"ok{i}" for i in range(5, 10)]
    for run in order:
        r.xadd(st.stream_key, _fields(run=run))
    proc_env = dict(env, PYTHONPATH=str(ROOT))
    runs = []
    for i in range(12):
        name = "d" if consumer == "same" else f"d{i}"
        p = subprocess.run([sys.executable, "-c", CRASHER, name, "2.5"], env=proc_env, cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
        runs.append(p.returncode)
        if p.returncode == 0 and _pending(r, st) == 0 and r.xlen(st.dead_letter_key):
            break
        assert p.returncode in (0, -9), p.stderr[-3000:]
    assert runs.count(-9) == st.max_deliveries, runs  # killed once per delivery, then dead-lettered
    (letter,) = _dead(r, st)
    assert letter["run"] == "crash" and f"not acknowledged after {st.max_deliveries} deliveries" in letter["reason"]
    d = Dispatcher(st, consumer="check", enqueue=lambda sid: None)
    assert _run_names(d) == {x for x in order if x != "crash"}
    assert _pending(r, st) == 0


def test_is_transient_tells_outages_from_bad_data():
    from sqlalchemy.exc import DataError, OperationalError

    from memq.errors import BadInput, BrokerUnavailable, SchemaOutOfDate, StorageError, StorageUnavailable
    from memq.store.db import translated
    from memq.workers.runtime import is_bad_input, is_transient

    class Limit(Exception):
        sqlstate = "54000"

    def translate(exc, url):
        """The memq error the store's session scope raises for `exc` (with it as the cause)."""
        try:
            with translated(url):
                raise exc
        except Exception as got:  # noqa: BLE001
            return got

    url = "postgresql+psycopg://u@h/db"
    assert is_transient(redis.ConnectionError("gone")) and is_transient(redis.TimeoutError())
    assert is_transient(redis.ResponseError("LOADING Redis is loading")) and is_transient(BrokerUnavailable("x"))
    assert is_transient(translate(OperationalError("SELECT", {}, Exception("server closed")), url))
    assert is_transient(SchemaOutOfDate("x"))
    assert not is_transient(redis.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_transient(translate(DataError("INSERT", {}, Exception("out of range")), url))
    assert not is_transient(translate(OperationalError("INSERT", {}, Limit("index row too large")), url))
    assert not is_transient(StorageError("refused")) and not is_transient(BadInput("bad"))
    for exc in (RecursionError(), MemoryError(), BadInput("x")):
        assert not is_transient(exc) and is_bad_input(exc)
    assert not is_bad_input(RuntimeError("a bug")) and not is_bad_input(StorageUnavailable("down"))


# ------------------------------------------------------------------------------- end to end


@pytest.fixture
def pg_stack(tmp_path, private_redis, pg_server):
    from tests.conftest import temp_pg_database

    srv = private_redis()
    # generous task limits: on a loaded test machine a cold first analysis can take longer than
    # the FAST 8 s soft limit, and what is measured here is the dispatcher, not the analysis
    with temp_pg_database("poison") as url:
        s = Stack(tmp_path, srv.url, url, MEMQ_TASK_SOFT_TIME_LIMIT_S="90", MEMQ_TASK_TIME_LIMIT_S="100",
                  MEMQ_ANALYSIS_LEASE_S="120", MEMQ_VISIBILITY_TIMEOUT_S="400")
        try:
            s.upgrade()
            s.start_worker(concurrency=1)
            yield s
        finally:
            s.close()


@pytest.mark.postgres
@pytest.mark.timeout(400)
def test_good_snapshot_behind_the_poison_is_analysed_within_seconds_also_after_a_restart(pg_stack):
    s = pg_stack
    st, r = s.settings, s.redis
    f = str(REAL / "capacity" / "oom.pickle.gz")

    def push_poison() -> None:
        for make, _why in POISON.values():
            r.xadd(s.stream, make())
        r.xadd(s.stream, _fields("snapshot", run="mismatch", size=str(len(SNAP) + 1)))

    def analysed(run: str) -> bool:
        rows = s.rows("SELECT s.state FROM snapshots s JOIN runs r ON r.id = s.run_id WHERE r.name = :n", n=run)
        return [x.state for x in rows] == ["done"]

    # a warm worker and dispatcher first (imports, the first analysis): what is timed below is the
    # way past the poison, not a cold start
    d1 = s.start_dispatcher(consumer="poison-d", wait=True)
    s.memq("push", f, "--run", "warm-up", "--cluster", "c")
    wait_for(lambda: analysed("warm-up"), 180, 0.2, "the warm-up snapshot analysed")

    # 1. poison, then a good snapshot, all in the stream before the dispatcher (same consumer name)
    #    starts again: the good one is behind every poison entry
    assert s.stop(d1) == 0
    r.set(envelope.blob_key(sha(SNAP), st.key_prefix), (REAL / "capacity" / "oom.pickle.gz").read_bytes())
    push_poison()
    s.memq("push", f, "--run", "after-poison", "--cluster", "c")
    s.start_dispatcher(consumer="poison-d", wait=True)
    wait_for(lambda: analysed("after-poison"), 30, 0.2, "the good snapshot behind the poison analysed")
    assert len(s.dead()) == len(POISON) + 1

    # 2. the same while it runs
    push_poison()
    s.memq("push", f, "--run", "while-running", "--cluster", "c")
    wait_for(lambda: analysed("while-running"), 30, 0.2, "the good snapshot analysed")
    dead = s.dead()
    assert len(dead) == 2 * (len(POISON) + 1)
    assert all(x["reason"] and x["stage"] == "dispatch" for x in dead)
    wait_for(lambda: _pending(r, st) == 0, 10, 0.2, "nothing pending")
    assert s.rows("SELECT count(*) FROM snapshots WHERE state <> 'done'")[0][0] == 0


@pytest.mark.parametrize("error", [RecursionError("maximum recursion depth exceeded"), MemoryError()])
def test_analysis_that_recurses_too_deep_or_exhausts_memory_fails_at_once(world, monkeypatch, error):
    """Issue 13 item 9 (worker side): the same input raises the same RecursionError / MemoryError
    every time: the snapshot is failed with the reason after one attempt (not retried five times),
    and a dead letter records it. The snapshot row comes from the real dispatcher; the analysis
    itself is made to raise (no real snapshot recurses that deep past the decoder's nesting check)."""
    from memq.pipeline import analyse
    from memq.workers import jobs

    env, st, r = world
    r.set(envelope.blob_key(sha(SNAP), st.key_prefix), (REAL / "capacity" / "oom.pickle.gz").read_bytes())
    r.xadd(st.stream_key, _fields("snapshot", run="deep"))
    enqueued: list[int] = []
    Dispatcher(st, consumer="c1", block_ms=50, enqueue=enqueued.append).run(install_signals=False, idle_exit_s=0.3)
    (sid,) = enqueued

    def boom(*_a, **_k):
        raise error

    monkeypatch.setattr(analyse, "analyse_claimed", boom)
    assert jobs.analyze(st, sid, task_id="t1") == "quarantined"
    with jobs._store(st).session() as s:
        from sqlalchemy import select

        from memq.store.orm import Snapshot

        row = s.execute(select(Snapshot.state, Snapshot.attempts, Snapshot.last_error).where(Snapshot.id == sid)).one()
    assert row.state == "failed" and row.attempts == 1 and type(error).__name__ in row.last_error
    (letter,) = _dead(r, st)
    assert letter["stage"] == "analyze" and type(error).__name__ in letter["reason"]


def test_run_end_of_an_older_agent_is_kept(world):
    """Agents before 2026-12-01 ended a run that died of a non-OOM exception with status "error": the
    door accepts it (a fleet upgrades slowly) and the run is stored as crashed, not dead-lettered."""
    from sqlalchemy import select

    from memq.store.orm import Run

    env, st, r = world
    r.xadd(st.stream_key, _fields("run_start", run="old-agent"))
    r.xadd(st.stream_key, _fields("run_end", run="old-agent", payload=json.dumps({"status": "error"})))
    r.xadd(st.stream_key, _fields("run_end", run="bad-status", payload=json.dumps({"status": "exploded"})))
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda sid: None)
    d.run(install_signals=False, idle_exit_s=0.5)
    reasons = {x["run"]: x["reason"] for x in _dead(r, st)}
    assert set(reasons) == {"bad-status"} and "payload.status must be one of" in reasons["bad-status"]
    with d.store.session() as s:
        status = s.execute(select(Run.status).where(Run.name == "old-agent")).scalar_one()
    assert status == "crashed"
    assert _pending(r, st) == 0


def test_a_later_run_start_never_overwrites_what_the_first_set(world):
    """Issue 24 item 2: a `run_start` under another team's run name (anyone holding agent credentials can
    send one) used to overwrite cluster, job, host, world size and device memory. The first run_start
    wins; a later one only fills what is still unknown (another rank's, or one sent before CUDA was
    up: its device facts arrive later), and a snapshot's envelope identity never moves the run."""
    from sqlalchemy import select

    from memq.store.orm import Run

    env, st, r = world
    GiB = 1 << 30
    first = {"world_size": 8, "device_total": 80 * GiB, "torch": "2.11.0", "labels": {"team": "vision"}}
    r.xadd(st.stream_key, _fields("run_start", run="victim", cluster="prod", job="train-42", host="node-1",
                                  payload=json.dumps(first)))
    forged = {"world_size": 1, "device_total": 1, "torch": "0.0.1", "gpu": "H200", "labels": {"team": "evil", "x": "1"}}
    r.xadd(st.stream_key, _fields("run_start", run="victim", cluster="attacker", job="other", host="evil-host",
                                  rank=3, payload=json.dumps(forged)))
    r.xadd(st.stream_key, _fields("run_end", run="victim", cluster="attacker", job="other", host="evil-host",
                                  payload=json.dumps({"status": "completed"})))
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda sid: None)
    d.run(install_signals=False, idle_exit_s=0.5)
    with d.store.session() as s:
        row = s.execute(select(Run).where(Run.name == "victim")).scalar_one()
        got = {k: getattr(row, k) for k in ("cluster", "job", "host", "world_size", "gpu_memory_bytes",
                                             "torch_version", "gpu_model", "rank")}
        labels = dict(row.labels)
    assert got == {"cluster": "prod", "job": "train-42", "host": "node-1", "world_size": 8,
                   "gpu_memory_bytes": 80 * GiB, "torch_version": "2.11.0", "gpu_model": "H200", "rank": 0}
    assert labels == {"team": "vision", "x": "1"}  # only a label it did not have is added


def _hostile_dict(segment_sizes: list[int], trace_sizes: list[int] = ()) -> dict:
    segs = [{"device": 0, "address": i << 60, "total_size": n, "stream": 0, "segment_type": "large",
             "blocks": [{"size": n, "requested_size": n, "state": "active_allocated", "frames": []}]}
            for i, n in enumerate(segment_sizes)]
    trace = [{"action": "alloc", "addr": k, "size": n, "stream": 0, "time_us": k, "frames": []}
             for k, n in enumerate(trace_sizes)]
    return {"segments": segs, "device_traces": [trace]}


def _hostile_snapshot(segment_sizes: list[int], trace_sizes: list[int] = ()) -> bytes:
    import pickle

    return pickle.dumps(_hostile_dict(segment_sizes, trace_sizes), protocol=4)


@pytest.mark.parametrize("segments, trace", [([2**62, 2**62], []), ([2**20], [2**62, 2**62, 2**62])],
                         ids=["segments", "trace"])
def test_a_hostile_size_is_refused_at_once_never_retried(world, segments, trace):
    """Round 4 (minor): a snapshot whose sizes sum past what a BIGINT column holds. The worker's
    decode refuses it as bad input, once, with the reason (it used to overflow a column on every
    attempt, retried for half an hour as if it were a bug); the blob goes to the real dispatcher
    and the real restricted decoder first."""
    from sqlalchemy import select

    from memq import codec
    from memq.store.orm import Snapshot
    from memq.workers import jobs

    env, st, r = world
    raw = _hostile_snapshot(segments, trace)
    blob = codec.compress(raw, "gzip")
    r.set(envelope.blob_key(sha(raw), st.key_prefix), blob)
    r.xadd(st.stream_key, _fields("snapshot", run="hostile", sha256=sha(raw), size=str(len(raw))))
    enqueued: list[int] = []
    Dispatcher(st, consumer="c1", block_ms=50, enqueue=enqueued.append).run(install_signals=False, idle_exit_s=0.3)
    assert _dead(r, st) == [] and len(enqueued) == 1
    assert jobs.analyze(st, enqueued[0], task_id="t1") == "quarantined"
    with jobs._store(st).session() as s:
        row = s.execute(select(Snapshot.state, Snapshot.attempts, Snapshot.last_error)
                        .where(Snapshot.id == enqueued[0])).one()
    assert row.state == "failed" and row.attempts == 1 and "a snapshot may claim" in row.last_error


def test_snapshot_sizes_just_at_and_over_the_cap():
    from memq.snapshot import MAX_FIGURE_BYTES, SnapshotError, parse_snapshot

    ok = parse_snapshot(_hostile_dict([MAX_FIGURE_BYTES // 2, MAX_FIGURE_BYTES // 2]))
    assert sum(s.total_size for s in ok.segments) == MAX_FIGURE_BYTES
    with pytest.raises(SnapshotError, match="a snapshot may claim"):
        parse_snapshot(_hostile_dict([MAX_FIGURE_BYTES // 2, MAX_FIGURE_BYTES // 2 + 1]))
    assert parse_snapshot(_hostile_dict([1], [MAX_FIGURE_BYTES])).traces
    with pytest.raises(SnapshotError, match="a snapshot may claim"):
        parse_snapshot(_hostile_dict([1], [MAX_FIGURE_BYTES, 1]))
    with pytest.raises(SnapshotError, match="a snapshot may claim"):
        parse_snapshot(_hostile_dict([1], [MAX_FIGURE_BYTES, -1]))  # a negative size cancels nothing
    with pytest.raises(SnapshotError, match="negative"):
        parse_snapshot(_hostile_dict([-5]))


def test_a_false_size_cannot_be_pinned_on_a_stored_blob_no_row_names(world):
    """Round 5 (the size check turned against another team): a blob the store holds with no row naming it
    (a refused snapshot's leftover within MEMQ_DEAD_BLOB_GRACE_S, or a crash between a blob and its row)
    was taken without inflating it, so the first envelope to name it set the size every later row is
    checked against: an attacker's false size had the real owner's snapshot dead-lettered "envelope size
    differs". The size is now checked against the stored bytes themselves."""
    env, st, r = world
    from memq.store.blobs import BlobStore

    BlobStore(st.blob_dir).put_encoded(sha(SNAP), (REAL / "capacity" / "oom.pickle.gz").read_bytes(), "gzip")
    r.xadd(st.stream_key, _fields("snapshot", run="attacker", size=str(len(SNAP) + 7)))
    r.xadd(st.stream_key, _fields("snapshot", run="victim"))
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda _sid: None)
    counts = d.run(install_signals=False, idle_exit_s=0.5)
    reasons = {x["run"]: x["reason"] for x in _dead(r, st)}
    assert set(reasons) == {"attacker"}, reasons
    assert f"inflates to {len(SNAP)} bytes, not the {len(SNAP) + 7}" in reasons["attacker"]
    assert _run_names(d) == {"victim"} and counts["snapshots"] == 1


def test_a_refused_entry_cannot_take_another_entrys_blob_with_it(world):
    """Round 5 (the dead-blob cleanup turned against another team): a refused snapshot's own Redis blob is
    deleted with its dead letter, so an attacker names the victim's blob in an entry made to be refused,
    queued ahead of the victim's. A bare key (older agents: one key per sha256) is shared, so it is never
    deleted for a refusal; a nonce key is the entry's own (the attacker cannot learn another's nonce). And
    the dead-blob record of a refused entry whose bytes are stored removes nothing a row names."""
    from memq.pipeline.dead_blobs import clean

    env, st, r = world
    r.set(envelope.blob_key(sha(SNAP), st.key_prefix), (REAL / "capacity" / "oom.pickle.gz").read_bytes())
    r.xadd(st.stream_key, _fields("snapshot", run="evil\x1b[31m"))  # refused at the door, same bare key
    r.xadd(st.stream_key, _fields("snapshot", run="victim"))
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda _sid: None)
    d.run(install_signals=False, idle_exit_s=0.5)
    assert len(_dead(r, st)) == 1 and _run_names(d) == {"victim"}
    r.xadd(st.stream_key, _fields("snapshot", run="evil\x1b[32m"))  # refused once the victim's bytes are stored
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda _sid: None)
    d.run(install_signals=False, idle_exit_s=0.5)
    assert len(_dead(r, st)) == 2 and _run_names(d) == {"victim"}
    assert r.zscore(st.dead_blobs_key, sha(SNAP)) is not None  # its bytes were stored: recorded
    got = clean(load_settings({**env, "MEMQ_DEAD_BLOB_GRACE_S": "0"}), d.store, r, race_grace_s=0.05)
    assert got["dead_blobs_removed"] == 0 and got["kept"]["referenced"] == 1
    assert d.store.blobs.get(sha(SNAP))  # the victim's blob, readable
