"""Put on PYTHONPATH by `memq run`: starts the memq agent in every Python process of the job that
uses CUDA (see memq/agent/bootstrap.py), then runs any other `sitecustomize` further down the path."""

import importlib.util
import sys
from pathlib import Path


def _memq_importable() -> None:
    """Make `memq` importable from where this file lies when the interpreter cannot find it (a
    checkout's profiler/ folder, run by an interpreter without memq installed)."""
    if "memq" in sys.modules or importlib.util.find_spec("memq") is not None:
        return
    pkg = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("memq", pkg / "__init__.py", submodule_search_locations=[str(pkg)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules["memq"] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules["memq"]
        raise


try:
    _memq_importable()
    from memq.agent.bootstrap import autostart as _memq_autostart

    _memq_autostart()
except Exception:  # noqa: BLE001 - the job must run even if the agent cannot
    pass

try:
    from memq.agent.bootstrap import chain_sitecustomize as _memq_chain

    _memq_chain(__file__)
except Exception:  # noqa: BLE001
    pass
