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

import pytest

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


def test_an_unpickling_thread_that_ends_without_answering_stops_no_later_decode():
    """The unpickling thread ends while a decode waits on it (here: an item it cannot read, which ends
    it outside its try), and a stop is then left for it though it is gone. The waiting decode says
    DecodeUnavailable instead of holding the decode turn for good, and the next decode gets a new
    thread that the stale stop does not end. Run in its own process: before, it hung there."""
    code = (
        "import threading\n"
        "from memq import codec\n"
        "from memq.errors import DecodeUnavailable\n"
        "u = codec._UNPICKLING\n"
        "u._start()\n"
        "go = threading.Event()\n"
        "u._jobs.put((go.wait, {}, threading.Event()))\n"  # keeps the thread busy until go
        "u._jobs.put('not a job')\n"  # then ends it outside its try, before it reaches the decode
        "threading.Timer(0.3, go.set).start()\n"
        "gone = u._thread\n"
        "try:\n"
        "    u.run(lambda: 'value', 1 << 20)\n"
        "    print('answered')\n"
        "except DecodeUnavailable as exc:\n"
        "    print('unavailable', exc.message)\n"
        "u._thread = gone\n"
        "u.retire()\n"  # a stop left for a thread that has already ended
        "print('then', u.run(lambda: 'value', 1 << 20))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["unavailable the decoding thread ended without an answer", "then value"], p.stdout


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


@pytest.mark.slow  # about 90 s here: three 100k-entry snapshots ingested and served
def test_memq_serve_reads_valid_snapshots_opened_at_once(tmp_path):
    """The attack through the real server: eight snapshot pages of a fresh history requested at the
    same moment (each decodes its stored blob on the server's threads) all show their snapshot; none
    says it cannot be read, then or on a later open."""
    import json
    import signal
    import socket
    import time
    import urllib.request

    from tests.bombs import clean_env

    env = clean_env(MEMQ_DATABASE_URL=f"sqlite:///{tmp_path / 'h.db'}", MEMQ_DATA_DIR=str(tmp_path / "data"),
                    MEMQ_BLOB_DIR=str(tmp_path / "blobs"), MEMQ_CONFIG=str(tmp_path / "none.toml"),
                    MEMQ_SERVE_TOKEN="")
    # the real 100k-entry snapshot made three distinct files (one entry's time moved), which take the
    # server long enough to decode that the decodes overlap, and five small real snapshots
    import gzip
    import pickle

    big_file = REAL.parents[2] / "benchmarks" / "data" / "big.pickle.gz"
    big = codec.loads_restricted(codec.decompress(big_file.read_bytes()))
    files = sorted(REAL.glob("*/*.pickle.gz"))[:THREADS - 3]
    for i in range(3):
        big["device_traces"][0][-1]["time_us"] += 1
        files.append(tmp_path / f"big{i}.pickle.gz")
        files[-1].write_bytes(gzip.compress(pickle.dumps(big, protocol=4), 1))  # our own data, pickled here
    del big
    for i, f in enumerate(files):
        subprocess.run([sys.executable, "-m", "memq", "ingest", str(f), "--run", f"r{i}", "--json"], env=env,
                       check=True, capture_output=True, timeout=120)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # faulthandler: a server that stops answering is made to print every thread's stack (SIGABRT)
    log = open(tmp_path / "serve.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "memq", "serve", "--port", str(port), "--log-level", "warning"],
                            env={**env, "PYTHONFAULTHANDLER": "1"}, start_new_session=True, stderr=log)
    base = f"http://127.0.0.1:{port}"

    def stacks() -> str:
        if proc.poll() is None:
            proc.send_signal(signal.SIGABRT)
            proc.wait(30)
        return (tmp_path / "serve.log").read_text(errors="replace")[-20000:]

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(base + "/healthz", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.2)

        def page(sid: int):
            with urllib.request.urlopen(f"{base}/api/snapshots/{sid}", timeout=120) as r:
                return json.loads(r.read())

        for _ in range(2):  # at once, then again from the server's cache
            results = _in_threads([functools.partial(page, sid) for sid in range(1, len(files) + 1)])
            failed = [repr(v) for ok, v in results if not ok]
            assert not failed, f"{failed}\nthe server's threads:\n{stacks()}"
            errors = [v["view"].get("blob_error") for _, v in results]
            assert errors == [None] * len(files), errors
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"memq serve did not stop on SIGTERM; its threads:\n{stacks()}")
        finally:
            log.close()
