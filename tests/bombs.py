"""Hostile inputs for the decode-limit tests (issue 13 items 5, 6, 9), made here, not stored.

- `zeros_gzip(n_mib)`: a gzip file of n MiB of zeros (1 GiB -> ~1 MB), built from one fully flushed
  deflate segment repeated, so making it costs a CRC and a sha256, not a compression of 1 GiB.
- `nested_frames_pickle(depth)`: a real fixture snapshot whose first block's `frames` is a list
  nested `depth` deep (the pickler itself would recurse, so the opcodes are spliced in).
- `deep_tuple_key_pickle(depth)`: a dict keyed by a tuple nested `depth` deep (hashing it recursed
  in C and crashed the unpickler with SIGSEGV).
- `peak_rss(cmd)`: run a command, return (exit code, stdout, stderr, its own peak RSS in bytes).
- `reset_peak_rss()` / `own_peak_rss()`: this process's peak RSS since the last reset (Linux's
  VmHWM, reset through /proc/self/clear_refs), for checks inside a long-lived test process.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import pickle
import signal
import struct
import subprocess
import sys
import zlib
from pathlib import Path

from memq.codec import decompress, loads_restricted

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


# Linux carries a process's peak RSS across fork and exec (the forked copy of the parent's memory
# counts), so a child forked straight from a big pytest process reports pytest's peak. A small
# wrapper process forks the command instead and reports the command's own peak (wait4's rusage).
_WRAPPER = """
import os, sys
out, args = sys.argv[1], sys.argv[2:]
pid = os.fork()
if pid == 0:
    try:
        os.execv(args[0], args)
    finally:
        os._exit(127)
_pid, status, usage = os.wait4(pid, 0)
with open(out, "w") as fh:
    fh.write(str(usage.ru_maxrss * 1024))
code = os.waitstatus_to_exitcode(status)
sys.exit(code if code >= 0 else 128 - code)
"""


def peak_rss(args: list[str], env: dict | None = None, timeout: float = 120,
             stdin=None) -> tuple[int, str, str, int]:
    """Run `args`; (exit code, stdout, stderr, peak RSS of that one process in bytes). A command
    killed by signal N exits 128 + N."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        rss_file = os.path.join(tmp, "rss")
        p = subprocess.Popen([sys.executable, "-c", _WRAPPER, rss_file, *args], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, stdin=stdin, cwd=ROOT, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)  # the wrapper and the command
            p.communicate()
            raise
        rss = int(Path(rss_file).read_text()) if os.path.exists(rss_file) else -1
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace"), rss


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def reset_peak_rss() -> int:
    """Make this process's peak RSS its current RSS (what earlier tests in the same process held
    must not count); returns that RSS in bytes."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    return _status_kib("VmRSS") * 1024


def own_peak_rss() -> int:
    """This process's peak RSS in bytes since it started or since reset_peak_rss(). Unlike
    getrusage's ru_maxrss it is the memory map's own figure, so it does not carry the peak of the
    process a child was forked from across exec."""
    return _status_kib("VmHWM") * 1024


def memq_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "memq", *args]


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(extra)
    return env
