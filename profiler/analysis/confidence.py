"""How sure a diagnosis is of each cause it lists: one function, `confidence`, from the role the cause
plays in the diagnosis and the strength of its deciding test (0..1, each `check_<cause>` says how
clearly its numbers pass). The constants are in rules.py; docs/analysis.md ("Causes") has the table:

- primary: CONF_BASE + CONF_PER_STRENGTH x strength, less CONF_EARLIER_UNSETTLED when a cause
  earlier in the precedence could not be ruled out; at most CONF_MESSAGE_FRAGMENTATION for
  fragmentation read from an OOM message alone;
- weak primary (an OOM with no test settled): CONF_UNSETTLED_PRIMARY;
- also holds: CONF_SECONDARY_BASE + CONF_SECONDARY_PER_STRENGTH x strength, at least
  CONF_BELOW_PRIMARY under the primary, never under CONF_FLOOR;
- listed (part of the story, its test does not hold): CONF_SECONDARY_BASE, at least
  CONF_BELOW_PRIMARY under the primary, never under CONF_FLOOR;
- not settled (an input is missing): CONF_NOT_SETTLED.
"""

from __future__ import annotations

from memq.analysis.rules import (
    CONF_BASE,
    CONF_BELOW_PRIMARY,
    CONF_EARLIER_UNSETTLED,
    CONF_FLOOR,
    CONF_MESSAGE_FRAGMENTATION,
    CONF_NOT_SETTLED,
    CONF_PER_STRENGTH,
    CONF_SECONDARY_BASE,
    CONF_SECONDARY_PER_STRENGTH,
    CONF_UNSETTLED_PRIMARY,
)

ROLES = ("primary", "weak_primary", "also_holds", "listed", "not_settled")


def confidence(role: str, strength: float = 0.0, *, primary: float | None = None,
               earlier_unsettled: bool = False, fragmentation_from_message: bool = False) -> float:
    """The confidence of a cause in `role`. `primary` is the primary cause's confidence (needed by the
    roles listed under it)."""
    if role == "primary":
        c = round(CONF_BASE + CONF_PER_STRENGTH * strength, 2)
        if earlier_unsettled:
            c = round(c - CONF_EARLIER_UNSETTLED, 2)
        return min(c, CONF_MESSAGE_FRAGMENTATION) if fragmentation_from_message else c
    if role == "weak_primary":
        return CONF_UNSETTLED_PRIMARY
    if role == "not_settled":
        return CONF_NOT_SETTLED
    if primary is None:
        raise ValueError(f"role {role!r} is listed under a primary: pass its confidence")
    if role == "also_holds":
        return max(round(min(primary - CONF_BELOW_PRIMARY,
                             CONF_SECONDARY_BASE + CONF_SECONDARY_PER_STRENGTH * strength), 2), CONF_FLOOR)
    if role == "listed":
        return round(max(CONF_FLOOR, min(primary - CONF_BELOW_PRIMARY, CONF_SECONDARY_BASE)), 2)
    raise ValueError(f"unknown confidence role {role!r} (one of {', '.join(ROLES)})")
