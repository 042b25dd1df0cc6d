"""The workers' work, as plain functions over ids (the Celery tasks in `memq.workers.tasks` only call these).

`analyze(st, snapshot_id, task_id)`: lease the snapshot (one conditional UPDATE: of two deliveries of
the same snapshot one wins; its RETURNING carries the row), hand the claim to the use case
(`memq.pipeline.analyse.analyse_claimed`: reused when (sha256, analyzer version, context) was already
analysed, else computed from this process's decode cache and upserted; an OOM run marked `oom`), and
schedule the run-level diagnosis. A delivery of the same task id that finds the snapshot leased is the
same task coming back (a retry after an outage, or a redelivery after its pool process died): it
takes the lease over instead of waiting for it to expire.

Outcomes: analysed | reused | done (nothing to do) | leased (another task holds it) | quarantined
(bad data: state failed with the reason, plus a dead letter) | retry (state back to pending,
enqueued again) | failed (out of attempts) | missing (no such row).

`recompute(st, run_id, rank)`: the run-level diagnosis (`memq.pipeline.analyse.diagnose_rank`: the digests stored
with the rank's analyses, plus the newest snapshot, usually still in this process's cache), debounced
per run and rank by `schedule_recompute`: at most one pending recompute, which runs once no
snapshot of the run finished for a quiet period (max(MEMQ_RUN_DIAGNOSIS_DELAY_MS, 2 x the last
recompute's duration)), or at the latest after max(10 x quiet, 20 x duration) from the first
snapshot it waits for; while analyses wait (in the broker, or snapshot rows pending) it yields to
them, up to a quarter of the visibility timeout. A run that receives many snapshots is diagnosed
once per burst, not after each snapshot, and not ahead of the analyses.

After a recompute, each OOM snapshot of the rank gets its what-if sweep (`sweep(st, snapshot_id)`,
task `whatif_sweep`): the standard settings replayed under the run's own limit, stored keyed by the
snapshot's sha256, the version and the inputs (idempotent: a repeat finds it stored).

`reap(st)`: expired leases back to pending and enqueued again; snapshots pending longer than
MEMQ_PENDING_REQUEUE_S enqueued again (a lost message); snapshots out of attempts failed and
dead-lettered; run diagnoses behind their snapshots recomputed.
"""

from __future__ import annotations

import datetime as dt
import gc
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memq.config import Settings
from memq.errors import BadInput, BrokerUnavailable, MemqError, NotFound
from memq.pipeline import analyse, sweeps
from memq.store import repository as repo
from memq.store.blob_snapshots import load_blob
from memq.workers import runtime
from memq.workers.queues import QUEUE_ANALYZE

log = logging.getLogger("memq.workers")

MAX_ATTEMPTS = repo.DEFAULT_MAX_ATTEMPTS


def _store(st: Settings):
    return runtime.store(st, async_commit=True)


@dataclass(frozen=True)
class Senders:
    """How the jobs hand work on to the next task. `memq.workers.tasks` passes Celery's; the jobs never
    import the tasks (which import them), and tests may pass their own."""

    #: analysis(snapshot_id, countdown or None): analyse a snapshot (again).
    analysis: Callable[[int, float | None], None]
    #: recompute(run_id, rank, countdown): the run-level diagnosis of one rank.
    recompute: Callable[[int, int, float], None]
    #: sweep(snapshot_id): the what-if sweep of an OOM snapshot.
    sweep: Callable[[int], None]


def _need(senders: Senders | None, what: str) -> Senders:
    if senders is None:
        raise TypeError(f"{what} sends follow-up work: pass senders (memq.workers.tasks.SENDERS)")
    return senders


# ------------------------------------------------------------------------------ decoded snapshots

#: Decoded snapshots kept per worker process, by sha256 (content-addressed, so never stale), for
#: the run diagnosis, which decodes the run's newest snapshot (usually one this process just
#: analysed; the earlier ones it reads as stored digests). Budget: MEMQ_WORKER_CACHE_MB, estimated
#: as 8 x the uncompressed size (a decoded 8,000-entry snapshot of 1.7 MB takes ~12 MB).
_cache: OrderedDict[str, Any] = OrderedDict()
_cache_bytes = 0


