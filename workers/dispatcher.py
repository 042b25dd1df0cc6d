"""The dispatcher: the agents' stream -> SQL rows and analysis tasks, acknowledged only once safe.

One loop (`Dispatcher.run`, started by `memq dispatcher`), reading the stream through the consumer
group `memq-dispatch`:

    XREADGROUP (new entries; after a start, first this consumer's own pending ones, see below)
    per entry, in stream order:
      bad envelope                -> dead letter (original fields + reason) and XACK, atomically.
                                     One schema at the door (envelope.parse): types, ranges, UTF-8,
                                     names, times, sizes; nothing that fails it reaches SQL
      stats                       -> consecutive entries batched: one INSERT of all their samples
                                     (ON CONFLICT DO NOTHING on (run, rank, time)), commit
      run_start / run_end         -> upsert the run / move its status up (never an OOM down), commit
                                     (what each kind records: memq.pipeline.record)
      snapshot                    -> consecutive entries batched. Each blob: the blob store already
                                     has it, else GET memq:blob:<sha256> from Redis, verify it inflates
                                     to its sha256 and store it (fsync, rename); missing or corrupt:
                                     dead letter with the reason. Then one transaction INSERTs their
                                     rows ON CONFLICT (run, rank, sha256) DO NOTHING and commits;
                                     then analyze_snapshot(id) is enqueued for each not done/failed
    XACK the batch, then DEL the moved blobs from Redis.

Crash anywhere and the entries stay pending: the next start of this consumer (its own pending
list) or another dispatcher (XPENDING idle > MEMQ_CLAIM_IDLE_S) takes them again ONE AT A TIME:
XPENDING gives each entry's delivery count, XCLAIM of that one entry counts one more delivery,
and it is handled and acknowledged alone. So an entry that crashes the process (a decompression
bomb under a memory limit) reaches MEMQ_MAX_DELIVERIES alone and is dead-lettered; the entries
read in the same batch are not charged for it. Handling again inserts nothing twice and at most
enqueues a duplicate task (tasks lease the snapshot, so it is analysed once).
Bad data versus outages (runtime.is_transient): only connection and availability errors are
transient; they keep the batch in memory and retry it with back-off (0.5 s doubling to
min(30 s, MEMQ_CLAIM_IDLE_S)), so waiting out an outage does not count as a delivery. Any other
error is the entry's: dead-lettered at once (a database refusal is tried once more without the
cached run ids first). An error that escapes a batch splits it: the batch is handled again one
entry at a time, and the entry that fails alone is dead-lettered, so it never takes its batch.
SIGTERM / SIGINT: finish the current entry, acknowledge what is done, stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from kombu.exceptions import OperationalError

from memq import envelope, identity
from memq.backoff import full_jitter
from memq.config import Settings, redact_url
from memq.errors import (
    BadInput,
    BrokerUnavailable,
    MemqError,
    StorageError,
    TooLarge,
)
from memq.pipeline import record
from memq.redis_client import make_client
from memq.redis_functions import Relay
from memq.store import partitions
from memq.store import repository as repo
from memq.workers import runtime
from memq.workers.faults import armed_fault
from memq.workers.heartbeat import Heartbeat
from memq.workers.queues import GROUP

log = logging.getLogger("memq.dispatcher")

#: Snapshot entries per transaction: small enough that analyses start while a burst is still being
#: moved in, large enough to share one commit (fsync) among several rows.
SNAPSHOT_GROUP = 8

Entry = tuple[str, dict | None]


def _s(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def _reason(exc: BaseException) -> str:
    """A dead letter's reason for an error an entry caused."""
    if isinstance(exc, BadInput):
        return f"refused: {exc}"
    if isinstance(exc, StorageError):
        return f"refused by the database: {exc}"
    return f"{type(exc).__name__}: {str(exc)[:500]}"


