"""The dispatcher in-process, on the shared Redis (unique prefix) and a SQLite history: an entry it
cannot handle for an unexpected reason is isolated and dead-lettered; the others go through."""

from __future__ import annotations

import secrets

import pytest
import redis

from memq import envelope
from memq.config import load_settings
from memq.workers.dispatcher import Dispatcher

pytestmark = pytest.mark.redis


class Flaky(Dispatcher):
    """A dispatcher with a bug that only one run name triggers."""

    def on_run_start(self, env):
        if env.run == "boom":
            raise RuntimeError("unexpected failure for this entry")
        super().on_run_start(env)


def _settings(tmp_path, shared_redis, prefix):
    return load_settings({"MEMQ_REDIS_URL": shared_redis, "MEMQ_KEY_PREFIX": prefix, "MEMQ_STREAM": prefix + "ingest",
                          "MEMQ_DEAD_STREAM": prefix + "dead", "MEMQ_DATABASE_URL": f"sqlite:///{tmp_path}/h.db",
                          "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_BLOB_DIR": str(tmp_path / "blobs"),
                          "MEMQ_CONFIG": str(tmp_path / "none.toml"), "MEMQ_MAX_DELIVERIES": "2",
                          "MEMQ_CLAIM_IDLE_S": "1"})


def test_a_busy_dispatcher_is_not_idle(tmp_path, shared_redis):
    """Several batches in the stream: `run(idle_exit_s=...)` handles them all before it calls itself
    idle (each step reports the entries it handled)."""
    prefix = f"memqtest:wkd:{secrets.token_hex(6)}:"
    st = _settings(tmp_path, shared_redis, prefix)
    r = redis.Redis.from_url(shared_redis)
    try:
        pipe = r.pipeline(transaction=False)
        for i in range(25):
            pipe.xadd(st.stream_key, envelope.build("stats", run="busy", cluster="c", rank=0,
                                                    payload={"samples": [{"t": 1.7e9 + i, "allocated_bytes": i}]}))
        pipe.execute()
        d = Dispatcher(st, consumer="t", batch=10, block_ms=50)
        assert d.step() == 10
        counts = d.run(install_signals=False, idle_exit_s=0.2)
        assert counts["stats"] == 25 and counts["samples"] == 25
        group = r.xinfo_groups(st.stream_key)[0]
        assert int(group["pending"]) == 0 and group["lag"] == 0
    finally:
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)


def test_an_entry_that_breaks_the_dispatcher_is_isolated_and_dead_lettered(tmp_path, shared_redis):
    prefix = f"memqtest:wkd:{secrets.token_hex(6)}:"
    st = _settings(tmp_path, shared_redis, prefix)
    r = redis.Redis.from_url(shared_redis)
    try:
        for name in ("ok1", "boom", "ok2"):
            r.xadd(st.stream_key, envelope.build("run_start", run=name, cluster="c", payload={"torch": "2.11"}))
        d = Flaky(st, consumer="t", block_ms=50)
        counts = d.run(install_signals=False, idle_exit_s=1.0)
        assert counts["dead"] == 1 and counts["errors"] == 0  # not an outage: dead-lettered at once, alone
        (dead,) = [{k.decode(): v.decode() for k, v in f.items()} for _i, f in r.xrange(st.dead_letter_key)]
        assert dead["run"] == "boom" and "RuntimeError" in dead["reason"] and dead["kind"] == "run_start"
        from sqlalchemy import select

        from memq.store.orm import Run

        with d.store.session() as s:
            names = set(s.execute(select(Run.name)).scalars())
        assert names == {"ok1", "ok2"}
        group = r.xinfo_groups(st.stream_key)[0]
        assert int(group["pending"]) == 0 and group["lag"] == 0
    finally:
        for key in r.scan_iter(match=prefix + "*"):
            r.delete(key)
