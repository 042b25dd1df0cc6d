"""Issue 13 item 5 in the services: a 1 MB gzip blob of zeros with a correct sha256 (it took the
dispatcher to 3.2 GB and a worker to 3.06 GB) goes through the real dispatcher on a PRIVATE
redis-server, as a process whose own peak RSS (wait4) is asserted under MEMQ_DECODE_BUDGET_BYTES:
- past the budget's cap it is dead-lettered with the reason, and the good snapshot behind it is stored;
- within a larger cap it is verified by streaming (sha256 and size) and stored, while the dispatcher
  stays far below the 256 MiB it inflated;
- the worker's decode of a stored bomb (blob_snapshots.load_blob) is a TooLarge bad input, in bounded memory.
"""

from __future__ import annotations

import gzip
import sys

import pytest
import redis

from memq import codec, envelope
from memq.config import load_settings
from tests.bombs import MIB, REAL, clean_env, peak_rss, zeros_gzip
from tests.workers.stack import sha

pytestmark = pytest.mark.redis

GOOD = (REAL / "capacity" / "oom.pickle.gz").read_bytes()
GOOD_RAW = gzip.decompress(GOOD)

DISPATCH = ("from memq.config import load_settings; from memq.workers.dispatcher import Dispatcher; "
            "d = Dispatcher(load_settings(), consumer='c1', block_ms=50, enqueue=lambda sid: None); "
            "print(d.run(install_signals=False, idle_exit_s=1.0))")


def _env(tmp_path, url: str, budget: int) -> dict[str, str]:
    return clean_env(MEMQ_REDIS_URL=url, MEMQ_DATABASE_URL=f"sqlite:///{tmp_path}/h.db", MEMQ_DATA_DIR=str(tmp_path),
                     MEMQ_BLOB_DIR=str(tmp_path / "blobs"), MEMQ_CONFIG=str(tmp_path / "none.toml"),
                     MEMQ_DECODE_BUDGET_BYTES=str(budget), MEMQ_CLAIM_IDLE_S="1")


def _push(r: redis.Redis, st, run: str, data: bytes, sha256: str, size: int) -> None:
    r.set(envelope.blob_key(sha256, st.key_prefix), data)
    fields = envelope.build("snapshot", run=run, cluster="c", rank=0, sha256=sha256, size=size, codec="gzip",
                            trigger="oom", step=1, epoch=0)
    r.xadd(st.stream_key, fields)


def _runs(st) -> dict[str, int]:
    from sqlalchemy import func, select

    from memq.store.connection import open_store
    from memq.store.orm import Run, Snapshot

    store = open_store(st)
    try:
        with store.session() as s:
            rows = s.execute(select(Run.name, func.count(Snapshot.id)).join(Snapshot, Snapshot.run_id == Run.id)
                             .group_by(Run.name)).all()
        return {name: int(n) for name, n in rows}
    finally:
        store.close()


def test_bomb_past_the_cap_is_dead_lettered_in_bounded_memory(tmp_path, private_redis):
    srv = private_redis(aof=False)
    budget = 256 * MIB
    env = _env(tmp_path, srv.url, budget)
    st = load_settings(env)
    r = redis.Redis.from_url(srv.url)
    data, bomb_sha, size = zeros_gzip(1024)  # 1 GiB of zeros in ~1 MB; the envelope tells the truth
    _push(r, st, "bomb", data, bomb_sha, size)
    _push(r, st, "good", GOOD, sha(GOOD_RAW), len(GOOD_RAW))

    rc, out, err, rss = peak_rss([sys.executable, "-c", DISPATCH], env=env, timeout=300)
    assert rc == 0, err[-3000:]
    dead = [{k.decode(): v.decode() for k, v in f.items()} for _i, f in r.xrange(st.dead_letter_key)]
    assert [d["run"] for d in dead] == ["bomb"], dead
    reason = dead[0]["reason"]
    assert f"exceeds the limit of {budget // codec.DECODE_BYTES_PER_RAW_BYTE} bytes" in reason, reason
    assert _runs(st) == {"good": 1}
    assert int(r.xpending(st.stream_key, "memq-dispatch")["pending"]) == 0
    assert rss < budget, f"dispatcher peak RSS {rss / MIB:.0f} MiB over the {budget / MIB:.0f} MiB budget"


def test_bomb_within_the_cap_is_verified_by_streaming(tmp_path, private_redis):
    srv = private_redis(aof=False)
    env = _env(tmp_path, srv.url, 8 * 1024 * MIB)  # cap 512 MiB
    st = load_settings(env)
    r = redis.Redis.from_url(srv.url)
    data, bomb_sha, size = zeros_gzip(256)
    _push(r, st, "zeros", data, bomb_sha, size)

    rc, out, err, rss = peak_rss([sys.executable, "-c", DISPATCH], env=env, timeout=300)
    assert rc == 0, err[-3000:]
    assert not r.xlen(st.dead_letter_key)
    assert _runs(st) == {"zeros": 1}
    stored = list((tmp_path / "blobs").rglob(f"{bomb_sha}.gz"))
    assert len(stored) == 1 and stored[0].read_bytes() == data  # kept as it came, not re-encoded
    assert rss < size * 3 // 4, f"dispatcher peak RSS {rss / MIB:.0f} MiB while verifying {size / MIB:.0f} MiB"


def test_worker_decode_of_a_stored_bomb_is_bad_input_in_bounded_memory(tmp_path):
    """A blob stored under a larger budget (another deployment, an older version) is decoded by a
    worker whose budget is smaller: TooLarge (a bad input: the snapshot fails, no retry), no OOM."""
    budget = 256 * MIB
    data, bomb_sha, size = zeros_gzip(1024)
    env = _env(tmp_path, "redis://127.0.0.1:1/0", budget)
    from memq.store.blobs import BlobStore

    BlobStore(tmp_path / "blobs", max_bytes=2 * size).put_encoded(bomb_sha, data, "gzip", size=size)
    script = ("from memq.store.connection import open_store; from memq.store import blob_snapshots; "
              "from memq.errors import TooLarge\n"
              "try:\n"
              f"    blob_snapshots.load_blob(open_store(), {bomb_sha!r})\n"
              "except TooLarge as exc:\n"
              "    print('TooLarge', exc)\n")
    rc, out, err, rss = peak_rss([sys.executable, "-c", script], env=env, timeout=300)
    assert rc == 0, err[-3000:]
    assert out.startswith("TooLarge") and f"limit of {budget // codec.DECODE_BYTES_PER_RAW_BYTE} bytes" in out
    assert rss < budget
