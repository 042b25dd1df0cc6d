"""Byte sizes: parse what users type (`17.2GiB`, `40GB`, `123456`) and format for people."""

from __future__ import annotations

import re

from profiler.errors import BadInput

_UNITS = {
    "": 1, "b": 1,
    "k": 1024, "kb": 1000, "kib": 1024,
    "m": 1024**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1024**3, "gb": 1000**3, "gib": 1024**3,
    "t": 1024**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")

KiB = 1024
MiB = 1024**2
GiB = 1024**3


def parse_size(text: str | int) -> int:
    """Bytes from `text`. Bare numbers are bytes; GiB/MiB/KiB are binary, GB/MB/KB decimal,
    and a bare G/M/K is binary (as nvidia-smi and torch messages mean it)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m or m.group(2).lower() not in _UNITS:
        raise BadInput(f"cannot read size {text!r}", hint="use bytes or a unit, e.g. 17179869184 or 16GiB")
    return int(round(float(m.group(1)) * _UNITS[m.group(2).lower()]))


def fmt_bytes(n: int | float | None) -> str:
    if n is None:
        return "n/a"
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div:
            return f"{sign}{n / div:.2f} {unit}"
    return f"{sign}{int(n)} B"
