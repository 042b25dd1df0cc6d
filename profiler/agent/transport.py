"""Background delivery: bounded queue -> serialize -> Redis (blob SET, then XADD) or the disk spool.

The training thread only ever calls `submit()`, which never blocks and never raises: a full queue
drops the message and counts it. Everything else happens on one daemon thread:

    serialize  snapshot object -> pickle bytes (protocol 4) -> sha256 -> zstd (gzip if zstandard is
               missing) -> envelope fields (memq.envelope.build)
    deliver    while the spool holds messages, new ones are appended to it (order is kept), and the
               spool is replayed oldest first whenever Redis answers again; otherwise
               SET memq:blob:<sha256> <blob> EX ttl, then XADD <stream> MAXLEN ~ N <fields>; where
               the ACL refuses XADD (a hardened deployment), RPUSH <stream>:inbox <fields as JSON>
               instead, which the dispatcher relays into the stream (profiler/redis_functions.py).
               Any other error (connect, timeout, OOM of a full Redis, auth) marks Redis down for a
               back-off period (full jitter: a random wait up to 0.5 s doubling to 30 s, so agents
               that lost Redis together do not come back together) and the message goes to the spool.
    spool      bounded; oldest dropped and counted when full; a failing disk drops and counts.

Redis URLs may carry a password and use TLS (`rediss://`); every command has a socket timeout and
no client-side retries, so one stuck call costs at most `send_timeout_s`.
"""

from __future__ import annotations

import gzip
import hashlib
import pickle
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from memq import envelope, redis_functions
from memq.agent.spool import Message, Spool
from memq.backoff import JitteredBackoff
from memq.errors import TooLarge
from memq.identity import sign
from memq.redis_client import make_client

try:  # the agent runs without redis-py (spool only) and without zstandard (gzip)
    import redis as _redis
except ImportError:  # pragma: no cover - exercised on machines without redis-py
    _redis = None

try:
    import zstandard as _zstd
except ImportError:  # pragma: no cover
    _zstd = None


def default_codec() -> str:
    return "zstd" if _zstd is not None else "gzip"


def compress(data: bytes, codec: str) -> bytes:
    if codec == "zstd":
        return _zstd.ZstdCompressor(level=3).compress(data)
    return gzip.compress(data, compresslevel=6)


class Counters:
    """sent, spooled, dropped, replayed, errors (+ queued, the messages waiting now); oversize: snapshots
    too big for one Redis value (dropped, kept aside); via_inbox: of the
    sent and replayed, those appended to the relay inbox because the ACL refused XADD."""

    NAMES = ("sent", "spooled", "dropped", "replayed", "errors", "via_inbox", "oversize")

    def __init__(self):
        self._lock = threading.Lock()
        self._v = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._v[name] += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._v)


@dataclass
class Item:
    """One message before serialization. `obj` is a snapshot (bytes or dict) for kind=snapshot."""

    kind: str
    payload: dict = field(default_factory=dict)
    obj: Any = None
    trigger: str | None = None
    step: int | None = None
    epoch: int | None = None
    ts: int = field(default_factory=envelope.now_ms)
    wait: threading.Event | None = None  # hold (bounded) until set: an OOM waiting for its message
    wait_s: float = 0.0
    finish: Callable[[Item], None] | None = None  # called just before serialization


_STOP = object()


def _acl_refused(exc: BaseException) -> bool:
    return (_redis is not None and isinstance(exc, _redis.exceptions.NoPermissionError)) or "NOPERM" in str(exc)


def append_fields(client, fields: dict, *, stream: str, maxlen: int, path: str = "stream") -> str:
    """Append one envelope: XADD when `path` is "stream" and the ACL allows it, else RPUSH to the
    relay inbox. Returns the path that worked, for the caller to start from next time."""
    if path == "stream":
        try:
            client.xadd(stream, fields, maxlen=maxlen, approximate=True)
            return "stream"
        except Exception as exc:
            if not _acl_refused(exc):
                raise
    client.rpush(redis_functions.inbox_key(stream), redis_functions.encode_fields(fields))
    return "inbox"


