"""Write side of the run history: the functions `memq ingest` and the workers call.

One module per concern (`runs`, `snapshots`, `analyses`, `stats`, `reports`, and `common` for times,
the dialect's INSERT and JSON-safe values); callers keep `from memq.store import repository as repo;
repo.upsert_run(...)`: every name is re-exported here.

Every function takes an open `Session` (from `memq.store.db.session_scope`), binds every value
as a parameter, and returns plain values (ids, dataclasses, dicts), never ORM rows. Statements are
written for both PostgreSQL and SQLite with the dialect's own INSERT ... ON CONFLICT.

Runs (`runs`)
- `upsert_run(session, RunMeta(...)) -> run_id`: create or update a run by name; fields left None
  keep their stored value, labels are merged, `started_at` keeps the earliest and `ended_at` the
  latest value seen. Safe to call from every rank and every retry.
- `move_run_status(session, run_id, status, ended_at=None, given=False)`: running < completed < crashed <
  oom, by the one rule of analysis/run_status.py (up the order only, or as a person gave it).
- `set_run_limit(session, run_id, limit_bytes)`: a limit given after the fact.
- `delete_run(session, run_name)`: the run with its samples, snapshots and diagnoses.

Snapshots, module `snapshots` (the analysis work queue; state pending -> running -> done | failed)
- `insert_snapshot(session, NewSnapshot(...)) -> (snapshot_id, created)`: idempotent,
  ON CONFLICT (run, rank, sha256) DO NOTHING; a redelivered message returns the existing id.
- `claim_snapshot(session, snapshot_id, lease_s) -> ClaimedSnapshot | None`: one atomic UPDATE;
  wins only if the snapshot is pending or its lease expired, and attempts < max_attempts.
- `claim_next(session, lease_s, limit)`: the same for the oldest claimable snapshots
  (FOR UPDATE SKIP LOCKED on PostgreSQL).
- `requeue_expired(session) -> [ids]`: the reaper: expired leases go back to pending.
- `complete_snapshot(session, snapshot_id, analysis_id, analyzer_version)`,
  `fail_snapshot(session, snapshot_id, error, retry=True, max_attempts=5)`.

Analysis results, module `analyses` (keyed by sha256, analyzer version and context key: nothing is analysed twice)
- `find_analysis(session, sha256, analyzer_version, context_key="") -> analysis_id | None`
- `store_analysis(session, sha256, analyzer_version, result, context_key="") -> analysis_id`:
  upsert of the contract JSON of `memq.analysis.analyze` plus its queryable figures.
- `context_key(ctx)`: the key of the outside facts (limit, device total, OOM message).
- `store_run_diagnosis(...)`, `refresh_run_summary(session, run_id)`.

Stat samples (`stats`)
- `insert_stat_samples(session, rows) -> int`: batched INSERT ... ON CONFLICT DO NOTHING on the
  primary key (run, rank, sampled_at), so a redelivered batch adds nothing. PostgreSQL gets one
  `INSERT ... SELECT unnest(<column array literals>)` per 10,000 rows (no COPY), SQLite an executemany.
  `stat_row(run_id, rank, stats, ...)` maps a `torch.cuda.memory_stats()` dict to a row.

Reports (`reports`)
- `upsert_report(session, report_date, scope, summary, path=None, analyzer_version=None) -> id`:
  one row per (date, scope); a rerun replaces it.
"""

from __future__ import annotations

from memq.store.repository.analyses import (
    CONTRACT_KEYS,
    MAX_DETAILS_CHARS,
    analysis_diagnosis,
    analysis_doc,
    context_key,
    contract_only,
    drop_digests_outside_window,
    fill_digest,
    find_analysis,
    forecast_summary,
    found_analysis,
    max_present,
    refresh_run_summary,
    replace_run_result,
    run_result,
    run_result_row,
    stale_diagnoses,
    store_analysis,
    store_run_diagnosis,
)
from memq.store.repository.common import _db_time, _insert, db_time, json_safe, to_utc, utcnow
from memq.store.repository.reports import upsert_report
from memq.store.repository.runs import (
    RunMeta,
    delete_run,
    find_run_id,
    move_run_status,
    run_id_for,
    run_owner,
    run_settings,
    run_status,
    set_run_limit,
    upsert_run,
)
from memq.store.repository.snapshots import (
    DEFAULT_LEASE_S,
    DEFAULT_MAX_ATTEMPTS,
    ClaimedSnapshot,
    NewSnapshot,
    claim_next,
    claim_snapshot,
    complete_snapshot,
    dead_letter_row,
    fail_snapshot,
    insert_snapshot,
    known_blob_size,
    pending_since,
    pending_snapshots,
    rank_snapshots,
    reanalyze_targets,
    requeue_expired,
    set_snapshot_time,
    snapshot_outcome,
    snapshot_row,
    take_over_lease,
)
from memq.store.repository.stats import STAT_BATCH_ROWS, STAT_COLUMNS, insert_stat_samples, stat_row

__all__ = [
    "CONTRACT_KEYS", "ClaimedSnapshot", "DEFAULT_LEASE_S", "DEFAULT_MAX_ATTEMPTS", "MAX_DETAILS_CHARS",
    "NewSnapshot", "RunMeta", "STAT_BATCH_ROWS", "STAT_COLUMNS", "_db_time", "_insert",
    "analysis_diagnosis", "analysis_doc", "claim_next", "claim_snapshot", "complete_snapshot", "context_key",
    "contract_only",
    "db_time", "dead_letter_row", "delete_run", "drop_digests_outside_window", "fail_snapshot", "fill_digest",
    "find_analysis", "found_analysis", "find_run_id", "forecast_summary", "insert_snapshot", "insert_stat_samples",
    "json_safe",
    "known_blob_size", "max_present", "move_run_status", "pending_since", "pending_snapshots",
    "rank_snapshots", "reanalyze_targets", "refresh_run_summary", "replace_run_result", "requeue_expired",
    "run_id_for", "run_owner", "run_result", "run_result_row", "run_settings", "run_status", "set_run_limit",
    "set_snapshot_time", "snapshot_outcome", "snapshot_row", "stale_diagnoses", "stat_row", "store_analysis",
    "store_run_diagnosis", "take_over_lease", "to_utc", "upsert_report", "upsert_run", "utcnow",
]