class Dispatcher:
    def __init__(self, st: Settings, *, consumer: str | None = None, group: str = GROUP, batch: int = 100,
                 block_ms: int = 1000, enqueue: Callable[[int], None] | None = None):
        self.st = st
        self.stream, self.group = st.stream_key, group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}"
        self.batch, self.block_ms = batch, block_ms
        self.r = self._client()
        self._enqueue = enqueue
        self.stop_event = threading.Event()
        self._read_own = True
        self._group_ready = False
        self._backlog: list[Entry] = []
        self._next_claim = 0.0
        self._next_partitions = 0.0
        self._run_ids: dict[str, tuple[int, str | None]] = {}  # run name -> (id, owner)
        self._refreshed: dict[tuple[int, int], float] = {}  # (run id, rank) -> last forecast refresh sent
        self._single = False  # after an unexpected error: one entry at a time
        self.limits = envelope.Limits.of(st)
        # Set, only signed envelopes pass the door (profiler/identity.py); a bad keyring stops the start.
        self.keyring = identity.parse_keyring(st.agent_keyring) if st.agent_keyring else {}
        self._sized: dict[str, int] = {}  # sha256 -> size, of the blobs inflated in the batch in hand
        self._dead_ids: set[str] = set()  # dead-lettered from the batch in hand (not again on its retry)
        self._uncommitted: dict[str, tuple[int, str | None]] = {}
        self.fault = armed_fault()  # the crash tests' kill points; '' unless the test harness started us
        self.counts = dict.fromkeys(("entries", "snapshots", "duplicates", "stats", "samples", "runs",
                                     "identity_refused",
                                     "dead", "claimed", "acked", "outages", "errors"), 0)
        self.heartbeat = None
        # agents whose ACL refuses XADD append to an inbox list; moved into the stream here
        self.relay = Relay.for_settings(self.r, st)

    # ------------------------------------------------------------------------------ plumbing
    def _client(self):
        timeout = max(10.0, self.block_ms / 1000.0 + 5.0)  # longer than one blocking read
        return make_client(self.st.redis_url, timeout, connect_timeout_s=5, retries=True, health_check_s=30)

    @property
    def store(self):
        return runtime.store(self.st)

    def enqueue(self, snapshot_id: int) -> None:
        if self._enqueue is not None:
            self._enqueue(snapshot_id)
            return
        from memq.workers.tasks import analyze_snapshot  # builds the Celery app: only at the first send

        try:
            analyze_snapshot.apply_async((int(snapshot_id),))
        except OperationalError as exc:
            raise BrokerUnavailable(f"cannot enqueue analysis of snapshot {snapshot_id}: {exc}") from exc

    def refresh_forecast(self, run_id: int, rank: int, figures: list, ts: float) -> None:
        """The forecast moves on with the batch's figures (a task: the dispatcher never analyses), at most
        once per MEMQ_FORECAST_REFRESH_S per rank: agents flush stats every few seconds, and a forecast
        counted in epochs gains nothing from each. A batch skipped or lost (broker down) leaves a gap the
        next one, or the next snapshot, covers."""
        from memq.workers.tasks import refresh_forecast  # builds the Celery app: only at the first send

        now = time.monotonic()
        key = (int(run_id), int(rank))
        if now - self._refreshed.get(key, float("-inf")) < self.st.forecast_refresh_s:
            return
        if len(self._refreshed) > 10_000:
            self._refreshed.clear()
        self._refreshed[key] = now
        try:
            refresh_forecast.apply_async((int(run_id), int(rank), figures, ts))
        except OperationalError as exc:
            log.warning("forecast refresh of run %s not enqueued: %s", run_id, exc)

    def _fault(self, point: str) -> None:
        if self.fault == f"dispatcher:{point}":
            log.warning("MEMQ_TEST_FAULT: killing the dispatcher at %s", point)
            os.kill(os.getpid(), signal.SIGKILL)

    def ensure_group(self) -> None:
        with runtime.redis_errors(self.st.redis_url):
            try:
                self.r.xgroup_create(self.stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    # ------------------------------------------------------------------------------ main loop
    def request_stop(self, signum: int | None = None, *_: Any) -> None:
        # the reason is logged by the loop, not here: a handler that logs can interrupt a log call
        self.stop_reason = signal.Signals(signum).name if signum else "a stop request"
        self.stop_event.set()

    def run(self, install_signals: bool = True, idle_exit_s: float | None = None) -> dict[str, int]:
        """Process until stopped (SIGTERM/SIGINT, or `idle_exit_s` with nothing to do)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.request_stop)
            signal.signal(signal.SIGINT, self.request_stop)
        self.heartbeat = Heartbeat(self.st, "dispatcher", self.consumer,
                                   {"stream": self.stream, "group": self.group}).start()
        log.info("dispatcher %s reading %s (group %s) at %s", self.consumer, self.stream, self.group,
                 redact_url(self.st.redis_url))
        backoff = 0.5
        idle_since = time.monotonic()
        try:
            while not self.stop_event.is_set():
                try:
                    n = self.step()
                    backoff = 0.5
                except Exception as exc:  # noqa: BLE001 - sorted by runtime.is_transient
                    if not runtime.is_transient(exc):
                        self.counts["errors"] += 1
                        log.warning("dispatcher: %s: %s", type(exc).__name__, exc,
                                    exc_info=not isinstance(exc, MemqError))
                        if self._on_unexpected(exc):
                            continue  # the entry in hand is dealt with: no reason to wait
                        self.stop_event.wait(backoff)
                        backoff = min(max(1.0, min(30.0, float(self.st.claim_idle_s))), backoff * 2)
                        continue
                    self.counts["outages"] += 1
                    log.warning("dispatcher: %s; retrying in %.1f s", exc, backoff)
                    self.stop_event.wait(full_jitter(backoff))  # dispatchers that lost Redis together spread out
                    # capped at the claim idle time: a waiting dispatcher retries before its
                    # entries would look abandoned to the others
                    backoff = min(max(1.0, min(30.0, float(self.st.claim_idle_s))), backoff * 2)
                    continue
                if n:
                    idle_since = time.monotonic()
                elif idle_exit_s is not None and time.monotonic() - idle_since > idle_exit_s:
                    break
        finally:
            self.heartbeat.stop()
        self._leave_group()
        why = getattr(self, "stop_reason", None) or ("a stop request" if self.stop_event.is_set() else "idle_exit_s")
        # a warning, so that it shows at any log level: an operator reading why ingest paused sees it
        log.warning("dispatcher %s stopped on %s after finishing the entries in hand (acknowledged; nothing "
                    "half-done is left): %s", self.consumer, why, self.counts)
        return dict(self.counts)

    def _leave_group(self) -> None:
        """A clean stop with nothing pending leaves the consumer group, so `memq status` does not list a
        stopped dispatcher as a consumer forever; one holding entries stays for the others to reclaim."""
        try:
            mine = [c for c in self.r.xinfo_consumers(self.stream, self.group)
                    if (c["name"].decode() if isinstance(c["name"], bytes) else c["name"]) == self.consumer]
            if mine and int(mine[0].get("pending", 0)) == 0:
                self.r.xgroup_delconsumer(self.stream, self.group, self.consumer)
        except Exception as exc:  # noqa: BLE001 - stopping must not fail over bookkeeping
            log.warning("dispatcher %s could not leave group %s: %s", self.consumer, self.group, exc)

    def step(self) -> int:
        """One round: reclaim when due, read a batch (or retry the one kept from an outage),
        process and acknowledge it. Returns the number of entries handled."""
        if not self._group_ready:
            self.ensure_group()  # here, not at start: a dispatcher may start before Redis does
            self._group_ready = True
        if time.monotonic() >= self._next_partitions:
            self._make_partitions()
        if not self._backlog and self._read_own:
            self._backlog = self.recover_own()
            self._single = bool(self._backlog)
        if not self._backlog:
            if time.monotonic() >= self._next_claim:
                self._next_claim = time.monotonic() + max(1.0, self.st.claim_idle_s / 4)
                self._backlog = self.reclaim()
                if self._backlog:  # one entry at a time: take the next one at the next step
                    self._single, self._next_claim = True, 0.0
            if not self._backlog:
                with runtime.redis_errors(self.st.redis_url):
                    self.relay.step()
                self._backlog = self.read()
        if not self._backlog:
            return 0
        batch = self._backlog[:1] if self._single else list(self._backlog)
        self.handle(batch)
        del self._backlog[:len(batch)]
        if not self._backlog:
            self._single = False
            self._dead_ids.clear()
        return len(batch)

    def _make_partitions(self) -> None:
        """stat_samples' coming day partitions (PostgreSQL), at start and then hourly. Failing here
        stops nothing: samples without a day partition land in the default one."""
        try:
            with self.store.session() as s:
                made = partitions.ensure_ahead(s, dt.datetime.now(dt.UTC), self.st.stat_partition_days_ahead)
        except Exception as exc:  # noqa: BLE001 - an optimisation; retried in a minute
            log.warning("dispatcher: stat_samples partitions not made (%s); retrying in 60 s", exc)
            self._next_partitions = time.monotonic() + 60
            return
        if made:
            log.info("dispatcher: made stat_samples partitions %s", ", ".join(made))
        self._next_partitions = time.monotonic() + 3600

    def _on_unexpected(self, exc: BaseException) -> bool:
        """An error that is not an outage, in the batch in hand: the batch is handled again one entry
        at a time, and an entry that fails alone is dead-lettered with the error at once. Returns
        whether the next step may come without waiting."""
        if not self._backlog:
            return False
        if not self._single and len(self._backlog) > 1:
            self._single = True
            return True
        eid, fields = self._backlog[0]
        try:
            self._dead_and_ack(eid, fields or {}, _reason(exc))
        except Exception:  # noqa: BLE001 - Redis down as well: tried again next time
            return False
        self._backlog.pop(0)
        if not self._backlog:
            self._single = False
            self._dead_ids.clear()
        return True

    def read(self) -> list[Entry]:
        with runtime.redis_errors(self.st.redis_url):
            try:
                # no wait while the relay is clearing the inbox: its next step goes on at once
                block = None if self.stop_event.is_set() or self.relay.hurry else self.block_ms
                resp = self.r.xreadgroup(self.group, self.consumer, {self.stream: ">"}, count=self.batch,
                                         block=block)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):  # a Redis that lost its data, or a new stream
                    self.ensure_group()
                    self._read_own = True
                    return []
                raise
        return [(_s(i), f) for i, f in (resp[0][1] if resp else [])]

    def recover_own(self) -> list[Entry]:
        """The oldest entry this consumer read and did not acknowledge (it crashed, or was killed),
        claimed again so that the delivery is counted; [] when none is left."""
        with runtime.redis_errors(self.st.redis_url):
            try:
                pend = self.r.xpending_range(self.stream, self.group, min="-", max="+", count=1,
                                             consumername=self.consumer)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    self.ensure_group()
                    return []
                raise
            if not pend:
                self._read_own = False
                return []
            got = self._take(pend[0], 0)
            if got is None:  # trimmed from the stream (or taken by another): nothing to handle
                self.r.xack(self.stream, self.group, _s(pend[0]["message_id"]))
                return []
        return got

    def reclaim(self) -> list[Entry]:
        """Entries other consumers took and left unacknowledged for claim_idle_s: those delivered
        max_deliveries times are dead-lettered; of the rest, the oldest is claimed (one delivery
        more) and returned, to be handled alone."""
        idle_ms = self.st.claim_idle_s * 1000
        with runtime.redis_errors(self.st.redis_url):
            try:
                pend = self.r.xpending_range(self.stream, self.group, min="-", max="+", count=self.batch,
                                             idle=idle_ms)
            except redis.ResponseError as exc:
                if "NOGROUP" in str(exc):
                    self.ensure_group()
                    return []
                raise
            pend = [p for p in pend if _s(p["consumer"]) != self.consumer]
            out: list[Entry] = []
            for p in pend:
                got = self._take(p, idle_ms)
                if got:
                    out = got
                    self.counts["claimed"] += 1
                    log.info("dispatcher %s claimed %s of idle consumer %s (delivered %s times before)",
                             self.consumer, got[0][0], _s(p["consumer"]), p["times_delivered"])
                    break
            self._forget_dead_consumers()
        return out

    def _take(self, pending: dict, min_idle_ms: int) -> list[Entry] | None:
        """XCLAIM one pending entry (which counts a delivery). [] when it was delivered
        max_deliveries times already (then it is dead-lettered); None when it is gone."""
        mid, n = _s(pending["message_id"]), int(pending["times_delivered"])
        got = self.r.xclaim(self.stream, self.group, self.consumer, min_idle_ms, [mid])
        if not got:
            return None  # another dispatcher took it first; Redis 7 drops trimmed entries here
        fields = got[0][1] or {}
        if n >= self.st.max_deliveries:
            self._dead_and_ack(mid, fields, f"not acknowledged after {n} deliveries (last consumer "
                                            f"{_s(pending['consumer'])}): it may crash the dispatcher")
            return []
        return [(mid, got[0][1])]

    def _forget_dead_consumers(self) -> None:
        """Remove consumers that hold nothing and were idle for a day (restarted dispatchers)."""
        try:
            for c in self.r.xinfo_consumers(self.stream, self.group):
                if int(c.get("pending", 0)) == 0 and int(c.get("idle", 0)) > 86_400_000 \
                        and _s(c.get("name")) != self.consumer:
                    self.r.xgroup_delconsumer(self.stream, self.group, _s(c["name"]))
        except Exception:  # noqa: BLE001 - housekeeping only
            pass

    # ------------------------------------------------------------------------------ entries
    def handle(self, entries: list[Entry]) -> None:
        self._sized.clear()
        done: list[str] = []
        blobs: set[str] = set()
        group: list[tuple[str, dict, envelope.Envelope]] = []  # consecutive stats, or snapshots

        def flush() -> None:
            if group:
                if group[0][2].kind == "stats":
                    done.extend(self._stats_batch(group))
                else:
                    ids, keys = self._snapshot_batch(group)
                    done.extend(ids)
                    blobs.update(keys)
                group.clear()

        for eid, fields in entries:
            self.counts["entries"] += 1
            if eid in self._dead_ids:
                continue
            if not fields:  # trimmed from the stream while pending: nothing left to process
                done.append(eid)
                continue
            try:
                env = envelope.parse(fields, self.limits)
                if self.keyring:  # the signer owns the run, and its name is scoped by it (identity.py)
                    who = identity.verify(fields, self.keyring)
                    env = dataclasses.replace(env, owner=who, run=identity.scoped_run(who, env.run))
            except identity.IdentityError as exc:
                self.counts["identity_refused"] += 1
                self._dead_and_ack(eid, fields, f"identity: {exc}")
                continue
            except BadInput as exc:
                self._dead_and_ack(eid, fields, f"bad envelope: {exc}")
                continue
            except Exception as exc:  # noqa: BLE001 - the schema must not stop the stream, even when it fails
                self._dead_and_ack(eid, fields, f"bad envelope (the check itself failed: {_reason(exc)})")
                continue
            if env.kind in ("stats", "snapshot"):
                if group and (group[0][2].kind != env.kind or (env.kind == "snapshot"
                                                               and len(group) >= SNAPSHOT_GROUP)):
                    flush()
                group.append((eid, fields, env))
                continue
            flush()
            handler = self.on_run_start if env.kind == "run_start" else self.on_run_end
            if self._attempt(eid, fields, lambda h=handler, e=env: h(e)):
                done.append(eid)
        flush()
        self._ack(done, blobs)

    def _attempt(self, eid: str, fields: dict, work: Callable[[], Any]) -> bool:
        """`work()` for one entry. An outage propagates (the batch is retried later); any other error
        dead-letters the entry at once and returns False. A database refusal is tried once more
        first, without the cached run ids (one may name a run deleted meanwhile)."""
        for first in (True, False):
            try:
                work()
                return True
            except Exception as exc:  # noqa: BLE001 - sorted by runtime.is_transient
                if runtime.is_transient(exc):
                    raise
                if first and isinstance(exc, StorageError):
                    self._run_ids.clear()
                    continue
                self._dead_and_ack(eid, fields, _reason(exc))
                return False
        return False

    def _stats_batch(self, items: list[tuple[str, dict, envelope.Envelope]]) -> list[str]:
        """One insert for all; when that fails for a reason other than an outage, entry by entry
        (dead-lettering only the entries that fail alone)."""
        try:
            self.on_stats([env for _, _, env in items])
            return [eid for eid, _, _ in items]
        except Exception as exc:  # noqa: BLE001 - sorted by runtime.is_transient
            if runtime.is_transient(exc):
                raise
        return [eid for eid, fields, env in items if self._attempt(eid, fields, lambda e=env: self.on_stats([e]))]

    def _ack(self, ids: list[str], blob_keys: set[str]) -> None:
        if not ids:
            return
        with runtime.redis_errors(self.st.redis_url):
            pipe = self.r.pipeline(transaction=False)
            pipe.xack(self.stream, self.group, *ids)
            if blob_keys:
                pipe.delete(*sorted(blob_keys))
            pipe.execute()
        self.counts["acked"] += len(ids)

    def _dead_and_ack(self, eid: str, fields: dict, reason: str) -> None:
        """Dead letter and acknowledgement in one MULTI, so neither happens without the other. A refused
        snapshot's blob goes with it: its own Redis key (one with a nonce: no other entry names it, and
        nobody can name it without reading the envelope) is deleted in the same MULTI; where its bytes are
        in the blob store, the sha256 is recorded in the dead-blob set, for the cleanup to remove the
        file after MEMQ_DEAD_BLOB_GRACE_S unless a row names it (memq.workers.retention.clean_dead_blobs).
        A bare key (older agents) may be shared by other entries of the same bytes: it keeps its TTL."""
        now_ms = int(time.time() * 1000)
        out = envelope.dead_letter_fields(fields or {})
        out.update(reason=reason[:2000], entry_id=eid, stage="dispatch", dead_at=str(now_ms))
        blob = envelope.dead_blob(fields)
        stored = False
        if blob is not None:
            try:
                stored = self.store.blobs.ref(blob[0]) is not None
            except Exception:  # noqa: BLE001 - an unreadable blob store: record it, the cleanup checks again
                stored = True
        with runtime.redis_errors(self.st.redis_url):
            pipe = self.r.pipeline(transaction=True)
            pipe.xadd(self.st.dead_letter_key, out, maxlen=runtime.DEAD_MAXLEN, approximate=True)
            pipe.incr(self.st.dead_letter_total_key)
            if blob is not None and blob[1] is not None:
                pipe.delete(envelope.blob_key(blob[0], self.st.key_prefix, blob[1]))
            if stored:
                pipe.zadd(self.st.dead_blobs_key, {blob[0]: now_ms}, gt=True)
            pipe.xack(self.stream, self.group, eid)
            pipe.execute()
        self._dead_ids.add(eid)
        self.counts["dead"] += 1
        log.warning("dead letter %s: %s", eid, reason)

    def _run_id(self, session, env: envelope.Envelope) -> int:
        """The run's id, created by this envelope when new (pipeline/record.py). An envelope of a run that
        another identity created raises IdentityError (the entry is dead-lettered: nothing of the run
        changes)."""
        got = self._run_ids.get(env.run)
        if got is None:
            got = record.new_run(session, env)
            self.counts["runs"] += 1
            self._uncommitted[env.run] = got
        err = identity.owner_mismatch(env.run, got[1], env.owner)
        if err is not None:
            raise err
        return got[0]

    @contextlib.contextmanager
    def _tx(self):
        """A store session; run ids learnt inside it are cached only once it committed."""
        self._uncommitted = {}
        try:
            with self.store.session() as s:
                yield s
        except BaseException:
            self._uncommitted = {}
            raise
        if len(self._run_ids) > 10_000:
            self._run_ids.clear()
        self._run_ids.update(self._uncommitted)
        self._uncommitted = {}

    def on_run_start(self, env: envelope.Envelope) -> None:
        with self._tx() as s:
            self._run_id(s, env)  # creates the run, or refuses another identity's before anything changes
            self._uncommitted[env.run] = (record.run_start(s, env), env.owner or None)
        self.counts["runs"] += 1

    def on_run_end(self, env: envelope.Envelope) -> None:
        with self._tx() as s:
            record.run_end(s, self._run_id(s, env), env)

    def on_stats(self, items: list[envelope.Envelope]) -> None:
        with self._tx() as s:
            got = record.stats(s, [(self._run_id(s, env), env) for env in items])
        for (rid, rank), (figs, ts) in got.figures.items():
            self.refresh_forecast(rid, rank, figs, ts)
        self.counts["stats"] += len(items)
        self.counts["samples"] += got.samples

    def _snapshot_batch(self, items: list[tuple[str, dict, envelope.Envelope]]) -> tuple[list[str], set[str]]:
        """Blobs first (each checked and stored, or dead-lettered), then one transaction for all the
        rows, then the analyses are enqueued. Returns the entry ids to acknowledge and the Redis blob
        keys to delete after that. A batch that fails for a reason other than an outage is handled
        again entry by entry, so only the entry that fails alone is dead-lettered."""
        ready = []
        for eid, fields, env in items:
            box: list = []
            moved = self._attempt(eid, fields, lambda e=eid, f=fields, v=env, b=box: b.append(self.move_blob(e, f, v)))
            if moved and box[0] is not None:  # None: dead-lettered inside (blob missing or bad)
                ready.append((eid, fields, env, box[0]))
        if not ready:
            return [], set()
        try:
            rows = self._insert_rows(ready)
        except Exception as exc:  # noqa: BLE001 - sorted by runtime.is_transient
            if runtime.is_transient(exc):
                raise
            if len(ready) > 1:
                ids: list[str] = []
                keys: set[str] = set()
                for item in ready:
                    got_ids, got_keys = self._snapshot_batch([item[:3]])
                    ids += got_ids
                    keys |= got_keys
                return ids, keys
            done: list = []
            eid, fields = ready[0][:2]
            if not self._attempt(eid, fields, lambda: done.extend(self._insert_rows(ready))):
                return [], set()
            rows = done
        self._fault("after_commit")
        for sid, state, created in rows:
            self.counts["snapshots" if created else "duplicates"] += 1
            if state in ("pending", "running"):
                self.enqueue(sid)
        self._fault("after_enqueue")
        return [eid for eid, *_ in ready], {env.blob_key(self.st.key_prefix)
                                            for _e, _f, env, _r in ready}

    def _insert_rows(self, ready: list) -> list[tuple[int, str, bool]]:
        with self._tx() as s:
            return [self._insert(s, eid, env, ref) for eid, _f, env, ref in ready]

    def move_blob(self, eid: str, fields: dict, env: envelope.Envelope) -> str | None:
        """The blob store key of the snapshot's bytes, moving them there from Redis if needed
        (verified: they must inflate to their sha256). None when dead-lettered (missing, corrupt)."""
        key = env.blob_key(self.st.key_prefix)
        blobs = self.store.blobs
        ref = blobs.claim(env.sha256)  # a blob held by a removal in progress is taken back
        if ref is not None:
            return ref
        with runtime.redis_errors(self.st.redis_url):
            data = self.r.get(key)
        if data is None:
            ref = blobs.claim(env.sha256)  # another entry of the same bytes moved them meanwhile
            if ref is None:
                self._dead_and_ack(eid, fields, f"blob missing: {key} is not in Redis (expired, evicted or never "
                                                f"written) and not in the blob store")
            return ref
        try:
            ref = blobs.put_encoded(env.sha256, data, env.codec, size=env.size)
        except BadInput as exc:
            why = str(exc)
            if isinstance(exc, TooLarge) and env.size is not None and env.size < blobs.max_bytes:
                why = f"it inflates past the {env.size} bytes its envelope says ({exc})"
            self._dead_and_ack(eid, fields, f"bad blob: {why}")
            return None
        self._sized[env.sha256] = int(env.size or 0)
        return ref

    def _insert(self, s, eid: str, env: envelope.Envelope, ref: str) -> tuple[int, str, bool]:
        """The snapshot row (ON CONFLICT DO NOTHING); returns (id, state, created)."""
        known = self._sized.get(env.sha256)
        if known is None:
            # the blob was already stored, so its bytes were not inflated here: the size must agree
            # with the rows that did (memq ingest records the real size)
            known = repo.known_blob_size(s, env.sha256)
        if known is None:
            # stored, but no row names it (a refused snapshot's leftover, a crash between blob and row):
            # its size is checked against the bytes themselves, else the first envelope to name it would
            # set the size every later one is held to (a false one refuses the real owner's)
            known = self.store.blobs.verify_stored(env.sha256, env.size)
            self._sized[env.sha256] = known
        if known is not None and env.size is not None and int(known) != env.size:
            raise BadInput(f"envelope size {env.size} differs from the {known} bytes of the blob {env.sha256[:12]}")
        return record.snapshot(s, self._run_id(s, env), env, ref, f"{self.stream}/{eid}")
