"""Parse `PYTORCH_CUDA_ALLOC_CONF` / `PYTORCH_ALLOC_CONF` strings the way torch does. Pure: no I/O.

Follows `c10/core/AllocatorConfig.{h,cpp}` (`AcceleratorAllocatorConfig::parseArgs`, torch 2.9 .. 2.11) and
the older `c10/cuda/CUDAAllocatorConfig.cpp`:

- The string is cut into tokens at `,` `:` `[` `]`; whitespace is dropped. Items are `key:value` joined by
  commas; list values are bracketed (`roundup_power2_divisions:[64:8,256:4,>:1]`).
- `max_split_size_mb:N` and `max_non_split_rounding_mb:N`: whole MiB, N >= 20 (kLargeBuffer / 1 MiB);
  torch refuses smaller values ("max_split_size_mb too small, must be >= 20"), and (2.11) a
  max_split_size_mb below large_segment_size_mb.
- `garbage_collection_threshold:F`: 0 < F < 1.
- `roundup_power2_divisions:N` (N a power of two: every interval) or `[S:N,...,>:N]`: S is an interval
  start in MiB and a power of two, N a power of two or 0 (no power-of-two rounding). The first entry also
  fills every interval below it; `>` fills every interval after the last one named (torch 2.11's
  AllocatorConfig test: `[64:8,...,1024:4,>:1]` leaves 1024 MiB at 4). The 16 intervals
  start at 1 MiB, 2 MiB, ... 32 GiB (sizes below 1 MiB use the first, above 64 GiB the last).
- `expandable_segments:True|False` (exactly these spellings).
- `large_segment_size_mb:N` (torch 2.11+): the segment size for large-pool requests under 10 MiB
  (default 20 MiB).
- `backend:native|cudaMallocAsync`; cudaMallocAsync has no caching allocator to model (refused here).
- Options that do not change device-memory placement (`release_lock_on_cudamalloc`, `pinned_*`,
  `graph_capture_record_stream_reuse`, `per_process_memory_fraction`, `throw_on_cudamalloc_oom`) are
  checked for a value and otherwise ignored.
- Any other key is an error, as in torch ("Unrecognized CachingAllocator option"). A trailing comma is
  accepted (`expandable_segments:False,`).

Bad values raise `BadInput` with a one-line message that names the offending item.
"""

from __future__ import annotations

import re

from memq.analysis.allocator_model import AllocatorConfig
from memq.errors import BadInput

MiB = 1024 * 1024
K_LARGE_BUFFER = 20 * MiB
SIZE_MAX = (1 << 64) - 1
N_ROUNDUP_INTERVALS = 16  # 1 MiB .. 64 GiB, one per power of two

_IGNORED = {
    "release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register", "pinned_num_register_threads", "pinned_max_register_threads",
    "pinned_use_background_threads", "graph_capture_record_stream_reuse", "per_process_memory_fraction",
    "pinned_reserve_segment_size_mb", "throw_on_cudamalloc_oom", "pinned_free_catch_all",
    "pinned_max_round_threshold", "pinned_max_cached_size",
}
_HINT = "see https://pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    buf: list[str] = []
    for ch in text:
        if ch in ",:[]":
            if buf:
                out.append("".join(buf))
                buf = []
            out.append(ch)
        elif not ch.isspace():
            buf.append(ch)
    if buf:
        out.append("".join(buf))
    return out


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def _int(tok: str, what: str, text: str) -> int:
    if not re.fullmatch(r"[0-9]+", tok):
        raise BadInput(f"--conf {text!r}: {what} must be a whole number, got {tok!r}", hint=_HINT)
    return int(tok)


