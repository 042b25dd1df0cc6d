"""Reading snapshot files from disk: the one place analysis inputs touch the file system."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from profiler import codec
from profiler.errors import SnapshotError, TooLarge
from profiler.model import Snapshot
from profiler.snapshot import parse_snapshot


@dataclass(frozen=True)
class LoadedSnapshot:
    path: str
    snapshot: Snapshot
    sha256: str  # of the uncompressed bytes, so a .gz and the plain pickle are one snapshot
    raw_size: int  # uncompressed bytes
    raw: bytes | None = None  # the uncompressed bytes, kept only when asked for (blob store)


def read_bytes(path: str | os.PathLike, max_bytes: int) -> bytes:
    p = Path(path)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise TooLarge(f"{p}: {size} bytes exceed the limit of {max_bytes} bytes")
        return p.read_bytes()
    except IsADirectoryError as exc:
        raise SnapshotError(f"{p}: is a directory, not a snapshot file") from exc
    except FileNotFoundError as exc:
        raise SnapshotError(f"{p}: no such file") from exc
    except PermissionError as exc:
        raise SnapshotError(f"{p}: permission denied") from exc
    except OSError as exc:
        raise SnapshotError(f"{p}: cannot read ({exc.strerror or exc})") from exc


def decode_snapshot_bytes(data: bytes, max_bytes: int = codec.DEFAULT_MAX_BYTES,
                          keep_raw: bool = False, name: str = "<bytes>") -> LoadedSnapshot:
    """Compressed or plain snapshot bytes -> parsed snapshot with its content hash."""
    if not data:
        raise SnapshotError("empty input")
    raw = codec.decompress(data, max_bytes)
    if not raw:
        raise SnapshotError("empty input after decompression")
    with codec.gc_paused():
        snap = parse_snapshot(codec.decode_plain(raw))
    return LoadedSnapshot(path=name, snapshot=snap, sha256=hashlib.sha256(raw).hexdigest(),
                          raw_size=len(raw), raw=raw if keep_raw else None)


def load_snapshot_file(path: str | os.PathLike, max_bytes: int = codec.DEFAULT_MAX_BYTES,
                       keep_raw: bool = False) -> LoadedSnapshot:
    """Errors name the file: `SnapshotError('oom.pickle: gzip data is truncated')`."""
    data = read_bytes(path, max_bytes)
    try:
        return decode_snapshot_bytes(data, max_bytes, keep_raw, name=str(path))
    except SnapshotError as exc:
        raise type(exc)(f"{path}: {exc.message}", hint=exc.hint) from exc
