"""stat_samples on PostgreSQL: one partition per UTC day, so retention drops whole days.

10,000 GPUs write 86 million samples a day; deleting them row by row a month later, and vacuuming
after, was the first thing to break in the capacity plan (deploy/CAPACITY.md). Since migration 0004
the PostgreSQL table is partitioned by range of `sampled_at`:
- `stat_samples_pYYYYMMDD` holds one UTC day; `stat_samples_default` everything else (a sample from
  a skewed clock, a spool replayed months later, `memq ingest` of an old stats file): nothing is
  refused for want of a partition.
- `ensure_days` creates the coming days' partitions (the dispatcher at start, `memq gc` and the
  daily retention task: a week ahead, MEMQ_STAT_PARTITION_DAYS_AHEAD). A day whose rows already sit
  in the default partition is carved out: its rows move into the new partition in the same
  transaction.
- `drop_days_before` drops the partitions of days wholly before a cutoff (retention.py decides
  which cutoff applies to every row).
SQLite keeps one plain table; every function here is a no-op there.
All DDL runs under one advisory lock, so two dispatchers starting together do not race.
"""

from __future__ import annotations

import datetime as dt
import re

from psycopg import sql
from sqlalchemy import text
from sqlalchemy.orm import Session

PARENT = "stat_samples"
DEFAULT = "stat_samples_default"
_DAY = re.compile(r"^stat_samples_p(\d{8})$")
PARTITION_NAME = re.compile(r"^stat_samples_(default|p\d{8})$")
LOCK_KEY = 0x6D656D70  # "memp"


def is_partition_name(name: str | None) -> bool:
    """Tables that are partitions of stat_samples (the ORM and migrations know only the parent)."""
    return bool(name and PARTITION_NAME.match(name))


def alembic_include_name(name: str | None, type_: str, parent_names) -> bool:
    """For Alembic's autogenerate: the partitions are made at run time, not by the models, so they
    are not tables to drop."""
    return not (type_ == "table" and is_partition_name(name))


def day_name(day: dt.date) -> str:
    return f"{PARENT}_p{day:%Y%m%d}"


def _on_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def is_partitioned(session: Session) -> bool:
    if not _on_postgres(session):
        return False
    return session.execute(text(
        "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table p JOIN pg_class c ON c.oid = p.partrelid "
        "WHERE c.relname = :t AND c.relnamespace = to_regnamespace(current_schema())::oid)"),
        {"t": PARENT}).scalar_one()


def days(session: Session) -> list[dt.date]:
    """The UTC days that have a partition of their own, oldest first."""
    return _days(session) if is_partitioned(session) else []


def _days(session: Session) -> list[dt.date]:
    names = session.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = :t "
        "AND p.relnamespace = to_regnamespace(current_schema())::oid"), {"t": PARENT}).scalars()
    out = []
    for n in names:
        m = _DAY.match(n)
        if m:
            out.append(dt.datetime.strptime(m.group(1), "%Y%m%d").date())
    return sorted(out)


def _bounds(day: dt.date) -> tuple[dt.datetime, dt.datetime]:
    lo = dt.datetime.combine(day, dt.time(), dt.UTC)
    return lo, lo + dt.timedelta(days=1)


def _lock(session: Session) -> None:
    session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": LOCK_KEY})


def ensure_days(session: Session, first: dt.date, last: dt.date) -> list[str]:
    """Partitions for the UTC days first..last (inclusive) that have none; returns the names created.
    Runs in the session's transaction (the caller commits)."""
    if not is_partitioned(session) or last < first:
        return []
    _lock(session)
    have = set(_days(session))
    created = []
    day = first
    while day <= last:
        if day not in have:
            _create_day(session, day)
            created.append(day_name(day))
        day += dt.timedelta(days=1)
    return created


def _exec(session: Session, query, params: tuple = ()) -> list[tuple]:
    """DDL on the session's own connection and transaction. Table names and partition bounds cannot
    be bound parameters, so statements are composed with psycopg's `sql` (quoted identifiers and
    literals, never string formatting); values that can be bound are."""
    dbapi = session.connection().connection.dbapi_connection
    with dbapi.cursor() as cur:
        cur.execute(query, params or None)
        return cur.fetchall() if cur.description else []


def _create_day(session: Session, day: dt.date) -> None:
    t0, t1 = _bounds(day)
    name, parent, default = sql.Identifier(day_name(day)), sql.Identifier(PARENT), sql.Identifier(DEFAULT)
    lo, hi = sql.Literal(t0), sql.Literal(t1)
    waiting = _exec(session, sql.SQL("SELECT EXISTS (SELECT 1 FROM {} WHERE sampled_at >= %s AND sampled_at < %s)")
                    .format(default), (t0, t1))[0][0]
    if not waiting:
        _exec(session, sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})")
              .format(name, parent, lo, hi))
        return
    # Rows of that day are in the default partition: a new partition for the day cannot be created
    # over them, so build it apart, move them, then attach it.
    check = sql.Identifier(day_name(day) + "_range")
    _exec(session, sql.SQL("CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)").format(name, parent))
    _exec(session, sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK (sampled_at >= {} AND sampled_at < {})")
          .format(name, check, lo, hi))
    _exec(session, sql.SQL("WITH moved AS (DELETE FROM {} WHERE sampled_at >= %s AND sampled_at < %s RETURNING *) "
                           "INSERT INTO {} SELECT * FROM moved").format(default, name), (t0, t1))
    _exec(session, sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})")
          .format(parent, name, lo, hi))
    _exec(session, sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(name, check))


def ensure_ahead(session: Session, now: dt.datetime, days_ahead: int) -> list[str]:
    """Partitions for today (UTC) and the next `days_ahead` days."""
    today = now.astimezone(dt.UTC).date()
    return ensure_days(session, today, today + dt.timedelta(days=max(0, days_ahead)))


def drop_days_before(session: Session, cut: dt.date, dry_run: bool = False) -> tuple[list[str], int]:
    """Drop the partitions of UTC days that end on or before midnight of `cut` (whole days only).
    Returns (names, rows they held); a dry run drops and counts nothing (its caller counts those rows
    with the rest). Runs in the session's transaction."""
    if not is_partitioned(session):
        return [], 0
    _lock(session)
    gone, rows = [], 0
    for day in _days(session):
        if day >= cut:
            break
        name = sql.Identifier(day_name(day))
        if not dry_run:
            rows += int(_exec(session, sql.SQL("SELECT count(*) FROM {}").format(name))[0][0])
            _exec(session, sql.SQL("DROP TABLE {}").format(name))
        gone.append(day_name(day))
    return gone, rows


def health(engine, today: dt.date) -> dict | None:
    """What `memq doctor` checks of the day partitions (PostgreSQL, partitioned only; else None): the
    days after `today` that have a partition, and the estimated rows in the default partition."""
    if engine.dialect.name != "postgresql":
        return None
    with Session(engine) as s:
        if not is_partitioned(s):
            return None
        ahead = [d for d in days(s) if d > today]
        stray = s.execute(text("SELECT greatest(reltuples, 0)::bigint FROM pg_class WHERE relname = :t "
                               "AND relnamespace = to_regnamespace(current_schema())::oid"),
                          {"t": DEFAULT}).scalar_one_or_none() or 0
    return {"ahead": ahead, "default_rows_estimate": int(stray)}
