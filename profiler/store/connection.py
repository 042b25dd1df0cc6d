"""`open_store(settings)`: the engine, the blob store and the schema guard, in one object.

    store = open_store()                    # settings from the environment / config file
    with store.session() as session:       # one transaction; DB errors become memq errors
        run_id = repository.upsert_run(session, RunMeta(name="r1"))

The embedded SQLite database migrates itself on first use; a server database must already be at
this memq's schema revision (`memq db upgrade`), or `SchemaOutOfDate` is raised.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session

from memq.config import Settings, load_settings, redact_url
from memq.store.blobs import BlobStore
from memq.store.db import is_sqlite, make_engine, session_scope
from memq.store.schema import ensure_schema


@dataclass
class Store:
    settings: Settings
    engine: Engine
    blobs: BlobStore

    @property
    def url(self) -> str:
        """The database URL with any password masked (safe to print)."""
        return redact_url(self.engine.url.render_as_string(hide_password=True))

    @contextlib.contextmanager
    def session(self) -> Iterator[Session]:
        with session_scope(self.engine) as s:
            yield s

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_store(settings: Settings | None = None, *, check_schema: bool = True,
               database_url: str | None = None, auto_migrate: bool | None = None) -> Store:
    """Connect lazily to the configured database. `auto_migrate` defaults to True for SQLite
    (the embedded default) and False for server databases."""
    settings = settings or load_settings()
    url = database_url or settings.database_url
    engine = make_engine(url)
    if check_schema:
        ensure_schema(engine, auto_migrate=is_sqlite(url) if auto_migrate is None else auto_migrate)
    return Store(settings=settings, engine=engine,
                 blobs=BlobStore(settings.blob_dir, settings.decode_max_bytes))
