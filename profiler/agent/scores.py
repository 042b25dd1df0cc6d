"""Attention scores, seen once, in the first forward.

A tensor whose last two dimensions are both the input's length, (..., t, t), grows with the square of the
length: attention's math path keeps its softmax for backward (an additive float mask, a relative position
bias, anything the fused kernels do not take). A trace of Python frames cannot show it: the allocation is
made on the model's line that calls attention, beside blocks of (batch, t, width) that grow linearly. So
while the first forward runs, autograd's saved-tensor hook notes each saved (..., t, t) tensor by the
line that made it and its bytes; `memq fit` scales the allocations of that line and size with the length
squared. The hook passes every tensor through unchanged, and is gone when that forward returns.
"""

from __future__ import annotations

import sys
from typing import Any

from memq.model import SQUARE_SITES_MAX, input_length

#: Module forwards the agent's pre-hook waits through, under no_grad or inference mode, for the first forward
#: that saves for backward: a validation sanity check before training (Lightning runs two batches) is a few
#: thousand module calls; an inference-only job stops paying its check (about a microsecond) after this many.
LEARNING_FORWARD_WAIT_CALLS = 100_000


class ScoreSites:
    """The saved-tensor pack hook of the first forward (identity): notes every saved tensor whose last two
    dimensions are equal, (..., n, n), by n; those of n = the input's length are kept when it returns (the
    length is known only then for a model called with keywords, as Hugging Face models are)."""

    def __init__(self, devices: tuple):
        self.devices = devices
        self.found: set[tuple[int, str, int, int]] = set()  # (n, file, line, bytes)

    def pack(self, t: Any) -> Any:
        try:
            shape = t.shape
            if (len(shape) >= 3 and shape[-1] == shape[-2] > 1 and len(self.found) < SQUARE_SITES_MAX
                    and t.device.type in self.devices):
                caller = sys._getframe(1)  # the line that ran the op: where the trace places its allocation
                self.found.add((int(shape[-1]), caller.f_code.co_filename, caller.f_lineno,
                                int(t.untyped_storage().nbytes())))
        except Exception:  # noqa: BLE001 - never in the way of the user's forward
            pass
        return t

    @staticmethod
    def unpack(t: Any) -> Any:
        return t

    def sites(self, length: int | None) -> list[list]:
        return [[f, line, b] for n, f, line, b in sorted(self.found) if n == length]


def learning() -> bool:
    """Does a forward now save tensors for backward (grad on, not inference mode)?"""
    torch = sys.modules["torch"]
    return bool(torch.is_grad_enabled()) and not torch.is_inference_mode_enabled()


def keyword_inputs(facts: dict, kwargs: dict) -> None:
    """A forward called with keywords only (`model(input_ids=..., attention_mask=...)`): its tensor keywords,
    input_ids first, stand for the positional arguments the pre-hook did not get."""
    torch = sys.modules["torch"]
    if facts.get("shapes") or not kwargs:
        return
    named = sorted((k for k, v in kwargs.items() if isinstance(v, torch.Tensor)), key=lambda k: k != "input_ids")[:4]
    facts["shapes"] = [[int(d) for d in kwargs[k].shape][:8] for k in named]
    facts["dtypes"] = [str(kwargs[k].dtype).removeprefix("torch.") for k in named]


def watch_first_forward(module: Any, facts: dict, devices: tuple) -> bool:
    """Note the first forward's attention scores into facts["square"] when that forward returns (and its
    keyword inputs into facts["shapes"] when it had no positional ones). False (nothing installed) under
    torch.compile's tracing (the hook would be traced, not run), where saved-tensor hooks are disabled (a
    functorch transform), or where the module cannot call a hook on every exit (torch < 2.1)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    if compiling is not None and compiling():
        return False
    rec = ScoreSites(devices)
    ctx = torch.autograd.graph.saved_tensors_hooks(rec.pack, rec.unpack)
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    state = {"handle": None}

    def done(_module, _args, kwargs, _out):
        handle, state["handle"] = state["handle"], None
        if handle is None:
            return None
        try:  # a hook of the user's forward: nothing of ours may raise into it
            handle.remove()
            # pop ours only: a forward that left hooks of its own pushed keeps them (ours, an identity,
            # then stays beneath them)
            if top is None or top(False) == (rec.pack, rec.unpack):
                ctx.__exit__(None, None, None)
            keyword_inputs(facts, kwargs)
            facts["square"] = rec.sites(input_length(facts.get("shapes"), facts.get("dtypes") or ()))
        except Exception:  # noqa: BLE001
            pass
        return None

    try:
        ctx.__enter__()
    except RuntimeError:  # "saved tensors default hooks are disabled"
        return False
    try:
        state["handle"] = module.register_forward_hook(done, with_kwargs=True, always_call=True)
    except TypeError:  # no always_call: an exception in the forward would leave the hook pushed
        ctx.__exit__(None, None, None)
        return False
    return True
