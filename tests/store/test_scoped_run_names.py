"""Migration 0014 against real databases (SQLite and PostgreSQL): runs a signed envelope created are
renamed `<owner>/<name>` (what the dispatcher now stores), unsigned runs keep their names, a scoped name
that would not fit runs.name or is taken is left alone; the downgrade strips the prefix again."""

from __future__ import annotations

import contextlib
import json

import pytest
from sqlalchemy import text

from memq import identity
from memq.errors import BadInput
from memq.store import schema
from memq.store.db import make_engine
from tests.conftest import temp_pg_database


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_owned_runs_are_renamed_by_their_principal_both_ways(kind, tmp_path, request):
    if kind == "postgresql":
        request.getfixturevalue("pg_server")
        cm = temp_pg_database("scoped")
    else:
        cm = contextlib.nullcontext(f"sqlite:///{tmp_path / 'm.db'}")
    long_name = "r" * (200 - len("team-a/") + 1)  # one character too long once scoped
    fits = "r" * (200 - len("team-a/"))  # just fits
    rows = [("llama", "team-a"), ("llama-b", "team-b"), ("legacy", None), (long_name, "team-a"), (fits, "team-a"),
            ("taken", "team-a"), ("team-a/taken", "team-a")]
    with cm as url:
        engine = make_engine(url)
        try:
            schema.upgrade(engine, "0013")
            with engine.begin() as conn:
                for name, owner in rows:
                    conn.execute(text("INSERT INTO runs (name, labels, status, owner) "
                                      "VALUES (:n, '{}', 'running', :o)"), {"n": name, "o": owner})
            schema.upgrade(engine)
            with engine.connect() as conn:
                names = set(conn.execute(text("SELECT name FROM runs")).scalars())
            assert names == {"team-a/llama", "team-b/llama-b", "legacy", long_name, "team-a/" + fits, "taken",
                             "team-a/taken"}
            schema.downgrade(engine, "0013")
            with engine.connect() as conn:
                back = set(conn.execute(text("SELECT name FROM runs")).scalars())
            assert {"llama", "llama-b", "legacy", long_name, fits} <= back
        finally:
            engine.dispose()


def test_scoped_run_names_and_principals():
    assert identity.scoped_run("team-a", "llama") == "team-a/llama"
    assert identity.scoped_run("team-a", "team-a/llama") == "team-a/llama"  # its own prefix is kept
    assert identity.scoped_run("team-a", "team-b/llama") == "team-a/team-b/llama"  # never another's
    assert len(identity.scoped_run("team-a", "r" * 193)) == 200
    with pytest.raises(identity.IdentityError, match="over the limit of 200"):
        identity.scoped_run("team-a", "r" * 194)
    for bad in ("team/a", "team\x1b[31m"):
        ring = {"keys": [{"kid": "k", "principal": bad, "secret": "ab" * 32}]}
        with pytest.raises(BadInput, match="principal"):
            identity.parse_keyring(json.dumps(ring))
