"""Parse an out-of-memory message as torch (and the libraries under it) printed it, in every layout
people paste (tests/fixtures/oom_messages/corpus.jsonl holds real ones, with their sources).

The caching allocator's message (c10/cuda/CUDACachingAllocator.cpp; the same text on ROCm with "HIP",
on XPU with "XPU", device-generic "Out of memory." in the shared allocator):

- 2.2 and later: "Tried to allocate S. GPU 0 has a total capacity of T of which F is free.
  [Process N has X memory in use.]* [Including non-PyTorch memory, this process has P memory in use.]
  [L allowed; ]Of the allocated memory A is allocated by PyTorch, [with Q allocated in private pools
  (e.g., CUDA Graphs), ]and U is reserved by PyTorch but unallocated." Since the private-pool text
  (2.4) torch prints A = allocated + Q and U = reserved - allocated - Q: reserved = A + U, and Q is
  inside A, never added again.
- 2.1: "total capacty" (sic); every process, this one included, printed as "Process N has X".
  A "Process N" line is this process too when no "this process" line is printed and N's figure
  holds PyTorch's reserved bytes (in a container torch cannot match its own pid).
- 1.4 to 2.0: "Tried to allocate S (GPU 0; T total capacity; A already allocated; F free;
  [L allowed; ]R reserved in total by PyTorch)"; IPEX's XPU builds print it without the free figure.
- 1.0 to 1.3: "...; F free; C cached)": C is the cache's unallocated part (reserved = A + C).
- 0.x: "cuda runtime error (2) : out of memory at .../THCStorage.cu:66", no figures.

Outside the caching allocator: "CUDA error: out of memory" (a cudaMalloc by a kernel launch, a
library, NCCL or CUDA-graph capture; context creation), cuBLAS/cuDNN "..._STATUS_ALLOC_FAILED",
MPS "MPS backend out of memory (MPS allocated: A, other allocations: O, max allowed: M). Tried to
allocate S on private pool" (aten/src/ATen/mps/MPSAllocator.mm; its KB/MB/GB are 1024-based),
IPEX's "can NOT allocate memory block with size larger than 4GB", vLLM's sampler warm-up.

Invariants of what is returned: reserved <= device total, allocated <= reserved, this process <=
device total. A message that breaks them (on Windows the driver spills into shared system memory,
so "reserved" can exceed the card) keeps its other figures; the one that cannot hold is dropped and
a note says why.
"""

from __future__ import annotations

import re
from dataclasses import replace

from memq.errors import BadInput
from memq.model import OomMessage

_NUM = r"([0-9]+(?:\.[0-9]+)?)\s*(bytes|B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"
_MULT = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4,
         # MPSAllocator.mm's format_size divides by 1024 and names the units KB/MB/GB
         "KB": 1024, "MB": 1024**2, "GB": 1024**3, "TB": 1024**4}
_FLAGS = re.IGNORECASE | re.DOTALL

_ALLOCATOR = re.compile(r"\b(CUDA|HIP|XPU)\s+out of memory\b|(?:^|[\s.:])Out of memory\.\s*Tried to allocate"
                        r"|Tried to allocate\s+[0-9]", re.IGNORECASE)
_CUDA_ERROR = re.compile(r"CUDA error:\s*out of memory|cudaErrorMemoryAllocation|cuda runtime err(?:or)?\s*\(2\)"
                         r"\s*:\s*out of memory", re.IGNORECASE)
_CUBLAS = re.compile(r"CUBLAS_STATUS_ALLOC_FAILED", re.IGNORECASE)
_CUDNN = re.compile(r"CUDNN_STATUS_ALLOC_FAILED", re.IGNORECASE)
_MPS = re.compile(r"MPS backend out of memory", re.IGNORECASE)
_BLOCK_LIMIT = re.compile(r"can NOT allocate memory block with size larger than\s*" + _NUM.replace(r"\s*", ""),
                          re.IGNORECASE)
