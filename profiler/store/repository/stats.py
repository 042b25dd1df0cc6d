"""Stat samples: batched, idempotent inserts (one unnest() statement per batch on PostgreSQL)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from sqlalchemy.orm import Session

from memq.errors import StorageError, StorageUnavailable
from memq.store.orm import (
    StatSample,
)
from memq.store.repository.common import _insert, to_utc

STAT_COLUMNS = ("run_id", "rank", "sampled_at", "step", "epoch", "allocated_bytes", "reserved_bytes",
                "active_bytes", "inactive_split_bytes", "alloc_retries", "oom_count")
_STAT_PG_TYPES = ("bigint", "integer", "timestamptz", "bigint", "integer", "bigint", "bigint", "bigint", "bigint",
                  "integer", "integer")
# One statement per batch: every column travels as one array literal, so the statement is the same
# whatever the batch size and the server expands the arrays with unnest(). Building the literals with
# str.join is several times cheaper than adapting 10,000 Python values per column one by one.
_STAT_PG_SQL = (
    "INSERT INTO stat_samples (" + ", ".join(STAT_COLUMNS) + ") SELECT * FROM unnest("
    + ", ".join(f"%s::{t}[]" for t in _STAT_PG_TYPES)
    + ") ON CONFLICT (run_id, rank, sampled_at) DO NOTHING"
)
STAT_BATCH_ROWS = 10_000


def stat_row(run_id: int, rank: int, stats: Mapping[str, Any], sampled_at: dt.datetime | float,
             step: int | None = None, epoch: int | None = None) -> dict[str, Any]:
    """A stat_samples row from a `torch.cuda.memory_stats()` dict (flat keys)."""
    def g(*keys):
        for k in keys:
            v = stats.get(k)
            if v is not None:
                return int(v)
        return None

    return {
        "run_id": run_id, "rank": rank, "sampled_at": to_utc(sampled_at),
        "step": step if step is not None else g("step"),
        "epoch": epoch if epoch is not None else g("epoch"),
        "allocated_bytes": g("allocated_bytes.all.current", "allocated_bytes"),
        "reserved_bytes": g("reserved_bytes.all.current", "reserved_bytes"),
        "active_bytes": g("active_bytes.all.current", "active_bytes"),
        "inactive_split_bytes": g("inactive_split_bytes.all.current", "inactive_split_bytes"),
        "alloc_retries": g("num_alloc_retries", "alloc_retries"),
        "oom_count": g("num_ooms", "oom_count"),
    }


def insert_stat_samples(session: Session, rows: Iterable[Mapping[str, Any]]) -> int:
    """Insert stat sample rows (dicts with STAT_COLUMNS keys; `sampled_at` a datetime or epoch
    seconds) in batches of STAT_BATCH_ROWS, inside the session's transaction; rows whose
    (run, rank, sampled_at) is already stored are skipped. PostgreSQL: one INSERT ... SELECT
    unnest(arrays) per batch; SQLite: executemany. Returns the number of rows offered."""
    dialect = session.get_bind().dialect.name
    total = 0
    batch: list[dict[str, Any]] = []
    for r in rows:
        batch.append({c: r.get(c) for c in STAT_COLUMNS} | {"sampled_at": to_utc(r["sampled_at"])})
        if len(batch) >= STAT_BATCH_ROWS:
            total += _flush_stats(session, batch, dialect)
            batch = []
    if batch:
        total += _flush_stats(session, batch, dialect)
    return total


def _int_array(values: list[Any]) -> str:
    return "{" + ",".join("NULL" if v is None else str(int(v)) for v in values) + "}"


def _ts_array(values: list[dt.datetime]) -> str:
    return "{" + ",".join('"' + v.isoformat() + '"' for v in values) + "}"


def _flush_stats(session: Session, batch: list[dict[str, Any]], dialect: str) -> int:
    if dialect == "postgresql":
        params = [_ts_array([r[c] for r in batch]) if c == "sampled_at" else _int_array([r[c] for r in batch])
                  for c in STAT_COLUMNS]
        dbapi = session.connection().connection.dbapi_connection  # the session's own transaction
        try:
            with dbapi.cursor() as cur:
                cur.execute(_STAT_PG_SQL, params)
        except psycopg.OperationalError as exc:
            raise StorageUnavailable(f"database unavailable while inserting stat samples: {exc}") from exc
        except psycopg.Error as exc:
            raise StorageError(f"database refused stat samples: {str(exc).splitlines()[0][:300]}") from exc
        return len(batch)
    if dialect == "sqlite":
        for r in batch:
            r["sampled_at"] = r["sampled_at"].replace(tzinfo=None)
    stmt = _insert(session, StatSample.__table__).on_conflict_do_nothing(
        index_elements=["run_id", "rank", "sampled_at"])
    session.execute(stmt, batch)
    return len(batch)