def _remember(ld, budget: int) -> None:
    global _cache_bytes
    if ld.sha256 in _cache:
        _cache.move_to_end(ld.sha256)
        return
    cost = 8 * ld.raw_size
    if cost > budget:
        return
    ld.snapshot.release_held()  # kept for long: what the analysis reads, not the dropped frames
    _cache[ld.sha256] = ld
    _cache_bytes += cost
    while _cache_bytes > budget and _cache:
        _, old = _cache.popitem(last=False)
        _cache_bytes -= 8 * old.raw_size


def _decode_frozen(store, sha256: str, name: str | None):
    """Decode a blob and move it out of the cyclic GC's sight (gc.freeze). A decoded snapshot is
    tens of thousands of acyclic containers that live until evicted: every full collection would
    walk them again (a fifth of a worker's CPU under load, measured with py-spy). Reference counting
    still frees them. The collect first frees cyclic garbage made so far, which would otherwise be
    frozen with the snapshot for good."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        ld = load_blob(store, sha256, name)
        gc.freeze()
    finally:
        if was:
            gc.enable()
    return ld


def _cached_load(store, sha256: str, name: str | None):
    ld = _cache.get(sha256)
    if ld is None:
        ld = _decode_frozen(store, sha256, name)
        _remember(ld, int(store.settings.worker_cache_mb) * 1024 * 1024)
    else:
        _cache.move_to_end(sha256)
    return ld


def forget_cache() -> None:
    global _cache_bytes
    _cache.clear()
    _cache_bytes = 0


# ---------------------------------------------------------------------------------------- analyze


def _holder_key(st: Settings, snapshot_id: int, task_id: str) -> str:
    return f"{st.key_prefix}lease:{int(snapshot_id)}:{task_id}"


def _seen_before(st: Settings, snapshot_id: int, task_id: str | None) -> bool:
    """True when this task id already ran for this snapshot (a retry or a redelivery)."""
    if not task_id:
        return False
    try:
        r = runtime.redis_client(st.redis_url)
        fresh = r.set(_holder_key(st, snapshot_id, task_id), b"1", nx=True,
                      px=(st.analysis_lease_s + st.visibility_timeout_s) * 1000)
        return not fresh
    except Exception:  # noqa: BLE001 - without Redis no take-over: the lease simply expires
        return False


def _claim(st: Settings, snapshot_id: int, task_id: str | None) -> tuple[repo.ClaimedSnapshot | None, str]:
    """The lease (one conditional UPDATE whose RETURNING carries the row the analysis reads), or why not."""
    store = _store(st)
    seen = _seen_before(st, snapshot_id, task_id)
    with store.session() as s:
        c = repo.claim_snapshot(s, snapshot_id, st.analysis_lease_s, MAX_ATTEMPTS)
        if c is not None:
            return c, "claimed"
        row = repo.snapshot_row(s, snapshot_id)
        if row is None:
            return None, "missing"
        if row.state == "running" and seen:
            # Each take-over counts as an attempt: an input that kills its pool process every time
            # (reject-on-worker-lost redelivers it) ends as failed, not in a loop.
            got = repo.take_over_lease(s, snapshot_id, st.analysis_lease_s, MAX_ATTEMPTS)
            if got is not None:
                return got, "taken over"
        if row.state == "pending" and row.attempts >= MAX_ATTEMPTS:
            return None, "out of attempts"
        return None, {"done": "done", "failed": "failed", "running": "leased"}.get(row.state, row.state)


def analyze(st: Settings, snapshot_id: int, task_id: str | None = None, senders: Senders | None = None) -> str:
    """See the module docstring. `senders` re-enqueue it and schedule the run diagnosis (tasks pass
    theirs); only an outcome that sends work needs them. One call down (the lease), one into the use
    case (memq.pipeline.analyse.analyse_claimed, with this process's decode cache), and back."""
    store = _store(st)
    lease, how = _claim(st, snapshot_id, task_id)
    if lease is None:
        if how == "done":
            done = analyse.settled(store, snapshot_id)
            schedule_recompute(st, done.run_id, done.rank, _need(senders, "analyze").recompute)
        elif how == "out of attempts":
            quarantine(st, snapshot_id, f"gave up after {MAX_ATTEMPTS} attempts")
            return "failed"
        return how
    try:
        # decoded through this process's cache, so that the run diagnosis can reuse it
        out = analyse.analyse_claimed(store, lease, lambda sha, src: _cached_load(store, sha, src))
    except NotFound as exc:
        quarantine(st, snapshot_id, f"blob missing: {exc}")
        return "quarantined"
    except BadInput as exc:
        quarantine(st, snapshot_id, f"bad snapshot: {exc}")
        return "quarantined"
    except MemqError:
        raise  # StorageUnavailable / BrokerUnavailable: the task retries (same task id: takes over)
    except (RecursionError, MemoryError) as exc:  # this input, every time (runtime.is_bad_input)
        quarantine(st, snapshot_id, f"bad snapshot: {type(exc).__name__}: {str(exc)[:300]}")
        return "quarantined"
    except Exception as exc:  # noqa: BLE001 - soft time limit, or a bug on this input: bounded retries
        reason = f"{type(exc).__name__}: {exc}"
        log.warning("analysis of snapshot %s failed (attempt %d): %s", snapshot_id, lease.attempts, reason,
                    exc_info=not _is_soft_limit(exc))
        with store.session() as s:
            state = repo.fail_snapshot(s, snapshot_id, reason, retry=True, max_attempts=MAX_ATTEMPTS)
        if state == "failed":
            _dead(st, snapshot_id, f"gave up after {lease.attempts} attempts: {reason}")
            return "failed"
        if senders is not None:
            senders.analysis(snapshot_id, min(2 ** lease.attempts, st.retry_backoff_max_s))
        return "retry"
    schedule_recompute(st, out.run_id, out.rank, _need(senders, "analyze").recompute)
    _release(st, snapshot_id, task_id)
    return "analysed" if out.computed else "reused"


def _release(st: Settings, snapshot_id: int, task_id: str | None) -> None:
    if task_id:
        try:
            runtime.redis_client(st.redis_url).delete(_holder_key(st, snapshot_id, task_id))
        except Exception:  # noqa: BLE001 - it expires by itself
            pass


def _is_soft_limit(exc: BaseException) -> bool:
    return type(exc).__name__ == "SoftTimeLimitExceeded"


def quarantine(st: Settings, snapshot_id: int, reason: str) -> None:
    """Bad data: the snapshot is failed for good with the reason, and a dead letter records it."""
    store = _store(st)
    with store.session() as s:
        repo.fail_snapshot(s, snapshot_id, reason, retry=False)
    log.warning("snapshot %s quarantined: %s", snapshot_id, reason)
    _dead(st, snapshot_id, reason)


def _dead(st: Settings, snapshot_id: int, reason: str) -> None:
    store = _store(st)
    with store.session() as s:
        row = repo.dead_letter_row(s, snapshot_id)
    if row is None:
        return
    fields = {"v": "1", "kind": "snapshot", "run": row.name, "cluster": row.cluster or "", "rank": row.rank,
              "sha256": row.sha256, "trigger": row.trigger, "step": "" if row.step is None else row.step,
              "epoch": "" if row.epoch is None else row.epoch}
    try:
        runtime.dead_letter(runtime.redis_client(st.redis_url), st, fields, reason, stage="analyze",
                            snapshot_id=snapshot_id, source=row.source)
    except Exception as exc:  # noqa: BLE001 - the SQL row (state failed, last_error) is the record
        log.warning("dead letter for snapshot %s not written: %s", snapshot_id, exc)


# -------------------------------------------------------------------------------- run diagnoses


def _cost_key(st: Settings, run_id: int, rank: int) -> str:
    return f"{st.key_prefix}rundiag-cost:{int(run_id)}:{int(rank)}"


def _last_key(st: Settings, run_id: int, rank: int) -> str:
    return f"{st.key_prefix}rundiag-last:{int(run_id)}:{int(rank)}"


def _timing(st: Settings, r, run_id: int, rank: int) -> tuple[float, float, float]:
    """(quiet period, longest wait, cap) of one run's diagnosis, from what the last recompute cost.
    A recompute waits until no snapshot of the run finished for the quiet period, but no longer
    than the longest wait; while snapshots of any run wait for analysis it yields to them, up to the
    cap. Quiet period and longest wait grow with the cost, so diagnosing takes a bounded share."""
    raw = r.get(_cost_key(st, run_id, rank))
    cost = float(raw) if raw else 0.0
    cap = st.visibility_timeout_s / 4.0
    quiet = min(cap, max(st.run_diagnosis_delay_ms / 1000.0, 2.0 * cost))
    longest = min(cap, max(10.0 * quiet, 20.0 * cost))
    return quiet, longest, cap


def analysis_backlog(st: Settings) -> int:
    """Analysis tasks waiting in the broker (not yet taken by a worker)."""
    broker = runtime.redis_client(st.broker_url or st.redis_url)
    q = st.broker_key_prefix + QUEUE_ANALYZE
    pipe = broker.pipeline(transaction=False)
    for k in (q, *(f"{q}\x06\x16{p}" for p in (3, 6, 9))):
        pipe.llen(k)
    return int(sum(pipe.execute()))


def schedule_recompute(st: Settings, run_id: int, rank: int, send: Callable[[int, int, float], None]) -> bool:
    """Note that a snapshot of (run, rank) is done, and enqueue one `recompute_run(run_id, rank)`
    unless one is already pending (a trailing debounce: see `recompute`). Returns whether this call
    enqueued it. Redis errors raise BrokerUnavailable (the caller retries)."""
    r = runtime.redis_client(st.redis_url)
    key = runtime.run_diag_key(st, run_id, rank)
    now = time.time()
    with runtime.redis_errors(st.redis_url):
        quiet, longest, cap = _timing(st, r, run_id, rank)
        r.set(_last_key(st, run_id, rank), f"{now:.3f}", ex=int(cap + st.task_time_limit_s + 60))
        if not r.set(key, f"{now:.3f}", nx=True, px=int((cap + quiet + st.task_time_limit_s) * 1000)):
            return False
    try:
        send(run_id, rank, quiet)
    except BaseException:
        r.delete(key)
        raise
    return True


def recompute(st: Settings, run_id: int, rank: int, senders: Senders) -> str | None:
    """The run-level diagnosis of one rank; returns its primary cause, or "deferred" when the run
    is still receiving snapshots (then it is enqueued again for when it goes quiet, within the
    longest wait counted from the first snapshot it waits for)."""
    r = runtime.redis_client(st.redis_url)
    key = runtime.run_diag_key(st, run_id, rank)
    try:
        quiet, longest, cap = _timing(st, r, run_id, rank)
        first, last = r.get(key), r.get(_last_key(st, run_id, rank))
        now = time.time()
        waited = now - float(first) if first else cap
        if last and now - float(last) < quiet and waited < longest:
            senders.recompute(run_id, rank, max(0.2, quiet - (now - float(last))))
            return "deferred"
        if waited < cap and (analysis_backlog(st) > 0 or _snapshots_waiting(st)):
            senders.recompute(run_id, rank, quiet)  # snapshots first
            return "deferred"
        r.delete(key)  # snapshots done from now on schedule a new recompute
    except Exception:  # noqa: BLE001 - without Redis: recompute now (the key expires by itself)
        pass
    store = _store(st)
    t0 = time.monotonic()
    result, ooms = analyse.diagnose_rank(store, run_id, rank, load=lambda sha, src: _cached_load(store, sha, src))
    took = time.monotonic() - t0
    try:
        r.set(_cost_key(st, run_id, rank), f"{took:.3f}", ex=7 * 24 * 3600)
    except Exception:  # noqa: BLE001
        pass
    # After the run diagnosis (which waits for the rank's analyses to settle), so that a sweep finds
    # the earlier snapshots it seeds its replay with already analysed.
    for sid in ooms:
        senders.sweep(sid)
    return ((result or {}).get("diagnosis") or {}).get("primary_cause")


def refresh_forecast(st: Settings, run_id: int, rank: int, figures: list, as_of_time: float | None,
                     senders: Senders | None = None) -> str:
    """A stats batch's per-step figures move the rank's OOM forecast on (memq.pipeline.analyse.refresh_forecast);
    when they move the growth model's leak verdict, the run diagnosis is scheduled again."""
    out = analyse.refresh_forecast(_store(st), run_id, rank, list(figures or []), as_of_time)
    if out == "verdict_changed" and senders is not None:
        schedule_recompute(st, run_id, rank, senders.recompute)
    return out


# ---------------------------------------------------------------------------------- what-if sweeps


def sweep(st: Settings, snapshot_id: int) -> str:
    """The standard what-if sweep of one OOM snapshot under its run's limit, seeded by the rank's
    earlier snapshots (memq.pipeline.sweeps); stored once per inputs. Returns swept | reused |
    skipped (not an OOM, blob gone, bad data: the analysis already records why)."""
    store = _store(st)
    try:
        sid, computed = sweeps.sweep_snapshot(store, snapshot_id, load=lambda sha, src: _cached_load(store, sha, src))
    except (NotFound, BadInput) as exc:
        log.info("what-if sweep of snapshot %s skipped: %s", snapshot_id, exc)
        return "skipped"
    except MemqError:
        raise  # an outage: the task retries
    except Exception as exc:  # noqa: BLE001 - a model bug on this input must not loop: the analysis stands
        log.warning("what-if sweep of snapshot %s failed: %s: %s", snapshot_id, type(exc).__name__, exc,
                    exc_info=not _is_soft_limit(exc))
        return "failed"
    return "swept" if computed else ("reused" if sid is not None else "skipped")


def _snapshots_waiting(st: Settings) -> bool:
    """Snapshot rows waiting for their analysis (recent ones: an old pending row is the reaper's)."""
    store = _store(st)
    with store.session() as s:
        return repo.pending_since(s, repo.utcnow() - dt.timedelta(seconds=st.pending_requeue_s))


# ------------------------------------------------------------------------------------------ reaper


def reap(st: Settings, senders: Senders, limit: int = 1000) -> dict[str, int]:
    """See the module docstring. `senders` send the analyses and diagnoses (the task passes its own)."""
    store = _store(st)
    r = runtime.redis_client(st.redis_url)
    now = repo.utcnow()
    with store.session() as s:
        expired = set(repo.requeue_expired(s))
        pending = repo.pending_snapshots(s, created_before=now - dt.timedelta(seconds=st.pending_requeue_s),
                                         limit=limit)
        pending += repo.pending_snapshots(s, ids=sorted(expired))
    exhausted = sorted({p.id for p in pending if p.attempts >= MAX_ATTEMPTS})
    for sid in exhausted:
        quarantine(st, sid, f"gave up after {MAX_ATTEMPTS} attempts")
    sent = 0
    for sid in sorted({p.id for p in pending if p.attempts < MAX_ATTEMPTS}):
        with runtime.redis_errors(st.redis_url):
            fresh = sid in expired or runtime.debounce(r, runtime.enqueue_key(st, sid), st.pending_requeue_s * 1000)
        if fresh:
            senders.analysis(sid, None)
            sent += 1
    stale = stale_diagnoses(st)
    for run_id, rank in stale:
        schedule_recompute(st, run_id, rank, senders.recompute)
    out = {"expired": len(expired), "enqueued": sent, "failed": len(exhausted), "diagnoses": len(stale)}
    if any(out.values()):
        log.info("reaper: %s", out)
    return out


def stale_diagnoses(st: Settings, limit: int = 200) -> list[tuple[int, int]]:
    """(run, rank) pairs whose analysed snapshots are not all in their run-level diagnosis, once
    the last diagnosis is older than the debounce delay."""
    with _store(st).session() as s:
        return repo.stale_diagnoses(
            s, repo.utcnow() - dt.timedelta(milliseconds=st.run_diagnosis_delay_ms + 1000),
            analyse.MAX_RUN_SNAPSHOTS, limit)  # read when called, like the pipeline's own use of it


__all__ = ["Senders", "analyze", "recompute", "reap", "refresh_forecast", "sweep",
           "schedule_recompute", "quarantine",
           "BrokerUnavailable"]
