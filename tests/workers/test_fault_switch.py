"""The dispatcher's fault points (MEMQ_TEST_FAULT) fire only in a process the test harness started
(workers/faults.py): a dispatcher started normally, with the variable set, ignores it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from memq.workers.faults import FAULT_ENV, HARNESS_ENV, armed_fault, write_marker
from tests.workers.stack import REAL, Stack, wait_for

FAULT = "dispatcher:after_commit"


def test_armed_only_with_a_valid_marker_of_a_running_ancestor(tmp_path):
    marker = write_marker(tmp_path / "m")
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(marker)}) == FAULT
    assert armed_fault({HARNESS_ENV: str(marker)}) == ""  # no fault asked for
    assert armed_fault({FAULT_ENV: FAULT}) == ""  # the variable alone: a production process
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(tmp_path / "absent")}) == ""
    # a marker naming a process that is not an ancestor (a sibling, or a harness long gone)
    sibling = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(write_marker(tmp_path / "s", sibling.pid))}) == ""
    finally:
        sibling.kill()
        sibling.wait()
    # writable by others, a link to a good marker, or not a marker at all
    os.chmod(marker, 0o622)
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(marker)}) == ""
    good = write_marker(tmp_path / "good")
    (tmp_path / "link").symlink_to(good)
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(tmp_path / "link")}) == ""
    (tmp_path / "junk").write_text("memq-test-harness pid=notanumber\n")
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(tmp_path / "junk")}) == ""
    assert armed_fault({FAULT_ENV: FAULT, HARNESS_ENV: str(good)}) == FAULT


def test_a_dispatcher_started_normally_ignores_the_fault_variable(tmp_path, shared_redis):
    """The same push and the same MEMQ_TEST_FAULT: without the harness's marker the dispatcher stores
    and acknowledges the snapshot and stops cleanly; with it, it kills itself after the commit."""
    s = Stack(tmp_path, shared_redis, f"sqlite:///{tmp_path / 'memq.db'}")
    try:
        s.upgrade()
        s.memq("push", str(REAL / "seed_sgd" / "epoch0.pickle.gz"), "--run", "faultless", "--no-check")
        plain = s.start_dispatcher(consumer="plain", fault=FAULT, harness=False)
        wait_for(lambda: s.rows("SELECT count(*) FROM snapshots")[0][0] == 1 or plain.poll() is not None, 60, 0.2,
                 "the snapshot row")
        wait_for(lambda: s.redis.xpending(s.stream, "memq-dispatch")["pending"] == 0, 30, 0.2, "acknowledged")
        assert plain.poll() is None, s.log_tail("dispatcher")
        assert s.stop(plain) == 0
        assert f"{FAULT_ENV}={FAULT} ignored" in s.log_tail("dispatcher")

        s.memq("push", str(REAL / "seed_sgd" / "epoch1.pickle.gz"), "--run", "faultless", "--no-check")
        armed = s.start_dispatcher(consumer="armed", fault=FAULT)
        assert armed.wait(60) == -signal.SIGKILL, s.log_tail("dispatcher")
        assert s.rows("SELECT count(*) FROM snapshots")[0][0] == 2  # committed ...
        assert s.redis.xpending(s.stream, "memq-dispatch")["pending"] >= 1  # ... never acknowledged
    finally:
        s.close()
