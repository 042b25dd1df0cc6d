"""No import cycle among the workers/ modules (issue 15): every import statement is read, at module
level and inside functions alike, since a function-level import is still a dependency (it only hides
the cycle until the function first runs). The dispatcher gets its heartbeat without a Celery app."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "workers"


def imports_of(path: Path, package: str, modules: set[str]) -> set[str]:
    """The modules of `package` (names in `modules`) that the file at `path` imports anywhere."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x`, `from .x import y`
                base = f"{package}.{base}" if base else package
            # `from workers import jobs` imports the module workers.jobs; `from workers.app import app`
            # imports workers.app
            names = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if len(parts) >= 2 and parts[0] == package and parts[1] in modules:
                found.add(parts[1])
    return found


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    files = {p.stem: p for p in folder.glob("*.py") if p.stem != "__init__"}
    return {name: imports_of(path, package, set(files)) - {name} for name, path in files.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 on the current path, 2 finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                got = visit(nxt)
                if got:
                    return got
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            got = visit(start)
            if got:
                return got
    return None


def test_no_import_cycle_among_workers_modules():
    graph = import_graph(ROOT / PACKAGE, PACKAGE)
    assert {"app", "runtime", "jobs", "tasks", "dispatcher", "queues", "heartbeat"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle among workers/ modules: " + " -> ".join(cycle)


def test_the_walk_sees_function_level_and_relative_imports(tmp_path):
    """The checker itself: a cycle closed only by an import inside a function, or by a relative
    import, is found (this is how app <-> runtime and jobs <-> tasks used to hide)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("def f():\n    from pkg.c import thing\n    return thing\n")
    (pkg / "c.py").write_text("import os\n\ndef g():\n    from . import a\n")
    (pkg / "d.py").write_text("from pkg.a import x\n")
    graph = import_graph(pkg, "pkg")
    assert graph == {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    (pkg / "c.py").write_text("import os\n")
    assert find_cycle(import_graph(pkg, "pkg")) is None


def test_dispatcher_and_heartbeat_build_no_celery_app():
    """Importing the dispatcher (which beats) loads neither Celery nor the app module: a Celery app
    is built only when a task is first sent."""
    code = ("import sys, workers.dispatcher, workers.heartbeat, workers.queues, workers.jobs; "
            "print(sorted(m for m in ('celery', 'workers.app', 'workers.tasks') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout
