"""Shared fixtures. Databases: the real PostgreSQL server and SQLite files, never mocks.

PostgreSQL is the shared server at MEMQ_TEST_POSTGRES_URL (default
postgresql://postgres@127.0.0.1:5432/postgres). Tests never touch its existing databases: they
create uniquely named ones (`memq_test_<pid>_<hex>`) and drop them when done. A server that cannot
be reached fails the PostgreSQL tests; it does not skip them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get("MEMQ_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
TABLES = ("stat_samples", "run_diagnoses", "snapshots", "analysis_results", "runs", "reports", "whatif_sweeps",
          "alert_summaries")


def _plain(url: str) -> str:
    """libpq form of a URL (psycopg.connect does not take the +psycopg driver suffix)."""
    for prefix in ("postgresql+psycopg://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql://" + url[len(prefix):]
    return url


def _with_database(url: str, name: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(_plain(url)).set(database=name).render_as_string(hide_password=False)


def _admin():
    import psycopg

    return psycopg.connect(_plain(PG_ADMIN_URL), autocommit=True, connect_timeout=10)


@contextlib.contextmanager
def temp_pg_database(tag: str = "t") -> Iterator[str]:
    """Create a uniquely named database on the shared server; drop it afterwards. Yields its URL."""
    from psycopg import sql

    name = f"memq_test_{tag}_{os.getpid()}_{secrets.token_hex(4)}"
    with _admin() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield _with_database(PG_ADMIN_URL, name)
    finally:
        with _admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_server() -> str:
    try:
        with _admin() as conn:
            conn.execute("SELECT 1")
    except Exception as exc:  # noqa: BLE001 - any failure here means the server is not usable
        pytest.fail(f"PostgreSQL at MEMQ_TEST_POSTGRES_URL is not reachable: {type(exc).__name__}: {exc}")
    return PG_ADMIN_URL


@pytest.fixture(scope="session")
def pg_session_db(pg_server) -> Iterator[str]:
    """One migrated database for the whole session; tables are emptied before each test."""
    from memq.store import schema
    from memq.store.db import make_engine

    with temp_pg_database("s") as url:
        engine = make_engine(url)
        schema.upgrade(engine)
        engine.dispose()
        yield url


def _truncate(url: str) -> None:
    from sqlalchemy import text

    from memq.store.db import make_engine

    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE " + ", ".join(TABLES) + " RESTART IDENTITY CASCADE"))
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request, tmp_path) -> str:
    """A migrated, empty database: a SQLite file, or the session's PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'memq.db'}"
    url = request.getfixturevalue("pg_session_db")
    _truncate(url)
    return url


def memq_environ(db_url: str, tmp_path: Path) -> dict[str, str]:
    return {"MEMQ_DATABASE_URL": db_url, "MEMQ_DATA_DIR": str(tmp_path / "data"),
            "MEMQ_BLOB_DIR": str(tmp_path / "blobs"), "MEMQ_CONFIG": str(tmp_path / "none.toml")}


@pytest.fixture
def store(db_url, tmp_path):
    from memq.config import load_settings
    from memq.store.connection import open_store

    settings = load_settings(memq_environ(db_url, tmp_path))
    st = open_store(settings, auto_migrate=True)
    yield st
    st.close()


@pytest.fixture
def memq_env(db_url, tmp_path, monkeypatch) -> dict[str, str]:
    """Point the `memq` commands of this test at `db_url` and private data/blob directories."""
    env = memq_environ(db_url, tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


# ------------------------------------------------------------------------- parallel runs (xdist)
# tests/run.sh runs the suite on two pytest-xdist workers with `--dist loadgroup
# --no-loadscope-reorder`. Every test's services are its own (databases named per process, Redis
# key prefixes per test, private servers on free ports, files under the worker's tmp dir), so tests
# may run side by side; what is grouped here is only set-up worth doing once:
# - the tests of one file go to one worker: a module-scoped stack (worker, dispatcher, servers,
#   an ingested history) starts once, as in a serial run;
# - tests/web and tests/report each go to one worker: their session-scoped history (ingests of the
#   real fixtures, 7-15 s) is built once, not once per worker.
# The groups start heaviest first (the end-to-end files that take 30-110 s), so the run ends with
# many short files that keep both workers busy. The order is a schedule hint only: a file missing
# from it just starts later.
_ONE_WORKER_DIRS = ("tests/web/", "tests/report/")
_HEAVY_FIRST = (
    "tests/workers/test_worker_faults.py", "tests/web/", "tests/report/", "tests/fuzz/test_fuzz_decoder.py",
    "tests/workers/test_poison.py", "tests/workers/test_agent_defaults_e2e.py", "tests/metrics/test_live_e2e.py",
    "tests/ops/test_stack_e2e.py", "tests/cli/test_history_cli.py", "tests/fuzz/", "tests/workers/",
    "tests/agent/test_reconnect_jitter.py", "tests/agent/test_gpu_spools.py", "tests/cli/", "tests/ops/",
    "tests/metrics/", "tests/analysis/test_playbook_links.py",
)


def _xdist_group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return next((d for d in _ONE_WORKER_DIRS if path.startswith(d)), path)


def _start_rank(group: str) -> int:
    return next((i for i, prefix in enumerate(_HEAVY_FIRST) if group.startswith(prefix)), len(_HEAVY_FIRST))


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the marks
def pytest_collection_modifyitems(config, items):
    if config.pluginmanager.hasplugin("xdist"):
        for item in items:
            item.add_marker(pytest.mark.xdist_group(_xdist_group(item.nodeid)))
    if getattr(config.option, "loadgroup", False) or getattr(config.option, "dist", "no") == "loadgroup":
        items.sort(key=lambda item: _start_rank(_xdist_group(item.nodeid)))  # stable: file order kept
