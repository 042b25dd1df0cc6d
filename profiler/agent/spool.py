"""Bounded on-disk spool for messages Redis could not take.

One file per message, named `<seq:012d>.mqs` so that name order is send order. A file is written
to a temporary name, flushed (fsync unless disabled) and renamed, so a crash leaves either the whole
message or nothing. When the spool would exceed `max_bytes`, the oldest files are deleted and
counted as dropped. A new message that alone exceeds `max_bytes` is dropped.

File format (plain data only, never pickled objects):
    b"MQS1" | u32 big-endian header length | header JSON | blob bytes (compressed, may be empty)
header JSON: {"fields": {stream fields, all str}, "blob_key": str|null}
"""

from __future__ import annotations

import json
import os
import re
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"MQS1"
SUFFIX = ".mqs"


@dataclass(frozen=True)
class Message:
    """One outgoing unit: stream fields plus, for snapshots, the compressed blob and its key."""

    fields: dict
    blob: bytes | None = None
    blob_key: str | None = None

    def size(self) -> int:
        return len(self.blob or b"") + sum(len(k) + len(v) for k, v in self.fields.items())


def encode(msg: Message) -> bytes:
    header = json.dumps({"fields": msg.fields, "blob_key": msg.blob_key}, separators=(",", ":")).encode()
    return MAGIC + struct.pack(">I", len(header)) + header + (msg.blob or b"")


def decode(data: bytes) -> Message:
    if data[:4] != MAGIC or len(data) < 8:
        raise ValueError("not a memq spool file")
    (n,) = struct.unpack(">I", data[4:8])
    header = json.loads(data[8:8 + n])
    fields = header["fields"]
    if not isinstance(fields, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items()):
        raise ValueError("spool file fields must be strings")
    blob = data[8 + n:]
    return Message(fields=fields, blob=blob if header.get("blob_key") else None, blob_key=header.get("blob_key"))


class Spool:
    """A folder of messages. Thread-safe; used by the transport thread (and by replays)."""

    def __init__(self, path: str | os.PathLike, max_bytes: int, fsync: bool = True):
        self.path = Path(path)
        self.max_bytes = int(max_bytes)
        self.fsync = fsync
        self.dropped = 0
        self._lock = threading.Lock()
        self._files: list[tuple[str, int]] = []  # (name, size), oldest first
        self._seq = 0
        self._ready = False

    def _ensure(self) -> None:
        if self._ready:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        files = []
        for p in self.path.iterdir():
            if p.suffix == SUFFIX and p.name[:12].isdigit():
                try:
                    files.append((p.name, p.stat().st_size))
                except OSError:
                    pass
            elif p.name.startswith(".tmp-"):
                try:  # a write interrupted by a crash
                    p.unlink()
                except OSError:
                    pass
        files.sort()
        self._files = files
        self._seq = int(files[-1][0][:12]) + 1 if files else 0
        self._ready = True

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(s for _, s in self._files)

    def put(self, msg: Message) -> bool:
        """Append; returns False when the message itself was dropped. Raises OSError on disk errors."""
        data = encode(msg)
        with self._lock:
            self._ensure()
            if len(data) > self.max_bytes:
                self.dropped += 1
                return False
            total = sum(s for _, s in self._files)
            while self._files and total + len(data) > self.max_bytes:
                name, size = self._files.pop(0)
                try:
                    (self.path / name).unlink()
                except FileNotFoundError:
                    pass
                total -= size
                self.dropped += 1
            name = f"{self._seq:012d}{SUFFIX}"
            self._write(name, data)
            self._seq += 1
            self._files.append((name, len(data)))
            return True

    def keep_aside(self, relpath: str, data: bytes) -> str | None:
        """Write `data` under this spool folder, outside the queue (a snapshot too big to send), when
        what is kept aside stays within the spool's size cap. Returns the path, or None (not kept)."""
        target = self.path / relpath
        with self._lock:
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                held = sum(p.stat().st_size for p in target.parent.iterdir() if p.is_file())
                if held + len(data) > self.max_bytes:
                    return None
                tmp = target.parent / f".tmp-{target.name}"
                tmp.write_bytes(data)
                os.replace(tmp, target)
            except OSError:
                return None
        return str(target)

    def _write(self, name: str, data: bytes) -> None:
        tmp = self.path / f".tmp-{name}"
        with open(tmp, "wb") as fh:
            fh.write(data)
            if self.fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self.path / name)

    def peek(self) -> tuple[str, Message] | None:
        """The oldest message (name, message), or None. Unreadable files are deleted and counted."""
        while True:
            with self._lock:
                self._ensure()
                if not self._files:
                    return None
                name = self._files[0][0]
            try:
                return name, decode((self.path / name).read_bytes())
            except (OSError, ValueError, KeyError, TypeError):
                self.remove(name)
                with self._lock:
                    self.dropped += 1

    def remove(self, name: str) -> None:
        with self._lock:
            self._files = [(n, s) for n, s in self._files if n != name]
            try:
                (self.path / name).unlink()
            except FileNotFoundError:
                pass

    def __iter__(self) -> Iterator[tuple[str, Message]]:
        with self._lock:
            self._ensure()
            names = [n for n, _ in self._files]
        for name in names:
            try:
                yield name, decode((self.path / name).read_bytes())
            except (OSError, ValueError, KeyError, TypeError):
                continue


def iter_spool_dirs(root: str | os.PathLike) -> Iterator[Path]:
    """Every folder under `root` (itself included) that holds spool files."""
    root = Path(root)
    for dirpath, _dirs, files in os.walk(root):
        if any(f.endswith(SUFFIX) for f in files):
            yield Path(dirpath)


_PROCESS_DIR = re.compile(r"^(?P<base>rank\d+-(?P<host>.+?)-(?P<pid>\d+))(?:\.adopted-(?P<adopter>\d+))?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def claim_orphans(own: Path, host: str) -> list[Path]:
    """The spool folders beside `own` (one run's, `rank<R>-<host>-<pid>`) of `host` whose process is
    gone, claimed by an atomic rename (so two new processes never both send them)."""
    out: list[Path] = []
    base = own.parent
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        m = _PROCESS_DIR.match(d.name)
        if not d.is_dir() or d == own or m is None or m.group("host") != host:
            continue
        owner = int(m.group("adopter") or m.group("pid"))
        if owner == os.getpid() or _alive(owner):
            continue
        claimed = d.with_name(f"{m.group('base')}.adopted-{os.getpid()}")
        try:
            os.rename(d, claimed)
        except OSError:
            continue  # another process claimed it first
        out.append(claimed)
    return out
