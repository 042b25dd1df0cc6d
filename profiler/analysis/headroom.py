"""Headroom and the one near miss (pure). ARCHITECTURE.md: "the last free bytes" means headroom under 5%
of a known LIMIT (NEAR_MISS_SHARE). A near miss is a run (or a snapshot) without an OOM whose peak
reserved bytes are in the last free bytes: the diagnosis (causes 3 and 9, the advice), the nightly
report, and the alerts (MEMQ_ALERT_HEADROOM_PCT, 5 by default, passed as the share) read it here.
The forecast's own margin (FORECAST_NEAR_MISS_SHARE, a tenth) warns earlier, on the step peaks' trend."""

from __future__ import annotations

from memq.analysis.rules import NEAR_MISS_SHARE


def in_last_free_bytes(used: int | None, limit: int | None, share: float = NEAR_MISS_SHARE) -> bool:
    """What is used (a peak, or A + S) leaves less than `share` of a known limit free (past the limit
    included); False when either is unknown."""
    if used is None or not limit:
        return False
    return limit - used < share * limit


def near_miss(peak_reserved: int | None, limit: int | None, *, oom: bool = False,
              share: float = NEAR_MISS_SHARE) -> bool:
    """The one definition of a near miss: no OOM, and the peak reserved bytes in the last free bytes of a
    known, positive limit."""
    if oom or not limit or limit <= 0:
        return False
    return in_last_free_bytes(peak_reserved, limit, share)


def headroom_ratio(peak_reserved: int | None, limit: int | None) -> float | None:
    """Share of the limit left free at the peak (negative past it); None when either is unknown."""
    if not peak_reserved or not limit or limit <= 0:
        return None
    return 1.0 - peak_reserved / limit
