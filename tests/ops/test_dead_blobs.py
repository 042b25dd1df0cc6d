"""The dead-blob cleanup (memq.pipeline.dead_blobs, memq.store.retention.remove_dead_blobs) on a private
redis-server, SQLite and the real PostgreSQL, and a real blob directory: the grace just under and just over
MEMQ_DEAD_BLOB_GRACE_S, a blob any row names never removed, a writer that needs a blob during the hold
taking it back, and a cleanup killed during its hold losing nothing. The whole path through a real
dispatcher is tests/workers/test_dead_blobs_e2e.py."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from memq.config import load_settings
from memq.pipeline.dead_blobs import clean
from memq.store import repository as repo
from tests.conftest import memq_environ
from tests.ops.stackfile import Server
from tests.workers.stack import wait_for

ROOT = Path(__file__).resolve().parents[2]
GRACE = 600  # MEMQ_DEAD_BLOB_GRACE_S in these tests


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("deadblobs"), "--save", "").start()
    yield s
    s.kill()


@pytest.fixture
def env(srv, db_url, tmp_path):
    return {**memq_environ(db_url, tmp_path), "MEMQ_REDIS_URL": srv.url, "MEMQ_DEAD_STREAM": f"t{os.getpid()}:dead",
            "MEMQ_DEAD_BLOB_GRACE_S": str(GRACE)}


@pytest.fixture
def st(env):
    return load_settings(env)


@pytest.fixture
def r(srv, st):
    c = redis.Redis.from_url(srv.url)
    c.delete(st.dead_blobs_key)
    return c


def _blob(store, tag: str) -> str:
    data = f"refused snapshot {tag}".encode() * 64
    sha = hashlib.sha256(data).hexdigest()
    store.blobs.put(sha, data)
    return sha


def _dead(r, st, sha: str, age_s: float) -> None:
    """What the dispatcher's dead letter records: the sha256, scored by the time of the dead letter."""
    sec, usec = r.time()
    r.zadd(st.dead_blobs_key, {sha: int((sec + usec / 1e6 - age_s) * 1000)})


def _row(store, sha: str, blob_ref: bool = True) -> None:
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name=f"run-{sha[:8]}"))
        repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=sha, size_bytes=10, source="test",
                                                 blob_ref=store.blobs.ref(sha) if blob_ref else None))


def test_the_grace_just_under_and_just_over(store, st, r):
    young, old = _blob(store, "young"), _blob(store, "old")
    _dead(r, st, young, GRACE - 5)
    _dead(r, st, old, GRACE + 5)
    out = clean(st, store, r, race_grace_s=0.05)
    assert out["dead_blobs_due"] == 1 and out["dead_blobs_removed"] == 1
    assert store.blobs.exists(young) and not store.blobs.exists(old)
    assert [m.decode() for m in r.zrange(st.dead_blobs_key, 0, -1)] == [young]  # waits for its own time
    assert clean(st, store, r, race_grace_s=0.05)["dead_blobs_due"] == 0


def test_a_blob_a_row_needs_is_never_removed(store, st, r):
    named, unlinked, alone = _blob(store, "named"), _blob(store, "unlinked"), _blob(store, "alone")
    _row(store, named)                   # a legitimate snapshot of the same bytes
    _row(store, unlinked, blob_ref=False)  # a row whose blob retention already removed: nothing needs it
    for sha in (named, unlinked, alone):
        _dead(r, st, sha, GRACE + 60)
    out = clean(st, store, r, race_grace_s=0.05)
    assert out["dead_blobs_removed"] == 2 and out["kept"]["referenced"] == 1 and out["restored"] == 0
    assert store.blobs.exists(named) and not store.blobs.exists(unlinked) and not store.blobs.exists(alone)
    assert r.zcard(st.dead_blobs_key) == 0


def test_a_writer_that_needs_the_blob_during_the_hold_takes_it_back(store, st, r):
    """The race: `memq ingest` (or a dispatcher) of the same bytes while the cleanup holds the file. The
    writer's put finds the held file, takes it back and names it in its row; the cleanup's final check
    leaves it in place."""
    import threading

    data = b"refused snapshot racing" * 64
    sha = hashlib.sha256(data).hexdigest()
    store.blobs.put(sha, data)
    _dead(r, st, sha, GRACE + 60)
    done = threading.Event()

    def writer():
        wait_for(lambda: not store.blobs.exists(sha), 20, 0.005, "the cleanup to hold the file")
        ref = store.blobs.put(sha, data)  # the held file comes back; nothing rewritten
        with store.session() as s:
            rid = repo.upsert_run(s, repo.RunMeta(name="late"))
            repo.insert_snapshot(s, repo.NewSnapshot(run_id=rid, sha256=sha, size_bytes=len(data), source="late",
                                                     blob_ref=ref))
        done.set()

    t = threading.Thread(target=writer)
    t.start()
    out = clean(st, store, r, race_grace_s=1.0)
    t.join(30)
    assert done.is_set()
    assert store.blobs.get(sha) == data
    assert out["dead_blobs_removed"] == 0 and out["restored"] == 1
    assert not list(Path(store.blobs.directory).rglob("*.held"))


