"""Each rank's own exit figures (table rank_figures): written by the dispatcher from `run_end` and the
`stats` flush before it, read with the run history for the cross-rank diagnosis."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from memq.store.orm import RankFigures
from memq.store.repository import _insert

_INT_MAX = (1 << 63) - 1


def _int(v: Any) -> int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = int(v)
    return v if 0 <= v <= _INT_MAX else None


def clean(figures: Mapping[str, Any]) -> dict[str, Any]:
    """Only the known keys, as ints or short strings: the payload comes from the network."""
    out: dict[str, Any] = {}
    for k in ("peak_allocated_bytes", "peak_reserved_bytes", "limit_bytes", "last_step", "steps"):
        out[k] = _int(figures.get(k))
    reason = figures.get("end_reason")
    out["end_reason"] = reason[:64] if isinstance(reason, str) else None
    sp = figures.get("step_peaks")
    if isinstance(sp, Mapping):
        out["step_peaks"] = {k: _int(sp.get(k)) for k in ("count", "median_peak_allocated", "max_peak_allocated",
                                                          "max_peak_reserved", "max_step", "last_peak_allocated")}
    return out


def upsert(session: Session, run_id: int, rank: int, figures: Mapping[str, Any], status: str | None,
           at: dt.datetime | None) -> None:
    """Store or update a rank's figures; peaks only ever grow (a late, smaller report never lowers them)."""
    doc = clean(figures)
    old = session.execute(select(RankFigures).where(RankFigures.run_id == run_id, RankFigures.rank == rank)
                          ).scalar_one_or_none()
    if old is not None:
        merged = dict(old.figures or {})
        for k, v in doc.items():
            if v is not None:
                merged[k] = v
        for k in ("peak_allocated_bytes", "peak_reserved_bytes"):
            vals = [x for x in ((old.figures or {}).get(k), doc.get(k)) if x is not None]
            merged[k] = max(vals) if vals else None
        doc = merged
    values = {"run_id": run_id, "rank": rank, "figures": doc, "updated_at": at,
              "peak_allocated_bytes": doc.get("peak_allocated_bytes"),
              "peak_reserved_bytes": doc.get("peak_reserved_bytes")}
    if status is not None:
        values["status"] = str(status)[:16]
    stmt = _insert(session, RankFigures).values(**values)
    set_ = {k: stmt.excluded[k] for k in values if k not in ("run_id", "rank")}
    session.execute(stmt.on_conflict_do_update(index_elements=["run_id", "rank"], set_=set_))


def for_run(session: Session, run_id: int) -> dict[int, dict[str, Any]]:
    """{rank: {"status", **figures}} of one run."""
    rows = session.execute(select(RankFigures).where(RankFigures.run_id == run_id)).scalars()
    return {r.rank: {**(r.figures or {}), "status": r.status} for r in rows}
