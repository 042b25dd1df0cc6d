"""Parse the text of a `torch.OutOfMemoryError` (`CUDA out of memory. Tried to allocate ...`)."""

from __future__ import annotations

import re

from profiler.errors import BadInput
from profiler.model import OomMessage

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
    dev = re.search(r"GPU\s+(\d+)\s+has a total capacity", text)
    return OomMessage(
        requested_bytes=_find(r"Tried to allocate\s+" + _NUM, text),
        device_index=int(dev.group(1)) if dev else None,
        device_total_bytes=_find(r"total capacity of\s+" + _NUM, text),
        device_free_bytes=_find(r"of which\s+" + _NUM + r"\s+is free", text),
        process_in_use_bytes=_find(r"this process has\s+" + _NUM + r"\s+memory in use", text),
        allowed_bytes=_find(_NUM + r"\s+allowed", text),
        allocated_bytes=_find(r"Of the allocated memory\s+" + _NUM + r"\s+is allocated by PyTorch", text),
        private_pool_bytes=_find(r"with\s+" + _NUM + r"\s+allocated in private pools", text),
        reserved_unallocated_bytes=_find(_NUM + r"\s+is reserved by PyTorch but unallocated", text),
        text=text.strip(),
    )
