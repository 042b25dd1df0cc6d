"""Content-addressed store of raw snapshots in a directory (`MEMQ_BLOB_DIR`).

A blob's key is the sha256 of the uncompressed snapshot bytes; it is stored zstd-compressed at
`<dir>/<sha[:2]>/<sha>.zst` (gzip `.gz` when the bytes arrived gzip-compressed from an agent
without zstandard; both are read back). Writes go to a temporary file in the same directory and
are renamed into place, so a reader never sees half a blob and two writers of the same bytes do not
conflict. Reads check the hash, so a corrupted file is reported, not analysed.

    blobs = BlobStore(settings.blob_dir)
    ref = blobs.put(sha256, raw_bytes)        # -> "ab/ab12...zst" (idempotent)
    ref = blobs.claim(sha256)                 # ref() for a writer: a blob held for removal comes back
    ref = blobs.put_encoded(sha256, data, "zstd")  # agent bytes as they came; verified first
    n = blobs.verify(sha256, data, size)      # inflated size, streamed (bounded, nothing held)
    raw = blobs.get(sha256)                   # uncompressed bytes
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from memq import codec
from memq.errors import NotFound, SnapshotError, StorageError

_SHA = re.compile(r"^[0-9a-f]{64}$")
_EXT = {"zstd": ".zst", "gzip": ".gz"}
#: A blob being removed is first renamed to `<name>.held` (memq.store.retention): the removal checks the
#: rows once more after a grace period, and a crash in between leaves the file on disk, never loses it.
#: A writer that needs a held blob (`claim`) renames it back.
HELD_SUFFIX = ".held"


def _check_sha(sha256: str) -> str:
    sha = sha256.lower()
    if not _SHA.match(sha):
        raise SnapshotError(f"not a sha256 hex digest: {sha256[:80]!r}")
    return sha


class BlobStore:
    def __init__(self, directory: str | os.PathLike, max_bytes: int = codec.DEFAULT_MAX_BYTES):
        self.directory = Path(directory).expanduser()
        self.max_bytes = max_bytes

    def _path(self, sha: str, ext: str) -> Path:
        return self.directory / sha[:2] / f"{sha}{ext}"

    def ref(self, sha256: str) -> str | None:
        """The relative key of the stored blob, or None when it is not stored."""
        sha = _check_sha(sha256)
        for ext in _EXT.values():
            p = self._path(sha, ext)
            if p.exists():
                return f"{sha[:2]}/{p.name}"
        return None

    def claim(self, sha256: str) -> str | None:
        """`ref`, for a writer about to name the blob in a row: a blob held for removal (retention, the
        dead-blob cleanup) is renamed back first, so the removal's final check sees the new row and the
        bytes are never lost."""
        found = self.ref(sha256)
        if found is not None:
            return found
        sha = _check_sha(sha256)
        for ext in _EXT.values():
            p = self._path(sha, ext)
            held = p.with_name(p.name + HELD_SUFFIX)
            if not held.exists():
                continue
            try:
                os.replace(held, p)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StorageError(f"cannot take back held blob {p.name}: {exc.strerror or exc}") from exc
            return f"{sha[:2]}/{p.name}"
        return self.ref(sha)  # another writer un-held or wrote it meanwhile

    def exists(self, sha256: str) -> bool:
        return self.ref(sha256) is not None

    def put(self, sha256: str, raw: bytes) -> str:
        """Store uncompressed snapshot bytes under their hash; returns the key. Idempotent."""
        sha = _check_sha(sha256)
        existing = self.claim(sha)
        if existing:
            return existing
        if hashlib.sha256(raw).hexdigest() != sha:
            raise SnapshotError(f"blob {sha[:12]}: bytes do not match their sha256")
        return self._write(sha, codec.compress(raw, "zstd"), ".zst")

    def put_encoded(self, sha256: str, data: bytes, encoding: str, size: int | None = None) -> str:
        """Store bytes already compressed by the agent (`zstd` or `gzip`) after checking that they
        inflate to `sha256` (and to `size` bytes when given: the envelope's claim, which also bounds
        the inflation); other encodings are recompressed."""
        sha = _check_sha(sha256)
        existing = self.claim(sha)
        if existing:
            return existing
        if encoding in _EXT and codec.compression_of(data) == encoding:
            self.verify(sha, data, size)
            return self._write(sha, data, _EXT[encoding])
        raw = codec.decompress(data, self._limit(size))
        self._check(sha, hashlib.sha256(raw).hexdigest(), len(raw), size)
        return self._write(sha, codec.compress(raw, "zstd"), ".zst")

    def verify(self, sha256: str, data: bytes, size: int | None = None) -> int:
        """The inflated size of compressed (or plain) `data`, after checking that it inflates to
        `sha256` (and to `size` bytes when given). Streams: the inflated bytes are hashed chunk by
        chunk and never held, so a small bomb costs time up to the cap, not memory. TooLarge past
        min(size, max_bytes); SnapshotError on a mismatch or corrupt data."""
        sha = _check_sha(sha256)
        digest, n = codec.inflated_digest(data, self._limit(size))
        self._check(sha, digest, n, size)
        return n

    def verify_stored(self, sha256: str, size: int | None) -> int:
        """`verify` of the stored blob itself (its inflated size against `size`): NotFound when absent."""
        sha = _check_sha(sha256)
        ref = self.ref(sha)
        if ref is None:
            raise NotFound(f"snapshot blob {sha[:12]} is not in the blob store {self.directory}")
        try:
            data = (self.directory / ref).read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read blob {ref} in {self.directory}: {exc.strerror or exc}") from exc
        return self.verify(sha, data, size)

    def _limit(self, size: int | None) -> int:
        return min(self.max_bytes, size) if size else self.max_bytes

    @staticmethod
    def _check(sha: str, digest: str, n: int, size: int | None) -> None:
        if size is not None and n != size:
            raise SnapshotError(f"blob {sha[:12]} inflates to {n} bytes, not the {size} its envelope says")
        if digest != sha:
            raise SnapshotError(f"blob {sha[:12]}: bytes do not match their sha256")

    def _write(self, sha: str, data: bytes, ext: str) -> str:
        target = self._path(sha, ext)
        try:
            write_atomic(target, data)
        except OSError as exc:
            raise StorageError(f"cannot write blob to {self.directory}: {exc.strerror or exc}",
                               hint="check MEMQ_BLOB_DIR exists and is writable") from exc
        return f"{sha[:2]}/{target.name}"

    def get(self, sha256: str) -> bytes:
        """Uncompressed bytes of a stored snapshot; NotFound when absent."""
        sha = _check_sha(sha256)
        ref = self.claim(sha)  # a row's blob held by a removal in progress is needed: it comes back
        if ref is None:
            raise NotFound(f"snapshot blob {sha[:12]} is not in the blob store {self.directory}",
                           hint="it was never stored here, or MEMQ_BLOB_DIR points elsewhere")
        try:
            data = (self.directory / ref).read_bytes()
        except OSError as exc:
            raise StorageError(f"cannot read blob {ref} in {self.directory}: {exc.strerror or exc}") from exc
        raw = codec.decompress(data, self.max_bytes)
        if hashlib.sha256(raw).hexdigest() != sha:
            raise SnapshotError(f"blob {ref} is corrupt: its content no longer matches its sha256")
        return raw

    def check_writable(self) -> None:
        """Raise StorageError unless a blob could be written now (for `memq doctor`)."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".probe.", dir=self.directory)
            os.close(fd)
            os.unlink(tmp)
        except OSError as exc:
            raise StorageError(f"blob store {self.directory} is not writable: {exc.strerror or exc}") from exc


def write_atomic(target: Path, data: bytes) -> None:
    """Write `data` to `target` so readers see the old file or the whole new one, never a part:
    a temporary file in the same directory, fsynced, then renamed over the target."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:12]}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
