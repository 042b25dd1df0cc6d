"""No import cycle among the workers/ modules (issue 15): every import statement is read, at module
level and inside functions alike, since a function-level import is still a dependency (it only hides
the cycle until the function first runs). The dispatcher gets its heartbeat without a Celery app."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDER, PACKAGE = "workers", "memq.workers"  # the repository's workers/ is installed as memq.workers


def import_graph(folder: Path, package: str) -> dict[str, set[str]]:
    """The modules of a flat package (`workers/`, imported as `package`) and those of it each
    imports, by short name."""
    graph = module_graph(folder.parent, package, folder=folder.name)
    short = {m: m[len(package) + 1:] for m in graph if m.startswith(package + ".")}
    return {short[m]: {short[d] for d in deps if d in short} - {short[m]} for m, deps in graph.items() if m in short}


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
    graph = import_graph(ROOT / FOLDER, PACKAGE)
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
    code = ("import sys, memq.workers.dispatcher, memq.workers.heartbeat, memq.workers.queues, memq.workers.jobs; "
            "print(sorted(m for m in ('celery', 'memq.workers.app', 'memq.workers.tasks') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


# ------------------------------------------------------------------ the profiler package (issue 28)

ADAPTERS = ("memq.cli", "memq.web", "memq.metrics")  # they point down, nothing points at them
IO_FREE = ("memq.analysis",)  # pure: no store, no agent, no Redis


def profiler_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """The repository's profiler/ folder, installed as the memq package (memq.workers and
    memq.migrations come from other folders: imports of them are not edges of this graph)."""
    return module_graph(root, "memq", folder="profiler", outside=("memq.workers", "memq.migrations"))


def module_graph(root: Path, package: str, folder: str | None = None,
                 outside: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Module -> the modules of `package` (the files under root/folder) it imports anywhere
    (function-level and relative imports included). `from pkg import sub` depends on pkg.sub,
    `from pkg import name` on pkg (its __init__)."""
    files = {}
    base_dir = root / (folder or package)
    for p in base_dir.rglob("*.py"):
        name = ".".join([package, *p.relative_to(base_dir).with_suffix("").parts])
        files[name.removesuffix(".__init__")] = p

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = pkg.split(".")
                    base = ".".join(parts[:len(parts) - (node.level - 1)] + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names]
                names = [s for s in subs if s in files] + ([base] if any(s not in files for s in subs) else [])
            else:
                continue
            for n in names:
                if (n == package or n.startswith(package + ".")) and not any(
                        n == o or n.startswith(o + ".") for o in outside):
                    r = resolve(n)
                    if r and r != mod:
                        deps.add(r)
        graph[mod] = deps
    return graph


def _area(mod: str) -> str:
    return ".".join(mod.split(".")[:2])


def upward_arrows(graph: dict[str, set[str]], packages: set[str]) -> list[tuple[str, str]]:
    """Imports that run back up: into the CLI from anything, into the web app or the exporter from
    anything but the CLI (which runs them), from the use cases, the store,
    the analysis or the agent into an adapter or the use cases, from the analysis into I/O, and from a
    top-level module of profiler/ (codec, config, model, ...) into any package but its own."""
    bad = []
    for mod, deps in graph.items():
        a = _area(mod)
        for d in deps:
            b = _area(d)
            if b == a:
                continue
            if b == "memq.cli" and mod != "memq.__main__":  # the outermost: commands
                bad.append((mod, d))
            elif b in ADAPTERS and a not in ("memq.cli", "memq.__main__"):  # what commands run
                bad.append((mod, d))
            elif a in ("memq.pipeline", "memq.store", "memq.analysis", "memq.agent") and b == "memq.pipeline":
                bad.append((mod, d))
            elif a in IO_FREE and b in ("memq.store", "memq.agent"):
                bad.append((mod, d))
            elif a not in packages and a != "memq.__main__" and b in packages:
                bad.append((mod, d))
    return sorted(bad)


def _packages(root: Path = ROOT) -> set[str]:
    return {f"memq.{p.parent.name}" for p in (root / "profiler").glob("*/__init__.py")}


def test_no_import_cycle_among_profiler_modules():
    graph = profiler_graph()
    assert {"memq.agent.transport", "memq.redis_functions", "memq.pipeline.analyse", "memq.pipeline.ingest",
            "memq.store.sweeps", "memq.pipeline.status", "memq.redis_client"} <= set(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle among profiler modules: " + " -> ".join(cycle)


def test_no_import_runs_back_up():
    bad = upward_arrows(profiler_graph(), _packages())
    assert bad == [], bad


def test_the_profiler_checks_see_the_cycles_and_arrows_they_forbid(tmp_path):
    """The checker itself, on the shapes the tree had: transport <-> redis_functions (one side inside
    a function), service <-> sweeps, metrics -> cli, a top-level module -> analysis."""
    prof = tmp_path / "profiler"
    for sub in ("agent", "store", "metrics", "cli", "analysis"):
        (prof / sub).mkdir(parents=True)
        (prof / sub / "__init__.py").write_text("")
    (prof / "__init__.py").write_text("")
    (prof / "agent" / "transport.py").write_text("from memq import redis_functions\n")
    (prof / "redis_functions.py").write_text("def main():\n    from memq.agent.transport import x\n")
    (prof / "store" / "service.py").write_text("from memq.store.sweeps import sweep\n")
    (prof / "store" / "sweeps.py").write_text("def f():\n    from .service import load_blob\n")
    (prof / "metrics" / "collector.py").write_text("def f():\n    from memq.cli.service import collect\n")
    (prof / "cli" / "service.py").write_text("")
    (prof / "alloc_conf.py").write_text("from memq.analysis.allocator_model import A\n")
    (prof / "analysis" / "allocator_model.py").write_text("")
    graph = profiler_graph(tmp_path)
    assert find_cycle(graph) is not None
    assert find_cycle({k: v for k, v in graph.items() if not k.startswith("memq.store")}) is not None
    assert find_cycle({k: v - {"memq.agent.transport"} for k, v in graph.items()
                       if not k.startswith("memq.store")}) is None
    bad = upward_arrows(graph, _packages(tmp_path))
    assert ("memq.metrics.collector", "memq.cli.service") in bad
    assert ("memq.alloc_conf", "memq.analysis.allocator_model") in bad
    assert ("memq.redis_functions", "memq.agent.transport") in bad


def test_redis_connections_are_made_in_one_module():
    """Every Redis client of the product comes from memq.redis_client (timeouts and retries in one
    place); a client made elsewhere is named here."""
    made = []
    for folder in ("profiler", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.name == "redis_client.py" and path.parent.name == "profiler":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                        and node.func.attr in ("from_url", "Redis", "StrictRedis")):
                    base = ast.unparse(node.func.value)
                    if "redis" in base.lower():
                        made.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node.func)}")
    assert made == [], made
