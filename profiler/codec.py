"""Bytes -> plain Python data, for snapshots that come from other people's jobs.

Snapshots are pickles, and a pickle can run code. `loads_restricted` uses an unpickler that refuses
every global (class, function, module attribute), so only the plain types real snapshots use
(dict, list, tuple, str, bytes, int, float, bool, None) can come out. Compressed input is inflated
with a hard cap on the output size, so a small gzip or zstd bomb cannot exhaust memory.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import pickle
import resource
import zlib
from typing import Any

from profiler.errors import RefusedPickle, SnapshotError, TooLarge

DEFAULT_MAX_BYTES = 4 * 1024**3  # uncompressed; the 100k-entry H200 snapshot is ~10 MB

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):  # noqa: D401 - pickle protocol hook
        raise RefusedPickle(f"pickle refers to {module}.{name}; snapshots hold only plain data")

    def persistent_load(self, pid):
        raise RefusedPickle("pickle uses persistent ids; snapshots hold only plain data")


@contextlib.contextmanager
def gc_paused():
    """Pause the cyclic garbage collector while building millions of acyclic containers: its
    generational passes otherwise make decoding superlinear in the number of trace entries."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# A real snapshot's objects take ~9x its pickle bytes (measured on the 100k-entry H200 snapshot).
ADDRESS_SPACE_PER_PICKLE_BYTE = 64
ADDRESS_SPACE_BASE = 1024**3


@contextlib.contextmanager
def address_space_capped(nbytes: int):
    """Cap this process's address space while unpickling foreign bytes.

    The C unpickler sizes its memo table from the index a LONG_BINPUT opcode names, so a 4 MiB
    pickle whose index was tampered with can make it zero-fill gigabytes before any object exists.
    A legitimate pickle never needs more than a small multiple of its size; past the cap the
    allocation fails with MemoryError, which becomes a TooLarge input error. Linux only."""
    try:
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):
        yield
        return
    cap = used + ADDRESS_SPACE_BASE + ADDRESS_SPACE_PER_PICKLE_BYTE * nbytes
    if soft != resource.RLIM_INFINITY and soft <= cap:
        yield
        return
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    except (ValueError, OSError):
        yield
        return
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def loads_restricted(data: bytes) -> Any:
    """Unpickle `data` with every global refused. Raises SnapshotError subclasses only."""
    try:
        with gc_paused(), address_space_capped(len(data)):
            return _RestrictedUnpickler(io.BytesIO(data)).load()
    except RefusedPickle:
        raise
    except RecursionError as exc:
        raise SnapshotError("pickle nests too deeply") from exc
    except MemoryError as exc:
        raise TooLarge("pickle needs more memory than is available") from exc
    except Exception as exc:  # noqa: BLE001 - any decode failure of foreign bytes is bad input
        raise SnapshotError(f"not a readable pickle ({type(exc).__name__}: {_short(exc)})") from exc


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:120]


def compression_of(data: bytes) -> str:
    if data[:2] == GZIP_MAGIC:
        return "gzip"
    if data[:4] == ZSTD_MAGIC:
        return "zstd"
    return "none"


def decompress(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Inflate gzip or zstd (by magic bytes, not by file name); other bytes pass through."""
    kind = compression_of(data)
    if kind == "gzip":
        return _gunzip(data, max_bytes)
    if kind == "zstd":
        return _unzstd(data, max_bytes)
    if len(data) > max_bytes:
        raise TooLarge(f"{len(data)} bytes exceed the limit of {max_bytes} bytes")
    return data


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    out = bytearray()
    rest = data
    try:
        # A .gz may hold several members (concatenated files); inflate each in turn.
        while rest:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while True:
                chunk = d.decompress(rest, max_bytes + 1 - len(out))
                out += chunk
                if len(out) > max_bytes:
                    raise TooLarge(f"decompressed size exceeds the limit of {max_bytes} bytes")
                if d.eof:
                    break
                if not d.unconsumed_tail:
                    raise SnapshotError("gzip data is truncated")
                rest = d.unconsumed_tail
            rest = d.unused_data
            if rest and rest[:2] != GZIP_MAGIC:
                break  # trailing garbage after the last member: ignore, as gzip(1) does
    except zlib.error as exc:
        raise SnapshotError(f"gzip data is corrupt ({exc})") from exc
    return bytes(out)


def _unzstd(data: bytes, max_bytes: int) -> bytes:
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is a dependency
        raise SnapshotError("zstd input needs the 'zstandard' package") from exc
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        out = reader.read(max_bytes + 1)
        while True:
            if len(out) > max_bytes:
                raise TooLarge(f"decompressed size exceeds the limit of {max_bytes} bytes")
            more = reader.read(max_bytes + 1 - len(out))
            if not more:
                break
            out += more
    except zstandard.ZstdError as exc:
        raise SnapshotError(f"zstd data is corrupt or truncated ({exc})") from exc
    return out


def compress(data: bytes, codec: str = "zstd") -> bytes:
    if codec == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(data)
    if codec == "gzip":
        return gzip.compress(data, compresslevel=6)
    raise ValueError(f"unknown codec {codec!r}")


def decode(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Any:
    """Raw snapshot bytes (maybe compressed) -> plain data. Pickle and JSON are accepted."""
    if not data:
        raise SnapshotError("empty input")
    raw = decompress(data, max_bytes)
    if not raw:
        raise SnapshotError("empty input after decompression")
    return decode_plain(raw)


def decode_plain(raw: bytes) -> Any:
    head = raw[:1]
    if head == b"\x80" or head in (b"(", b"]", b"}"):
        return loads_restricted(raw)
    stripped = raw.lstrip()[:1]
    if stripped in (b"{", b"["):
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise SnapshotError(f"not valid JSON ({_short(exc)})") from exc
    raise SnapshotError("not a snapshot: neither a pickle nor JSON (after gzip/zstd)")
