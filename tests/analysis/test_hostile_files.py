"""Issue 13 items 5, 6 and 9 at the command line: `memq analyze` / `memq push` on files made to
hurt (a 1 MB gzip bomb, /dev/zero, FIFOs, frames nested 100k deep, a tuple key nested 1M deep).
Each ends with exit 2 and one line on stderr, in bounded memory (the process's own peak RSS, read
with wait4, stays under MEMQ_DECODE_BUDGET_BYTES), never an OOM, a hang, a RecursionError or a
crash. Real files go through `memq` as a subprocess where the exit code matters."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import pytest

from memq import codec
from memq.errors import NestedTooDeep, NotRegularFile, SnapshotError, TooLarge
from memq.load import load_snapshot_file, read_bytes
from tests.bombs import (
    MIB,
    REAL,
    clean_env,
    deep_tuple_key_pickle,
    gz,
    memq_cmd,
    nested_frames_json,
    nested_frames_pickle,
    peak_rss,
    zeros_gzip,
)

BUDGET = 256 * MIB  # -> 16 MiB of pickle admitted
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "big.pickle.gz"  # shared/fixtures/real/bench_100k


@pytest.fixture(scope="module")
def bomb(tmp_path_factory):
    """1 GiB of zeros as a ~1 MB gzip, with its correct sha256."""
    data, sha, size = zeros_gzip(1024)
    assert len(data) < 1.1 * MIB and size == 1024 * MIB
    path = tmp_path_factory.mktemp("bomb") / "zeros.pickle.gz"
    path.write_bytes(data)
    return path, sha, size


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return clean_env(MEMQ_DATA_DIR=str(tmp_path / "data"), MEMQ_CONFIG=str(tmp_path / "none.toml"),
                     MEMQ_DATABASE_URL=f"sqlite:///{tmp_path / 'h.db'}", MEMQ_DECODE_BUDGET_BYTES=str(BUDGET),
                     MEMQ_REDIS_URL="redis://127.0.0.1:1/0", **extra)  # push must refuse before Redis


def _one_line_refusal(rc: int, err: str) -> str:
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("memq: error: "), err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


# ------------------------------------------------------------------------------ bombs (item 5)


@pytest.mark.parametrize("command", ["analyze", "push"])
def test_gzip_bomb_stops_at_the_budget_in_bounded_memory(bomb, tmp_path, command):
    path, _sha, _size = bomb
    args = [command, str(path)] + (["--run", "r"] if command == "push" else [])
    rc, _out, err, rss = peak_rss(memq_cmd(*args), env=_env(tmp_path))
    line = _one_line_refusal(rc, err)
    assert f"exceeds the limit of {BUDGET // codec.DECODE_BYTES_PER_RAW_BYTE} bytes" in line
    assert rss < BUDGET, f"peak RSS {rss / MIB:.0f} MiB over the {BUDGET / MIB:.0f} MiB budget"


def test_blob_verification_streams_a_bomb_within_the_cap(bomb, tmp_path):
    """With a cap above 1 GiB the bomb is verified (sha256 and size) without ever holding its
    inflated bytes: the verifying process stays far below the 1 GiB it hashed."""
    path, sha, size = bomb
    script = ("import sys; from memq.store.blobs import BlobStore; "
              f"b = BlobStore({str(tmp_path / 'blobs')!r}, max_bytes=2 * 1024**3); "
              f"print(b.verify({sha!r}, open({str(path)!r}, 'rb').read(), size={size}))")
    rc, out, err, rss = peak_rss([sys.executable, "-c", script], env=clean_env())
    assert rc == 0, err
    assert int(out) == size
    assert rss < 200 * MIB, f"peak RSS {rss / MIB:.0f} MiB while hashing 1 GiB"


def test_inflating_past_the_cap_stops_there():
    data, sha, size = zeros_gzip(64)
    with pytest.raises(TooLarge):
        codec.decompress(data, 16 * MIB)
    with pytest.raises(TooLarge):
        codec.inflated_digest(data, size - 1)
    assert codec.inflated_digest(data, size) == (sha, size)
    assert len(codec.decompress(data, size)) == size


def test_zstd_bomb_stops_at_the_cap_and_frames_concatenate():
    import hashlib

    zeros = bytes(64 * MIB)
    data = codec.compress(zeros, "zstd")
    assert len(data) < 64 * 1024
    with pytest.raises(TooLarge):
        codec.decompress(data, 16 * MIB)
    assert codec.inflated_digest(data, 64 * MIB) == (hashlib.sha256(zeros).hexdigest(), 64 * MIB)
    two = codec.compress(b"a" * 1000, "zstd") + codec.compress(b"b" * 1000, "zstd")
    assert codec.decompress(two) == b"a" * 1000 + b"b" * 1000
    with pytest.raises(SnapshotError, match="zstd"):
        codec.decompress(data[:-10] + b"\xff" * 10)


def test_json_memory_bomb_is_too_large(tmp_path):
    """[{}, {}, ...]: 3 bytes of JSON per 64-byte dict, past 16x the input."""
    path = tmp_path / "dicts.json"
    path.write_bytes(b"[" + b"{}," * (4 * MIB) + b"{}]")
    rc, _out, err, rss = peak_rss(memq_cmd("analyze", str(path)), env=_env(tmp_path), timeout=120)
    assert "memory" in _one_line_refusal(rc, err)
    assert rss < BUDGET + 64 * MIB


def test_multi_member_gzip_and_trailing_garbage_still_inflate():
    a, b = b"first member " * 1000, b"second member" * 1000
    assert codec.decompress(gz(a) + gz(b) + b"\x00\x00junk") == a + b
    with pytest.raises(SnapshotError, match="truncated"):
        codec.decompress(gz(a)[:-20])


def test_real_snapshots_fit_the_default_budget():
    """The default budget is a quarter of the process's memory, at least 768 MiB: the smallest (64 MiB
    of pickle) admits the 100k-entry bench snapshot (21 MB), a 4 GiB worker the real 1,000,000-entry
    H200 capture (85 MB)."""
    from memq.config import MIN_DECODE_BUDGET, auto_decode_budget, load_settings, process_memory_bytes

    st = load_settings({})
    assert st.decode_budget == auto_decode_budget(process_memory_bytes())
    assert codec.raw_limit(MIN_DECODE_BUDGET) == 64 * MIB
    ld = load_snapshot_file(BENCH, max_bytes=codec.raw_limit(MIN_DECODE_BUDGET))
    assert len(ld.snapshot.trace) >= 100_000
    assert codec.raw_limit(auto_decode_budget(4 * 1024 * MIB)) > 85_113_544  # the real 1M capture
    assert load_settings({"MEMQ_DECODE_BUDGET_BYTES": str(256 * MIB)}).decode_budget == 256 * MIB


def test_the_auto_budget_is_a_quarter_of_the_memory_and_at_least_768_mib():
    from memq.config import DECODE_MEMORY_SHARE, MIN_DECODE_BUDGET, auto_decode_budget

    edge = MIN_DECODE_BUDGET * DECODE_MEMORY_SHARE
    assert auto_decode_budget(edge - 4096) == MIN_DECODE_BUDGET  # just under: the floor
    assert auto_decode_budget(edge + 4096) == (edge + 4096) // 4  # just over: a quarter
    assert auto_decode_budget(None) == MIN_DECODE_BUDGET  # memory unknown


def test_the_process_memory_is_the_cgroup_limit_or_the_machine(tmp_path, monkeypatch):
    from memq import config

    phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = tmp_path / "memory.max"
    monkeypatch.setattr(config, "_CGROUP_LIMITS", (str(limit),))
    limit.write_text("max\n")  # cgroup v2 with no limit
    assert config.process_memory_bytes() == phys
    limit.write_text(f"{2 * 1024 * MIB}\n")
    assert config.process_memory_bytes() == 2 * 1024 * MIB
    limit.write_text(f"{phys * 4}\n")  # cgroup v1 "no limit" is a huge number
    assert config.process_memory_bytes() == phys


# ------------------------------------------------------------------------------ devices, FIFOs (item 6)


@pytest.mark.parametrize("command", ["analyze", "push"])
def test_dev_zero_is_refused_at_once(tmp_path, command):
    extra = ["--max-bytes", "10MB"] if command == "analyze" else ["--run", "r"]
    args = [command, "/dev/zero", *extra]
    rc, _out, err, rss = peak_rss(memq_cmd(*args), env=_env(tmp_path), timeout=60)
    assert "character device" in _one_line_refusal(rc, err)
    assert rss < BUDGET


def test_fifo_without_a_writer_does_not_hang(tmp_path):
    """It waits MEMQ_PIPE_IDLE_TIMEOUT_S (30 s unless set) for a writer, then gives up with one line.
    The commands run with 2 s (the same code path; the 30 s default is asserted below), and must not
    have given up before it."""
    from concurrent.futures import ThreadPoolExecutor

    from memq.config import load_settings

    assert load_settings(_env(tmp_path)).pipe_idle_timeout_s == 30  # the product's default
    fifo = tmp_path / "snap.fifo"
    os.mkfifo(fifo)
    commands = (["analyze", str(fifo)], ["push", str(fifo), "--run", "r"])
    env = _env(tmp_path, MEMQ_PIPE_IDLE_TIMEOUT_S="2")

    def run(command):
        t0 = time.monotonic()
        return (*peak_rss(memq_cmd(*command), env=env, timeout=120), time.monotonic() - t0)

    with ThreadPoolExecutor(len(commands)) as pool:  # both wait out the idle limit at once
        results = list(pool.map(run, commands))
    for rc, _out, err, _rss, took in results:
        assert "nothing to read for 2 s" in _one_line_refusal(rc, err)
        assert took >= 2.0, took


def test_fifo_whose_writer_comes_late_is_read(tmp_path):
    fifo = tmp_path / "late.fifo"
    os.mkfifo(fifo)
    data = (REAL / "frag_synthetic" / "oom.pickle.gz").read_bytes()

    def write_later():
        time.sleep(0.5)  # the reader is already waiting
        with open(fifo, "wb") as fh:
            fh.write(data)

    t = threading.Thread(target=write_later, daemon=True)
    t.start()
    assert read_bytes(fifo, 10 * MIB) == data
    t.join(10)


def test_fifo_with_a_writer_is_read(tmp_path):
    """A pipe is a fine way to hand memq a snapshot (`memq analyze <(zcat x.gz)`): it is read, capped."""
    fifo = tmp_path / "snap.fifo"
    os.mkfifo(fifo)
    data = (REAL / "frag_synthetic" / "oom.pickle.gz").read_bytes()

    def write():
        with open(fifo, "wb") as fh:
            fh.write(data)

    t = threading.Thread(target=write, daemon=True)
    t.start()
    rc, out, err, _rss = peak_rss(memq_cmd("analyze", str(fifo), "--json"), env=_env(tmp_path), timeout=60)
    t.join(10)
    assert rc == 0, err
    assert '"schema": 1' in out


def test_a_fifo_that_never_ends_stops_at_the_cap(tmp_path):
    fifo = tmp_path / "zeros.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def write():
        with open(fifo, "wb") as fh:
            while not stop.is_set():
                try:
                    fh.write(bytes(MIB))
                except BrokenPipeError:
                    return

    t = threading.Thread(target=write, daemon=True)
    t.start()
    try:
        with pytest.raises(TooLarge, match="more than 10000000 bytes"):
            read_bytes(fifo, 10_000_000)
    finally:
        stop.set()
        t.join(10)


def test_a_stalled_writer_is_abandoned_after_the_idle_timeout(tmp_path):
    fifo = tmp_path / "stall.fifo"
    os.mkfifo(fifo)
    opened = threading.Event()
    release = threading.Event()

    def hold_open():
        fd = os.open(fifo, os.O_RDWR)  # a writer that never writes (O_RDWR: does not wait for a reader)
        opened.set()
        release.wait(30)
        os.close(fd)

    t = threading.Thread(target=hold_open, daemon=True)
    t.start()
    assert opened.wait(10)
    try:
        with pytest.raises(SnapshotError, match="nothing to read"):
            read_bytes(fifo, 10_000_000, idle_timeout_s=0.3)
    finally:
        release.set()
        t.join(10)


def test_directories_and_devices_are_not_snapshot_files(tmp_path):
    with pytest.raises(NotRegularFile, match="directory"):
        read_bytes(tmp_path, 1000)
    with pytest.raises(NotRegularFile, match="character device"):
        read_bytes("/dev/null", 1000)


def test_a_file_larger_than_the_cap_is_refused_without_trusting_its_size(tmp_path):
    p = tmp_path / "big.pickle"
    p.write_bytes(b"\x80" * 5000)
    with pytest.raises(TooLarge):
        read_bytes(p, 4999)
    assert read_bytes(p, 5000) == b"\x80" * 5000


# ------------------------------------------------------------------------------ nesting (item 9)


@pytest.mark.parametrize("case", ["pickle 100k deep", "gzip pickle 100k deep", "json 100k deep", "json 150 deep",
                                  "tuple key 1M deep"])
def test_deep_nesting_is_bad_input_not_a_crash(tmp_path, case):
    data = {"pickle 100k deep": lambda: nested_frames_pickle(100_000),
            "gzip pickle 100k deep": lambda: gz(nested_frames_pickle(100_000)),
            "json 100k deep": lambda: nested_frames_json(100_000),
            "json 150 deep": lambda: nested_frames_json(150),  # under Python's limit, over ours
            "tuple key 1M deep": lambda: deep_tuple_key_pickle(1_000_000)}[case]()
    path = tmp_path / "deep.snapshot"
    path.write_bytes(data)
    rc, _out, err, _rss = peak_rss(memq_cmd("analyze", str(path)), env=_env(tmp_path), timeout=120)
    assert "nests" in _one_line_refusal(rc, err), err


def test_nesting_is_refused_by_the_decoder_itself():
    with pytest.raises(NestedTooDeep):
        codec.decode_plain(nested_frames_pickle(codec.MAX_NESTING + 5))
    with pytest.raises(NestedTooDeep):
        codec.decode_plain(nested_frames_json(codec.MAX_NESTING + 5))
    with pytest.raises(NestedTooDeep):
        codec.loads_restricted(deep_tuple_key_pickle(300_000))
    assert codec.decode_plain(nested_frames_json(20))  # shallow enough: accepted


def test_shared_containers_are_refused():
    """A pickle can reference one list from many places (memo); walking such a DAG as a tree blows
    up exponentially. 40 levels of [x, x] is 2^40 paths from 300 bytes."""
    body = b"\x80\x02]q\x00"  # EMPTY_LIST, BINPUT 0
    for i in range(40):
        body += b"(h" + bytes([i]) + b"h" + bytes([i]) + b"lq" + bytes([i + 1])  # [m[i], m[i]] -> m[i+1]
    data = body + b"."
    with pytest.raises(SnapshotError, match="reuses containers"):
        codec.loads_restricted(data)


def test_real_snapshots_pass_the_shape_check():
    for p in sorted(REAL.glob("*/*.pickle.gz")):
        raw = codec.decompress(p.read_bytes())
        codec.check_shape(codec.loads_restricted(raw), len(raw))


def test_memory_bomb_pickle_is_too_large_not_an_oom(tmp_path):
    """1 byte per empty set (EMPTY_SET, APPENDS into a list) builds ~200 bytes of objects per byte:
    past 16x the pickle the address-space cap turns it into TooLarge (exit 2)."""
    n = 8 * MIB
    data = b"\x80\x04](" + b"\x8f" * n + b"e."
    path = tmp_path / "sets.pickle"
    path.write_bytes(data)
    rc, _out, err, rss = peak_rss(memq_cmd("analyze", str(path)), env=_env(tmp_path), timeout=120)
    assert "memory" in _one_line_refusal(rc, err)
    assert rss < BUDGET + 64 * MIB

