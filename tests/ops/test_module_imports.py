"""Imports live at module level, where a reader (and a path-based tool) sees them: a function-level
import in the areas below is one of the few listed here, each lazy for a reason that still holds: a
start-up a test pins (named with it), or an import cycle it breaks (said so next to it)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("profiler/agent", "profiler/alerts", "profiler/metrics", "profiler/pipeline", "profiler/analysis",
         "profiler/store", "workers",
         *(f"profiler/{m}.py" for m in ("codec", "redis_functions", "redis_client", "envelope", "config", "load",
                                        "backoff", "playbook_doc")))
#: files of those areas not (yet) held to it
SKIP = ("profiler/analysis/timeline.py", "profiler/analysis/frames.py")

#: `memq analyze` of a healthy snapshot imports none of these (tests/analysis/test_import_purity.py)
ONLY_WHEN_NEEDED = "loaded only when the input needs it (tests/analysis/test_import_purity.py)"
#: the agent imports these modules and runs without redis-py and zstandard, spooling gzip
#: (tests/agent/test_faults.py::test_without_redis_py_and_zstandard_spools_gzip)
#: the tasks module builds the Celery app: the dispatcher, which only sends tasks, never builds one
#: before the first send (tests/workers/test_import_graph.py::test_dispatcher_and_heartbeat_build_no_celery_app)
NO_CELERY_APP = "the dispatcher builds no Celery app until it sends a task (tests/workers/test_import_graph.py)"
AGENT_WITHOUT = "the agent runs without it (tests/agent/test_faults.py, without redis-py and zstandard)"

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
    ("profiler/analysis/__init__.py", "analyze", "memq.analysis.checkpoint"): "the OOM's rules: " + ONLY_WHEN_NEEDED,
    ("profiler/analysis/__init__.py", "analyze", "memq.analysis.whatif"): "the allocator model: " + ONLY_WHEN_NEEDED,
    ("profiler/analysis/__init__.py", "_fit", "memq.analysis.fit"): "a run's fit curve: " + ONLY_WHEN_NEEDED,
    ("profiler/analysis/__init__.py", "explain_message", "memq.analysis.message_verdict"):
        "an OOM message's verdict: " + ONLY_WHEN_NEEDED,
    ("profiler/analysis/memory.py", "smallest_request_rounding_to", "memq.analysis.allocator_model"):
        "the allocator model: " + ONLY_WHEN_NEEDED,
    ("profiler/analysis/per_snapshot.py", "_own_fit", "memq.analysis.fit"): "the fit rules: " + ONLY_WHEN_NEEDED,
    ("profiler/pipeline/offline.py", "advice_replay", "memq.analysis.whatif"):
        "the allocator model, for an OOM's replay: " + ONLY_WHEN_NEEDED,
    ("workers/dispatcher.py", "enqueue", "memq.workers.tasks"): NO_CELERY_APP,
    ("workers/dispatcher.py", "refresh_forecast", "memq.workers.tasks"): NO_CELERY_APP,
    ("profiler/codec.py", "_sha256", "hashlib"): "OpenSSL: " + ONLY_WHEN_NEEDED,
    ("profiler/codec.py", "_unzstd_chunks", "zstandard"): AGENT_WITHOUT + "; " + ONLY_WHEN_NEEDED,
    ("profiler/codec.py", "compress", "zstandard"): AGENT_WITHOUT,
    ("profiler/config.py", "_read_file", "tomllib"): "only with a config file: " + ONLY_WHEN_NEEDED,
    ("profiler/playbook_doc.py", "to_html", "markdown_it"):
        "memq serve's /playbook page; analyze's terminal text does not need it: " + ONLY_WHEN_NEEDED,
    ("profiler/backoff.py", "__init__", "redis.backoff"): AGENT_WITHOUT,
    ("profiler/redis_client.py", "make_client", "redis"): AGENT_WITHOUT,
    ("profiler/redis_client.py", "make_client", "redis.backoff"): AGENT_WITHOUT,
    ("profiler/redis_client.py", "make_client", "redis.retry"): AGENT_WITHOUT,
    ("profiler/redis_functions.py", "loaded_version", "redis"): AGENT_WITHOUT,
    ("profiler/redis_functions.py", "step", "redis"): AGENT_WITHOUT,
    ("profiler/redis_functions.py", "doctor_checks", "redis"): AGENT_WITHOUT,
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
        yield from (f for f in (sorted(p.rglob("*.py")) if p.is_dir() else [p])
                    if str(f.relative_to(ROOT)) not in SKIP)


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