def parse_alloc_conf(text: str):
    """`"expandable_segments:True,max_split_size_mb:128"` -> `AllocatorConfig` (defaults for keys not named).

    The empty string gives the default configuration."""
    tok = _tokens(text or "")
    values: dict = {}
    i = 0
    n = len(tok)

    def expect(j: int, ch: str) -> None:
        if j >= n or tok[j] != ch:
            got = tok[j] if j < n else "end of string"
            raise BadInput(f"--conf {text!r}: expected {ch!r} after {tok[j - 1]!r}, got {got!r}", hint=_HINT)

    def value(j: int, key: str) -> str:
        if j >= n or tok[j] in ",:[]":
            raise BadInput(f"--conf {text!r}: {key} needs a value", hint=_HINT)
        return tok[j]

    while i < n:
        key = tok[i]
        if key in ",:[]":
            raise BadInput(f"--conf {text!r}: expected a setting name, got {key!r}", hint=_HINT)
        expect(i + 1, ":")
        i += 2
        if key == "max_split_size_mb" or key == "max_non_split_rounding_mb":
            mb = _int(value(i, key), key, text)
            if mb < K_LARGE_BUFFER // MiB:
                raise BadInput(f"--conf {text!r}: {key} too small, must be >= {K_LARGE_BUFFER // MiB}",
                               hint=_HINT)
            values["max_split_size" if key == "max_split_size_mb" else "max_non_split_rounding_size"] = mb * MiB
        elif key == "large_segment_size_mb":
            mb = _int(value(i, key), key, text)
            if mb < 1:
                raise BadInput(f"--conf {text!r}: large_segment_size_mb must be >= 1", hint=_HINT)
            values["large_segment_size"] = mb * MiB
        elif key == "garbage_collection_threshold":
            raw = value(i, key)
            try:
                f = float(raw)
            except ValueError:
                raise BadInput(f"--conf {text!r}: garbage_collection_threshold must be a number, got {raw!r}",
                               hint=_HINT) from None
            if not 0.0 < f < 1.0:
                raise BadInput(f"--conf {text!r}: garbage_collection_threshold must be in (0.0, 1.0), got {raw}",
                               hint=_HINT)
            values["garbage_collection_threshold"] = f
        elif key == "expandable_segments":
            raw = value(i, key)
            if raw not in ("True", "False"):
                raise BadInput(f"--conf {text!r}: expandable_segments must be True or False, got {raw!r}",
                               hint=_HINT)
            values["expandable_segments"] = raw == "True"
        elif key == "roundup_power2_divisions":
            divs, i = _parse_roundup(tok, i, text)
            values["roundup_power2_divisions"] = divs
        elif key == "backend":
            raw = value(i, key)
            if raw == "native":
                pass
            elif raw in ("cudaMallocAsync", "hipMallocAsync"):
                raise BadInput(f"--conf {text!r}: backend:{raw} has no caching allocator to simulate",
                               hint="what-if models the native caching allocator only")
            else:
                raise BadInput(f"--conf {text!r}: unknown allocator backend {raw!r} (native or cudaMallocAsync)",
                               hint=_HINT)
        elif key in _IGNORED:
            if i < n and tok[i] == "[":
                while i < n and tok[i] != "]":
                    i += 1
            else:
                value(i, key)
        else:
            raise BadInput(f"--conf {text!r}: unrecognized allocator option {key!r}", hint=_HINT)
        i += 1
        if i < n:
            expect(i, ",")  # a trailing comma is accepted, as torch does
            i += 1
    lss = values.get("large_segment_size", K_LARGE_BUFFER)
    if values.get("max_split_size", SIZE_MAX) < lss:
        raise BadInput(f"--conf {text!r}: max_split_size_mb must be >= large_segment_size_mb ({lss // MiB})",
                       hint=_HINT)
    return AllocatorConfig(**values)


def _parse_roundup(tok: list[str], i: int, text: str) -> tuple[tuple[int, ...], int]:
    n = len(tok)
    divs = [0] * N_ROUNDUP_INTERVALS
    if i >= n:
        raise BadInput(f"--conf {text!r}: roundup_power2_divisions needs a value", hint=_HINT)
    if tok[i] != "[":
        d = _int(tok[i], "roundup_power2_divisions", text)
        if not _is_pow2(d):
            raise BadInput(f"--conf {text!r}: roundup_power2_divisions must be a power of 2, got {d}", hint=_HINT)
        return (d,) * N_ROUNDUP_INTERVALS, i
    first = True
    last_index = 0
    i += 1
    while i < n and tok[i] != "]":
        start = tok[i]
        if i + 2 >= n or tok[i + 1] != ":":
            raise BadInput(f"--conf {text!r}: roundup_power2_divisions entries are SIZE_MB:DIVISIONS", hint=_HINT)
        d = _int(tok[i + 2], "roundup_power2_divisions", text)
        if d != 0 and not _is_pow2(d):
            raise BadInput(f"--conf {text!r}: roundup_power2_divisions must be a power of 2 or 0, got {d}",
                           hint=_HINT)
        if start == ">":
            for k in range(last_index + 1, N_ROUNDUP_INTERVALS):
                divs[k] = d
        else:
            mb = _int(start, "roundup_power2_divisions interval", text)
            if not _is_pow2(mb):
                raise BadInput(f"--conf {text!r}: roundup_power2_divisions intervals must be powers of 2, got {mb}",
                               hint=_HINT)
            index = min(max(mb.bit_length() - 1, 0), N_ROUNDUP_INTERVALS - 1)
            if first:
                for k in range(index):
                    divs[k] = d
                first = False
            divs[index] = d
            last_index = index
        i += 3
        if i < n and tok[i] == ",":
            i += 1
    if i >= n:
        raise BadInput(f"--conf {text!r}: roundup_power2_divisions list is missing ']'", hint=_HINT)
    return tuple(divs), i


def split_settings(text: str) -> list[str]:
    """Top-level `key:value` items of a conf string (commas inside [...] stay inside)."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return [x for x in out if x]
