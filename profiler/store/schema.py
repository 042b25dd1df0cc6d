"""Schema version guard and migrations (Alembic, imported lazily: only this path needs it).

- `upgrade(engine, "head")`, `downgrade(engine, "-1")`, `current_revision(engine)`.
- `verify_schema(engine)`: raises `SchemaOutOfDate` ("run `memq db upgrade`") when the database is
  behind this memq, and also when it is ahead (a newer memq migrated it).
- `ensure_schema(engine, auto_migrate)`: the embedded SQLite default migrates itself (under a file
  lock, so two CLI processes starting at once do not both create tables); server databases are
  only checked.
The migration scripts live in the `memq.migrations` package (the repository's migrations/), found
through the import system, so this works from an installed wheel as well as from a checkout.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.engine import make_url

from memq.errors import SchemaOutOfDate, StorageError
from memq.store.db import UPGRADE_HINT, is_sqlite, translated


def migrations_dir() -> Path:
    spec = importlib.util.find_spec("memq.migrations")
    if spec is None or not spec.submodule_search_locations:
        raise StorageError("the memq migrations package is not installed",
                           hint="reinstall memq: `pip install memq`")
    path = Path(next(iter(spec.submodule_search_locations)))
    if not (path / "env.py").exists():
        raise StorageError(f"no Alembic env.py in {path}; the memq.migrations package is incomplete")
    return path


def alembic_config(engine: Engine | None = None):
    directory = migrations_dir()
    cfg = Config(str(directory / "alembic.ini"))
    cfg.set_main_option("script_location", str(directory))
    if engine is not None:
        cfg.attributes["url"] = engine.url.render_as_string(hide_password=False)
    return cfg


@functools.lru_cache(maxsize=1)
def _script_heads() -> tuple[tuple[str, ...], frozenset[str]]:
    script = ScriptDirectory.from_config(alembic_config())
    return tuple(script.get_heads()), frozenset(rev.revision for rev in script.walk_revisions())


def head_revision() -> str:
    heads, _ = _script_heads()
    if len(heads) != 1:
        raise StorageError(f"the migrations have {len(heads)} heads ({', '.join(heads)}); expected one")
    return heads[0]


def current_revision(engine: Engine) -> str | None:
    with translated(_url(engine)), engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _run(engine: Engine, fn_name: str, revision: str) -> None:
    cfg = alembic_config(engine)
    with translated(_url(engine)), engine.begin() as conn:
        cfg.attributes["connection"] = conn
        getattr(command, fn_name)(cfg, revision)


def upgrade(engine: Engine, revision: str = "head") -> None:
    with _migration_lock(engine):
        _run(engine, "upgrade", revision)
    _verified.discard(_key(engine))


def downgrade(engine: Engine, revision: str = "-1") -> None:
    with _migration_lock(engine):
        _run(engine, "downgrade", revision)
    _verified.discard(_key(engine))


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[None]:
    """A file lock beside a SQLite database; PostgreSQL uses an advisory lock in env.py."""
    if not is_sqlite(engine):
        yield
        return
    db = make_url(str(engine.url)).database
    if not db or db == ":memory:":
        yield
        return
    lock_path = Path(db).expanduser().with_name(Path(db).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


_verified: set[str] = set()


def _key(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def verify_schema(engine: Engine) -> None:
    """Raise SchemaOutOfDate unless the database is exactly at this memq's head revision."""
    head = head_revision()
    current = current_revision(engine)
    if current == head:
        return
    where = _url(engine)
    if current is None:
        raise SchemaOutOfDate(f"the database at {where} has no memq schema yet", hint=UPGRADE_HINT)
    _, known = _script_heads()
    if current not in known:
        raise SchemaOutOfDate(f"the database at {where} is at schema revision {current}, which this "
                              f"memq does not know (a newer memq migrated it)",
                              hint="upgrade memq, or downgrade the database with the newer memq")
    raise SchemaOutOfDate(f"the database at {where} is at schema revision {current}, this memq "
                          f"needs {head}", hint=UPGRADE_HINT)


def ensure_schema(engine: Engine, *, auto_migrate: bool) -> None:
    """Check the schema once per process and engine URL; migrate first when `auto_migrate`."""
    key = _key(engine)
    if key in _verified:
        return
    if auto_migrate:
        head = head_revision()
        _, known = _script_heads()
        current = current_revision(engine)
        if current != head and (current is None or current in known):
            with _migration_lock(engine):
                if current_revision(engine) != head:
                    _run(engine, "upgrade", "head")
    verify_schema(engine)
    _verified.add(key)