_HOLDER = """
import sys
from memq.config import load_settings
from memq.pipeline.dead_blobs import clean
from memq.redis_client import make_client
from memq.store.connection import open_store
st = load_settings()
clean(st, open_store(st), make_client(st.redis_url, 5), race_grace_s=120)
"""


@pytest.mark.parametrize("named", [True, False], ids=["a-row-appears", "nothing-needs-it"])
def test_a_cleanup_killed_during_its_hold_loses_nothing(store, st, r, env, named):
    """SIGKILL while the file is held aside: the file is still on disk (held); the record is still in the
    set. A writer takes it back at once; else the next cleanup settles it: back where a row names it,
    removed where none does."""
    data = f"refused snapshot killed {named}".encode() * 64
    sha = hashlib.sha256(data).hexdigest()
    store.blobs.put(sha, data)
    _dead(r, st, sha, GRACE + 60)
    p = subprocess.Popen([sys.executable, "-c", _HOLDER], env={**os.environ, **env}, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    held = list((Path(store.blobs.directory) / sha[:2]).glob("*.held"))
    try:
        wait_for(lambda: list((Path(store.blobs.directory) / sha[:2]).glob("*.held")), 60, 0.02,
                 "the cleanup to hold the file")
    finally:
        os.kill(p.pid, signal.SIGKILL)
        out = p.communicate(timeout=30)[0]
    held = list((Path(store.blobs.directory) / sha[:2]).glob("*.held"))
    assert len(held) == 1, out
    assert not store.blobs.exists(sha) and r.zscore(st.dead_blobs_key, sha) is not None
    if named:
        _row(store, sha, blob_ref=False)
        with store.session() as s:  # the row learns where its blob lives, as insert_snapshot does
            from sqlalchemy import update

            from memq.store.orm import Snapshot
            s.execute(update(Snapshot).where(Snapshot.sha256 == sha).values(blob_ref=f"{sha[:2]}/{sha}.zst"))
    # within the race grace of the hold (it could still be another cleanup's): left alone, record kept
    young = clean(st, store, r, race_grace_s=3600)
    assert young["deferred"] == [sha] and held[0].exists() and r.zscore(st.dead_blobs_key, sha) is not None
    time.sleep(0.1)
    out = clean(st, store, r, race_grace_s=0.05)
    assert not held[0].exists()
    assert store.blobs.exists(sha) is named
    if named:
        assert store.blobs.get(sha) == data and out["held_restored"] == 1
    else:
        assert out["dead_blobs_removed"] == 1
    assert r.zcard(st.dead_blobs_key) == 0


def test_a_writer_takes_back_a_blob_a_killed_cleanup_left_held(store, tmp_path):
    data = b"held after a crash" * 64
    sha = hashlib.sha256(data).hexdigest()
    ref = store.blobs.put(sha, data)
    p = Path(store.blobs.directory) / ref
    os.replace(p, p.with_name(p.name + ".held"))  # what a cleanup killed during its hold leaves
    assert not store.blobs.exists(sha)
    assert store.blobs.claim(sha) == ref and store.blobs.get(sha) == data


@pytest.mark.parametrize("named", [True, False], ids=["a-row-appears", "nothing-needs-it"])
def test_the_beats_tick_never_sleeps_it_holds_then_settles_on_a_later_tick(store, st, r, named):
    """wait=False (the stream-trim tick): the file is held aside and its record kept; a call at least the
    race grace later settles it (back where a row named it meanwhile, else gone) and drops the record."""
    data = f"refused snapshot tick {named}".encode() * 64
    sha = hashlib.sha256(data).hexdigest()
    store.blobs.put(sha, data)
    _dead(r, st, sha, GRACE + 60)
    t = time.monotonic()
    first = clean(st, store, r, race_grace_s=0.5, wait=False)
    assert time.monotonic() - t < 0.5 and first["deferred"] == [sha]
    assert not store.blobs.exists(sha) and r.zscore(st.dead_blobs_key, sha) is not None
    too_soon = clean(st, store, r, race_grace_s=60, wait=False)  # just under the grace: untouched
    assert too_soon["deferred"] == [sha] and too_soon["dead_blobs_removed"] == 0
    if named:
        _row(store, sha, blob_ref=False)
        with store.session() as s:
            from sqlalchemy import update

            from memq.store.orm import Snapshot
            s.execute(update(Snapshot).where(Snapshot.sha256 == sha).values(blob_ref=f"{sha[:2]}/{sha}.zst"))
    time.sleep(0.6)
    second = clean(st, store, r, race_grace_s=0.5, wait=False)  # just over
    assert second["deferred"] == [] and r.zcard(st.dead_blobs_key) == 0
    assert store.blobs.exists(sha) is named
    assert second["dead_blobs_removed"] == (0 if named else 1)
    assert not list((Path(store.blobs.directory) / sha[:2]).glob("*.held"))
