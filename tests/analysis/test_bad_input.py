"""Untrusted input: nothing executes, every failure is exit code 2 with one line naming the file."""

from __future__ import annotations

import gzip
import os
import pickle
import random
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from memq import codec
from memq.errors import RefusedPickle, SnapshotError, TooLarge
from memq.load import decode_snapshot_bytes
from tests.helpers import REAL

ROOT = Path(__file__).resolve().parents[2]


def _evil_pickle(marker) -> bytes:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    return pickle.dumps({"segments": [], "x": Evil()})


def test_restricted_unpickler_refuses_globals_and_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"
    with pytest.raises(RefusedPickle, match="posix.system|os.system"):
        codec.decode(_evil_pickle(marker))
    assert not marker.exists()


def test_plain_snapshot_pickles_still_load():
    raw = pickle.dumps({"segments": [], "device_traces": [[]], "t": (1, 2), "b": b"x", "f": 1.5, "n": None})
    assert codec.decode(raw)["t"] == (1, 2)


def test_gzip_bomb_stops_at_the_limit():
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024))
    with pytest.raises(TooLarge):
        codec.decode(bomb, max_bytes=1024 * 1024)


def test_zstd_bomb_stops_at_the_limit():
    bomb = codec.compress(b"\0" * (64 * 1024 * 1024), "zstd")
    with pytest.raises(TooLarge):
        codec.decode(bomb, max_bytes=1024 * 1024)


@pytest.mark.parametrize("data,match", [
    (b"", "empty"),
    (random.Random(7).randbytes(4096), "not a snapshot|not a readable pickle|not valid JSON"),
    (gzip.compress(b"hello world"), "not a snapshot"),
    (gzip.compress(pickle.dumps({"segments": []}))[:-12], "truncated|corrupt"),
    (pickle.dumps({"segments": []})[:-3], "not a readable pickle"),
    (pickle.dumps([1, 2, 3]), "segment 0 is not a dict"),
    (pickle.dumps({"device_traces": []}), "no 'segments'"),
    (pickle.dumps({"segments": [{"total_size": "big"}]}), "not an integer"),
    (pickle.dumps({"segments": [{"total_size": 10, "blocks": [{"size": 10, "state": "weird"}]}]}), "unknown state"),
    (pickle.dumps(42), "expected a snapshot"),
    (b"{not json", "not valid JSON"),
    (zlib.compress(b"abc"), "not a snapshot"),
], ids=lambda v: v if isinstance(v, str) else f"{len(v)}B")
def test_bad_bytes_raise_snapshot_error(data, match):
    with pytest.raises(SnapshotError, match=match):
        decode_snapshot_bytes(data)


def _memq(*args, **kw):
    return subprocess.run([sys.executable, "-m", "memq", *args], capture_output=True, text=True, timeout=120,
                          **kw)


@pytest.mark.parametrize("content,fragment", [
    (b"", "empty input"),
    (b"\x80\x04\x95garbage", "not a readable pickle"),
    (b"random text that is not a snapshot", "not a snapshot"),
])
def test_cli_bad_file_exit_2_one_line(tmp_path, content, fragment):
    f = tmp_path / "bad.pickle"
    f.write_bytes(content)
    p = _memq("analyze", str(f))
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and str(f) in lines[0] and fragment in lines[0], p.stderr
    assert "Traceback" not in p.stderr


def test_cli_malicious_pickle_refused_and_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    f = tmp_path / "evil.pickle"
    f.write_bytes(_evil_pickle(marker))
    p = _memq("analyze", str(f), "--json")
    assert p.returncode == 2 and "refers to" in p.stderr and str(f) in p.stderr
    assert not marker.exists()
    assert p.stdout == ""


def test_cli_too_large_and_missing_files(tmp_path):
    p = _memq("analyze", str(REAL / "capacity" / "oom.pickle.gz"), "--max-bytes", "1KiB")
    assert p.returncode == 2 and "limit" in p.stderr
    p = _memq("analyze", str(tmp_path / "nope.pickle"))
    assert p.returncode == 2 and "no such file" in p.stderr
    p = _memq("analyze", str(tmp_path))
    assert p.returncode == 2 and "directory" in p.stderr


def test_cli_bad_size_option():
    p = _memq("analyze", str(REAL / "capacity" / "oom.pickle.gz"), "--limit", "lots")
    assert p.returncode == 2 and "lots" in p.stderr and "Traceback" not in p.stderr


def test_tampered_memo_index_cannot_exhaust_memory():
    # LONG_BINPUT with index 0xF0000000: the C unpickler would zero-fill a ~64 GiB memo table.
    code = (
        "import struct, sys\n"
        "from memq.errors import TooLarge\n"
        "from memq import codec\n"
        "data = b'\\x80\\x04N' + b'r' + struct.pack('<I', 0xF0000000) + b'.'\n"
        "try:\n"
        "    codec.loads_restricted(data)\n"
        "except TooLarge as e:\n"
        "    print('refused', e)\n"
        # this program's own peak: ru_maxrss would keep that of the pytest process it was forked
        # from across exec (1.1 GB after the big-snapshot tests)
        "from tests.bombs import own_peak_rss\n"
        "rss = own_peak_rss()\n"
        "print('rss', rss)\n"
        "sys.exit(0 if rss < 1024**3 else 1)\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 0 and "refused" in p.stdout, p.stdout + p.stderr
