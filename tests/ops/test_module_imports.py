"""Imports live at module level, where a reader (and a path-based tool) sees them, in the agent, the
alerts, the exporter and the dead-blob cleanup: a function-level import there is one of the few listed
here, each lazy for a reason that still holds (issue 37 item 5)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("profiler/agent", "profiler/alerts", "profiler/metrics", "profiler/pipeline/dead_blobs.py")

#: (file, function, module) -> why it stays lazy
LAZY = {
    ("profiler/agent/source.py", "_t", "torch"):
        "the agent never imports torch before the job does (tests/agent/test_torch_source.py)",
    ("profiler/agent/integrations.py", "_lightning_base", "lightning.pytorch"):
        "the job's trainer library, not a dependency of the agent",
    ("profiler/agent/integrations.py", "_lightning_base", "pytorch_lightning"):
        "the same library under its older name",
    ("profiler/agent/integrations.py", "hf_callback", "transformers"):
        "the job's trainer library, not a dependency of the agent",
}


def function_level_imports(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    out = []

    def visit(node, fn):
        for ch in ast.iter_child_nodes(node):
            if isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(ch, ch.name)
                continue
            if fn is not None and isinstance(ch, ast.Import):
                out.extend((fn, a.name) for a in ch.names)
            elif fn is not None and isinstance(ch, ast.ImportFrom):
                out.append((fn, ch.module or ""))
            visit(ch, fn)

    visit(tree, None)
    return out


def files():
    for area in AREAS:
        p = ROOT / area
        yield from (sorted(p.rglob("*.py")) if p.is_dir() else [p])


def test_function_level_imports_are_only_the_listed_lazy_ones():
    found = {(str(f.relative_to(ROOT)), fn, mod) for f in files() for fn, mod in function_level_imports(f)}
    assert found == set(LAZY), {"not listed": sorted(found - set(LAZY)), "gone": sorted(set(LAZY) - found)}


def test_the_checker_sees_nested_and_method_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\n\nclass C:\n    def m(self):\n        if True:\n            from a.b import c\n"
                 "\n\ndef g():\n    def h():\n        import x.y\n    return h\n")
    assert function_level_imports(f) == [("m", "a.b"), ("h", "x.y")]


def test_importing_the_agent_loads_no_torch_and_no_trainer_library():
    code = ("import sys, memq.agent, memq.agent.integrations, memq.agent.bootstrap; "
            "print(sorted(m for m in ('torch', 'lightning', 'pytorch_lightning', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
