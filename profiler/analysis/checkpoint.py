"""A checkpoint being loaded onto the GPU beside the live model and optimizer (ARCHITECTURE.md cause 3:
`torch.load` restoring a checkpoint; the resume case of "The failing step's need"). Pure.

`torch.load(path)` of a checkpoint saved from GPU tensors restores every tensor onto the GPU, so a
resume briefly holds the model and optimizer twice (once live, once loaded), which is not a training
step at all: its blocks are copies of the parameters and the optimizer state, not a larger input.

Recognised by the failing allocation's frames (the OOM event's, or the agent's observer stack), and
without frames by what appeared since the previous snapshot: blocks that duplicate the live parameter
and optimizer-state blocks size for size, in more bytes than the parameters' own (an EMA copy of the
weights duplicates the parameters once, and is no checkpoint).
"""

from __future__ import annotations

import re
from collections import Counter

from memq.analysis import frames as fr
from memq.analysis.rules import DUPLICATE_OVER_PARAMS, DUPLICATE_SHARE  # sources: rules.py
from memq.model import Snapshot, frame_file, frame_name
from memq.units import fmt_bytes

_LOAD_FILE = re.compile(r"torch/serialization\.py$|safetensors/")
# An optimizer's load_state_dict casts the loaded state onto the parameters' device; a module's copies
# into the live tensors (which allocates nothing), but it is the load all the same.
_LOAD_NAME = re.compile(r"^(load_state_dict|_load_from_state_dict)$")


def load_frame(frames: list) -> dict | None:
    """The frame that restores a checkpoint, or None."""
    for f in frames or []:
        if _LOAD_FILE.search(frame_file(f).replace("\\", "/")) or _LOAD_NAME.match(frame_name(f)):
            return f
    return None


def checkpoint_load(oom_frames: list, snap: Snapshot, before: dict | None) -> dict | None:
    """{"by", "site", "loaded_bytes", "duplicated_bytes", "params_bytes", "state_bytes"} when the OOM came
    while a checkpoint was loaded onto the GPU; `before`: the previous snapshot's live blocks."""
    params = state = 0
    live_sizes: Counter = Counter()
    new: list[int] = []
    for seg in snap.segments:
        for b in seg.blocks:
            if not b.is_live:
                continue
            cat = fr.categorize(b.frames) if b.frames else None
            is_new = before is not None and (b.address, b.size) not in before
            if cat in (fr.PARAMETERS, fr.OPTIMIZER_STATE) and not is_new:
                live_sizes[b.size] += 1
                if cat == fr.PARAMETERS:
                    params += b.size
                else:
                    state += b.size
            elif is_new:
                new.append(b.size)
    dup = 0
    left = Counter(live_sizes)
    for size in new:
        if left[size] > 0:
            left[size] -= 1
            dup += size
    out = {"loaded_bytes": sum(new) if before is not None else None, "duplicated_bytes": dup,
           "params_bytes": params, "state_bytes": state, "site": None}
    frame = load_frame(oom_frames)
    if frame is not None:
        out["by"] = f"the failing allocation is in {frame_name(frame)} ({frame_file(frame).rsplit('/', 1)[-1]})"
        out["site"] = fr.user_line(oom_frames)
        return out
    if (before is not None and params and state and dup > DUPLICATE_OVER_PARAMS * params
            and dup >= DUPLICATE_SHARE * max(1, sum(new))):
        out["by"] = (f"the blocks new since the previous snapshot duplicate the live parameter and optimizer-"
                     f"state blocks size for size ({fmt_bytes(dup, 'brief')}, {dup / params:.1f}x the parameters)")
        return out
    return None