_WARMUP = re.compile(r"CUDA out of memory occurred when warming up", re.IGNORECASE)
_SERVERS = (("vllm", re.compile(r"vllm|VllmWorker|EngineCore|gpu[_-]memory[_-]utilization|max[_-]num[_-]seqs"
                                r"|(?:INFO|ERROR|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[\w+\.py:\d+\]", re.IGNORECASE)),
            ("sglang", re.compile(r"sglang|mem[_-]fraction[_-]static", re.IGNORECASE)))

UNRECOGNISED = "the text is not an out-of-memory message of a layout memq knows"


def _bytes(num: str, unit: str) -> int:
    return int(round(float(num) * _MULT[unit]))


def _find(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text, flags=_FLAGS)
    return _bytes(m.group(1), m.group(2)) if m else None


def _server(text: str) -> str | None:
    return next((name for name, rx in _SERVERS if rx.search(text)), None)


def parse_oom_message(text: str) -> OomMessage:
    """Every figure the message carries; fields it lacks stay None. Raises BadInput when the text is
    no out-of-memory message of a known layout (memq never calls such a text healthy)."""
    text = (text or "").strip()
    server = _server(text)
    if _MPS.search(text):
        return _checked(_mps(text, server))
    if _WARMUP.search(text):
        return OomMessage(text=text, kind="server_warmup", layout="server_warmup", server=server or "vllm")
    block = _BLOCK_LIMIT.search(text)
    if block:
        legacy = _legacy(text, server, platform="xpu")
        return _checked(replace(legacy, kind="block_limit", layout="xpu_block_limit",
                                allowed_bytes=None, notes=(f"a single allocation may not exceed "
                                                           f"{block.group(1)} {block.group(2)} on this platform",)))
    if _ALLOCATOR.search(text) and re.search(r"Tried to allocate|out of memory\.", text, _FLAGS):
        if re.search(r"\(GPU\s+\d+;", text, _FLAGS):
            return _checked(_legacy(text, server, platform=_platform(text)))
        return _checked(_current(text, server))
    if _CUBLAS.search(text):
        return OomMessage(text=text, kind="cublas", layout="cublas", server=server)
    if _CUDNN.search(text):
        return OomMessage(text=text, kind="cudnn", layout="cudnn", server=server)
    if _CUDA_ERROR.search(text):
        thc = re.search(r"cuda runtime err(?:or)?\s*\(2\)", text, _FLAGS)
        return OomMessage(text=text, kind="cuda_error", layout="thc" if thc else "cuda_error", server=server)
    raise BadInput(UNRECOGNISED,
                   hint="paste the line with 'out of memory. Tried to allocate ...' (CUDA/HIP/XPU), 'MPS backend "
                        "out of memory', 'CUDA error: out of memory' or '..._STATUS_ALLOC_FAILED'")


def _platform(text: str) -> str:
    m = re.search(r"\b(HIP|XPU)\s+out of memory", text, re.IGNORECASE)
    return m.group(1).lower() if m else "cuda"


def _current(text: str, server: str | None) -> OomMessage:
    """2.1 and later (module docstring), also cut short: every figure is optional."""
    dev = re.search(r"GPU\s+(\d+)\s+has a total capac", text)
    this = _find(r"this process has\s+" + _NUM + r"\s+memory in use", text)
    procs = [(int(m.group(1)), _bytes(m.group(2), m.group(3)))
             for m in re.finditer(r"Process\s+(\d+)\s+has\s+" + _NUM + r"\s+memory in use", text, _FLAGS)]
    allocated = _find(r"Of the allocated memory\s+" + _NUM + r"\s+is allocated by PyTorch", text)
    unallocated = _find(_NUM + r"\s+is reserved by PyTorch but unallocated", text)
    notes: list[str] = []
    if this is None and procs and allocated is not None:
        # 2.1 printed every process as "Process N"; in a container the pid is not this process's
        # either. The one whose figure holds PyTorch's reserved bytes is this process.
        reserved = allocated + (unallocated or 0)
        own = [p for p in procs if p[1] >= reserved]
        if len(own) == 1:
            this = own[0][1]
            procs = [p for p in procs if p is not own[0]]
            notes.append(f"process {own[0][0]} is read as this process: its figure holds PyTorch's reserved bytes")
    layout = "capacty" if re.search(r"total capacty", text) else "current"
    if re.search(r"allocated in private pools", text, _FLAGS):
        layout = "private_pools"
    truncated = not re.search(r"reserved by PyTorch but unallocated|allocated in private pools", text, _FLAGS)
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        device_index=int(dev.group(1)) if dev else None,
        device_total_bytes=_find(r"total capac(?:ity|ty) of\s+" + _NUM, text),
        device_free_bytes=_find(r"of\s+which\s+" + _NUM + r"\s+is free", text),
        process_in_use_bytes=this,
        allowed_bytes=_find(_NUM + r"\s+allowed", text),
        allocated_bytes=allocated,
        private_pool_bytes=_find(r"with\s+" + _NUM + r"\s+allocated in private pools", text),
        reserved_unallocated_bytes=unallocated,
        text=text, layout="truncated" if truncated and allocated is None else layout,
        platform=_platform(text), other_processes=tuple(procs), server=server, truncated=truncated,
        notes=tuple(notes),
    )


