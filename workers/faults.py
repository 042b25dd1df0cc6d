"""Fault points for the crash tests (tests/workers/test_worker_faults.py), unreachable in production.

`MEMQ_TEST_FAULT=dispatcher:after_commit` makes a dispatcher SIGKILL itself at that point. A variable
left in a production environment (a copied unit file, an exported shell) must not do that, so the
fault is armed only when the process proves that the test harness started it, and every check
fails closed (no fault):
- `MEMQ_TEST_HARNESS` names a marker file: a regular file (not a link), owned by this process's
  user and writable by nobody else;
- the marker reads `memq-test-harness pid=<N>`, and N is this process or one of its ancestors
  (the harness that wrote it, still running: a stale marker from an earlier run arms nothing);
  ancestors are read from /proc, so elsewhere than Linux nothing is armed.
A fault variable that is not armed is logged once and ignored.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("memq.workers")

FAULT_ENV = "MEMQ_TEST_FAULT"
HARNESS_ENV = "MEMQ_TEST_HARNESS"
MAGIC = "memq-test-harness"
_MAX_DEPTH = 64


def write_marker(path: Path, pid: int | None = None) -> Path:
    """The harness's side: a marker that arms faults in the processes started below `pid`
    (default: the calling process)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(f"{MAGIC} pid={os.getpid() if pid is None else int(pid)}\n")
    os.chmod(path, 0o600)
    return path


def _parent(pid: int) -> int | None:
    text = Path(f"/proc/{pid}/stat").read_text()
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ')'
    return int(text[text.rindex(")") + 2:].split()[1])


def _ancestors() -> set[int]:
    seen, pid = {os.getpid()}, os.getppid()
    for _ in range(_MAX_DEPTH):
        if pid in seen or pid <= 0:
            break
        seen.add(pid)
        if pid == 1:
            break
        pid = _parent(pid)
    return seen


def _harness_pid(path: str) -> int | None:
    info = os.lstat(path)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return None
    with open(path, encoding="ascii") as fh:
        words = fh.read(200).split()
    if len(words) != 2 or words[0] != MAGIC or not words[1].startswith("pid="):
        return None
    return int(words[1][4:])


def armed_fault(environ: Mapping[str, str] | None = None) -> str:
    """The fault point to honour, or '' (see the module docstring)."""
    env = os.environ if environ is None else environ
    fault = env.get(FAULT_ENV, "")
    if not fault:
        return ""
    try:
        harness = _harness_pid(env.get(HARNESS_ENV, "")) if env.get(HARNESS_ENV) else None
        if harness is not None and harness in _ancestors():
            return fault
    except (OSError, ValueError):  # unreadable, vanished, garbage, no /proc: not armed
        pass
    log.warning("%s=%s ignored: this process was not started by the memq test harness (%s)", FAULT_ENV, fault,
                HARNESS_ENV)
    return ""
