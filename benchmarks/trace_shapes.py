"""Snapshots of any length in the shapes real recordings have, built from real trace entries.

Each shape takes the entries of a real recording, repeats them to `n` entries (each copy's addresses
moved to their own range and its times after the previous copy's) and shares the objects the way
the shape says; the result is pickled with protocol 4, as torch's `_dump_snapshot` does:

- `python`: Python frames (the real 100k-entry H200 snapshot), shared as torch 2.11 pickles a capture:
  one dict per distinct frame for the whole file, one frames list per allocation, shared by the frees
  of that allocation;
- `cpp`: the same sharing, with the C++ and Python frames of a `stacks="all"` recording (the real
  cuDNN-workspace capture: 35 frames a stack, demangled symbols up to 1,473 characters);
- `cpp_lists`: the C++ frames with a frames list of its own for every entry (frame dicts still shared);
- `unshared`: every frames list and every frame dict its own object (the Python frames as the real
  100k-entry snapshot holds them: 55,150 lists of 486,682 dicts, no two the same object);
- `no_frames`: the Python recording's entries with no frames (`stacks` off: each entry its own empty list).
"""

from __future__ import annotations

import pickle
from pathlib import Path

from memq import codec

ROOT = Path(__file__).resolve().parents[1]
PY_SOURCE = ROOT / "benchmarks" / "data" / "big.pickle.gz"
CPP_SOURCE = ROOT / "tests" / "fixtures" / "captured" / "cudnn_workspace" / "after_benchmark_step.pickle.gz"
SHAPES = ("python", "cpp", "cpp_lists", "unshared", "no_frames")
_ADDR_STRIDE = 1 << 40  # each copy's addresses in a range of their own


def _source(shape: str) -> dict:
    path = CPP_SOURCE if shape.startswith("cpp") else PY_SOURCE
    return codec.loads_restricted(codec.decompress(path.read_bytes()))


def build(shape: str, n: int) -> bytes:
    """A pickled snapshot of `n` trace entries in `shape` (see the module's docstring)."""
    snap = _source(shape)
    trace = [e for e in snap["device_traces"][0] if e.get("action") != "snapshot"]
    t0, t1 = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    frames: dict[tuple, dict] = {}  # one dict per distinct frame, for the shared shapes

    def shared(f: dict) -> dict:
        return frames.setdefault((f["filename"], f["line"], f["name"]), f)

    out: list[dict] = []
    k = 0
    while len(out) < n:
        by_addr: dict[int, list] = {}  # the list of each live allocation of this copy
        for e in trace:
            if len(out) >= n:
                break
            e2 = dict(e)
            if "addr" in e2 and type(e2["addr"]) is int:
                e2["addr"] += k * _ADDR_STRIDE
            if type(e2.get("time_us")) is int:
                e2["time_us"] += k * (t1 - t0 + 1000)
            fl = e.get("frames") or []
            if shape == "no_frames":
                e2["frames"] = []
            elif shape == "unshared":
                e2["frames"] = [dict(f) for f in fl]
            elif shape == "cpp_lists":
                e2["frames"] = [shared(f) for f in fl]
            else:  # python, cpp: a list per allocation, the same list for its frees
                if e2.get("action") == "alloc" or e2.get("addr") not in by_addr:
                    lst = [shared(f) for f in fl]
                    if e2.get("action") == "alloc":
                        by_addr[e2.get("addr")] = lst
                else:
                    lst = by_addr[e2["addr"]] if fl else []
                e2["frames"] = lst
            out.append(e2)
        k += 1
    snap["device_traces"] = [out]
    return pickle.dumps(snap, protocol=4)
