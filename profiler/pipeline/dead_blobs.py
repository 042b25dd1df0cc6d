"""The dead-blob cleanup: blob files of dead-lettered snapshots go once their grace has passed.

A snapshot entry the dispatcher refuses (forged, unsigned, another principal's run, a database
refusal, a blob that does not match its name) may have left its bytes behind: in Redis (the entry's own
blob key, which the dispatcher deletes in the dead letter's MULTI when it carries a nonce) and, when
the refusal came after the bytes were moved, in the blob store. For the latter the dispatcher records
the sha256 in the sorted set `<dead stream>:blobs` (Settings.dead_blobs_key), scored by the time of the
dead letter, in the same MULTI as the dead letter itself: a crash never leaves a dead letter without
its record. `clean` takes the records older than MEMQ_DEAD_BLOB_GRACE_S and removes their files where
no snapshot row names the sha256 with a blob_ref (memq.store.retention.remove_dead_blobs: renamed
aside, checked again after RACE_GRACE_S, put back if a row appeared). A blob any row names stays: the
same bytes pushed by a legitimate job are never touched. Records leave the set only after their files
were dealt with (a file held aside keeps its record until it is settled), so a crash repeats the
work (idempotent). Called on the stream-trim tick (memq.workers.retention; it never sleeps: a file held
on one tick is settled on a tick at least RACE_GRACE_S later) and by `memq gc`, whatever the retention
policy.
"""

from __future__ import annotations

import logging

from memq.store.retention import RACE_GRACE_S, remove_dead_blobs

log = logging.getLogger("memq.dead_blobs")

#: Records handled per call (each a file check; the removals are held RACE_GRACE_S once per call).
BATCH = 2000


def clean(st, store, r, *, race_grace_s: float | None = None, budget: int = BATCH, wait: bool = True,
          dry_run: bool = False) -> dict:
    """Remove the blob files of dead-lettered snapshots past their grace (see the module docstring).
    `store` may be a callable that opens it (only called when a record is due). `wait=False` (the beat's
    tick) never sleeps: files are held aside now and settled by the next call once RACE_GRACE_S has
    passed, their records kept until then; `wait=True` (`memq gc`) settles them within the call."""
    key = st.dead_blobs_key
    sec, usec = r.time()
    cutoff = int(sec * 1000 + usec // 1000) - int(st.dead_blob_grace_s) * 1000
    due = r.zrangebyscore(key, "-inf", cutoff, start=0, num=budget, withscores=True)
    waiting = int(r.zcard(key))
    if not due:
        return {"dead_blobs_due": 0, "dead_blobs_waiting": waiting, "dead_blobs_removed": 0}
    if callable(store):
        store = store()
    shas = [m.decode() if isinstance(m, bytes) else str(m) for m, _ in due]
    summary = remove_dead_blobs(store, shas, grace_s=RACE_GRACE_S if race_grace_s is None else race_grace_s,
                                wait=wait, dry_run=dry_run)
    if not dry_run:
        # the records handled: up to the last score taken (ties beyond the budget come again: idempotent).
        # A file that could not be removed (named in `errors`) is an orphan for retention from here on.
        last = int(due[-1][1])
        pipe = r.pipeline(transaction=True)  # one MULTI: a held file never loses its record
        pipe.zremrangebyscore(key, "-inf", last if len(due) < budget else f"({last}")
        if summary["deferred"]:  # held, not yet settled: due again at the next call, with their own times
            scores = {(m.decode() if isinstance(m, bytes) else str(m)): sc for m, sc in due}
            pipe.zadd(key, {sha: int(scores.get(sha, cutoff)) for sha in summary["deferred"]})
        pipe.execute()
    if summary["dead_blobs_removed"]:
        log.info("dead-blob cleanup: removed %d blob file(s) of dead-lettered snapshots (%d bytes); kept %d a "
                 "row names", summary["dead_blobs_removed"], summary["bytes_freed"], summary["kept"]["referenced"])
    for err in summary["errors"]:
        log.warning("dead-blob cleanup: %s", err)
    return {"dead_blobs_due": len(due), "dead_blobs_waiting": waiting - (0 if dry_run else len(due))} | summary
