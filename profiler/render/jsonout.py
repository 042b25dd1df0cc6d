"""JSON output: the contract object, one document, stable key order."""

from __future__ import annotations

import json
from typing import TextIO


def write_json(result: dict, out: TextIO, *, details: bool = True) -> None:
    doc = result if details else {k: v for k, v in result.items() if k != "details"}
    json.dump(doc, out, indent=2, default=_default)
    out.write("\n")


def _default(o):
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)