def _legacy(text: str, server: str | None, platform: str) -> OomMessage:
    """The parenthesised layout of torch 1.x-2.0 and IPEX (module docstring)."""
    dev = re.search(r"\(GPU\s+(\d+);", text, _FLAGS)
    allocated = _find(r";\s*" + _NUM + r"\s+already allocated", text)
    reserved = _find(r";\s*" + _NUM + r"\s+reserved in total by PyTorch", text)
    unallocated = reserved - allocated if reserved is not None and allocated is not None else None
    layout = "reserved_in_total"
    notes: list[str] = []
    if reserved is None:
        # 1.0-1.3: "cached" was the cache's unallocated part (allocated + cached + free adds up to
        # the device less its context in the messages of that time)
        unallocated = _find(r";\s*" + _NUM + r"\s+cached", text)
        layout = "cached" if unallocated is not None else "truncated"
    elif unallocated is not None and unallocated < 0:
        notes.append("the message's reserved figure is below its allocated one: read as no unallocated cache")
        unallocated = 0
    if platform == "xpu":
        layout = "xpu_legacy"
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        device_index=int(dev.group(1)) if dev else None,
        device_total_bytes=_find(r"\(GPU\s+\d+;\s*" + _NUM + r"\s+total capacity", text),
        device_free_bytes=_find(r";\s*" + _NUM + r"\s+free", text),
        allowed_bytes=_find(r";\s*" + _NUM + r"\s+allowed", text),
        allocated_bytes=allocated,
        reserved_unallocated_bytes=unallocated,
        text=text, layout=layout, platform=platform, server=server,
        truncated=not re.search(r"(reserved in total by PyTorch|cached)\s*\)", text, _FLAGS), notes=tuple(notes),
    )


def _mps(text: str, server: str | None) -> OomMessage:
    """MPSAllocator.mm: the cap is the high watermark ("max allowed"), which counts this allocator's
    bytes and the other Metal allocations of the process together."""
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        allocated_bytes=_find(r"MPS allocated:\s*" + _NUM, text),
        other_allocations_bytes=_find(r"other allocations:\s*" + _NUM, text),
        allowed_bytes=_find(r"max allowed:\s*" + _NUM, text),
        text=text, kind="mps", layout="mps", platform="mps", server=server,
        truncated=not re.search(r"Tried to allocate", text),
    )


def _checked(m: OomMessage) -> OomMessage:
    """Hold the invariants (module docstring): drop a device total that the message's own figures exceed."""
    notes = list(m.notes)
    total = m.device_total_bytes
    over = [(name, v) for name, v in (("reserved", m.reserved_bytes), ("allocated", m.allocated_bytes),
                                      ("this process's", m.process_in_use_bytes)) if v is not None]
    if total is not None:
        bad = [(name, v) for name, v in over if v > total]
        if bad:
            name, v = bad[0]
            notes.append(f"the message's {name} {_fmt(v)} exceeds its total capacity {_fmt(total)} (on Windows the "
                         "driver spills into shared system memory): the capacity is not used")
            m = replace(m, device_total_bytes=None)
    return replace(m, notes=tuple(notes))


def _fmt(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.2f} MiB"