class Transport:
    #: memq.identity.Key that signs every envelope; None: unsigned (the class default keeps a
    #: transport built field by field, as serialize()'s callers may, unsigned)
    signing_key = None
    max_blob_bytes = 64 * 1024**2  # MEMQ_MAX_BLOB_BYTES' default, for a transport built field by field
    keep_oversize = True

    def __init__(self, *, identity: dict, spool: Spool, redis_url: str | None, stream: str = "memq:ingest",
                 key_prefix: str = "memq:", maxlen: int = 1_000_000, blob_ttl_s: int = 7 * 24 * 3600,
                 codec: str | None = None, send_timeout_s: float = 2.0, queue_size: int = 256,
                 max_pending_snapshots: int = 16, backoff_s: tuple[float, float] = (0.5, 30.0),
                 client_factory: Callable[[], Any] | None = None, counters: Counters | None = None,
                 adopt: Callable[[], list] | None = None, jitter: bool = True, signing_key=None,
                 max_blob_bytes: int = 64 * 1024**2, keep_oversize: bool = True):
        self.identity = identity  # run, cluster, job, rank, host
        self.signing_key = signing_key  # memq.identity.Key: every envelope is signed with it
        self.spool = spool
        self.redis_url = redis_url
        self.stream = stream
        self.key_prefix = key_prefix
        self.maxlen = maxlen
        self.blob_ttl_s = blob_ttl_s
        self.max_blob_bytes = max_blob_bytes
        self.keep_oversize = keep_oversize
        self.codec = codec or default_codec()
        self.send_timeout_s = send_timeout_s
        self.backoff_min, self.backoff_max = backoff_s
        self.write_path = "stream"  # "inbox" once the ACL refused XADD on this connection
        self.counters = counters or Counters()
        self._q: queue.Queue = queue.Queue(maxsize=queue_size)
        self._pending_snapshots = threading.BoundedSemaphore(max_pending_snapshots)
        if client_factory is None and _redis is not None and redis_url:
            client_factory = lambda: make_client(redis_url, send_timeout_s)  # noqa: E731
        self._factory = client_factory
        self._client = None
        self._next_try = 0.0
        self._backoff = JitteredBackoff(self.backoff_min, self.backoff_max, jitter)
        self._stop_deadline: float | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._busy = 0
        self._busy_lock = threading.Lock()
        self.last_error: str | None = None
        self.connects = 0  # successful (re)connections, for the reconnect benchmark
        self._adopt = adopt  # finds and claims spools of dead processes of this run on this host
        self._adopted: list | None = None
        self._thread = threading.Thread(target=self._run, name="memq-agent-transport", daemon=True)

    # -- training-thread side (never blocks, never raises) ---------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, item: Item) -> bool:
        try:
            if item.kind == "snapshot" and not self._pending_snapshots.acquire(blocking=False):
                self.counters.add("dropped")
                return False
            with self._busy_lock:
                self._busy += 1
                self._idle.clear()
            try:
                self._q.put_nowait(item)
            except queue.Full:
                self._done(item)
                self.counters.add("dropped")
                return False
            return True
        except Exception:  # noqa: BLE001 - never into the training loop
            self.counters.add("errors")
            return False

    def flush(self, timeout: float) -> bool:
        """Wait (bounded) until every submitted message was sent or spooled."""
        return self._idle.wait(timeout)

    def stop(self, timeout: float) -> bool:
        """Deliver what is queued within `timeout` s (spooling what Redis cannot take in time)."""
        self._stop_deadline = time.monotonic() + max(0.0, timeout)
        try:
            self._q.put(_STOP, timeout=max(0.0, timeout / 4))
        except queue.Full:
            pass
        if self._thread.is_alive():
            self._thread.join(max(0.0, self._stop_deadline - time.monotonic()))
        return not self._thread.is_alive()

    def pending(self) -> int:
        return self._busy

    # -- worker thread ---------------------------------------------------------------------------
    def _done(self, item: Any) -> None:
        if isinstance(item, Item) and item.kind == "snapshot":
            try:
                self._pending_snapshots.release()
            except ValueError:
                pass
        with self._busy_lock:
            self._busy -= 1
            if self._busy <= 0:
                self._busy = 0
                self._idle.set()

    def _idle_wait(self) -> float:
        """How long to wait for the next message: while Redis is down with messages spooled, wake
        when the back-off ends, so each agent's replay starts at its own jittered moment rather
        than at the next message (which the ranks of a job submit together)."""
        if self._client is None and len(self.spool):
            return min(0.5, max(0.005, self._next_try - time.monotonic()))
        return 0.5

    def _run(self) -> None:
        while True:
            try:
                item = self._q.get(timeout=self._idle_wait())
            except queue.Empty:
                item = None
            if item is _STOP:
                self._drain_queue_at_stop()
                return
            try:
                if item is None:
                    if len(self.spool) and self._connected():
                        self._replay_spool()
                    if self._adopt is not None and self._connected():
                        self._replay_adopted()
                    continue
                self._handle(item)
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                self.counters.add("errors")
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                if item is not None:
                    self._done(item)

    def _drain_queue_at_stop(self) -> None:
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                continue
            try:
                late = self._stop_deadline is not None and time.monotonic() > self._stop_deadline
                self._handle(item, spool_only=late)
            except Exception as exc:  # noqa: BLE001
                self.counters.add("errors")
                self.last_error = f"{type(exc).__name__}: {exc}"
            finally:
                self._done(item)
        if len(self.spool) and not self._late() and self._connected(force=True):
            self._replay_spool()  # one last try, back-off or not: the process is about to end

    def _late(self) -> bool:
        return self._stop_deadline is not None and time.monotonic() > self._stop_deadline

    def _handle(self, item: Item, spool_only: bool = False) -> None:
        if item.wait is not None and not item.wait.is_set():
            limit = item.wait_s
            if self._stop_deadline is not None:
                limit = min(limit, max(0.0, self._stop_deadline - time.monotonic()) / 2)
            item.wait.wait(limit)
        if item.finish is not None:
            try:
                item.finish(item)
            except Exception:  # noqa: BLE001
                self.counters.add("errors")
        try:
            msg = self.serialize(item)
        except Exception as exc:  # noqa: BLE001 - an unpicklable snapshot, a bad payload
            self.counters.add("errors")
            self.counters.add("dropped")
            self.last_error = f"serialize: {type(exc).__name__}: {exc}"
            return
        item.obj = None  # let the snapshot dict go
        self.deliver(msg, spool_only=spool_only)

    def serialize(self, item: Item) -> Message:
        ident = self.identity
        common = dict(run=ident["run"], cluster=ident["cluster"], rank=ident.get("rank", 0), job=ident.get("job"),
                      host=ident.get("host"), ts=item.ts, payload=item.payload)
        if item.kind != "snapshot":
            return Message(fields=self._signed(envelope.build(item.kind, **common)))
        obj = item.obj
        data = bytes(obj) if isinstance(obj, (bytes, bytearray, memoryview)) else pickle.dumps(obj, protocol=4)
        sha = hashlib.sha256(data).hexdigest()
        blob = compress(data, self.codec)
        if len(blob) > self.max_blob_bytes:
            self._oversize(sha, blob, len(data))
        nonce = envelope.new_nonce()  # the blob key other jobs cannot guess (envelope.blob_key)
        fields = envelope.build("snapshot", sha256=sha, size=len(data), codec=self.codec, trigger=item.trigger,
                                step=item.step, epoch=item.epoch, nonce=nonce, **common)
        return Message(fields=self._signed(fields), blob=blob, blob_key=envelope.blob_key(sha, self.key_prefix, nonce))

    def _oversize(self, sha: str, blob: bytes, raw_size: int) -> None:
        """Refuse a snapshot too big for one Redis value at the door, and keep it where the job's owner
        can analyse it offline (within the spool's size cap): never a 1 GB value in Redis."""
        what = (f"snapshot of {raw_size / 1e6:.0f} MB ({len(blob) / 1e6:.0f} MB compressed) exceeds "
                f"MEMQ_MAX_BLOB_BYTES ({self.max_blob_bytes / 1e6:.0f} MB compressed)")
        kept = None
        if self.keep_oversize:
            kept = self.spool.keep_aside(f"oversize/{sha[:16]}.pickle.{'zst' if self.codec == 'zstd' else 'gz'}", blob)
        self.counters.add("oversize")
        where = f"; kept at {kept} for `memq analyze`" if kept else ""
        raise TooLarge(what + where, hint="lower max_entries, or raise MEMQ_MAX_BLOB_BYTES where Redis allows")

    def _signed(self, fields: dict) -> dict:
        key = self.signing_key
        if key is None:
            return fields
        return sign(fields, key)

    def deliver(self, msg: Message, spool_only: bool = False) -> None:
        if not spool_only and self._connected():
            if len(self.spool):
                self._replay_spool()
            if not len(self.spool) and self._client is not None:
                try:
                    self._send(msg)
                    self.counters.add("sent")
                    return
                except Exception as exc:  # noqa: BLE001
                    self._down(exc)
        self._to_spool(msg)

    def _to_spool(self, msg: Message) -> None:
        before = self.spool.dropped
        try:
            kept = self.spool.put(msg)
        except Exception as exc:  # noqa: BLE001 - disk full, permissions, a file where the folder is
            self.counters.add("errors")
            self.counters.add("dropped")
            self.last_error = f"spool: {type(exc).__name__}: {exc}"
            return
        self.counters.add("dropped", self.spool.dropped - before)
        if kept:
            self.counters.add("spooled")

    def _send(self, msg: Message) -> None:
        c = self._client
        if msg.blob_key is not None:
            c.set(msg.blob_key, msg.blob, ex=self.blob_ttl_s)
        self.write_path = append_fields(c, msg.fields, stream=self.stream, maxlen=self.maxlen, path=self.write_path)
        if self.write_path == "inbox":
            self.counters.add("via_inbox")

    def _replay_spool(self) -> None:
        while not self._late():
            head = self.spool.peek()
            if head is None:
                return
            name, msg = head
            try:
                self._send(msg)
            except Exception as exc:  # noqa: BLE001
                self._down(exc)
                return
            self.spool.remove(name)
            self.counters.add("replayed")

    def _replay_adopted(self) -> None:
        """Deliver what earlier processes of this run left in their spools (they died while Redis
        was unreachable). Claimed once (an atomic rename), retried until sent, then removed."""
        if self._adopted is None:
            try:
                self._adopted = list(self._adopt())
            except Exception as exc:  # noqa: BLE001
                self._adopted = []
                self.counters.add("errors")
                self.last_error = f"adopt: {type(exc).__name__}: {exc}"
        while self._adopted and not self._late():
            path = self._adopted[0]
            sp = Spool(path, max_bytes=1 << 62, fsync=False)
            try:
                n = replay_spool(sp, self._client, stream=self.stream, maxlen=self.maxlen,
                                 blob_ttl_s=self.blob_ttl_s, key_prefix=self.key_prefix, counters=self.counters)
            except Exception as exc:  # noqa: BLE001 - a bad file or Redis down: try again later
                self._down(exc)
                return
            self.counters.add("replayed", n)
            self._adopted.pop(0)
            try:
                for leftover in path.iterdir():
                    leftover.unlink()
                path.rmdir()
            except OSError:
                pass

    def _connected(self, force: bool = False) -> bool:
        if self._client is not None:
            return True
        if self._factory is None or (time.monotonic() < self._next_try and not force):
            return False
        try:
            client = self._factory()
            client.ping()
        except Exception as exc:  # noqa: BLE001
            self._down(exc)
            return False
        self._client = client
        self._backoff.reset()
        self.write_path = "stream"  # the ACL may have changed while we were away: try XADD again
        self.connects += 1
        return True

    def _down(self, exc: BaseException) -> None:
        self.counters.add("errors")
        self.last_error = f"redis: {type(exc).__name__}: {exc}"
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:  # noqa: BLE001
                pass
        self._next_try = time.monotonic() + self._backoff.next()


def replay_spool(spool: Spool, client, *, stream: str = "memq:ingest", maxlen: int = 1_000_000,
                 blob_ttl_s: int = 7 * 24 * 3600, remove: bool = True, key_prefix: str | None = None,
                 counters: Counters | None = None) -> int:
    """Send a spool's messages in order to `client` (a redis-py client); returns how many were sent.
    Used by `python -m memq.agent.replay` for spools written where no Redis was reachable.
    `key_prefix` re-keys blobs for a deployment whose prefix differs from the writer's."""
    n, path = 0, "stream"
    for name, msg in list(spool):
        env = envelope.parse(msg.fields)  # refuse anything that is not a valid envelope
        if msg.blob_key is not None:
            key = env.blob_key(key_prefix) if key_prefix is not None else msg.blob_key
            client.set(key, msg.blob, ex=blob_ttl_s)
        path = append_fields(client, msg.fields, stream=stream, maxlen=maxlen, path=path)
        if path == "inbox" and counters is not None:
            counters.add("via_inbox")
        if remove:
            spool.remove(name)
        n += 1
    return n
