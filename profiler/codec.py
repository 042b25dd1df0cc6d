"""Bytes -> plain Python data, for snapshots that come from other people's jobs.

Snapshots are pickles, and a pickle can run code. `loads_restricted` uses an unpickler that refuses
every global (class, function, module attribute), so only the plain types real snapshots use
(dict, list, tuple, str, bytes, int, float, bool, None) can come out. Foreign bytes are bounded
three ways, each ending in a `BadInput` subclass, never in an OOM, a RecursionError or a crash:
- size: compressed input is inflated in chunks with a hard cap on the output (`iter_inflate`);
  `inflated_digest` verifies a blob against its sha256 without ever holding the inflated bytes;
- memory: the object graph a pickle or JSON document builds is bounded by the process's address
  space while it is built (`address_space_capped`), one decode at a time per process
  (`decode_turn`), so each decode gets its own cap and the limit is restored exactly; callers pick
  the byte cap from the decode budget (`raw_limit`, `MEMQ_DECODE_BUDGET_BYTES`);
- shape: nothing nests deeper than `MAX_NESTING` and no container is shared more than a tree
  allows (`check_shape`), so later code can walk the data without recursion limits.
"""

from __future__ import annotations

import contextlib
import gc
import gzip
import io
import json
import pickle
import queue
import resource
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from memq.errors import DecodeUnavailable, NestedTooDeep, RefusedPickle, SnapshotError, TooLarge

DEFAULT_MAX_BYTES = 4 * 1024**3  # uncompressed; the 100k-entry H200 snapshot is ~21 MB

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# Memory a decode takes per uncompressed pickle byte: peak RSS growth of a whole
# `load.load_snapshot_file` (compressed bytes + objects + parsed model; a compressed pickle is unpickled
# while inflated and its trace entries released as they are parsed), measured with
# benchmarks/bench_big.py's inputs and all 41 files of tests/fixtures/real:
#   - 7.4x for the real 1,000,000-entry H200 capture (85 MB), 7.1x for 1M entries tiled from the 100k
#     one (258 MB), 9.5x for the real 100k-entry snapshot (21 MB);
#   - 12-13x for the 0.4-2 MB files, where ~2 MB of fixed cost (buffers, the decoding thread) counts.
# A budget B admits pickles up to B / 12 (`raw_limit`); budgets are at least 768 MiB (config), so a
# pickle at the cap is at least 64 MB, where the measured need is under 10x: a 1.2x margin. The
# address-space cap while unpickling is 12x the pickle plus a small slack. Crafted pickles can build
# more per byte (an empty set is 1 opcode byte and 216 bytes of object): those hit the address-space cap
# and end as TooLarge instead.
DECODE_BYTES_PER_RAW_BYTE = 12
ADDRESS_SPACE_SLACK = 64 * 1024**2

# Real snapshots nest 6-8 containers deep (snapshot > traces > entry > frames > frame); 100 leaves
# room for new layouts and keeps every later walk far from Python's recursion limit.
MAX_NESTING = 100

_CAP_HINT = f"the cap is MEMQ_DECODE_BUDGET_BYTES / {DECODE_BYTES_PER_RAW_BYTE}, or --max-bytes when lower"
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
def gc_paused(*, freeze: bool = False):
    """Pause the cyclic garbage collector while building millions of acyclic containers: its
    generational passes otherwise make decoding superlinear in the number of trace entries.

    With `freeze` (a command that exits soon after), what was built is moved out of the collector's
    sight when it resumes: its first pass would otherwise walk every parsed event once more (0.17 s
    for a million) only to find nothing to collect."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            if freeze:
                gc.freeze()
            gc.enable()


# One decode at a time builds objects under the address-space cap. RLIMIT_AS belongs to the whole
# process: a second decode that set its own cap while the first ran would leave the first's unpickling
# thread no room for its stack ("can't start new thread"), and interleaved save/restore pairs could leave
# any limit behind. Unpickling holds the GIL throughout, so decodes in threads never ran in parallel:
# taking turns costs no throughput. Re-entrant: a decode may nest a smaller one on its own thread.
_DECODE_LOCK = threading.RLock()


@contextlib.contextmanager
def decode_turn():
    """This thread's turn to decode: no other thread of the process sets or holds the cap until it ends."""
    with _DECODE_LOCK:
        yield


