"""Writing a file the user named with --out: regular files only, one clear error otherwise.

The write is atomic (a temporary file in the same directory, fsynced, renamed over the target), so
a reader sees the old file or the whole new one. A rename replaces whatever the name points at,
so the target is checked first: a device (/dev/full, /dev/null), a FIFO, a socket or a directory
is refused, never replaced by a regular file; a missing parent directory is reported, never
created silently. Every failure is an OutputError (exit 2) naming the path and the reason.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from memq.errors import OutputError
from memq.render.safe import safe_text

_KINDS = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device", stat.S_IFIFO: "a FIFO",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}
_REASONS = {errno.ENOSPC: "no space left on the device", errno.EDQUOT: "disk quota exceeded",
            errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted", errno.ENOENT: "files cannot be created there",
            errno.ENOTDIR: "a part of the path is not a directory", errno.ENAMETOOLONG: "file name too long"}


def write_output(path: str | os.PathLike, data: str | bytes) -> Path:
    """Write `data` (text is UTF-8) to the regular file `path`; returns the path written."""
    target = _checked_target(Path(path))
    payload = data.encode() if isinstance(data, str) else data
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=".tmp", dir=target.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as exc:
        raise OutputError(f"cannot write {_show(target)}: {_reason(exc)}") from exc
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return target


def check_output(path: str | os.PathLike) -> Path:
    """The path `write_output` would write, or OutputError now: lets a command refuse a bad --out
    before doing its work (a read-only or full place is found by creating and removing a file)."""
    target = _checked_target(Path(path))
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{target.name[:40]}.", suffix=".probe", dir=target.parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise OutputError(f"cannot write {_show(target)}: {_reason(exc)}") from exc
    return target


def _checked_target(p: Path) -> Path:
    if not p.name or p.name in (".", ".."):
        raise OutputError(f"{_show(p)} names a directory, not a file", hint="give a file name, e.g. report.html")
    try:
        st = os.stat(p)  # follows a symlink: a link to a regular file is written through
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise OutputError(f"cannot write {_show(p)}: {_reason(exc)}") from exc
    if st is not None:
        kind = stat.S_IFMT(st.st_mode)
        if kind != stat.S_IFREG:
            what = _KINDS.get(kind, "not a regular file")
            raise OutputError(f"{_show(p)} is {what}; --out writes regular files only",
                              hint="name a regular file")
        p = Path(os.path.realpath(p))
    parent = p.parent
    if not parent.exists():
        raise OutputError(f"cannot write {_show(p)}: directory {_show(parent)} does not exist",
                          hint="create it first; memq does not create directories for --out")
    if not parent.is_dir():
        raise OutputError(f"cannot write {_show(p)}: {_show(parent)} is not a directory")
    return p


def _reason(exc: OSError) -> str:
    return _REASONS.get(exc.errno or 0) or exc.strerror or type(exc).__name__


def _show(p: Path) -> str:
    return safe_text(str(p))
