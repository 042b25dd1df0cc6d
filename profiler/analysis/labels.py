"""How evidence names a snapshot: in the user's terms (where in the run it was taken), never a
stream id or a blob hash. "end of epoch 0 (step 14)", "OOM in step 60 (epoch 3)",
"periodic snapshot at step 200". Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_NUM = {"epoch": re.compile(r"epoch[_-]?(\d+)", re.I), "step": re.compile(r"step[_-]?(\d+)", re.I)}
_OOM = re.compile(r"(^|[^a-z])oom([^a-z]|$)", re.I)


def infer_from_name(path: str) -> dict[str, Any]:
    """Step, epoch and trigger from file names such as `epoch2.pickle.gz`, `step0040.pickle.gz`,
    `oom.pickle.gz` (the agent and the fixtures name them so). Explicit options win."""
    name = str(path).replace("\\", "/").rsplit("/", 1)[-1]
    out: dict[str, Any] = {}
    for key, rx in _NUM.items():
        m = rx.search(name)
        if m:
            out[key] = int(m.group(1))
    if _OOM.search(name):
        out["trigger"] = "oom"
    elif "epoch" in out:
        out["trigger"] = "epoch_end"
    elif "step" in out:
        out["trigger"] = "periodic"
    return out


def snapshot_label(trigger: str | None, step: int | None = None, epoch: int | None = None, *,
                   step_in_progress: int | None = None, step_completed: int | None = None,
                   fallback: str | None = None) -> str | None:
    """A label from what is known of where the snapshot was taken; `fallback` (e.g. a file name)
    when neither trigger nor step is known. For an OOM, the step in progress is the failing one
    (older agents sent the last completed step: then the OOM is "after" it)."""
    ep = f"epoch {epoch}" if epoch is not None else None
    if trigger == "oom":
        if step_in_progress is not None:
            return f"OOM in step {step_in_progress}" + (f" ({ep})" if ep else "")
        if step_completed is not None:
            return f"OOM in step {step_completed + 1}" + (f" ({ep})" if ep else "")
        if step is not None:
            return f"OOM at step {step}" + (f" ({ep})" if ep else "")
        return f"OOM in {ep}" if ep else "the OOM snapshot"
    if trigger == "epoch_end" and epoch is not None:
        return f"end of {ep}" + (f" (step {step})" if step is not None else "")
    kind = {"periodic": "periodic snapshot", "manual": "manual snapshot", "signal": "snapshot on signal",
            "epoch_end": "end-of-epoch snapshot"}.get(trigger or "", "snapshot" if trigger else None)
    if kind is None:
        if step is None and epoch is None:
            return fallback
        kind = "snapshot"
    if step is not None:
        return f"{kind} at step {step}" + (f" ({ep})" if ep else "")
    if ep:
        return f"{kind} in {ep}"
    return fallback or kind


def agent_label(agent: Mapping[str, Any] | None, fallback: str | None = None) -> str | None:
    """The label of a snapshot from the facts its agent embedded (per_snapshot.agent_facts)."""
    if not agent or not agent.get("trigger"):
        return fallback
    done = agent.get("step_completed")
    if agent.get("trigger") == "oom" and agent.get("step_in_progress") is None and done is None:
        done = agent.get("step")  # agents before step_in_progress sent the last marked (completed) step
    return snapshot_label(agent.get("trigger"), agent.get("step"), agent.get("epoch"),
                          step_in_progress=agent.get("step_in_progress"), step_completed=done,
                          fallback=fallback)