@contextlib.contextmanager
def address_space_capped(nbytes: int):
    """Cap this process's address space while building objects from `nbytes` foreign bytes (in this
    thread's decode turn, so the cap and its restore belong to one decode).

    The C unpickler sizes its memo table from the index a LONG_BINPUT opcode names, so a 4 MiB
    pickle whose index was tampered with can make it zero-fill gigabytes before any object exists,
    and a pickle of empty containers builds ~200 bytes of objects per byte. A real snapshot needs
    less than DECODE_BYTES_PER_RAW_BYTE times its size; past that the allocation fails with
    MemoryError, which becomes a TooLarge input error. Linux only."""
    with decode_turn(), _capped(nbytes):
        yield


@contextlib.contextmanager
def _capped(nbytes: int):
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
# unpickler runs on a thread with a stack of _STACK_MAX (`_Unpickling`; address space, only used pages
# count), and a bound past what that stack holds is refused.
_TUPLE_OPCODES = b"\x85\x86\x87t"  # TUPLE1, TUPLE2, TUPLE3, TUPLE
# Every other byte: deleting these leaves the tuple opcodes' bytes, and writes little (a fifth less
# work per byte than deleting the opcodes and keeping the rest).
_OTHER_BYTES = bytes(b for b in range(256) if b not in _TUPLE_OPCODES)
_INLINE_TUPLE_OPS = 20_000
# A level of tuplehash takes 64-80 bytes of stack (CPython 3.11, x86_64: a 64 MiB stack hashes a tuple
# nested 838,860 deep and crashes at 1,048,576); 256 leaves room for other builds. The largest stack is
# address space only (pages count when touched): 4 GiB bounds the nesting at 16.6M levels, and the
# tuple-opcode bytes of a real 10M-entry trace (890 MB of pickle: 8.3M of them, mostly inside 8-byte
# addresses and times) stay under it.
_STACK_PER_LEVEL = 256
_STACK_BASE = 32 * 1024**2
_STACK_MAX = 4 * 1024**3
# How often a decode waiting on the unpickling thread checks that the thread is still there.
_ANSWER_POLL_S = 0.5


def _stack_needed(data: bytes) -> int:
    bound = len(data.translate(None, _OTHER_BYTES))  # one pass (4 counts take 4)
    if bound <= _INLINE_TUPLE_OPS:
        return 0
    need = _STACK_BASE + _STACK_PER_LEVEL * bound
    if need > _STACK_MAX:
        raise TooLarge(f"pickle may nest tuples {bound} deep; snapshots hold a few flat tuples")
    return need


