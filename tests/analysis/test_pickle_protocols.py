"""Snapshots pickled with protocol 5 (Python 3.14's default pickle protocol, which memory_viz cannot
read) decode like the protocol-2 files torch writes today, through memq's restricted decoder."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from memq import codec

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"


@pytest.mark.parametrize("name", ["seed_adamw/epoch1.pickle.gz", "capacity"])
def test_protocol_5_snapshot_decodes_as_the_original(name):
    path = REAL / name
    if path.is_dir():
        path = sorted(path.glob("*.pickle*"))[-1]
    raw = codec.decompress(path.read_bytes())
    snap = codec.loads_restricted(raw)
    again = pickle.dumps(snap, protocol=5)
    assert again[:2] == b"\x80\x05"
    assert codec.loads_restricted(again) == snap
