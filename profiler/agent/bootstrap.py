"""Start the agent with no change to the training script (`memq run`).

How: `memq run --run R --cluster C -- CMD...` sets MEMQ_AGENT_RUN / MEMQ_AGENT_CLUSTER (and the
MEMQ_* settings given as options), puts `memq/agent/_site` (holding a `sitecustomize.py`) at the front
of PYTHONPATH, and the folder holding an installed `memq` package after it, and execs CMD. Python imports
`sitecustomize` at start-up in every process of the job, also under torchrun, accelerate, deepspeed
or `python -m`, and with any interpreter that finds the package. Why this and not a wrapper module:
a wrapper (`python -m memq.agent.bootstrap train.py`, also supported) only covers commands that
start with `python`, not launchers that spawn the ranks themselves.

`autostart()` is cheap and imports no torch. It skips multiprocessing children (DataLoader workers
under spawn/forkserver) and starts the agent with `announce="on_ready"`: nothing is sent until
the process initialises CUDA, so launchers and helper processes stay silent. Any `sitecustomize`
that the environment had before runs after ours (`chain_sitecustomize`). Not covered: `python -I`
/ `python -S` (isolated mode ignores PYTHONPATH / site): use the wrapper module there.
"""

from __future__ import annotations

import importlib
import json
import os
import runpy
import sys
from pathlib import Path

from memq import agent
from memq.agent.core import make_source

SITE_DIR = Path(__file__).resolve().parent / "_site"
PACKAGE_DIR = Path(__file__).resolve().parents[1]
# An installed memq lies in a folder named memq: its parent goes on the path. A checkout's package
# folder is profiler/, whose parent holds the checkout's other folders (workers, tests), which must not
# shadow the job's own modules: there the sitecustomize registers the package itself.
PACKAGE_ROOT = PACKAGE_DIR.parent if PACKAGE_DIR.name == "memq" else None

ENV_RUN, ENV_CLUSTER = "MEMQ_AGENT_RUN", "MEMQ_AGENT_CLUSTER"
ENV_JOB, ENV_OPTIONS = "MEMQ_AGENT_JOB", "MEMQ_AGENT_OPTIONS"


def _is_helper_process(argv: list[str]) -> bool:
    joined = " ".join(argv[:4])
    return "--multiprocessing-fork" in argv or "multiprocessing" in joined and argv[:1] == ["-c"]


def autostart(announce: str = "on_ready"):
    """Start the agent from the environment if MEMQ_AGENT_RUN is set; returns the agent or None."""
    env = os.environ
    if not env.get(ENV_RUN) or env.get("MEMQ_AGENT_DISABLE") == "1":
        return None
    if _is_helper_process(list(getattr(sys, "argv", []) or [])):
        return None
    options = {}
    if env.get(ENV_OPTIONS):
        try:
            options = json.loads(env[ENV_OPTIONS])
        except ValueError:
            options = {}
    if env.get(ENV_JOB):
        options.setdefault("job", env[ENV_JOB])
    if env.get("MEMQ_AGENT_SOURCE", "").startswith("replay:"):
        options.setdefault("source", make_source(env["MEMQ_AGENT_SOURCE"]))
    options.setdefault("announce", announce)
    return agent.start(run=env[ENV_RUN], cluster=env.get(ENV_CLUSTER) or "default", **options)


def chain_sitecustomize(our_file: str) -> None:
    """Import the next `sitecustomize` on sys.path (the one ours shadows), if there is one."""
    ours = str(Path(our_file).resolve().parent)
    saved_path, saved_mod = list(sys.path), sys.modules.get("sitecustomize")
    try:
        sys.path[:] = [p for p in sys.path if str(Path(p or ".").resolve()) != ours]
        sys.modules.pop("sitecustomize", None)
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved_path
        if saved_mod is not None:
            sys.modules["sitecustomize"] = saved_mod


def child_env(run: str, cluster: str, *, job: str | None = None, settings: dict | None = None,
              options: dict | None = None, environ: dict | None = None) -> dict:
    """The environment `memq run` gives the job."""
    env = dict(os.environ if environ is None else environ)
    env[ENV_RUN], env[ENV_CLUSTER] = run, cluster
    if job:
        env[ENV_JOB] = job
    for k, v in (settings or {}).items():
        if v is not None:
            env[k] = str(v)
    if options:
        env[ENV_OPTIONS] = json.dumps(options)
    ours = [str(SITE_DIR)] + ([str(PACKAGE_ROOT)] if PACKAGE_ROOT is not None else [])
    parts = ours + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def main(argv: list[str] | None = None) -> None:
    """`python -m memq.agent.bootstrap SCRIPT [ARGS]` or `... -m MODULE [ARGS]`, with MEMQ_AGENT_RUN set."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        print("usage: python -m memq.agent.bootstrap SCRIPT|-m MODULE [ARGS...]", file=sys.stderr)
        raise SystemExit(2)
    autostart(announce="on_ready")
    if argv[0] == "-m" and len(argv) > 1:
        sys.argv = argv[1:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main()
