"""The agents' append-only write path: an inbox list, and the Redis function that relays it.

`XADD` takes trim options (`MAXLEN 0`) and explicit IDs (the largest possible one makes every later
XADD fail), and Redis ACLs cannot filter arguments. A Redis function does not help on its own: Redis
checks every command a function calls against the ACL of the user who called FCALL, so an agent
allowed FCALL but not XADD cannot append through a function either. memq therefore splits the path:

    agent      SET <prefix>blob:<sha256> (as before) and RPUSH <stream>:inbox <JSON array of fields>
               (RPUSH has no options: it can only append)
    dispatcher FCALL memq_relay: moves inbox elements into the stream with `*` IDs and the
               deployment's MAXLEN ~ N, drops malformed ones in bulk (counted; one dead letter per
               step says how many), and, where the dispatcher holds a keyring, also those that
               carry no signature of one of its key ids; caps the TTL of each relayed snapshot's blob

In a hardened deployment (deploy/redis/users.acl.template) the agent user has RPUSH on the inbox and
no XADD; the agent's transport tries XADD first and switches to the inbox when the ACL refuses it, so
development setups with an all-powerful user keep writing the stream directly.

The library (`memq_functions.lua`, `#!lua name=memq`, VERSION below) is loaded by the dispatcher the
first time it finds the inbox non-empty (FUNCTION LOAD REPLACE when missing or older; a newer one is
left alone), or by an operator: `memq relay load --redis-url URL`. `memq
doctor` warns when it is outdated, when it is missing while agents' messages wait in the inbox, and
when the inbox is not being relayed.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memq.identity import parse_keyring

log = logging.getLogger("memq.redis_functions")

LIBRARY = "memq"
VERSION = 5  # must equal VERSION in memq_functions.lua (tests/ops/test_ingest_relay.py checks)
SOURCE = Path(__file__).with_name("memq_functions.lua")
#: Elements moved per FCALL: the function blocks Redis while it runs, so keep each call short.
RELAY_BATCH = 1000
#: Redis time one relay step may spend dropping junk, in calls of up to 100,000 drops each (the
#: Lua library's MAX_DROPS_PER_CALL): junk is cleared at least as fast as the agent user can push it
#: (benchmarks/bench_inbox_flood.py), and the dispatcher reads its stream between steps.
RELAY_STEP_BUDGET_S = 0.25
#: An inbox element waiting longer than this means nobody relays it (doctor's warning).
STALE_INBOX_S = 60


def inbox_key(stream: str) -> str:
    """The list agents append to when XADD is refused; the dispatcher relays it into `stream`."""
    return f"{stream}:inbox"


def encode_fields(fields: Mapping[Any, Any]) -> str:
    """Stream fields -> one inbox element: a JSON array, name and value alternating."""
    flat: list[str] = []
    for k, v in fields.items():
        for x in (k, v):
            flat.append(x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x))
    return json.dumps(flat, separators=(",", ":"))


def source() -> str:
    return SOURCE.read_text()


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _missing(exc: BaseException) -> bool:
    return "function not found" in str(exc).lower()


def loaded_version(client) -> int | None:
    """The memq library's version loaded in this Redis, or None when it is not loaded."""
    import redis  # the agent imports this module and runs without redis-py (spool only)

    try:
        return int(client.fcall_ro("memq_version", 0))
    except redis.ResponseError as exc:
        if _missing(exc):
            return None
        raise


def ensure_library(client) -> str:
    """Load or upgrade the library; idempotent. Returns current | loaded | upgraded | newer."""
    have = loaded_version(client)
    if have is not None and have >= VERSION:
        return "current" if have == VERSION else "newer"
    client.function_load(source(), replace=True)
    log.info("redis function library %s version %s %s", LIBRARY, VERSION, "loaded" if have is None else "upgraded")
    return "loaded" if have is None else "upgraded"


