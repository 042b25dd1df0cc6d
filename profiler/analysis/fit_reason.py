"""Why a run has no `fit` (pure, light: a healthy snapshot's analysis says it without loading the
allocator model that `memq fit` replays with)."""

from __future__ import annotations


def missing_reason(reasons: list[tuple[str, str | None]]) -> str:
    """A run's `fit_reason` when it has no `fit`: (snapshot name, its reason) of each snapshot, oldest
    first; the reason of the latest snapshot that has a trace, else that none has one."""
    traced = [(n, r) for n, r in reasons if r and not r.startswith("no trace")]
    if not traced:
        return (f"none of the run's {len(reasons)} snapshot(s) has a trace: memq fit replays a recorded training "
                "step (the agent records the warm-up at its defaults, history=\"auto\"; history=\"off\" records "
                "none)")
    name, why = traced[-1]
    return f"no snapshot of the run holds a whole training step from its start; the latest traced one ({name}): {why}"
