"""One home per rule (issue 37), read from the source as the import-graph test beside it reads imports:

- SQL is built in profiler/store/ only: no module of profiler/ or workers/ outside it imports SQLAlchemy
  (statement builders, text(), sessions, events: at module level and inside functions alike), calls
  `.execute(...)` or `.query(...)` on a session, or imports the ORM (memq.store.orm); migrations/ is
  not scanned (Alembic's own SQL);
- which rank speaks for a run is decided by analysis/run_verdict.run_verdict alone, fed by
  store/run_verdicts alone: no other code orders ranks' diagnoses by peak, cause or OOM;
- a run's status moves by analysis/run_status.py alone: only the store writes `status=` to a run, only
  the use cases of pipeline/runs.py ask it to (`move_run_status`), and the statuses are listed once
  (memq/model.py);
- a near miss is analysis/headroom.py's: no comparison against NEAR_MISS_SHARE elsewhere;
- confidence comes from analysis/confidence.py: no literal confidence in the analysis elsewhere;
- the workers hold no use case: workers/ imports nothing of the analysis (what a snapshot, an envelope or
  a run's status means is asked of profiler/pipeline/; the workers keep leases, debounce, the decode
  cache, the stream and the senders).
Each checker is run on a small tree with the shapes it forbids, so a checker that finds nothing fails.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SESSIONS = {"s", "session", "sess", "conn", "connection", "db"}
STATUSES = {"running", "completed", "crashed", "oom"}


def _files(root: Path, folders=("profiler", "workers")) -> list[Path]:
    return sorted(p for f in folders for p in (root / f).rglob("*.py"))


def _rel(root: Path, p: Path) -> str:
    return p.relative_to(root).as_posix()


def _in_store(rel: str) -> bool:
    return rel.startswith("profiler/store/")


def sql_outside_store(root: Path = ROOT) -> list[str]:
    bad = []
    for p in _files(root):
        rel = _rel(root, p)
        if _in_store(rel):
            continue
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("execute", "query", "scalars", "scalar")
                  and isinstance(node.func.value, ast.Name) and node.func.value.id in SESSIONS and node.args):
                bad.append(f"{rel}:{node.lineno} {ast.unparse(node.func)}(...)")
                continue
            else:
                continue
            for n in names:
                if n == "sqlalchemy" or n.startswith("sqlalchemy.") or n in ("memq.store.orm", "memq.store.orm.*"):
                    bad.append(f"{rel}:{node.lineno} imports {n}")
                    break
                if n.startswith("memq.store.orm."):
                    bad.append(f"{rel}:{node.lineno} imports {n}")
                    break
    return bad


def test_sql_is_built_in_the_store_only():
    assert sql_outside_store() == []


# ------------------------------------------------------------------------------ the run verdict

VERDICT_HOMES = {"profiler/analysis/run_verdict.py", "profiler/analysis/ranks.py"}
VERDICT_WORDS = ("peak_reserved", "primary_cause", "oom_at", "\"oom\"", "'oom'", ".oom", ".cause")


def rank_choices(root: Path = ROOT) -> list[str]:
    """Code that picks one rank by ordering ranks' diagnoses (a sort, max, min or ORDER BY whose key
    names a rank and a peak, a cause or an OOM), and calls of run_verdict outside its feeder."""
    bad = []
    for p in _files(root):
        rel = _rel(root, p)
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name == "run_verdict" and rel not in {"profiler/store/run_verdicts.py"} | VERDICT_HOMES:
                bad.append(f"{rel}:{node.lineno} calls run_verdict")
            if name not in ("max", "min", "sorted", "sort", "order_by") or rel in VERDICT_HOMES:
                continue
            text = " ".join(ast.unparse(a) for a in [*node.args, *(k.value for k in node.keywords)])
            if "rank" in text and any(w in text for w in VERDICT_WORDS):
                bad.append(f"{rel}:{node.lineno} {name}(... {text[:80]})")
    return bad


def test_one_function_decides_which_rank_speaks_for_a_run():
    assert rank_choices() == []


# ---------------------------------------------------------------------------- status, near miss

def status_rules(root: Path = ROOT) -> list[str]:
    bad = []
    for p in _files(root):
        rel = _rel(root, p)
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)) and rel != "profiler/model.py":
                words = {e.value if isinstance(e, ast.Constant) else None for e in node.elts}
                if len(words & STATUSES) >= 3 and words <= STATUSES:  # a list of statuses, not a header row
                    bad.append(f"{rel}:{node.lineno} lists run statuses")
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "values"
                    and any(k.arg == "status" for k in node.keywords)
                    and rel not in ("profiler/store/repository/runs.py", "profiler/store/outbox.py")
                    and "Run" in ast.unparse(node.func.value)):
                bad.append(f"{rel}:{node.lineno} writes a run's status")
            called = getattr(node.func, "attr", getattr(node.func, "id", "")) if isinstance(node, ast.Call) else ""
            if called == "move_run_status" and rel != "profiler/pipeline/runs.py":
                bad.append(f"{rel}:{node.lineno} moves a run's status outside pipeline/runs.py")
    return bad


def test_one_status_rule():
    assert status_rules() == []


NEAR_MISS_HOMES = {"profiler/analysis/headroom.py", "profiler/analysis/rules.py"}


def near_miss_rules(root: Path = ROOT) -> list[str]:
    bad = []
    for p in _files(root):
        rel = _rel(root, p)
        if rel in NEAR_MISS_HOMES:
            continue
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Compare) and any(w in ast.unparse(node) for w in ("NEAR_MISS", "HEADROOM")):
                bad.append(f"{rel}:{node.lineno} {ast.unparse(node)[:80]}")
    return bad


def test_one_near_miss():
    assert near_miss_rules() == []


# ----------------------------------------------------------------------------------- confidence

CONFIDENCE_HOMES = {"profiler/analysis/confidence.py", "profiler/analysis/rules.py"}


def literal_confidences(root: Path = ROOT) -> list[str]:
    """A confidence given as a literal number or word in the analysis (a keyword, an attribute set, a
    dict entry, a positional argument of MessageVerdict) outside confidence.py."""
    bad = []
    for p in sorted((root / "profiler" / "analysis").rglob("*.py")):
        rel = _rel(root, p)
        if rel in CONFIDENCE_HOMES:
            continue
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            found = []
            if isinstance(node, ast.keyword) and node.arg == "confidence":
                found = [node.value]
            elif isinstance(node, ast.Assign) and any(getattr(t, "attr", None) == "confidence" for t in node.targets):
                found = [node.value]
            elif isinstance(node, ast.Dict):
                found = [v for k, v in zip(node.keys, node.values, strict=True)
                         if isinstance(k, ast.Constant) and k.value == "confidence"]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "MessageVerdict" and len(node.args) > 2:
                found = [node.args[2]]
            for v in found:
                if isinstance(v, ast.Constant) and isinstance(v.value, (int, float, str)) and v.value is not None:
                    bad.append(f"{rel}:{v.lineno} confidence {v.value!r}")
                elif isinstance(v, ast.Tuple):
                    bad += [f"{rel}:{v.lineno} confidence {e.value!r}" for e in v.elts
                            if isinstance(e, ast.Constant) and e.value in ("high", "medium", "low", "none")]
    return bad


def test_confidence_comes_from_confidence_py():
    assert literal_confidences() == []


# ------------------------------------------------------------------------------ workers: plumbing

def analysis_in_workers(root: Path = ROOT) -> list[str]:
    bad = []
    for p in _files(root, ("workers",)):
        rel = _rel(root, p)
        for node in ast.walk(ast.parse(p.read_text(), filename=str(p))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            else:
                continue
            if any(n == "memq.analysis" or n.startswith("memq.analysis.") for n in names):
                bad.append(f"{rel}:{node.lineno} imports {ast.unparse(node)[:80]}")
    return bad


def test_the_workers_ask_the_use_cases_not_the_analysis():
    assert analysis_in_workers() == []


# ------------------------------------------------------------------------- the checkers themselves

def test_the_checkers_see_what_they_forbid(tmp_path):
    (tmp_path / "profiler" / "store").mkdir(parents=True)
    (tmp_path / "profiler" / "analysis").mkdir()
    (tmp_path / "workers").mkdir()
    (tmp_path / "profiler" / "store" / "ok.py").write_text(
        "from sqlalchemy import select\nfrom memq.store.orm import Run\n"
        "def f(s):\n    return s.execute(select(Run)).all()\n")
    (tmp_path / "workers" / "jobs.py").write_text(
        "def f(s, rows):\n    from sqlalchemy import update\n    from memq.store.orm import Run\n"
        "    s.execute(update(Run).values(status='oom'))\n"
        "    repo.move_run_status(s, 1, 'oom')\n"
        "    return max(rows, key=lambda d: (d.oom, d.peak_reserved_bytes, -d.rank))\n"
        "ORDER = ('running', 'completed', 'crashed', 'oom')\n"
        "def g():\n    from memq.analysis import run_status\n")
    (tmp_path / "profiler" / "web.py").write_text(
        "from memq.store import orm\nimport sqlalchemy.orm\n"
        "def g(session, q):\n    return session.execute(q)\n"
        "def h(peak, limit):\n    return limit - peak < NEAR_MISS_SHARE * limit\n")
    (tmp_path / "profiler" / "analysis" / "x.py").write_text(
        "def f(r):\n    r.confidence = 'high'\n    return MessageVerdict('s', 'capacity', 0.7, [])\n"
        "D = {'confidence': 0.4}\nV = dict(confidence=0.9)\n")
    sql = sql_outside_store(tmp_path)
    assert [b.split(" ")[0] for b in sql] == ["profiler/web.py:1", "profiler/web.py:2", "profiler/web.py:4",
                                             "workers/jobs.py:2", "workers/jobs.py:3", "workers/jobs.py:4"], sql
    assert [b.split(" ")[0] for b in rank_choices(tmp_path)] == ["workers/jobs.py:6"]
    assert sorted(b.split(" ")[0] for b in status_rules(tmp_path)) == ["workers/jobs.py:4", "workers/jobs.py:5",
                                                                       "workers/jobs.py:7"]
    assert [b.split(" ")[0] for b in near_miss_rules(tmp_path)] == ["profiler/web.py:6"]
    assert len(literal_confidences(tmp_path)) == 4
    assert [b.split(" ")[0] for b in analysis_in_workers(tmp_path)] == ["workers/jobs.py:9"]
