"""`memq run` starts the agent in the job's Python processes with no code change (sitecustomize)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from memq.agent.bootstrap import _is_helper_process, child_env

from .conftest import REAL, entries

SCRIPT = """
import sys
from memq import agent
a = agent.current()
assert a is not None and a.announce == "on_ready", a
print("RUN", a.run, a.cluster, a.identity["job"])
for step in range(4):
    agent.mark_step(step, 0)
agent.mark_epoch(0)
"""


def _env(stream, prefix, tmp_path, **extra):
    env = dict(os.environ, MEMQ_STREAM=stream, MEMQ_KEY_PREFIX=prefix, MEMQ_SPOOL_DIR=str(tmp_path / "spool"),
               MEMQ_AGENT_SOURCE=f"replay:{REAL / 'seed_adamw'}", MEMQ_AGENT_SIGNAL="")
    env.update(extra)
    return env


def test_memq_run_starts_the_agent_in_the_child(shared, tmp_path):
    r, prefix, stream = shared
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, "-m", "memq", "run", "--run", "no-code-change", "--cluster", "c1",
                          "--job", "j42", "--", sys.executable, str(script)],
                         env=_env(stream, prefix, tmp_path), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "RUN no-code-change c1 j42" in out.stdout
    got = entries(r, stream)
    assert [e.kind for e in got][0] == "run_start" and got[-1].kind == "run_end"
    assert {e.run for e in got} == {"no-code-change"} and {e.job for e in got} == {"j42"}
    assert [e.trigger for e in got if e.kind == "snapshot"] == ["periodic", "epoch_end"]


def test_memq_run_keeps_the_exit_status_and_an_existing_sitecustomize(shared, tmp_path):
    r, prefix, stream = shared
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "sitecustomize.py").write_text("import os\nos.environ['THEIRS_RAN'] = '1'\n")
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nprint('THEIRS', os.environ.get('THEIRS_RAN'))\nsys.exit(7)\n")
    env = _env(stream, prefix, tmp_path, PYTHONPATH=str(theirs))
    out = subprocess.run([sys.executable, "-m", "memq", "run", "--run", "x", "--cluster", "c", "--",
                          sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 7 and "THEIRS 1" in out.stdout, out.stderr


def test_memq_run_unknown_command_is_bad_input():
    out = subprocess.run([sys.executable, "-m", "memq", "run", "--run", "x", "--cluster", "c", "--",
                          "no-such-command-xyz"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "command not found" in out.stderr


@pytest.mark.parametrize(("field", "value"), [("--run", "bad\x1b]0;x\x07"), ("--cluster", ""), ("--job", "j" * 201)])
def test_memq_run_refuses_names_ingest_and_push_refuse(field, value):
    """Issue 23 item 8: `memq run` accepted names the dispatcher then dead-letters (hours later)."""
    args = {"--run": "x", "--cluster": "c"} | {field: value}
    argv = [a for kv in args.items() for a in kv]
    out = subprocess.run([sys.executable, "-m", "memq", "run", *argv, "--", sys.executable, "-c", "pass"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "name" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_memq_run_without_a_gpu_says_so_and_still_runs_the_command():
    """Issue 23 item 8: with no GPU `memq run` was silent (no run, no warning). CUDA_VISIBLE_DEVICES=""
    hides every device on any machine, as a CPU-only one has none."""
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "memq", "run", "--run", "x", "--cluster", "c", "--",
                          sys.executable, "-c", "print('RAN')"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0 and "RAN" in out.stdout
    assert "no GPU device is visible" in out.stderr and "'x' will have no data" in out.stderr


def test_child_env_and_helper_detection(tmp_path):
    env = child_env("r", "c", job="j", settings={"MEMQ_REDIS_URL": "rediss://:pw@h:6380/0", "MEMQ_SPOOL_DIR": None},
                    environ={"PYTHONPATH": "/keep/me"})
    assert env["MEMQ_AGENT_RUN"] == "r" and env["MEMQ_AGENT_JOB"] == "j"
    assert env["MEMQ_REDIS_URL"] == "rediss://:pw@h:6380/0" and "MEMQ_SPOOL_DIR" not in env
    parts = env["PYTHONPATH"].split(os.pathsep)
    assert parts[0].endswith(os.path.join("agent", "_site")) and parts[-1] == "/keep/me"
    assert _is_helper_process(["-c", "--multiprocessing-fork", "tracker_fd=5"])
    assert _is_helper_process(["-c", "from multiprocessing.forkserver import main; main()"])
    assert not _is_helper_process(["train.py", "--epochs", "3"])


def test_spawned_dataloader_style_children_start_no_agent(tmp_path):
    code = """
import multiprocessing as mp
from memq import agent

def child(q):
    from memq import agent as a
    q.put(a.current() is None)

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); p.join()
    print("PARENT", agent.current() is not None, "CHILD_NONE", q.get())
"""
    script = tmp_path / "mp.py"
    script.write_text(code)
    env = child_env("r", "c", environ=dict(os.environ, MEMQ_SPOOL_DIR=str(tmp_path / "s"),
                                           MEMQ_REDIS_URL="redis://127.0.0.1:1/0", MEMQ_AGENT_SIGNAL=""))
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert "PARENT True CHILD_NONE True" in out.stdout, out.stderr
