"""The agent's parts depend one way (profiler/agent/core.py): the facade builds and wires them; no part
imports the facade, the triggers' target (the recorder) never imports the triggers, and the hooks, the
watch, the outcome and the job objects import none of the other parts."""

from __future__ import annotations

import ast
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "profiler" / "agent"
PARTS = ("recorder", "triggers", "signals", "outcome", "watch", "job", "guard")


def imports(module: str) -> set[str]:
    tree = ast.parse((AGENT / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("memq.agent."):
            out.add(node.module.rpartition(".")[2])
        elif isinstance(node, ast.Import):
            out |= {a.name.rpartition(".")[2] for a in node.names if a.name.startswith("memq.agent.")}
    return out


def test_parts_depend_one_way():
    deps = {m: imports(m) & (set(PARTS) | {"core"}) for m in PARTS}
    assert all("core" not in d for d in deps.values()), deps
    assert "triggers" not in deps["recorder"] and "signals" not in deps["recorder"]
    for leaf in ("signals", "outcome", "watch", "job"):
        assert deps[leaf] <= {"guard"}, (leaf, deps[leaf])
    assert deps["guard"] == set()


def test_no_part_holds_the_facade():
    """A part built by the facade gets values and callables, never `self` of the Agent."""
    src = (AGENT / "core.py").read_text()
    calls = [n for n in ast.walk(ast.parse(src)) if isinstance(n, ast.Call)]
    passed_self = [ast.unparse(c) for c in calls for v in [*c.args, *(k.value for k in c.keywords)]
                   if isinstance(v, ast.Name) and v.id == "self"]
    assert passed_self == []


def test_the_facade_contains_every_failure_of_its_parts(tmp_path):
    """A source that fails at every reading once armed: every call of the API returns, the failures
    are counted, and the job's own exception leaves the `with` block unchanged."""
    import pytest

    from memq.agent import Agent

    from .parts import GIB, Source

    src = Source(fail={"step_signals", "stats", "snapshot", "set_history", "metadata"})
    src.limit_bytes = src.metadata = src.device_total = lambda *a: (_ for _ in ()).throw(RuntimeError("no"))
    a = Agent("r", "c", source=src, redis_url="redis://127.0.0.1:1/0", spool_dir=str(tmp_path), signal=None,
              stats_interval_s=0, snapshot_every_s=0, fsync=False, backoff_s=(0.05, 0.1)).start()
    with pytest.raises(KeyError, match="the job's own"):
        with a:
            for i in range(5):
                a.mark_step(i, 0)
            a.mark_epoch(0)
            assert a.snapshot() is False
            src.observer(0, GIB, 2 * GIB, 0)  # the allocator's OOM observer
            raise KeyError("the job's own")
    c = a.counters()
    assert a.stopped and a.status == "crashed" and c["errors"] >= 10, c
