"""Reading snapshot files from disk: the one place analysis inputs touch the file system."""

from __future__ import annotations

import os
import select
import stat
from dataclasses import dataclass
from pathlib import Path

from memq import codec
from memq.config import load_settings
from memq.errors import NotRegularFile, SnapshotError, TooLarge
from memq.model import Snapshot
from memq.snapshot import parse_snapshot


@dataclass(frozen=True)
class LoadedSnapshot:
    path: str
    snapshot: Snapshot
    sha256: str | None  # of the uncompressed bytes, so a .gz and the plain pickle are one snapshot;
    # None when the loader was told not to hash (digest=False)
    raw_size: int  # uncompressed bytes
    raw: bytes | None = None  # the uncompressed bytes, kept only when asked for (blob store)


_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket",
          stat.S_IFDIR: "a directory"}


def read_bytes(path: str | os.PathLike, max_bytes: int, *, idle_timeout_s: float | None = None) -> bytes:
    """The bytes of a snapshot file, at most `max_bytes` of them (TooLarge past that).

    The size stat() reports is not trusted: /dev/zero says 0 and never ends, a FIFO says 0 and may
    never send. So the file is opened without blocking, checked with fstat on the open descriptor,
    and read in a loop that stops one byte past the cap. Devices, sockets and directories are
    refused; a FIFO or pipe is read under the same cap and abandoned when idle for `idle_timeout_s`
    (also when no writer ever comes; None: MEMQ_PIPE_IDLE_TIMEOUT_S, 30 s by default)."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except IsADirectoryError as exc:
        raise NotRegularFile(f"{p}: is a directory, not a snapshot file") from exc
    except FileNotFoundError as exc:
        raise SnapshotError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise SnapshotError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot open ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        kind = stat.S_IFMT(mode)
        if kind in _KINDS:
            raise NotRegularFile(f"{p}: is {_KINDS[kind]}, not a snapshot file",
                                 hint="memq reads regular files, FIFOs and pipes")
        if stat.S_ISREG(mode):
            os.set_blocking(fd, True)
            return _read_capped(fd, p, max_bytes, None)
        if idle_timeout_s is None:  # read here, not by every caller: only a pipe needs it
            idle_timeout_s = float(load_settings().pipe_idle_timeout_s)
        return _read_capped(fd, p, max_bytes, idle_timeout_s)  # FIFO / pipe: stays non-blocking
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read ({exc.strerror or exc})") from exc
    finally:
        os.close(fd)


def _read_capped(fd: int, p: Path, max_bytes: int, idle_timeout_s: float | None) -> bytes:
    buf = bytearray()
    while True:
        # A FIFO is polled before every read: until a writer connects and writes (POLLIN) or goes
        # away (POLLHUP), a non-blocking read would say EOF; nothing for idle_timeout_s ends it.
        if idle_timeout_s is not None and not _readable_within(fd, idle_timeout_s):
            raise SnapshotError(f"{p}: nothing to read for {idle_timeout_s:g} s (a FIFO or pipe with no writer, "
                                "or one that stalled)")
        try:
            chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - len(buf)))
        except BlockingIOError:
            continue
        if not chunk:
            return bytes(buf)
        buf += chunk
        if len(buf) > max_bytes:
            raise TooLarge(f"{p}: more than {max_bytes} bytes (the limit)",
                           hint="raise --max-bytes or MEMQ_DECODE_BUDGET_BYTES if it is a real snapshot")


def _readable_within(fd: int, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(int(timeout_s * 1000)))


_READ_CHUNK = 4 * 1024 * 1024


def decode_snapshot_bytes(data: bytes, max_bytes: int = codec.DEFAULT_MAX_BYTES,
                          keep_raw: bool = False, name: str = "<bytes>", digest: bool = True) -> LoadedSnapshot:
    """Compressed or plain snapshot bytes -> parsed snapshot with its content hash.

    Memory follows what the analysis keeps, not the pickle: a compressed pickle is unpickled while it
    is inflated (unless `keep_raw` asks for the inflated bytes), and the parser releases each trace
    entry as it reads it. The shape check walks everything but the trace entries, whose every kept
    value the parser checks itself (codec.check_shape's bounds, in one pass instead of two)."""
    if not data:
        raise SnapshotError("empty input")
    try:
        return _decode(data, max_bytes, keep_raw, name, digest)
    except SnapshotError:
        codec.discard_decoding_stack()  # hostile input may have used the unpickling thread's deep stack
        raise


def _decode(data: bytes, max_bytes: int, keep_raw: bool, name: str, digest: bool) -> LoadedSnapshot:
    # The parse in the same turn as the unpickling: what it allocates never eats the headroom another
    # thread's decode was given under the process-wide cap.
    with codec.decode_turn(), codec.gc_paused():
        if keep_raw:
            raw = codec.decompress(data, max_bytes)
            if not raw:
                raise SnapshotError("empty input after decompression")
            obj, sha, size = codec.decode_plain(raw, check=False), codec.sha256_hex(raw), len(raw)
        else:
            raw = None
            obj, sha, size = codec.decode_stream(data, max_bytes, check=False, digest=digest)
        codec.check_shape(snapshot_shell(obj), size)
        snap = parse_snapshot(obj, consume=True, nbytes=size)
    return LoadedSnapshot(path=name, snapshot=snap, sha256=sha, raw_size=size, raw=raw)


def snapshot_shell(obj: object) -> object:
    """The decoded snapshot without its trace entries (the part the parser does not check whole)."""
    if isinstance(obj, dict) and isinstance(obj.get("device_traces"), list):
        return {k: v for k, v in obj.items() if k != "device_traces"}
    return obj


def load_snapshot_file(path: str | os.PathLike, max_bytes: int = codec.DEFAULT_MAX_BYTES,
                       keep_raw: bool = False, digest: bool = True) -> LoadedSnapshot:
    """Errors name the file: `SnapshotError('oom.pickle: gzip data is truncated')`."""
    data = read_bytes(path, max_bytes)
    try:
        return decode_snapshot_bytes(data, max_bytes, keep_raw, name=str(path), digest=digest)
    except SnapshotError as exc:
        raise type(exc)(f"{path}: {exc.message}", hint=exc.hint) from exc
