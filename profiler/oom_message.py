"""Parse the text of a `torch.OutOfMemoryError` (`CUDA out of memory. Tried to allocate ...`), in every
layout torch has printed:

- 2.1 and later: "... GPU 0 has a total capacity of 79.15 GiB of which 25.56 MiB is free. Including
  non-PyTorch memory, this process has 79.12 GiB memory in use. 18.85 GiB allowed; Of the allocated
  memory 78.52 GiB is allocated by PyTorch, and 101.65 MiB is reserved by PyTorch but unallocated."
  (2.1.0 printed "total capacty" and "Process 2 has 79.12 GiB memory in use").
- 1.x to 2.0, the layout most forum posts quote: "Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total
  capacity; 14.21 GiB already allocated; 3.75 MiB free; 14.50 GiB allowed; 14.50 GiB reserved in total
  by PyTorch)": "allowed" only under a per-process fraction, and before 1.4 "1.34 GiB cached" for the
  cache's free part (reserved = allocated + cached). The device's free bytes are its own (all
  processes); the process's use is not printed, so memory outside PyTorch is unknown there.
"""

from __future__ import annotations

import re

from memq.errors import BadInput
from memq.model import OomMessage

_NUM = r"([0-9]+(?:\.[0-9]+)?)\s*(B|bytes|KiB|MiB|GiB|TiB)"
_MULT = {"B": 1, "bytes": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3, "TiB": 1024**4}


def _bytes(num: str, unit: str) -> int:
    return int(round(float(num) * _MULT[unit]))


def _find(pattern: str, text: str) -> int | None:
    m = re.search(pattern, text, flags=re.IGNORECASE | re.DOTALL)
    return _bytes(m.group(1), m.group(2)) if m else None


def parse_oom_message(text: str) -> OomMessage:
    """Every figure the message carries; fields it lacks stay None. Raises BadInput when the text
    is not an out-of-memory message at all."""
    if not text or "out of memory" not in text.lower():
        raise BadInput("the message is not a CUDA out-of-memory message",
                       hint="pass the line that starts with 'CUDA out of memory. Tried to allocate'")
    legacy = re.search(r"\(GPU\s+(\d+);\s*" + _NUM + r"\s+total capacity", text, flags=re.IGNORECASE)
    if legacy:
        return _legacy(text, int(legacy.group(1)))
    dev = re.search(r"GPU\s+(\d+)\s+has a total capac", text)
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        device_index=int(dev.group(1)) if dev else None,
        device_total_bytes=_find(r"total capac(?:ity|ty) of\s+" + _NUM, text),
        device_free_bytes=_find(r"of which\s+" + _NUM + r"\s+is free", text),
        process_in_use_bytes=_find(r"(?:this process|Process \d+) has\s+" + _NUM + r"\s+memory in use", text),
        allowed_bytes=_find(_NUM + r"\s+allowed", text),
        allocated_bytes=_find(r"Of the allocated memory\s+" + _NUM + r"\s+is allocated by PyTorch", text),
        private_pool_bytes=_find(r"with\s+" + _NUM + r"\s+allocated in private pools", text),
        reserved_unallocated_bytes=_find(_NUM + r"\s+is reserved by PyTorch but unallocated", text),
        text=text.strip(),
    )


def _legacy(text: str, device: int) -> OomMessage:
    """The parenthesised layout of torch 1.x-2.0 (module docstring)."""
    allocated = _find(r";\s*" + _NUM + r"\s+already allocated", text)
    reserved = _find(r";\s*" + _NUM + r"\s+reserved in total by PyTorch", text)
    unallocated = reserved - allocated if reserved is not None and allocated is not None else None
    if reserved is None:
        # "cached" was the cache's free part (messages show it far below what is allocated, and
        # allocated + cached + free then adds up to the device less its context)
        unallocated = _find(r";\s*" + _NUM + r"\s+cached", text)
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        device_index=device,
        device_total_bytes=_find(r"\(GPU\s+\d+;\s*" + _NUM + r"\s+total capacity", text),
        device_free_bytes=_find(r";\s*" + _NUM + r"\s+free", text),
        allowed_bytes=_find(r";\s*" + _NUM + r"\s+allowed", text),
        allocated_bytes=allocated,
        reserved_unallocated_bytes=None if unallocated is None else max(0, unallocated),
        text=text.strip(),
    )
