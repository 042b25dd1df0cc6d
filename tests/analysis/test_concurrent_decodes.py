"""Decode limits hold per decode, not per process: several threads of one process (the threads of
`memq serve`) decode snapshots at the same time and every valid one is read, the process's address-space
limit is what it was before, and the memory bombs are still refused while others decode."""

from __future__ import annotations

import functools
import resource
import subprocess
import sys
import threading
from pathlib import Path

from memq import codec
from memq.errors import TooLarge
from memq.load import decode_snapshot_bytes

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
SNAPSHOTS = [REAL / "seed_adamw" / "epoch0.pickle.gz", REAL / "frag_dynamic_1.15" / "oom.pickle.gz",
             REAL / "seed_sgd" / "epoch1.pickle.gz", REAL / "capacity" / "oom.pickle.gz"]
THREADS = 8
MIB = 1024 * 1024


def _in_threads(jobs: list) -> list:
    """Run each job in its own thread, all released at once; (ok, value or exception) per job."""
    start = threading.Barrier(len(jobs))
    out: list = [None] * len(jobs)

    def run(i, job):
        start.wait()
        try:
            out[i] = (True, job())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            out[i] = (False, exc)

    threads = [threading.Thread(target=run, args=(i, j)) for i, j in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_eight_concurrent_decodes_all_succeed_and_leave_the_limit_as_it_was():
    before = resource.getrlimit(resource.RLIMIT_AS)
    blobs = [p.read_bytes() for p in SNAPSHOTS]
    for _ in range(3):  # the race took 1-6 of 8 decodes: a few rounds make it certain
        jobs = [functools.partial(decode_snapshot_bytes, blobs[i % len(blobs)], 256 * MIB) for i in range(THREADS)]
        results = _in_threads(jobs)
        failed = [repr(v) for ok, v in results if not ok]
        assert not failed, failed
        assert all(v.snapshot.traces for _, v in results)
        assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_bombs_are_refused_while_valid_snapshots_decode_beside_them():
    before = resource.getrlimit(resource.RLIMIT_AS)
    sets = b"\x80\x04](" + b"\x8f" * (4 * MIB) + b"e."  # ~200 bytes of objects per byte: past the cap
    memo = b"\x80\x04]r\xff\xff\xff\x7f."  # LONG_BINPUT 2**31-1: the memo table zero-filled to 16 GiB
    good = SNAPSHOTS[0].read_bytes()
    jobs = [lambda: codec.loads_restricted(sets), lambda: codec.loads_restricted(memo)]
    jobs += [lambda: decode_snapshot_bytes(good, 256 * MIB) for _ in range(THREADS - 2)]
    results = _in_threads(jobs)
    assert all(not ok and isinstance(v, TooLarge) for ok, v in results[:2]), results[:2]
    failed = [repr(v) for ok, v in results[2:] if not ok]
    assert not failed, failed
    assert resource.getrlimit(resource.RLIMIT_AS) == before


def test_a_decode_that_cannot_get_its_thread_is_transient_not_the_snapshots_fault(tmp_path):
    """A process with too little address space left for the unpickling thread's stack: the decode
    says so as DecodeUnavailable (exit 1, retried by workers, 503 from memq serve, never cached),
    not as an unreadable snapshot; the same process reads it once the space is back."""
    code = (
        "import resource, sys\n"
        "from memq.errors import DecodeUnavailable\n"
        "from memq.load import decode_snapshot_bytes\n"
        f"data = open({str(SNAPSHOTS[0])!r}, 'rb').read()\n"
        "used = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "old = resource.getrlimit(resource.RLIMIT_AS)\n"
        "resource.setrlimit(resource.RLIMIT_AS, (used + 1024**3, old[1]))\n"
        "try:\n"
        "    decode_snapshot_bytes(data, 64 * 1024**2)\n"
        "    print('decoded')\n"
        "except DecodeUnavailable as exc:\n"
        "    print('unavailable', exc)\n"
        "resource.setrlimit(resource.RLIMIT_AS, old)\n"
        "print('then', len(decode_snapshot_bytes(data, 64 * 1024**2).snapshot.trace))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("unavailable cannot start the decoding thread"), p.stdout
    assert "then " in p.stdout and not p.stdout.rstrip().endswith("then 0")


def test_transient_decode_failures_are_retried_and_never_cached_as_a_page():
    from memq.errors import DecodeUnavailable
    from memq.web.app import _status, _Views
    from memq.workers.runtime import is_transient

    assert is_transient(DecodeUnavailable("no thread")) and not is_transient(TooLarge("too big"))
    assert _status(DecodeUnavailable("no thread")) == 503
    views = _Views()

    def fails():
        raise DecodeUnavailable("no thread")

    try:
        views.get(("sha", 1), fails)
    except DecodeUnavailable:
        pass
    assert views.get(("sha", 1), lambda: {"ok": True}) == {"ok": True}
