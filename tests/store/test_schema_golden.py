"""The migrated schema, as the database reports it, matches a reviewed golden dump per dialect.

The drift test proves models and migrations agree; this one makes every schema change visible in
review (a changed dump file in the diff). HOW TO FIX after an intended change:
    MEMQ_UPDATE_GOLDEN=1 python -m pytest tests/store/test_schema_golden.py
then review and commit tests/store/schema/*.json.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pytest
from sqlalchemy import inspect

from memq.store import schema
from memq.store.db import make_engine
from tests.conftest import temp_pg_database

GOLDEN = Path(__file__).parent / "schema"


def dump(engine) -> dict:
    insp = inspect(engine)
    out = {}
    for table in sorted(insp.get_table_names()):
        out[table] = {
            "columns": [{"name": c["name"], "type": str(c["type"]), "nullable": c["nullable"],
                         "default": None if c.get("default") is None else str(c["default"])}
                        for c in insp.get_columns(table)],
            "primary_key": insp.get_pk_constraint(table),
            "foreign_keys": sorted(({"name": f["name"], "columns": f["constrained_columns"],
                                     "referred": f"{f['referred_table']}({', '.join(f['referred_columns'])})",
                                     "ondelete": (f.get("options") or {}).get("ondelete")}
                                    for f in insp.get_foreign_keys(table)), key=lambda f: f["name"] or ""),
            "unique": sorted(({"name": u["name"], "columns": u["column_names"]}
                              for u in insp.get_unique_constraints(table)), key=lambda u: u["name"] or ""),
            "indexes": sorted(({"name": i["name"], "columns": i["column_names"], "unique": bool(i["unique"])}
                               for i in insp.get_indexes(table)), key=lambda i: i["name"] or ""),
            "checks": sorted(({"name": c["name"], "sqltext": " ".join(str(c["sqltext"]).split())}
                              for c in insp.get_check_constraints(table)), key=lambda c: c["name"] or ""),
        }
    return out


@contextlib.contextmanager
def migrated(kind: str, tmp_path):
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'golden.db'}"
        cm = contextlib.nullcontext(url)
    else:
        cm = temp_pg_database("golden")
    with cm as url:
        engine = make_engine(url)
        try:
            schema.upgrade(engine)
            yield engine
        finally:
            engine.dispose()


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_schema_matches_golden_dump(kind, tmp_path, request):
    if kind == "postgresql":
        request.getfixturevalue("pg_server")
    with migrated(kind, tmp_path) as engine:
        actual = dump(engine)
    path = GOLDEN / f"{kind}.json"
    text = json.dumps(actual, indent=1, sort_keys=True) + "\n"
    if os.environ.get("MEMQ_UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    expected = path.read_text() if path.exists() else ""
    assert text == expected, (
        f"the {kind} schema differs from {path.relative_to(Path.cwd()) if path.is_relative_to(Path.cwd()) else path}.\n"
        "HOW TO FIX: if the change is intended (a new migration), run\n"
        "    MEMQ_UPDATE_GOLDEN=1 python -m pytest tests/store/test_schema_golden.py\n"
        "and commit the updated dump with the migration.")
