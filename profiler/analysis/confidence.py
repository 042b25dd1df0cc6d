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

The other verdicts take theirs from here too:
- an OOM message read alone (message_verdict.py): `message_confidence(situation)`, one value per
  situation the message's own figures settle (MESSAGE_CONFIDENCE in rules.py);
- a what-if replay (whatif.py) says its confidence in words (`high`, `medium`, `low`, `none`):
  `replay_confidence(case)`, one word per case of how far the replay reaches (REPLAY_CONFIDENCE).
- the OOM forecast (forecast.py): `forecast_confidence(outcome, ...)`, one level per outcome and, for a
  dated OOM, from the growth model's points and the width of its slope's interval (FORECAST_CONF_*).
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
    FORECAST_CONF_BOUNDED,
    FORECAST_CONF_DATED_BASE,
    FORECAST_CONF_DATED_PER_POINT,
    FORECAST_CONF_DATED_POINTS,
    FORECAST_CONF_FEW_POINTS,
    FORECAST_CONF_FLOOR,
    FORECAST_CONF_NO_GROWTH_BASE,
    FORECAST_CONF_NO_GROWTH_PER_POINT,
    FORECAST_CONF_NO_GROWTH_POINTS,
    FORECAST_CONF_UNDATED,
    FORECAST_CONF_WIDTH_LOSS,
    MESSAGE_CONFIDENCE,
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


def message_confidence(situation: str) -> float:
    """The confidence of a message-only verdict in `situation` (a key of MESSAGE_CONFIDENCE)."""
    try:
        return MESSAGE_CONFIDENCE[situation]
    except KeyError:
        raise ValueError(f"unknown message situation {situation!r} (one of {', '.join(MESSAGE_CONFIDENCE)})") from None


#: What a what-if replay's confidence says, by how far the replay reaches (docs/whatif.md).
REPLAY_CONFIDENCE = {
    # the recorded settings replayed reproduce the trace: at least 95% of its segment events at the same
    # request and the reserved bytes within 5% after every entry
    "reproduced": "high",
    # the recorded settings replayed, reproducing the trace less closely than that
    "approximate": "medium",
    # from the first allocation: an OOM of the setting, or a fit where the recorded run had no OOM
    "from_start": "high",
    # from the first allocation through the request the recorded run failed; what came after is in no trace
    "past_recorded_oom": "medium",
    # a mid-run window where the live blocks and the request exceed the limit whatever the cache's layout
    "live_over_limit": "medium",
    # survives the recorded window only, from a rebuilt start (or a lower cap over a mid-run window)
    "window_only": "low",
    # the snapshot cannot answer (no trace, a trace short of the OOM, a recording the replay does not reproduce)
    "not_assessable": "none",
}
REPLAY_LEVELS = ("high", "medium", "low", "none")


def replay_confidence(case: str) -> str:
    """The word a what-if result's `confidence` carries in `case` (a key of REPLAY_CONFIDENCE)."""
    try:
        return REPLAY_CONFIDENCE[case]
    except KeyError:
        raise ValueError(f"unknown replay case {case!r} (one of {', '.join(REPLAY_CONFIDENCE)})") from None


#: The outcomes of an OOM forecast, each with its confidence (forecast.py): `none` is no forecast yet
#: (too few points, no limit, growth said but not claimed), which carries no confidence at all.
FORECAST_OUTCOMES = ("none", "no_growth", "bounded", "undated", "dated")


def forecast_confidence(outcome: str, points: int = 0, *, interval_width: float = 1.0, few: bool = False) -> float:
    """The confidence of an OOM forecast with `outcome` (one of FORECAST_OUTCOMES). `points`: the growth
    series' points; `interval_width`: the slope's 95% interval as a share of twice the slope (1.0 when it
    is unknown or unbounded); `few`: the dated forecast stands on few points (GROWTH_FEW_POINTS)."""
    if outcome == "none":
        return 0.0
    if outcome == "no_growth":
        return round(FORECAST_CONF_NO_GROWTH_BASE
                     + FORECAST_CONF_NO_GROWTH_PER_POINT * min(FORECAST_CONF_NO_GROWTH_POINTS, points), 2)
    if outcome == "bounded":
        return FORECAST_CONF_BOUNDED
    if outcome == "undated":
        return FORECAST_CONF_UNDATED
    if outcome == "dated":
        base = (FORECAST_CONF_FEW_POINTS if few else
                FORECAST_CONF_DATED_BASE + FORECAST_CONF_DATED_PER_POINT * min(FORECAST_CONF_DATED_POINTS, points))
        loss = min(FORECAST_CONF_WIDTH_LOSS, interval_width / 2)
        return round(max(FORECAST_CONF_FLOOR, base * (1.0 - loss)), 2)
    raise ValueError(f"unknown forecast outcome {outcome!r} (one of {', '.join(FORECAST_OUTCOMES)})")
