"""Alembic environment of memq: the ORM metadata is the target; batch mode on SQLite.

The connection comes from `config.attributes["connection"]` when memq runs the migrations
(memq.store.schema), else from MEMQ_DATABASE_URL / the memq config (plain `alembic` CLI).
On PostgreSQL an advisory lock serialises concurrent upgrades.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import text

from memq.store.orm import Base
from memq.store.partitions import alembic_include_name

config = context.config
target_metadata = Base.metadata
MIGRATION_LOCK_KEY = 0x6D656D71  # "memq"


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        from memq.config import load_settings

        url = load_settings().database_url
    return url


def _configure(**kw) -> None:
    context.configure(target_metadata=target_metadata, compare_type=True,
                      compare_server_default=False, include_name=alembic_include_name, **kw)


def run_migrations_offline() -> None:
    url = _url()
    _configure(url=url, literal_binds=True, render_as_batch=url.startswith("sqlite"),
               dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run(connection) -> None:
    _configure(connection=connection, render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from memq.store.db import make_engine

    engine = make_engine(_url())
    try:
        with engine.connect() as conn:
            _run(conn)
            conn.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
