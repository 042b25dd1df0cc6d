"""Run history in SQL plus a content-addressed blob store of raw snapshots.

Modules
- `orm`: the tables (typed SQLAlchemy 2 ORM); `migrations/` holds the matching Alembic revisions.
- `db`: engines and the transactional scope that maps database errors to memq errors.
- `schema`: upgrade / downgrade / current revision, and the out-of-date schema guard.
- `blobs`: `BlobStore`, raw snapshots by sha256 in `MEMQ_BLOB_DIR`.
- `repository`: write side, a package with one module per concern (runs, snapshot work queue,
  analysis results, stat samples, reports), re-exported as `repository.X`; used by `memq ingest` and the workers.
- `queries`: read side behind `memq runs / history / compare / versions` (the documents:
  profiler/pipeline/history.py).
- `connection`: `open_store(settings)` -> `Store(engine, blobs, settings)`: the connection to both
  (engine, sessions, blob store), the entry point.
Nothing here is imported by `import memq`; sqlalchemy loads only when a command needs it.
"""
