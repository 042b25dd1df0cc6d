"""What every part of the repository shares: UTC times as each database takes them, and the
dialect's own INSERT (for ON CONFLICT)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from memq.errors import BadInput


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def to_utc(value: dt.datetime | float | int | None) -> dt.datetime | None:
    """Aware UTC datetime from a datetime (naive = UTC, as SQLite returns them) or epoch seconds."""
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return dt.datetime.fromtimestamp(float(value), dt.UTC)
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def db_time(session: Session, value: dt.datetime | None) -> dt.datetime | None:
    """A time as this database takes it in a comparison or a write: SQLite keeps no offset, so
    naive UTC there; aware UTC elsewhere."""
    value = to_utc(value)
    if value is not None and session.get_bind().dialect.name == "sqlite":
        return value.replace(tzinfo=None)
    return value


_db_time = db_time  # early callers used the private name


def _insert(session: Session, table):
    name = session.get_bind().dialect.name
    if name == "postgresql":
        return postgresql.insert(table)
    if name == "sqlite":
        return sqlite.insert(table)
    raise BadInput(f"unsupported database dialect {name!r}", hint="use PostgreSQL or SQLite")


def json_safe(value: Any) -> Any:
    """Plain JSON data: tuples to lists, non-finite floats (JSONB refuses NaN) to None, other
    objects to strings."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)
