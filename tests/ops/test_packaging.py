"""What the wheel installs cannot collide with a training environment's own modules (issue 23 item
12). The repository keeps its profiler/, workers/ and migrations/ folders; the wheel installs them as
one package, memq (memq.workers, memq.migrations), and no module imports a folder's name.

- the package list in pyproject.toml is every folder with an __init__.py, under its installed name;
- no import anywhere in the tree names `profiler`, `workers` or `migrations` as a top-level module;
- a wheel installed into a virtual environment that already holds its own `profiler`, `workers` and
  `migrations` modules leaves them untouched and importable, and `from memq import agent` works even
  from a folder with a `profiler.py` in it;
- `memq run`'s start-up path (the sitecustomize it puts on PYTHONPATH) starts the agent in a job
  whose own `profiler` module stays the job's, both from an installed wheel and from a checkout run
  by an interpreter that does not have memq installed.
"""

from __future__ import annotations

import ast
import json
import os
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from memq.agent import bootstrap
from tests.ops.wheel import run_ok as _run

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {"profiler": "memq", "workers": "memq.workers", "migrations": "memq.migrations"}
CHECKOUT_NAMES = ("profiler", "workers", "migrations")

pytestmark = pytest.mark.timeout(300)


def _installed_packages() -> set[str]:
    out = set()
    for folder, name in FOLDERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            out.add(".".join([name, *rel]))
    return out


def test_pyproject_lists_every_package_under_its_installed_name():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert set(conf["packages"]) == _installed_packages()
    assert conf["package-dir"] == {v: k for k, v in FOLDERS.items()}


def _top_level_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def test_nothing_imports_a_checkout_folder_by_its_name():
    files = [p for d in ("profiler", "workers", "migrations", "tests", "benchmarks", "deploy")
             for p in (ROOT / d).rglob("*.py") if "fixtures" not in p.parts]
    bad = [f"{p.relative_to(ROOT)}:{line} imports {name}" for p in files
           for line, name in _top_level_imports(p) if name in CHECKOUT_NAMES]
    assert bad == []


def test_the_checker_sees_such_an_import(tmp_path):
    f = tmp_path / "x.py"
    f.write_text("def f():\n    from workers.app import app\n    import profiler.agent\n")
    assert [n for _, n in _top_level_imports(f)] == ["workers", "profiler"]


def _their_modules(site: Path) -> dict[Path, str]:
    """A training environment's own modules with the checkout's folder names."""
    files = {site / "profiler" / "__init__.py": "WHOSE = 'theirs'\n",
             site / "workers.py": "WHOSE = 'theirs'\n",
             site / "migrations" / "__init__.py": "WHOSE = 'theirs'\n"}
    for f, text in files.items():
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return files


def _venv(path: Path) -> tuple[str, Path]:
    _run(sys.executable, "-m", "venv", "--without-pip", str(path))
    py = str(path / "bin" / "python")
    site = Path(_run(py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    return py, site


def _job_env(site_dir_first: list[str], spool: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MEMQ_", "PYTHON"))}
    env.update({"PYTHONPATH": os.pathsep.join(site_dir_first), "MEMQ_AGENT_RUN": "collide",
                "MEMQ_AGENT_CLUSTER": "c", "MEMQ_REDIS_URL": "redis://127.0.0.1:1/0", "MEMQ_SPOOL_DIR": str(spool)})
    return env


JOB = ("import json, sys, profiler, workers, migrations\n"
       "print(json.dumps({'whose': [profiler.WHOSE, workers.WHOSE, migrations.WHOSE],"
       " 'agent': 'memq.agent' in sys.modules}))\n")


def test_the_wheel_installs_only_memq_and_leaves_the_environments_modules_alone(tmp_path, memq_wheel):
    wheel = memq_wheel
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"memq"} and len(tops) == 2
    py, site = _venv(tmp_path / "v")
    theirs = _their_modules(site)
    _run(sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel))
    assert all(f.read_text() == text for f, text in theirs.items())
    # the job's folder has a profiler.py of its own: memq is not affected by it
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "profiler.py").write_text("WHOSE = 'the script folder'\n")
    out = _run(py, "-c", "import profiler, workers, memq.agent, memq.workers, memq.migrations; "
               "print(profiler.WHOSE, workers.WHOSE, memq.agent.__name__)", cwd=str(job_dir))
    assert out.split() == ["the", "script", "folder", "theirs", "memq.agent"]
    # memq run's start-up path from the installed wheel
    installed_site = site / "memq" / "agent" / "_site"
    env = _job_env([str(installed_site)], tmp_path / "spool")
    got = json.loads(_run(py, "-c", JOB, env=env, cwd=str(tmp_path)).strip().splitlines()[-1])
    assert got == {"whose": ["theirs"] * 3, "agent": True}


def test_memq_run_from_a_checkout_keeps_the_jobs_modules_and_starts_the_agent(tmp_path):
    """An interpreter without memq installed, given what `memq run` puts on PYTHONPATH in a
    checkout: the agent starts (the sitecustomize registers the package from its own folder) and
    the checkout's workers/, migrations/ and tests/ do not shadow the job's modules."""
    py, site = _venv(tmp_path / "v")
    _their_modules(site)
    env = bootstrap.child_env("collide", "c", environ=_job_env([], tmp_path / "spool"))
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(bootstrap.SITE_DIR)
    assert str(ROOT) not in env["PYTHONPATH"].split(os.pathsep)
    probe = JOB + "import memq; print(memq.__file__)\n"
    lines = _run(py, "-c", probe, env=env, cwd=str(tmp_path)).strip().splitlines()
    assert json.loads(lines[-2]) == {"whose": ["theirs"] * 3, "agent": True}
    assert Path(lines[-1]) == ROOT / "profiler" / "__init__.py"