class _Unpickling:
    """The one thread pickles are unpickled on when they may nest tuples deeply: made once, with a
    stack of _STACK_MAX (address space only: pages count when used), and kept. A thread made per
    decode was not reliably gone when the next decode measured the address space it may use (Python's
    threads are detached; glibc unmaps a dead thread's stack only when another thread starts), so a
    dead decode's stack loosened the next cap, and in a busy process a new one could not get its stack.
    After a decode that failed (hostile input, which may have used deep stack) it is let go, so the
    stack pages that decode touched are not kept resident."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()

    def run(self, fn: Callable[[], T], cap_bytes: int) -> T:
        """fn() on the thread, under the cap for `cap_bytes` of pickle. In the caller's decode turn."""
        if self._thread is None or not self._thread.is_alive():
            self._start()
        thread, jobs = self._thread, self._jobs
        box: dict[str, Any] = {}
        done = threading.Event()
        with _capped(cap_bytes):  # set and restored by the caller, around the whole of fn()
            jobs.put((fn, box, done))
            # The caller holds the decode turn while it waits, so a thread that ended without an
            # answer would otherwise stop every later decode of the process for good.
            while not done.wait(_ANSWER_POLL_S) and thread.is_alive():
                pass
        if not done.is_set():
            self._thread = None
            raise DecodeUnavailable("the decoding thread ended without an answer",
                                    hint="retry; the snapshot itself was not read")
        if "error" in box:
            self.retire()
            raise box["error"]
        return box["value"]

    def retire(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join()
            self._thread = None

    def _start(self) -> None:
        # A queue per thread: a stop left for a thread that had already ended must not stop its successor.
        self._jobs = jobs = queue.SimpleQueue()

        def serve() -> None:
            while (job := jobs.get()) is not None:
                fn, box, done = job
                try:
                    box["value"] = fn()
                except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                    box["error"] = exc
                finally:
                    del fn, job, box  # nothing of this decode stays referenced by the idle thread
                    done.set()

        old = threading.stack_size()
        try:
            threading.stack_size(_STACK_MAX)
            t = threading.Thread(target=serve, name="memq-unpickle", daemon=True)
            try:
                t.start()
            except RuntimeError as exc:  # the process is out of threads or address space: not the input's fault
                raise DecodeUnavailable(f"cannot start the decoding thread now ({_short(exc)})",
                                        hint="retry later; the snapshot itself was not read") from exc
        finally:
            threading.stack_size(old)
        self._thread = t


_UNPICKLING = _Unpickling()


def _capped_on_stack(fn: Callable[[], T], stack_bytes: int, cap_bytes: int) -> T:
    """fn() under the address-space cap for `cap_bytes` of pickle, on the unpickling thread when it
    needs more stack than the caller's thread has (`stack_bytes` > 0), in this thread's decode turn."""
    with decode_turn():
        if not stack_bytes:
            with _capped(cap_bytes):
                return fn()
        return _UNPICKLING.run(fn, cap_bytes)


def discard_decoding_stack() -> None:
    """After hostile input (refused later than the unpickling itself): let the unpickling thread go, so
    whatever stack it touched is not kept resident by a long-lived process."""
    with decode_turn():
        _UNPICKLING.retire()


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


def loads_restricted(data: bytes, *, check: bool = True) -> Any:
    """Unpickle `data` with every global refused. Raises SnapshotError subclasses only.
    `check=False` leaves the shape check to the caller (the snapshot loader checks the part it does
    not validate itself)."""

    def load() -> Any:
        return _RestrictedUnpickler(io.BytesIO(data)).load()

    return _unpickled(load, _stack_needed(data), len(data), check)


def _sha256(data: bytes = b""):
    import hashlib  # on first use: it loads OpenSSL, which a command that never hashes does not need

    return hashlib.sha256(data)


def sha256_hex(data: bytes) -> str:
    return _sha256(data).hexdigest()


class InflatingReader:
    """The uncompressed bytes of a gzip or zstd blob as a file the C unpickler reads from, so that a
    decode never holds the whole inflated pickle (85 MB for a 1M-entry trace) beside the objects it
    builds. It hashes and counts what passes through, and bounds the tuple opcodes it has seen by
    what the unpickling thread's stack can hash (see _stack_needed)."""

    def __init__(self, data: bytes, max_bytes: int, max_tuple_ops: int, digest: bool = True) -> None:
        self._chunks = iter_inflate(data, max_bytes)
        self._buf = bytearray()  # appended to and compacted, so a large object read is linear
        self._pos = 0
        self._hash = _sha256() if digest else None
        self.size = 0
        self._tuple_ops = 0
        self._max_tuple_ops = max_tuple_ops

    def _fill(self) -> bool:
        chunk = next(self._chunks, b"")
        if not chunk:
            return False
        if self._hash is not None:
            self._hash.update(chunk)
        self.size += len(chunk)
        self._tuple_ops += len(chunk.translate(None, _OTHER_BYTES))
        if self._tuple_ops > self._max_tuple_ops:
            raise TooLarge(f"pickle may nest tuples {self._tuple_ops} deep; snapshots hold a few flat tuples")
        if self._pos > _OUT_CHUNK and self._pos * 2 > len(self._buf):
            del self._buf[:self._pos]
            self._pos = 0
        self._buf += chunk
        return True

    def _take(self, n: int) -> bytes:
        out = bytes(self._buf[self._pos:self._pos + n])
        self._pos += len(out)
        return out

    def peek(self, n: int = 1) -> bytes:
        n = max(1, n)
        while len(self._buf) - self._pos < n and self._fill():
            pass
        return bytes(self._buf[self._pos:self._pos + n])

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            while self._fill():
                pass
            return self._take(len(self._buf) - self._pos)
        while len(self._buf) - self._pos < n and self._fill():
            pass
        return self._take(n)

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readline(self) -> bytes:
        start = self._pos
        while True:
            i = self._buf.find(b"\n", start)
            if i >= 0:
                return self._take(i + 1 - self._pos)
            start = len(self._buf)  # what is scanned is not scanned again
            if not self._fill():
                return self._take(len(self._buf) - self._pos)

    def sha256(self) -> str | None:
        return self._hash.hexdigest() if self._hash is not None else None


def decode_stream(data: bytes, max_bytes: int = DEFAULT_MAX_BYTES, *, check: bool = True,
                  digest: bool = True) -> tuple[Any, str | None, int]:
    """`decode` that returns (object, sha256 of the uncompressed bytes, their size) and, for a
    compressed pickle, unpickles while inflating: memory holds the compressed bytes and the objects,
    never the whole inflated pickle. The size is known only at the end, so the address space is capped
    for `max_bytes` of pickle. JSON and uncompressed input are decoded whole. Without `digest` the
    hash is None: a caller that never names the snapshot (`memq analyze`) does not pay for hashing
    it, nor the 3.7 MB that loading OpenSSL's libcrypto for it adds to the process."""
    if not data:
        raise SnapshotError("empty input")
    if compression_of(data) == "none":
        raw = next(iter_inflate(data, max_bytes))
        return decode_plain(raw, check=check), _sha256(raw).hexdigest() if digest else None, len(raw)
    stack = min(_STACK_MAX, _STACK_BASE + _STACK_PER_LEVEL * max(0, max_bytes))
    reader = InflatingReader(data, max_bytes, (stack - _STACK_BASE) // _STACK_PER_LEVEL, digest)
    head = reader.peek(1)
    if not head:
        raise SnapshotError("empty input after decompression")
    if not _is_pickle(head):
        raw = reader.read()
        return decode_plain(raw, check=check), reader.sha256(), reader.size

    def load() -> Any:
        obj = _RestrictedUnpickler(reader).load()
        reader.read()  # what follows the STOP opcode still counts in the hash, as in the whole-file path
        return obj

    obj = _unpickled(load, stack, max_bytes, check, nbytes=lambda: reader.size)
    return obj, reader.sha256(), reader.size


def _unpickled(load: Callable[[], Any], stack: int, cap_bytes: int, check: bool,
               nbytes: Callable[[], int] | None = None) -> Any:
    """load() under the cap for `cap_bytes` of pickle, on a stack of `stack` bytes; any failure that is
    the input's becomes a SnapshotError, one that is the process's (DecodeUnavailable) stays itself."""
    try:
        with gc_paused():
            obj = _capped_on_stack(load, stack, cap_bytes)
            if check:
                try:
                    check_shape(obj, nbytes() if nbytes else cap_bytes)
                except SnapshotError:
                    discard_decoding_stack()
                    raise
            return obj
    except (SnapshotError, DecodeUnavailable):
        raise
    except RecursionError as exc:
        raise NestedTooDeep("pickle nests too deeply") from exc
    except MemoryError as exc:
        size = nbytes() if nbytes else cap_bytes
        raise TooLarge(f"pickle needs more than {DECODE_BYTES_PER_RAW_BYTE}x its {size} bytes "
                       "of memory; real snapshots need less than that") from exc
    except Exception as exc:  # noqa: BLE001 - any decode failure of foreign bytes is bad input
        raise SnapshotError(f"not a readable pickle ({type(exc).__name__}: {_short(exc)})") from exc


def loads_json(raw: bytes, *, check: bool = True) -> Any:
    """JSON with the same memory and shape bounds as pickles."""
    try:
        with gc_paused():
            with address_space_capped(len(raw)):
                obj = json.loads(raw)
            if check:
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
    h = _sha256()
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
        import zstandard  # the agent imports this module and runs without it (spooling gzip)

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


def _is_pickle(head: bytes) -> bool:
    return head[:1] == b"\x80" or head[:1] in (b"(", b"]", b"}")


def decode_plain(raw: bytes, *, check: bool = True) -> Any:
    if _is_pickle(raw[:1]):
        return loads_restricted(raw, check=check)
    stripped = raw.lstrip()[:1]
    if stripped in (b"{", b"["):
        return loads_json(raw, check=check)
    raise SnapshotError("not a snapshot: neither a pickle nor JSON (after gzip/zstd)")
