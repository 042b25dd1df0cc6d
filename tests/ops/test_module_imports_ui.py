"""Imports live at module level in the CLI, the web app, the report and the renderers (issue 37 item 5):
a command module imports its own dependencies, and `memq`'s LazyGroup imports only the module of the
command that runs (`memq --help` none). A function-level import there is one of the few listed here,
each lazy for the start-up time that a test below pins."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.ops.test_module_imports import function_level_imports

ROOT = Path(__file__).resolve().parents[2]
AREAS = ("profiler/cli", "profiler/web", "profiler/report", "profiler/render")
SNAPSHOT = "tests/fixtures/real/capacity/oom.pickle.gz"
SERVICES = ("sqlalchemy", "alembic", "celery", "kombu", "redis", "starlette", "uvicorn", "prometheus_client",
            "matplotlib", "torch")

#: (file, function, module) -> why it stays lazy
LAZY = {
    ("profiler/cli/__init__.py", "build_context", "memq.oom_message"):
        "`memq analyze FILE` parses no OOM message (test_analyze_json_loads_no_service_and_no_rich)",
    ("profiler/cli/_listing.py", "open_cli_store", "memq.store.connection"):
        "sqlalchemy: whatif and fit import the listing helpers for their FILE path (test_whatif_file_...)",
    ("profiler/cli/_listing.py", "table", "rich.table"):
        "rich: a --json output draws no table (test_whatif_file_json_loads_no_service_and_no_rich)",
    ("profiler/cli/analyze.py", "_emit", "memq.render.terminal"):
        "rich: `memq analyze --json` prints no report (test_analyze_json_loads_no_service_and_no_rich)",
    ("profiler/cli/whatif.py", "_from_run", "memq.pipeline.sweeps"):
        "sqlalchemy: only `--run` reads the history (test_whatif_file_json_loads_no_service_and_no_rich)",
    ("profiler/report/plots.py", "_plt", "matplotlib"):
        "when a chart is drawn, not when the web app or a report worker starts (test_the_web_app_...)",
    ("profiler/report/plots.py", "_plt", "matplotlib.pyplot"):
        "the same, after the Agg backend is chosen",
    ("profiler/render/safe.py", "rich_text", "rich.markup"):
        "rich: memq.cli imports safe_text for its error line (test_help_..., test_analyze_json_...)",
    ("profiler/render/safe.py", "safe_console_class", "rich.console"):
        "rich: as for rich_text",
    ("profiler/render/safe.py", "safe_console_class", "rich.errors"):
        "rich: as for rich_text",
    ("profiler/render/safe.py", "safe_console_class", "rich.segment"):
        "rich: as for rich_text",
}


def found_imports(root: Path) -> set[tuple[str, str, str]]:
    out = set()
    for area in AREAS:
        for f in sorted((root / area).rglob("*.py")):
            out |= {(str(f.relative_to(root)), fn, mod) for fn, mod in function_level_imports(f)}
    return out


def test_function_level_imports_are_only_the_listed_lazy_ones():
    found = found_imports(ROOT)
    assert found == set(LAZY), {"not listed": sorted(found - set(LAZY)), "gone": sorted(set(LAZY) - found)}


def test_the_checker_reports_an_unlisted_import_in_each_area(tmp_path):
    for area in AREAS:
        (tmp_path / area).mkdir(parents=True)
    (tmp_path / "profiler/cli/cmd.py").write_text("import click\n\n\ndef run():\n    from memq.store import db\n")
    (tmp_path / "profiler/web/page.py").write_text("class P:\n    async def get(self):\n        import jinja2\n")
    (tmp_path / "profiler/report/x.py").write_text("def f():\n    if True:\n        import matplotlib\n")
    (tmp_path / "profiler/render/ok.py").write_text("import re\n\n\ndef f():\n    return re\n")
    assert found_imports(tmp_path) == {("profiler/cli/cmd.py", "run", "memq.store"),
                                       ("profiler/web/page.py", "get", "jinja2"),
                                       ("profiler/report/x.py", "f", "matplotlib")}


#: a `memq ARGV` process on the console script's path, os._exit included; it prints sys.modules last
# (`python -X importtime` would miss the command module: LazyGroup imports it through importlib)
MEMQ = ("import atexit, os, sys\n"
        "def dump():\n"
        "    sys.stderr.write('MODULES ' + ' '.join(sorted(sys.modules)) + '\\n')\n"
        "    sys.stderr.flush()\n"
        "atexit.register(dump)\n"
        "_exit = os._exit\n"
        "os._exit = lambda code: (dump(), _exit(code))\n"
        "sys.argv[0] = 'memq'\n")


def loaded(*argv: str, code: str = "from memq.cli import main; main()") -> set[str]:
    p = subprocess.run([sys.executable, "-c", MEMQ + code, *argv], capture_output=True, text=True, cwd=ROOT,
                       timeout=120)
    dumps = [line for line in p.stderr.splitlines() if line.startswith("MODULES ")]
    assert p.returncode == 0 and len(dumps) == 1, p.stdout[-2000:] + p.stderr[-2000:]
    return set(dumps[0].split()[1:])


def heavy(names: set[str], extra: tuple[str, ...] = ()) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in SERVICES + extra or n in extra)


def test_help_imports_no_command_module_and_no_rich():
    names = loaded("--help")
    commands = sorted(n for n in names if n.startswith("memq.cli."))
    assert (commands, heavy(names, ("rich", "jinja2"))) == ([], [])


def test_analyze_json_loads_no_service_and_no_rich():
    names = loaded("analyze", SNAPSHOT, "--json")
    assert "memq.cli.analyze" in names and "memq.pipeline.offline" in names
    assert heavy(names, ("rich", "jinja2", "memq.oom_message", "memq.store", "memq.web")) == []


def test_whatif_file_json_loads_no_service_and_no_rich():
    names = loaded("whatif", SNAPSHOT, "--json")
    assert "memq.cli.whatif" in names and "memq.analysis.whatif" in names
    assert heavy(names, ("rich", "jinja2")) == []


def test_view_and_explain_load_no_service(tmp_path):
    view = loaded("view", SNAPSHOT, "--out", str(tmp_path / "v.html"))
    explain = loaded("explain", "CUDA out of memory. Tried to allocate 2.00 GiB.", "--json")
    assert (tmp_path / "v.html").stat().st_size > 0
    assert (heavy(view), heavy(explain, ("memq.pipeline", "memq.load"))) == ([], [])


def test_status_loads_no_celery():
    names = loaded("status", "--help")
    assert "memq.cli.status" in names and "redis" in names
    assert [n for n in names if n.split(".")[0] in ("celery", "kombu")] == []


def test_the_web_app_and_the_report_load_no_matplotlib():
    names = loaded(code="import memq.web.app, memq.report, memq.report.html, memq.report.markdown")
    assert "memq.report.plots" in names and "starlette" in names
    assert [n for n in names if n.split(".")[0] == "matplotlib"] == []
