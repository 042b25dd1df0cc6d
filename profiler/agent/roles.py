"""The roles of the tensors the agent can see, as address ranges sent with each snapshot
(ARCHITECTURE.md "Composition and phase"): the optimizer's parameters, their `.grad`, the tensors in
`optimizer.state`, and the model's parameters and buffers when the job passed its model; and the
inference caches the job declared: `memq.agent.roles.declare(cache)` once, where `cache` is the object
that holds a KV cache (transformers' `DynamicCache` or `StaticCache`, a list of tensors, a tensor):
its tensors are read again at every snapshot, so a cache that grows by concatenation is followed.

The analysis reads these first (profiler/analysis/provenance.py): a live block that holds one of these
storages is that class, "known from the job", whatever its frames say or whenever it was made.

What is sent (`memq_agent["roles"]`): `{"v": 1, "ranges": [[address, nbytes, code], ...], "bytes":
{role: total}, "truncated": bool}`, ranges sorted by address, one per storage (a storage seen in two
roles keeps the first of ROLES: a parameter that is also in the state stays a parameter). Codes are the
index in ROLES. Storages of size 0, meta tensors and tensors of other devices are left out.

Cost: one Python pass over the parameters and the state (a 7B model in 291 tensors: well under a
millisecond per hundred tensors); it runs where a snapshot is taken, never on a step boundary. No torch
import: the tensors come from the job's own objects.
"""

from __future__ import annotations

import weakref
from typing import Any

from memq.model import AGENT_ROLES as ROLES  # the analysis reads the same table

PARAMETER, GRADIENT, OPTIMIZER_STATE, BUFFER, CACHE = range(len(ROLES))
MAX_RANGES = 200_000  # beyond this the list is cut (and says so): a snapshot's metadata stays bounded
SCHEMA = 1
MAX_DECLARED = 64  # declared holders kept (the oldest are dropped): a job declares a cache or two
# Declared holders: weak references where the object takes one (a cache object, a tensor), else weak
# references to the tensors it held when declared (a list or a tuple cannot be referenced weakly), so
# that declaring never keeps a cache alive.
_declared: list = []


def declare(holder: Any, role: str = "cache") -> bool:
    """Declares what `holder` holds (its tensors, in its attributes, lists, tuples and dicts, a few levels
    deep) to be `role` (only "cache": an inference cache) at every later snapshot. Returns whether it was
    kept; never raises."""
    if role != "cache" or holder is None:
        return False
    try:
        try:
            refs = (weakref.ref(holder),)
        except TypeError:
            refs = tuple(weakref.ref(t) for t in _tensors(holder, 0, 5))
        _declared.append(refs)
        del _declared[:-MAX_DECLARED]
        return True
    except Exception:  # noqa: BLE001 - a holder whose tensors take no weak reference: nothing declared
        return False


def _storage_range(t: Any, device_types: tuple) -> tuple[int, int] | None:
    """(address, nbytes) of a tensor's whole storage (views share their base's block), or None."""
    try:
        if t is None or not hasattr(t, "untyped_storage"):
            return None
        if getattr(t, "is_meta", False) or t.device.type not in device_types:
            return None
        inner = getattr(t, "_local_tensor", None)  # a DTensor's shard on this rank
        if inner is not None:
            t = inner
        st = t.untyped_storage()
        n = int(st.nbytes())
        ptr = int(st.data_ptr())
    except Exception:  # noqa: BLE001 - a subclass without storage, a freed or fake tensor
        return None
    if n <= 0 or ptr == 0:
        return None
    return ptr, n


def _tensors(obj: Any, depth: int = 0, max_depth: int = 3):
    """Tensors in an optimizer state value: a tensor, or lists, tuples and dicts of them; with a larger
    max_depth (a declared cache) also the attributes of plain objects."""
    if depth > max_depth:
        return
    if hasattr(obj, "untyped_storage"):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors(v, depth + 1, max_depth)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors(v, depth + 1, max_depth)
    elif max_depth > 3 and hasattr(obj, "__dict__") and not isinstance(obj, type):
        yield from _tensors(vars(obj), depth + 1, max_depth)


def collect(optimizer: Any = None, model: Any = None, device_types: tuple = ("cuda",),
            max_ranges: int = MAX_RANGES) -> dict | None:
    """The roles of what the optimizer and the model hold, or None when there is nothing to say
    (neither was given, or they hold no tensor of `device_types`). Never raises."""
    if optimizer is None and model is None and not _declared:
        return None
    seen: dict[int, tuple[int, int]] = {}  # address -> (nbytes, role code)
    totals = [0] * len(ROLES)
    truncated = False

    def add(t: Any, code: int) -> None:
        nonlocal truncated
        r = _storage_range(t, device_types)
        if r is None:
            return
        ptr, n = r
        if ptr in seen:
            return
        if len(seen) >= max_ranges:
            truncated = True
            return
        seen[ptr] = (n, code)
        totals[code] += n

    try:
        params: list = []
        groups = getattr(optimizer, "param_groups", None) or []
        for g in groups:
            params.extend(g.get("params", []) if isinstance(g, dict) else [])
        if model is not None and hasattr(model, "parameters"):
            params.extend(model.parameters())
        for p in params:
            add(p, PARAMETER)
        for p in params:
            add(getattr(p, "grad", None), GRADIENT)
        state = getattr(optimizer, "state", None)
        if isinstance(state, dict):
            for per_param in state.values():
                for t in _tensors(per_param):
                    add(t, OPTIMIZER_STATE)
        if model is not None and hasattr(model, "buffers"):
            for b in model.buffers():
                add(b, BUFFER)
        for refs in list(_declared):
            for ref in refs:
                for t in _tensors(ref(), 0, 5):
                    add(t, CACHE)
    except Exception:  # noqa: BLE001 - a job's odd optimizer: what was gathered so far still holds
        truncated = True
    if not seen:
        return None
    ranges = [[ptr, n, code] for ptr, (n, code) in sorted(seen.items())]
    return {"v": SCHEMA, "ranges": ranges, "bytes": {ROLES[i]: totals[i] for i in range(len(ROLES)) if totals[i]},
            "truncated": truncated}
