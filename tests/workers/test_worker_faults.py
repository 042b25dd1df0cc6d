"""Faults on PRIVATE Redis and PostgreSQL instances, with real dispatcher and Celery worker processes.

Each test ends with the same check: exactly one snapshot row per snapshot sent, each analysed, and
exactly one analysis result per snapshot's bytes; nothing lost, nothing duplicated."""

from __future__ import annotations

import signal
import struct
import time

import pytest

from memq import codec, envelope
from memq.agent.source import ReplaySource
from tests.workers.stack import (
    BIG,
    REAL,
    Stack,
    VaryingSource,
    children,
    fixture_bytes,
    kill_group,
    make_agent,
    sha,
    variant,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SGD = ["before_training.pickle.gz", "epoch0.pickle.gz", "epoch1.pickle.gz", "epoch2.pickle.gz"]


def _push(stack: Stack, run: str, *files: str, extra: tuple[str, ...] = ()) -> list[str]:
    out = stack.memq_json("push", *files, "--run", run, "--no-check", *extra)
    return [s["sha256"] for s in out["snapshots"]]


def _drained(stack: Stack) -> bool:
    """The stream is fully read and acknowledged by the dispatcher group."""
    r = stack.redis
    groups = r.xinfo_groups(stack.stream)
    return bool(groups) and all(int(g["pending"]) == 0 and (g.get("lag") in (0, None)) for g in groups)


def _done(stack: Stack, n: int, timeout: float = 90) -> None:
    try:
        wait_for(lambda: stack.states().get("done", 0) >= n, timeout, 0.2, f"{n} snapshots done")
    except AssertionError as e:  # what each process last said: a CI log must show where it stuck
        logs = "\n".join(stack.log_tail(name, 3000) for name in ("worker", "beat", "dispatcher"))
        raise AssertionError(f"{e}; snapshot states {stack.states()}\n{logs}") from None


class ListSource(ReplaySource):
    """Replays the given snapshot byte strings, in order (bad ones included)."""

    def __init__(self, items: list[bytes]):
        super().__init__(REAL / "seed_sgd")
        self.items = list(items)

    def snapshot(self):
        return self.items.pop(0)


def test_same_envelope_twice_and_the_same_task_twice(fault_stack):
    s = fault_stack
    s.start_worker()
    s.start_dispatcher()
    a = make_agent(s, "dup", ReplaySource(REAL / "seed_sgd"))
    assert a.snapshot("manual") and a.snapshot("manual")
    a.stop(10)
    _done(s, 2)
    r = s.redis
    snaps = [f for _id, f in r.xrange(s.stream) if f[b"kind"] == b"snapshot"]
    assert len(snaps) == 2
    # The same envelopes again (an agent retry after a lost reply): their blobs already moved to
    # the blob store. One is sent with its blob back in Redis too.
    first = snaps[0]
    blob = codec.compress(fixture_bytes("seed_sgd", SGD[0]), first[b"codec"].decode())
    first_key = envelope.parse(first).blob_key(s.prefix)  # <prefix>blob:<sha256>:<nonce>, as the agent set it
    r.set(first_key, blob)
    for f in snaps:
        r.xadd(s.stream, f)
    wait_for(lambda: _drained(s), 30, 0.2, "the duplicates read and acknowledged")
    # The same task delivered twice (a broker redelivery): the lease lets one of them work.
    from memq.workers.app import make_app

    app = make_app(s.settings)
    ids = [row.id for row in s.rows("SELECT id FROM snapshots ORDER BY id")]
    for sid in ids:
        app.send_task("workers.tasks.analyze_snapshot", args=[sid])
        app.send_task("workers.tasks.analyze_snapshot", args=[sid])
    wait_for(lambda: s.log_tail("worker", 10**7).count("'done'") >= 4, 30, 0.2, "4 duplicate tasks done")
    s.assert_exactly_once({sha(fixture_bytes("seed_sgd", f)) for f in SGD[:2]})
    assert s.dead() == []
    assert int(r.exists(first_key)) == 0  # moved, then removed


def test_bad_data_is_quarantined_with_the_reason_and_workers_keep_going(fault_stack, tmp_path):
    s = fault_stack
    marker = tmp_path / "pwned"
    cmd = f"touch {marker}".encode()
    # PROTO 2, GLOBAL os.system, BINUNICODE cmd, TUPLE1, REDUCE, STOP: runs `cmd` if ever unpickled
    malicious = b"\x80\x02cos\nsystem\nX" + struct.pack("<I", len(cmd)) + cmd + b"\x85R."
    good = fixture_bytes("seed_sgd", SGD[1])
    truncated_pickle = good[: len(good) // 2]  # a blob that inflates fine to bytes that are cut short
    # Everything is in the stream before any dispatcher or worker runs.
    a = make_agent(s, "bad", ListSource([malicious, truncated_pickle, good]))
    for _ in range(3):
        assert a.snapshot("manual")
    a.flush(10)
    r = s.redis
    # a blob whose compressed bytes are cut short
    from memq import envelope
    from memq.agent.spool import Spool
    from memq.agent.transport import Item, Transport

    t = Transport(identity={"run": "bad", "cluster": "c", "rank": 0}, spool=Spool(tmp_path / "unused", 0),
                  redis_url=None, key_prefix=s.prefix)
    msg = t.serialize(Item("snapshot", obj=fixture_bytes("seed_sgd", SGD[2]), trigger="manual"))
    r.set(msg.blob_key, msg.blob[: len(msg.blob) // 3])
    r.xadd(s.stream, msg.fields)
    # a snapshot whose blob never arrived, and an entry that is not an envelope at all
    lost = t.serialize(Item("snapshot", obj=fixture_bytes("seed_sgd", SGD[3]), trigger="manual"))
    r.xadd(s.stream, lost.fields)
    r.xadd(s.stream, {"v": "1", "kind": "snapshot", "run": "bad", "cluster": "c", "sha256": "nope"})
    a.stop(10)

    s.start_worker()
    s.start_dispatcher()
    wait_for(lambda: len(s.dead()) >= 5, 60, 0.2, "five dead letters")
    _done(s, 1)
    dead = s.dead()
    reasons = {d.get("sha256", "")[:12] + "/" + d["stage"]: d["reason"] for d in dead}
    assert any("refers to" in v and "system" in v for v in reasons.values()), reasons  # refused global
    assert reasons[sha(truncated_pickle)[:12] + "/analyze"].startswith("bad snapshot")
    assert "bad blob" in reasons[msg.fields["sha256"][:12] + "/dispatch"]
    assert "blob missing" in reasons[lost.fields["sha256"][:12] + "/dispatch"]
    assert any(v.startswith("bad envelope") for v in reasons.values())
    for d in dead:  # original fields are kept
        assert d["v"] == "1" and d["run"] == "bad" and d["kind"] == "snapshot"
    assert not marker.exists(), "the malicious pickle ran"
    rows = {row.sha256: row for row in s.rows("SELECT sha256, state, last_error, attempts FROM snapshots")}
    assert rows[sha(malicious)].state == "failed" and "refers to" in rows[sha(malicious)].last_error
    assert rows[sha(malicious)].attempts == 1  # bad data is not retried
    assert rows[sha(truncated_pickle)].state == "failed"
    assert rows[sha(good)].state == "done"
    assert msg.fields["sha256"] not in rows and lost.fields["sha256"] not in rows
    # the workers keep going: a good snapshot after the bad ones is analysed, the run diagnosed
    _push(s, "bad", str(REAL / "seed_sgd" / SGD[0]))
    _done(s, 2)
    wait_for(lambda: s.rows("SELECT primary_cause FROM runs WHERE name = 'bad'")[0][0] == "healthy", 30, 0.2,
             "run diagnosis without the quarantined snapshots")
    assert all(p.poll() is None for p in s.procs.values())
    assert envelope.VERSION == 1


def _running(stack: Stack, sha256: str) -> bool:
    rows = stack.rows("SELECT state FROM snapshots WHERE sha256 = :sha", sha=sha256)
    return bool(rows) and rows[0][0] == "running"


def test_worker_sigkilled_in_the_middle_of_an_analysis(fault_stack, tmp_path):
    s = fault_stack
    worker = s.start_worker()
    s.start_dispatcher()
    big = codec.decompress(BIG.read_bytes())
    big_sha = sha(big)
    shas = _push(s, "kill", str(BIG), *(str(REAL / "seed_sgd" / f) for f in SGD[:2]))
    # 1. the pool process dies mid-analysis; the worker's main process lives (reject-on-worker-lost)
    wait_for(lambda: _running(s, big_sha), 60, 0.02, "the 100k-entry snapshot being analysed")
    time.sleep(0.3)
    kids = children(worker.pid)
    assert kids, "no pool process"
    for pid in kids:
        with __import__("contextlib").suppress(ProcessLookupError):
            __import__("os").kill(pid, signal.SIGKILL)
    _done(s, 3)
    (row,) = s.rows("SELECT attempts FROM snapshots WHERE sha256 = :sha", sha=big_sha)
    assert row.attempts >= 2
    # 2. the whole worker (main process, pool, beat) is SIGKILLed mid-analysis; a new one recovers
    other = variant(big, "second")
    path = tmp_path / "big2.pickle"
    path.write_bytes(other)
    shas += _push(s, "kill", str(path))
    wait_for(lambda: _running(s, sha(other)), 60, 0.02, "the second big snapshot being analysed")
    time.sleep(0.3)
    kill_group(worker)
    assert worker.poll() is not None
    s.start_worker()
    _done(s, 4, timeout=120)
    s.assert_exactly_once(set(shas))
    assert s.dead() == []


def test_dispatcher_killed_between_insert_and_acknowledge(fault_stack):
    s = fault_stack
    s.start_worker()
    # 1. killed right after its commit, before the enqueue and the XACK; the same consumer
    #    restarted reads its own pending entries first
    shas = _push(s, "disp", *(str(REAL / "seed_sgd" / f) for f in SGD))
    d1 = s.start_dispatcher(consumer="d1", fault="dispatcher:after_commit")
    assert d1.wait(60) == -signal.SIGKILL
    rows = s.rows("SELECT state FROM snapshots")
    assert rows and all(r.state == "pending" for r in rows)  # committed, never enqueued ...
    assert s.redis.xpending(s.stream, "memq-dispatch")["pending"] >= 1  # ... nor acknowledged
    d1b = s.start_dispatcher(consumer="d1")
    _done(s, 4)
    wait_for(lambda: _drained(s), 30, 0.2, "stream drained")
    assert s.stop(d1b) == 0  # SIGTERM: a clean stop
    # 2. killed after the enqueue, before the XACK; another dispatcher claims the dead consumer's
    #    entries once they are idle (XPENDING + XCLAIM), and enqueues again: analysed once all the same
    shas += _push(s, "disp", str(REAL / "frag_synthetic" / "fragmented.pickle.gz"),
                  str(REAL / "frag_synthetic" / "oom.pickle.gz"))
    d2 = s.start_dispatcher(consumer="d2", fault="dispatcher:after_enqueue")
    assert d2.wait(60) == -signal.SIGKILL
    assert s.redis.xpending(s.stream, "memq-dispatch")["pending"] >= 1
    s.start_dispatcher(consumer="d3")
    _done(s, 6)
    wait_for(lambda: _drained(s), 30, 0.2, "stream drained")
    s.assert_exactly_once(set(shas))
    assert s.dead() == []
    assert s.rows("SELECT status FROM runs WHERE name = 'disp'")[0][0] == "oom"


def test_entry_that_keeps_killing_dispatchers_is_dead_lettered(fault_stack):
    s = fault_stack
    s.env["MEMQ_MAX_DELIVERIES"] = "2"
    _push(s, "poison", str(REAL / "seed_sgd" / SGD[0]), extra=("--status", "running"))
    for name in ("p1", "p2"):  # each delivery kills the dispatcher that reads it
        p = s.start_dispatcher(consumer=name, fault="dispatcher:after_commit")
        assert p.wait(60) == -signal.SIGKILL
        time.sleep(3.2)  # MEMQ_CLAIM_IDLE_S: the entries now look abandoned
    s.start_dispatcher(consumer="p3")
    wait_for(lambda: s.dead(), 30, 0.2, "a dead letter")
    (dead,) = [d for d in s.dead() if d["kind"] == "snapshot"]
    assert "not acknowledged after 2 deliveries" in dead["reason"] and dead["run"] == "poison"
    assert dead["sha256"] == sha(fixture_bytes("seed_sgd", SGD[0]))  # the original fields, plus reason
    wait_for(lambda: _drained(s), 30, 0.2, "nothing left pending")


def test_redis_restarted(fault_stack):
    s = fault_stack
    worker = s.start_worker()
    disp = s.start_dispatcher(wait=True)
    src = VaryingSource("seed_sgd")
    a = make_agent(s, "redis-restart", src, stats_interval_s=0)
    for i in range(3):
        a.mark_step(i, 0)
        assert a.snapshot("manual")
    a.flush(10)
    s.redis_server.kill()  # SIGKILL; AOF with fsync always keeps what was acknowledged
    for i in range(3, 6):
        a.mark_step(i, 0)
        assert a.snapshot("manual")  # spooled by the agent
    a.flush(5)
    time.sleep(2)
    s.redis_server.start()
    for i in range(6, 9):
        a.mark_step(i, 0)
        assert a.snapshot("manual")
    counters = a.stop(30)
    assert counters["dropped"] == 0 and counters["spooled"] > 0
    # every snapshot the agent took: the nine manual ones and its own baseline after warm-up
    _done(s, len({sha(b) for b in src.taken}), timeout=120)
    s.assert_exactly_once({sha(b) for b in src.taken})
    assert worker.poll() is None and disp.poll() is None
    assert s.dead() == []
    assert s.assert_samples_stored() >= 9


def test_postgres_stopped_for_30_s(fault_stack):
    s = fault_stack
    worker = s.start_worker()
    disp = s.start_dispatcher()
    src = VaryingSource("seed_sgd")
    a = make_agent(s, "pg-down", src, stats_interval_s=0)
    a.mark_step(0, 0)
    assert a.snapshot("manual")
    a.flush(10)
    _done(s, 1)
    s.pg.stop()
    try:
        t0 = time.monotonic()
        for i in range(1, 5):
            a.mark_step(i, 0)
            assert a.snapshot("manual")
        a.flush(10)
        time.sleep(max(0.0, 30 - (time.monotonic() - t0)))
    finally:
        s.pg.start()
    a.stop(10)
    # every snapshot the agent took: the five manual ones and its own (warm-up, comparable points)
    assert len(src.taken) >= 5
    _done(s, len(src.taken), timeout=120)
    s.assert_exactly_once({sha(b) for b in src.taken})
    assert worker.poll() is None and disp.poll() is None
    assert s.dead() == []
    assert s.assert_samples_stored() >= 5
    assert "unavailable" in s.log_tail("dispatcher", 10**6)
