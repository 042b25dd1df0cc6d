"""Nightly reports: one row per (date, scope); a rerun replaces it."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from memq.store.orm import (
    Report,
)
from memq.store.repository.common import _db_time, _insert, json_safe, utcnow


def upsert_report(session: Session, report_date: dt.date, scope: str, summary: Mapping[str, Any],
                  path: str | None = None, analyzer_version: str | None = None) -> int:
    """One report per (date, scope): a rerun replaces the stored one. Returns its id."""
    values = {"report_date": report_date, "scope": scope, "summary": json_safe(summary),
              "path": path, "analyzer_version": analyzer_version, "generated_at": _db_time(session, utcnow())}
    stmt = _insert(session, Report).values(**values)
    set_ = {k: stmt.excluded[k] for k in ("summary", "path", "analyzer_version", "generated_at")}
    stmt = stmt.on_conflict_do_update(index_elements=["report_date", "scope"], set_=set_).returning(Report.id)
    return int(session.execute(stmt).scalar_one())
