from __future__ import annotations

import fcntl
import os

import pytest

from tests.ops.wheel import build_wheel


@pytest.fixture(scope="session")
def memq_wheel(tmp_path_factory):
    """The wheel of this checkout (pip wheel --no-deps), built once for the session. Under xdist every
    worker asks for it: one builds it (setuptools builds in the source tree, so two builds at once
    collide), the others wait on the lock and take that one."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # one folder per session
    dest = shared / "memq-wheel"
    dest.mkdir(exist_ok=True)
    with open(shared / "memq-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(dest.glob("memq-*.whl"))
        return built[0] if built else build_wheel(dest)
