"""Inbox starvation: how long another job's entry waits behind junk that the agent user pushes.

A private redis-server with deploy/'s ACL users (tests/ops/acl_redis.py), the real dispatcher (as the
`memq` user, SQLite history), and two writers as `memq-agent`:
- burst: 200,000 one-byte elements in RPUSH commands of 10,000, then one victim stats entry;
- sustained: a flooder pushing 10,000-element RPUSHes as fast as one connection can for `--seconds`,
  while a victim pushes one stats entry every 0.2 s; each victim entry's wait is measured from its
  RPUSH to the dispatcher storing its sample.

    python benchmarks/bench_inbox_flood.py [--junk 200000] [--seconds 10] [--wellformed]

`--wellformed` floods with junk the relay cannot tell from real entries: complete, well-formed stats
envelopes that are unsigned, while the dispatcher holds a keyring and the victim signs its entries. The
relay moves them; the dispatcher refuses each at its door (a dead letter each).

tests/ops/test_inbox_flood.py runs `burst` and a short `sustained` with bounds."""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import envelope, redis_functions  # noqa: E402

CHUNK = 10_000  # elements per RPUSH: one command, as an attacker would send them


#: The victim's signing key where the dispatcher holds a keyring (`--wellformed`).
VICTIM_KEY = None


def victim_entry(run: str, i: int) -> str:
    fields = envelope.build("stats", run=run, cluster="c", rank=0,
                            payload={"samples": [{"t": time.time(), "allocated_bytes": i}]})
    if VICTIM_KEY is not None:
        from memq import identity

        fields = identity.sign(fields, VICTIM_KEY)
    return redis_functions.encode_fields(fields)


def wellformed_junk(i: int) -> str:
    """An unsigned stats envelope: the relay takes it; a dispatcher with a keyring refuses it."""
    return redis_functions.encode_fields(envelope.build(
        "stats", run=f"junk-{i}", cluster="c", rank=0, payload={"samples": []}))


def keyring() -> tuple[str, object]:
    """A keyring of one principal and its key (for `--wellformed`)."""
    import json
    import secrets

    from memq import identity

    secret = secrets.token_hex(32)
    ring = json.dumps({"keys": [{"kid": "v1", "principal": "victim-team", "secret": secret}]})
    return ring, identity.Key(kid="v1", secret=bytes.fromhex(secret))


def settings(tmp: Path, redis_url: str, **extra: str):
    from memq.config import load_settings

    return load_settings({"MEMQ_REDIS_URL": redis_url, "MEMQ_DATABASE_URL": f"sqlite:///{tmp}/h.db",
                          "MEMQ_DATA_DIR": str(tmp), "MEMQ_BLOB_DIR": str(tmp / "blobs"),
                          "MEMQ_SPOOL_DIR": str(tmp / "spool"), "MEMQ_CONFIG": str(tmp / "none.toml"), **extra})


def dispatcher(st):
    from memq.workers.dispatcher import Dispatcher

    return Dispatcher(st, consumer="flood-bench", batch=100, block_ms=200, enqueue=lambda _sid: None)


def burst(agent, d, inbox: str, junk: int, timeout_s: float = 120.0) -> dict:
    """`junk` one-byte elements, then one victim entry: seconds until the victim's sample is stored."""
    t0 = time.perf_counter()
    for i in range(0, junk, CHUNK):
        agent.rpush(inbox, *([b"x"] * min(CHUNK, junk - i)))
    push_s = time.perf_counter() - t0
    before = d.counts["samples"]
    sent = time.perf_counter()
    agent.rpush(inbox, victim_entry("victim-burst", 0))
    while d.counts["samples"] == before and time.perf_counter() - sent < timeout_s:
        d.step()
    waited = time.perf_counter() - sent
    return {"junk": junk, "push_s": round(push_s, 3), "victim_wait_s": round(waited, 3),
            "stored": d.counts["samples"] > before, "dropped": d.relay.counts["refused"]}


def sustained(agent_url: str, agent, d, inbox: str, seconds: float, timeout_s: float = 120.0,
              wellformed: bool = False) -> dict:
    """A flooder on its own connection for `seconds`; a victim entry every 0.2 s; each one's wait."""
    import redis

    stop = threading.Event()
    pushed = [0]

    def flood():
        r = redis.Redis.from_url(agent_url)
        chunk = [wellformed_junk(i) for i in range(CHUNK)] if wellformed else [b"x"] * CHUNK
        while not stop.is_set():
            r.rpush(inbox, *chunk)
            pushed[0] += CHUNK

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    sends: list[float] = []
    waits: list[float] = []
    start = time.perf_counter()
    base = d.counts["samples"]
    next_send = start
    while True:
        now = time.perf_counter()
        if now - start < seconds and now >= next_send:
            agent.rpush(inbox, victim_entry("victim-sustained", len(sends)))
            sends.append(now)
            next_send = now + 0.2
        if now - start >= seconds:
            stop.set()
        d.step()
        done = d.counts["samples"] - base
        now = time.perf_counter()
        while len(waits) < done:  # FIFO: the n-th stored sample is the n-th sent
            waits.append(now - sends[len(waits)])
        if stop.is_set() and len(waits) == len(sends):
            break
        if now - start > seconds + timeout_s:
            break
    t.join(10)
    elapsed = time.perf_counter() - start
    return {"seconds": seconds, "wellformed": wellformed, "junk_pushed": pushed[0],
            "push_rate_per_s": round(pushed[0] / seconds), "refused_at_door": d.counts["dead"],
            "victims_sent": len(sends), "victims_stored": len(waits),
            "victim_wait_max_s": round(max(waits), 3) if waits else None,
            "victim_wait_median_s": round(sorted(waits)[len(waits) // 2], 3) if waits else None,
            "inbox_left": agent_llen(d, inbox), "elapsed_s": round(elapsed, 1)}


def agent_llen(d, inbox: str) -> int:
    return int(d.r.llen(inbox))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--junk", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--wellformed", action="store_true", help="junk the relay cannot tell from real entries")
    args = ap.parse_args()
    from tests.ops.acl_redis import acl_redis

    global VICTIM_KEY
    extra = {}
    if args.wellformed:
        ring, VICTIM_KEY = keyring()
        extra["MEMQ_AGENT_KEYRING"] = ring
    with tempfile.TemporaryDirectory() as tmp, acl_redis(Path(tmp)) as srv:
        st = settings(Path(tmp), srv["memq_url"], **extra)
        d = dispatcher(st)
        inbox = redis_functions.inbox_key(st.stream_key)
        agent = srv["agents"]["file"]
        d.step()  # the consumer group and the library
        if not args.wellformed:
            print("burst:", burst(agent, d, inbox, args.junk))
        print("sustained:", sustained(srv["agent_url"], agent, d, inbox, args.seconds, wellformed=args.wellformed))


if __name__ == "__main__":
    main()
