"""Bytes -> plain Python data, for snapshots that come from other people's jobs.

Snapshots are pickles, and a pickle can run code. `loads_restricted` uses an unpickler that refuses
every global (class, function, module attribute), so only the plain types real snapshots use
(dict, list, tuple, str, bytes, int, float, bool, None) can come out. Foreign bytes are bounded
three ways, each ending in a `BadInput` subclass, never in an OOM, a RecursionError or a crash:
- size: compressed input is inflated in chunks with a hard cap on the output (`iter_inflate`);
  `inflated_digest` verifies a blob against its sha256 without ever holding the inflated bytes;
- memory: the object graph a pickle or JSON document builds is bounded by the process's address
  space while it is built (`address_space_capped`), and callers pick the byte cap from the decode
  budget (`raw_limit`, `MEMQ_DECODE_BUDGET_BYTES`);
- shape: nothing nests deeper than `MAX_NESTING` and no container is shared more than a tree
  allows (`check_shape`), so later code can walk the data without recursion limits.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import hashlib
import io
import json
import pickle
import resource
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from profiler.errors import NestedTooDeep, RefusedPickle, SnapshotError, TooLarge

DEFAULT_MAX_BYTES = 4 * 1024**3  # uncompressed; the 100k-entry H200 snapshot is ~21 MB

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# Memory a decode takes per uncompressed pickle byte. Measured (tests/fixtures/real, all 41 files,
# and benchmarks/data/big.pickle.gz (shared fixture bench_100k), 20.8 MB, 100k trace entries):
#   - the unpickled object graph alone: 6.6x-9.5x the pickle bytes (tracemalloc, retained), peak
#     8.2x-10.6x while building; address space grows 8.9x for the 100k-entry file;
#   - a whole `load_snapshot_file` (compressed bytes + inflated bytes + objects + parsed model),
#     peak RSS growth: 10.2x (100k entries), 10.8x (seed_adamw/epoch0), 9.3x (a 77 KB snapshot).
# 16 leaves a 1.5x margin over the worst of those, so a budget B admits pickles up to B / 16 bytes
# (`raw_limit`) and the address-space cap while unpickling is 16x the pickle plus a small slack.
# Crafted pickles can build more per byte (an empty set is 1 opcode byte and 216 bytes of object):
# those hit the address-space cap and end as TooLarge instead.
DECODE_BYTES_PER_RAW_BYTE = 16
ADDRESS_SPACE_SLACK = 64 * 1024**2

# Real snapshots nest 6-8 containers deep (snapshot > traces > entry > frames > frame); 100 leaves
# room for new layouts and keeps every later walk far from Python's recursion limit.
MAX_NESTING = 100

_CAP_HINT = "the cap is MEMQ_DECODE_BUDGET_BYTES / 16, or --max-bytes when lower"
_IN_CHUNK = 256 * 1024
_OUT_CHUNK = 1024 * 1024

T = TypeVar("T")


def raw_limit(budget_bytes: int, max_bytes: int | None = None) -> int:
    """The largest uncompressed snapshot a decode budget admits (and `max_bytes`, when smaller)."""
    cap = max(1, int(budget_bytes) // DECODE_BYTES_PER_RAW_BYTE)
    return min(cap, int(max_bytes)) if max_bytes else cap


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


@contextlib.contextmanager
def address_space_capped(nbytes: int):
    """Cap this process's address space while building objects from `nbytes` foreign bytes.

    The C unpickler sizes its memo table from the index a LONG_BINPUT opcode names, so a 4 MiB
    pickle whose index was tampered with can make it zero-fill gigabytes before any object exists,
    and a pickle of empty containers builds ~200 bytes of objects per byte. A real snapshot needs
    less than DECODE_BYTES_PER_RAW_BYTE times its size; past that the allocation fails with
    MemoryError, which becomes a TooLarge input error. Linux only."""
    try:
        with open("/proc/self/statm") as fh:
            used = int(fh.read().split()[0]) * resource.getpagesize()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):
        yield
        return
    cap = used + ADDRESS_SPACE_SLACK + DECODE_BYTES_PER_RAW_BYTE * nbytes
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


# Hashing a tuple hashes its items recursively in C with no depth check (CPython 3.11), so a
# pickle that uses a tuple nested 200k deep as a dict key or set member overflows the C stack while
# unpickling (a 1 MB pickle, SIGSEGV) before any check on the result could run. A tuple cannot nest
# deeper than the pickle has tuple opcodes, and counting the bytes those opcodes use is one C pass
# over the input (an upper bound: the same bytes occur inside strings and integers). Below
# _INLINE_TUPLE_OPS the calling thread's stack is ample (8 MiB holds ~150k levels); above it the
# unpickler runs on a thread whose stack fits the bound (virtual memory; only used pages count).
_TUPLE_OPCODES = b"\x85\x86\x87t"  # TUPLE1, TUPLE2, TUPLE3, TUPLE
_INLINE_TUPLE_OPS = 20_000
_STACK_PER_LEVEL = 256  # measured ~56 bytes per nesting level of tuplehash
_STACK_BASE = 32 * 1024**2
_STACK_MAX = 2 * 1024**3


def _stack_needed(data: bytes) -> int:
    bound = len(data) - len(data.translate(None, _TUPLE_OPCODES))  # one pass (4 counts take 4)
    if bound <= _INLINE_TUPLE_OPS:
        return 0
    need = _STACK_BASE + _STACK_PER_LEVEL * bound
    if need > _STACK_MAX:
        raise TooLarge(f"pickle may nest tuples {bound} deep; snapshots hold a few flat tuples")
    return need


def _on_stack(fn: Callable[[], T], stack_bytes: int) -> T:
    """fn() on a thread with a stack of `stack_bytes` (the caller's thread when 0)."""
    if not stack_bytes:
        return fn()
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    old = threading.stack_size()
    try:
        threading.stack_size(stack_bytes)
        t = threading.Thread(target=run, name="memq-unpickle", daemon=True)
        t.start()  # the stack is mapped here, before the unpickler caps the address space
    finally:
        threading.stack_size(old)
    t.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def check_shape(obj: Any, nbytes: int) -> None:
    """Refuse data nested deeper than MAX_NESTING, or sharing containers (a DAG whose walk would
    blow up), without recursion: a breadth-first walk, one level at a time, in C where it can.

    Only containers the garbage collector tracks can hold other containers (a dict of scalars is
    untracked), so each level keeps just those. A tree built from `nbytes` bytes has at most
    `nbytes` references in all (every value costs at least one opcode byte or JSON character);
    more means the input reuses containers, which snapshots never do. Cost: ~0.2 s for the
    100k-entry snapshot (1.4M references), about a quarter of its inflate + unpickle time."""
    level = [obj]
    depth = 0
    seen = 0
    budget = nbytes + 1024
    while level:
        depth += 1
        if depth > MAX_NESTING:
            raise NestedTooDeep(f"data nests deeper than {MAX_NESTING} levels (snapshots nest about 7)")
        refs = gc.get_referents(*level)
        seen += len(refs)
        if seen > budget:
            raise SnapshotError(f"data reuses containers ({seen} references from {nbytes} bytes); "
                                "snapshots are plain trees")
        level = list(filter(gc.is_tracked, refs))


def loads_restricted(data: bytes) -> Any:
    """Unpickle `data` with every global refused. Raises SnapshotError subclasses only."""

    def load() -> Any:
        with address_space_capped(len(data)):
            return _RestrictedUnpickler(io.BytesIO(data)).load()

    try:
        with gc_paused():
            obj = _on_stack(load, _stack_needed(data))
            check_shape(obj, len(data))
            return obj
    except SnapshotError:
        raise
    except RecursionError as exc:
        raise NestedTooDeep("pickle nests too deeply") from exc
    except MemoryError as exc:
        raise TooLarge(f"pickle needs more than {DECODE_BYTES_PER_RAW_BYTE}x its {len(data)} bytes "
                       "of memory; real snapshots need less than that") from exc
    except Exception as exc:  # noqa: BLE001 - any decode failure of foreign bytes is bad input
        raise SnapshotError(f"not a readable pickle ({type(exc).__name__}: {_short(exc)})") from exc


def loads_json(raw: bytes) -> Any:
    """JSON with the same memory and shape bounds as pickles."""
    try:
        with gc_paused():
            with address_space_capped(len(raw)):
                obj = json.loads(raw)
            check_shape(obj, len(raw))
            return obj
    except SnapshotError:
        raise
    except RecursionError as exc:
        raise NestedTooDeep("JSON nests too deeply (snapshots nest about 7 levels)") from exc
    except MemoryError as exc:
        raise TooLarge(f"JSON needs more than {DECODE_BYTES_PER_RAW_BYTE}x its {len(raw)} bytes of memory") from exc
    except ValueError as exc:
        raise SnapshotError(f"not valid JSON ({_short(exc)})") from exc


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text[:120]


def compression_of(data: bytes) -> str:
    if data[:2] == GZIP_MAGIC:
        return "gzip"
    if data[:4] == ZSTD_MAGIC:
        return "zstd"
    return "none"


def iter_inflate(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> Iterator[bytes]:
    """The uncompressed bytes of gzip, zstd or plain `data`, in chunks of at most 1 MiB.
    TooLarge as soon as more than `max_bytes` came out; SnapshotError when corrupt or truncated."""
    kind = compression_of(data)
    if kind == "gzip":
        chunks = _gunzip_chunks(data)
    elif kind == "zstd":
        chunks = _unzstd_chunks(data)
    else:
        if len(data) > max_bytes:
            raise TooLarge(f"{len(data)} bytes exceed the limit of {max_bytes} bytes", hint=_CAP_HINT)
        yield data
        return
    total = 0
    for chunk in chunks:
        total += len(chunk)
        if total > max_bytes:
            raise TooLarge(f"decompressed size exceeds the limit of {max_bytes} bytes", hint=_CAP_HINT)
        yield chunk


def decompress(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """Inflate gzip or zstd (by magic bytes, not by file name); other bytes pass through."""
    if compression_of(data) == "none":
        return next(iter_inflate(data, max_bytes))
    return b"".join(iter_inflate(data, max_bytes))


def inflated_digest(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, int]:
    """(sha256 hex, size) of the uncompressed bytes, streamed: memory stays at one chunk."""
    h = hashlib.sha256()
    size = 0
    for chunk in iter_inflate(data, max_bytes):
        h.update(chunk)
        size += len(chunk)
    return h.hexdigest(), size


def _gunzip_chunks(data: bytes) -> Iterator[bytes]:
    # Input is fed in small pieces so that zlib's unconsumed_tail (a copy) stays small too.
    view = memoryview(data)
    pos, n = 0, len(data)
    pending = b""
    try:
        while True:  # a .gz may hold several members (concatenated files); inflate each in turn
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while not d.eof:
                if d.unconsumed_tail:
                    buf = d.unconsumed_tail
                elif pending:
                    buf, pending = pending, b""
                elif pos < n:
                    buf = view[pos:pos + _IN_CHUNK]
                    pos += len(buf)
                else:
                    buf = b""  # input used up: take what zlib still holds, if anything
                out = d.decompress(buf, _OUT_CHUNK)
                if out:
                    yield out
                elif not len(buf):
                    raise SnapshotError("gzip data is truncated")
            pending = d.unused_data
            if len(pending) < 2 and pos < n:
                pending += bytes(view[pos:pos + _IN_CHUNK])
                pos = min(n, pos + _IN_CHUNK)
            if pending[:2] != GZIP_MAGIC:
                return  # the end, or trailing garbage after the last member: ignored, as gzip(1) does
    except zlib.error as exc:
        raise SnapshotError(f"gzip data is corrupt ({exc})") from exc


def _unzstd_chunks(data: bytes) -> Iterator[bytes]:
    try:
        import zstandard
    except ImportError as exc:  # pragma: no cover - zstandard is a dependency
        raise SnapshotError("zstd input needs the 'zstandard' package") from exc
    try:
        # The decompressor refuses frames whose window exceeds zstd's default limit (128 MiB).
        reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data), read_across_frames=True)
        while True:
            chunk = reader.read(_OUT_CHUNK)
            if not chunk:
                return
            yield chunk
    except zstandard.ZstdError as exc:
        raise SnapshotError(f"zstd data is corrupt or truncated ({exc})") from exc


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
        return loads_json(raw)
    raise SnapshotError("not a snapshot: neither a pickle nor JSON (after gzip/zstd)")