class Relay:
    """The dispatcher's side: `step()` moves up to RELAY_BATCH inbox elements into the stream.

    Connection errors propagate (the caller's outage handling retries); anything else (the library
    cannot be loaded, a wrong-typed key, exhausted stream IDs) is logged at most once a minute and
    counted, and the dispatcher carries on reading the stream."""

    def __init__(self, client, *, stream: str, key_prefix: str, maxlen: int, blob_ttl_s: int,
                 batch: int = RELAY_BATCH, dead_key: str | None = None, dead_maxlen: int = 100_000,
                 kids: tuple[str, ...] = ()):
        self.client, self.stream, self.inbox = client, stream, inbox_key(stream)
        # with a keyring, only elements signed with one of its key ids are relayed (memq_functions.lua)
        self.kids = ",".join(sorted(kids))
        self.key_prefix, self.maxlen, self.blob_ttl_s, self.batch = key_prefix, maxlen, blob_ttl_s, batch
        self.dead_key, self.dead_maxlen = dead_key, dead_maxlen
        self.counts = {"moved": 0, "refused": 0, "errors": 0, "held": 0}
        self.last_error: str | None = None
        self.waiting = 0  # inbox elements left after the last step
        self.hurry = False
        self._checked = False
        self._next_log = 0.0

    @classmethod
    def for_settings(cls, client, st) -> Relay:
        kids: tuple[str, ...] = ()
        if st.agent_keyring:
            kids = tuple(parse_keyring(st.agent_keyring))
        return cls(client, stream=st.stream_key, key_prefix=st.key_prefix, maxlen=st.stream_maxlen,
                   blob_ttl_s=st.blob_ttl_s, dead_key=st.dead_letter_key, kids=kids)

    def _call(self):
        extra = (self.kids,) if self.kids else ()
        return self.client.fcall("memq_relay", 2, self.inbox, self.stream, self.batch, self.maxlen,
                                 self.key_prefix, self.blob_ttl_s, *extra)

    def step(self) -> int:
        import redis

        self.hurry = False
        try:
            # Most deployments' agents write the stream directly; only an inbox in use needs the
            # library (so a development Redis never gets one loaded for nothing).
            if not self.client.llen(self.inbox):
                self.waiting = 0
                return 0
            if not self._checked:
                ensure_library(self.client)
                self._checked = True
            moved = refused = 0
            err = ""
            until = time.monotonic() + RELAY_STEP_BUDGET_S
            while True:  # more calls only while they drop junk: moves are capped by `batch` per step
                try:
                    m, f, err = self._call()
                except redis.ResponseError as exc:
                    if not _missing(exc):  # a Redis restarted without persistence lost the library
                        raise
                    ensure_library(self.client)
                    m, f, err = self._call()
                moved, refused = moved + int(m), refused + int(f)
                if err or not int(f) or moved >= self.batch or time.monotonic() >= until:
                    break
            waiting = self.client.llen(self.inbox)
            if refused:
                self._dead_summary(refused)
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            raise
        except redis.RedisError as exc:
            self._error(f"{type(exc).__name__}: {exc}")
            return 0
        moved, refused, waiting = int(moved), int(refused), int(waiting)
        self.counts["moved"] += moved
        self.counts["refused"] += refused
        self.waiting = waiting
        if not moved and not refused and waiting:
            # Back-pressure, not loss: the stream is full of unread entries; the inbox keeps the rest.
            self.counts["held"] += 1
            if time.monotonic() >= self._next_log:
                self._next_log = time.monotonic() + 60
                log.warning("relay %s -> %s: %d inbox elements wait: the stream holds MAXLEN %d unread entries "
                            "(dispatchers behind)", self.inbox, self.stream, waiting, self.maxlen)
        # elements left behind a step that made progress: the dispatcher reads without waiting and
        # relays again at once; held (stream full) or failing: it waits as usual, never a busy loop
        self.hurry = bool((moved or refused) and waiting and not err)
        if err:
            self._error(f"stream {self.stream} refused an inbox element: {_text(err)}")
        return moved

    def _dead_summary(self, refused: int) -> None:
        """One dead letter for every junk element a step dropped (a dead letter each would let a
        flood push real dead letters out of the capped dead stream); the total counter counts each."""
        if not self.dead_key:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(self.dead_key, {"v": "0", "stage": "relay", "dropped": str(refused), "relay_error": "junk",
                                  "reason": f"relay: dropped {refused} inbox element(s) that are not a JSON "
                                            f"array of field names and values" + (
                                                ", or carry no signature of a key in the keyring"
                                                if self.kids else ""),
                                  "dead_at": str(int(time.time() * 1000))},
                  maxlen=self.dead_maxlen, approximate=True)
        pipe.incrby(self.dead_key + ":total", refused)
        pipe.execute()

    def _error(self, what: str) -> None:
        self.counts["errors"] += 1
        self.last_error = what
        if time.monotonic() >= self._next_log:
            self._next_log = time.monotonic() + 60
            log.warning("relay %s -> %s: %s", self.inbox, self.stream, what)


def doctor_checks(r, st) -> list[tuple[str, str, str, str | None]]:
    """`memq doctor`'s lines about the relay: (name, status, detail, fix), status ok|info|warning."""
    import redis

    out: list[tuple[str, str, str, str | None]] = []
    load_fix = ("start `memq dispatcher` (it loads the library) or run "
                "`memq relay load` with the memq (services) user")
    try:
        have = loaded_version(r)
    except redis.RedisError as exc:
        return [("redis-functions", "warning", f"cannot call memq_version: {exc}",
                 "grant the memq services user FCALL/FCALL_RO (ACL +@scripting)")]
    inbox = inbox_key(st.stream_key)
    try:
        waiting = int(r.llen(inbox))
        head = r.lindex(inbox, 0) if waiting else None
    except redis.RedisError as exc:
        return [("inbox", "warning", f"cannot read {inbox}: {exc}", "grant the memq services user LLEN/LINDEX")]
    if have is None and waiting:
        out.append(("redis-functions", "warning", f"the {LIBRARY} function library is not loaded and {waiting} "
                    f"agent messages wait in {inbox}: nothing relays them to the stream", load_fix))
    elif have is None:
        out.append(("redis-functions", "info", f"the {LIBRARY} function library is not loaded yet (the "
                    "dispatcher loads it when an agent first appends to the inbox)", None))
    elif have < VERSION:
        out.append(("redis-functions", "warning", f"the {LIBRARY} function library is version {have}, "
                    f"this memq ships {VERSION}", load_fix))
    else:
        out.append(("redis-functions", "ok", f"{LIBRARY} function library version {have} loaded", None))
    if not waiting:
        return out
    age = _age_s(head)
    line = f"{inbox}: {waiting} agent messages wait for the relay"
    if age is not None and age > STALE_INBOX_S:
        out.append(("inbox", "warning", f"{line}, the oldest for {age:.0f} s: no dispatcher is relaying",
                    "start `memq dispatcher`; " + load_fix))
    else:
        out.append(("inbox", "info", line, None))
    return out


def _age_s(element: Any) -> float | None:
    try:
        flat = json.loads(element)
        ts = dict(zip(flat[::2], flat[1::2], strict=False)).get("ts")
        return time.time() - int(ts) / 1000.0
    except (TypeError, ValueError, AttributeError):
        return None
