"""Hostile inputs for the decode-limit tests (issue 13 items 5, 6, 9), made here, not stored.

- `zeros_gzip(n_mib)`: a gzip file of n MiB of zeros (1 GiB -> ~1 MB), built from one fully flushed
  deflate segment repeated, so making it costs a CRC and a sha256, not a compression of 1 GiB.
- `nested_frames_pickle(depth)`: a real fixture snapshot whose first block's `frames` is a list
  nested `depth` deep (the pickler itself would recurse, so the opcodes are spliced in).
- `deep_tuple_key_pickle(depth)`: a dict keyed by a tuple nested `depth` deep (hashing it recursed
  in C and crashed the unpickler with SIGSEGV).
- `peak_rss(cmd)`: run a command, return (exit code, stdout, stderr, its own peak RSS in bytes).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from profiler.codec import decompress, loads_restricted

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "fixtures" / "real"
MIB = 1024 * 1024


def zeros_gzip(n_mib: int) -> tuple[bytes, str, int]:
    """(gzip bytes, sha256 of the inflated bytes, inflated size) for n_mib MiB of zeros."""
    block = bytes(MIB)
    c = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    segment = c.compress(block) + c.flush(zlib.Z_FULL_FLUSH)  # byte-aligned, no back references
    end = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS).flush(zlib.Z_FINISH)  # an empty final block
    crc, h = 0, hashlib.sha256()
    for _ in range(n_mib):
        crc = zlib.crc32(block, crc)
        h.update(block)
    size = n_mib * MIB
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"
    data = header + segment * n_mib + end + struct.pack("<II", crc, size & 0xFFFFFFFF)
    return data, h.hexdigest(), size


def nested_frames_pickle(depth: int) -> bytes:
    raw = decompress((REAL / "frag_synthetic" / "oom.pickle.gz").read_bytes())
    snap = loads_restricted(raw)
    marker = "__NESTED_FRAMES__"
    snap["segments"][0]["blocks"][0]["frames"] = marker
    p = pickle.dumps(snap, protocol=2)  # protocol 2: no FRAME opcodes whose lengths a splice would break
    op = b"X" + struct.pack("<I", len(marker)) + marker.encode()
    assert p.count(op) == 1
    return p.replace(op, b"]" * depth + b"a" * (depth - 1))  # EMPTY_LIST x depth, APPEND x depth-1


def nested_frames_json(depth: int) -> bytes:
    return (b'{"segments": [{"address": 0, "total_size": 2097152, "stream": 0, "segment_type": "small", '
            b'"blocks": [{"address": 0, "size": 2097152, "state": "inactive", "frames": '
            + b"[" * depth + b"]" * depth + b"}]}]}")


def deep_tuple_key_pickle(depth: int) -> bytes:
    return b"\x80\x02}" + b")" + b"\x85" * depth + b"K\x01s."  # {((((),),),): 1}


def gz(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=1)


def peak_rss(args: list[str], env: dict | None = None, timeout: float = 120,
             stdin=None) -> tuple[int, str, str, int]:
    """Run `args`; (exit code, stdout, stderr, peak RSS of that one process in bytes). The child is
    reaped with wait4, whose rusage is the child's own (getrusage(RUSAGE_CHILDREN) would be the
    largest of every child this test process ever had)."""
    import tempfile
    import time

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(args, env=env, stdout=out, stderr=err, stdin=stdin, cwd=ROOT)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                p.kill()
                os.wait4(p.pid, 0)
                p.returncode = -9
                raise subprocess.TimeoutExpired(args, timeout)
            time.sleep(0.05)
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return (p.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                usage.ru_maxrss * 1024)


def memq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "profiler", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(extra)
    return env
