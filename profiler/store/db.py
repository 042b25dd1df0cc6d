"""Engines and the one transactional scope that translates database errors.

- `make_engine(url)`: a plain `postgresql://` URL goes to psycopg 3; SQLite gets foreign keys,
  WAL and a busy timeout (several CLI processes and a worker may share the file).
- `session_scope(engine)` / `connection_scope(engine)`: commit on success, rollback on failure,
  always close; `OperationalError` and lost connections -> `StorageUnavailable` (retry later),
  a missing table -> `SchemaOutOfDate`, any other `SQLAlchemyError` -> `StorageError`.
  Messages carry the redacted URL, never a password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, configure_mappers

import memq.store.orm  # noqa: F401 - the mapped classes must be imported to be configured
from memq.config import normalize_database_url, redact_url
from memq.errors import MemqError, SchemaOutOfDate, StorageError, StorageUnavailable

UPGRADE_HINT = "run `memq db upgrade`"


def is_sqlite(url_or_engine: str | Engine | Connection) -> bool:
    if isinstance(url_or_engine, str):
        return url_or_engine.startswith("sqlite")
    return url_or_engine.dialect.name == "sqlite"


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine for `url`. Creating it connects to nothing."""
    url = normalize_database_url(url)
    if is_sqlite(url):
        u = make_url(url)
        if u.database and u.database != ":memory:":
            Path(u.database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30})
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args = {"connect_timeout": 10} if url.startswith("postgresql+psycopg") else {}
    return create_engine(url, echo=echo, pool_pre_ping=True, connect_args=connect_args)


def _sqlite_pragmas(dbapi_conn, _record) -> None:
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA foreign_keys = ON")
    cur.execute("PRAGMA busy_timeout = 30000")
    cur.execute("PRAGMA journal_mode = WAL")
    cur.execute("PRAGMA synchronous = NORMAL")
    cur.close()


def _first_line(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None) or exc
    text = str(orig).strip().splitlines()
    return text[0][:300] if text else type(orig).__name__


def _is_missing_table(exc: sa_exc.SQLAlchemyError) -> bool:
    msg = str(getattr(exc, "orig", exc)).lower()
    return "no such table" in msg or ("relation" in msg and "does not exist" in msg) or (
        "column" in msg and "does not exist" in msg) or "no such column" in msg


def translate(exc: BaseException, url: str) -> MemqError:
    """The memq error for a database exception (see module docstring)."""
    where = redact_url(url)
    if isinstance(exc, MemqError):
        return exc
    if isinstance(exc, sa_exc.SQLAlchemyError) and _is_missing_table(exc):
        return SchemaOutOfDate(f"the database schema at {where} is missing tables or columns "
                               f"({_first_line(exc)})", hint=UPGRADE_HINT)
    if isinstance(exc, (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.TimeoutError)) or (
            isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated):
        return StorageUnavailable(f"database {where} unavailable: {_first_line(exc)}",
                                  hint="check that it is running and reachable; retry later")
    if isinstance(exc, sa_exc.SQLAlchemyError):
        return StorageError(f"database {where} refused the operation: {_first_line(exc)}")
    return StorageUnavailable(f"database {where} unavailable: {exc}")


@contextlib.contextmanager
def translated(url: str) -> Iterator[None]:
    """Turn database exceptions raised inside the block into memq errors."""
    try:
        yield
    except MemqError:
        raise
    except (sa_exc.SQLAlchemyError, OSError) as exc:
        raise translate(exc, url) from exc


@contextlib.contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """One unit of work: commit on success, rollback on any error, always close."""
    url = engine.url.render_as_string(hide_password=True)
    session = Session(engine, expire_on_commit=False)
    try:
        with translated(url):
            yield session
            session.commit()
    except BaseException:
        with contextlib.suppress(Exception):
            session.rollback()
        raise
    finally:
        with contextlib.suppress(Exception):
            session.close()


@contextlib.contextmanager
def connection_scope(engine: Engine) -> Iterator[Connection]:
    """Core connection in a transaction (bulk inserts), with the same error translation."""
    url = engine.url.render_as_string(hide_password=True)
    with translated(url), engine.begin() as conn:
        yield conn


__all__ = ["make_engine", "session_scope", "connection_scope", "translated", "translate", "is_sqlite",
           "StorageError", "UPGRADE_HINT"]


def commit_asynchronously(engine: Engine) -> None:
    """PostgreSQL: every new connection of `engine` sets synchronous_commit off (a commit returns before
    its WAL reaches the disk); the pool is emptied so that no connection made before is kept. Other
    dialects: nothing."""
    if engine.dialect.name != "postgresql":
        return
    event.listen(engine, "connect", _no_sync_commit)
    engine.dispose()  # the schema check's pooled connection predates the listener


def _no_sync_commit(dbapi_conn, _record) -> None:
    was = dbapi_conn.autocommit
    dbapi_conn.autocommit = True
    try:
        dbapi_conn.execute("SET synchronous_commit TO off")
    finally:
        dbapi_conn.autocommit = was


def configure_orm() -> None:
    """Configure the ORM's mappers now (a forked worker process, before its first task: configured lazily
    inside a task, a soft time limit could interrupt SQLAlchemy's one-time configuration)."""
    configure_mappers()
