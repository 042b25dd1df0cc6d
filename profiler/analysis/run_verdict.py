"""A run's verdict across its ranks, and the run-level rules every screen reads (pure: plain data in,
plain values out).

Which rank speaks for a run (`run_verdict`): every screen that shows one verdict for a run (the runs
list and the run row's cause, the history page, compare, the nightly report, the exporter, the alerts)
asks this function, so they never disagree about which rank's diagnosis is the run's.

1. A rank that ran out of memory speaks, the first to fail: earliest OOM snapshot, then earliest OOM
   step, then lowest rank (analysis/ranks.py `failed_ranks`, the order the cross-rank section names
   `failed_rank` by). Data-parallel ranks fail one at a time and the launcher tears the others down: the
   OOM that ended the job is what the run is about (ARCHITECTURE.md: the run "dies with CUDA out of
   memory"; the forecast too is the rank that runs out first). A rank whose own run diagnosis found an
   OOM that no snapshot trigger or exit status recorded (an OOM message given with the files) comes
   after those, the highest peak first. A failed rank without a diagnosis yet (torn down before its
   snapshot was analysed) is passed over for the next failed rank that has one.
2. No rank failed: the rank whose primary cause comes first in ARCHITECTURE.md's precedence (causes
   1-9: a leaking rank speaks before a healthy one with a higher peak, as a leak is primary before the
   causes after it in one diagnosis), then the highest peak reserved, then the lowest rank.

`forecast_rank`: which rank's OOM forecast is the run's. The one near miss is analysis/headroom.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from memq.analysis.classify import PRECEDENCE, UNDETERMINED_LEAD
from memq.analysis.ranks import RankFacts, failed_ranks


@dataclass(frozen=True)
class RankDiagnosis:
    """What a verdict needs of one rank's run-level diagnosis."""

    rank: int
    cause: str | None
    oom: bool = False                       # its run-level analysis found an OOM (`oom` is not null)
    peak_reserved_bytes: int | None = None  # the diagnosis' peak reserved bytes


def rank_diagnosis(rank: int, result: Mapping[str, Any] | None, peak_reserved_bytes: int | None = None,
                   cause: str | None = None) -> RankDiagnosis:
    """A RankDiagnosis from a stored or fresh run-level result (analysis.analyze's dict)."""
    res = result or {}
    if cause is None:
        cause = (res.get("diagnosis") or {}).get("primary_cause")
    return RankDiagnosis(rank=int(rank), cause=cause, oom=bool(res.get("oom")), peak_reserved_bytes=peak_reserved_bytes)


def _precedence(cause: str | None) -> int:
    return PRECEDENCE.index(cause) if cause in PRECEDENCE else len(PRECEDENCE)


def run_verdict(diagnoses: Iterable[RankDiagnosis], rank_facts: Iterable[RankFacts] = ()) -> int | None:
    """The rank whose diagnosis is the run's (see the module docstring); None when no rank has one."""
    diags = {d.rank: d for d in diagnoses}
    if not diags:
        return None
    failed = [f.rank for f in failed_ranks(rank_facts)]
    failed += [d.rank for d in sorted(diags.values(), key=lambda d: (-(d.peak_reserved_bytes or 0), d.rank))
               if d.oom and d.rank not in failed]
    for rank in failed:
        if rank in diags:
            return rank
    best = min(diags.values(), key=lambda d: (_precedence(d.cause), -(d.peak_reserved_bytes or 0), d.rank))
    return best.rank


def forecast_moment(fc: Mapping[str, Any] | None) -> float | None:
    """The epoch second a forecast puts its OOM at (the moment it was made plus its time left); None when
    either is unknown."""
    if not fc:
        return None
    t, eta = fc.get("as_of_time"), fc.get("eta_s")
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (t, eta))
    return float(t) + float(eta) if ok else None


def forecast_rank(forecasts: Mapping[int, Mapping[str, Any] | None]) -> int | None:
    """The rank whose forecast is the run's: of the ranks whose forecast expects an OOM, the one whose OOM
    comes first (the earliest moment, then the earliest step, then the lowest rank); None when none
    expects one. The run row's forecast columns, the history's forecast and the forecast alert read it."""
    inf = float("inf")
    coming = []
    for rank, fc in forecasts.items():
        if isinstance(fc, Mapping) and fc.get("oom_expected"):
            at = forecast_moment(fc)
            step = fc.get("step")
            coming.append((inf if at is None else at,
                           step if isinstance(step, int) and not isinstance(step, bool) else inf, rank))
    return min(coming)[2] if coming else None


def undetermined(diagnosis: Mapping[str, Any] | None) -> bool:
    """True when a diagnosis names its primary cause only as the best-supported candidate of an OOM that
    no deciding test settled (classify.diagnose's weak primary): every screen then reads "undetermined",
    never the candidate as a finding."""
    causes = (diagnosis or {}).get("causes") or []
    first = causes[0] if causes and isinstance(causes[0], Mapping) else {}
    ev = first.get("evidence") or []
    return bool(ev) and isinstance(ev[0], str) and ev[0].startswith(UNDETERMINED_LEAD)
