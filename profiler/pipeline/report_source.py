"""What the report reads, bound to one open session: `memq.report.data.build_report` asks this
object for plain dicts and never sees SQLAlchemy. The rows are the store's (profiler/store/report_queries.py),
a run's timeline is its history document (pipeline/history.py).

    with store.session() as s:
        doc = build_report(SqlReportSource(s), day, scope, simulate=whatif_simulator(store, s))

(`whatif_simulator`, which replays the top fragmented runs' last snapshot under a proposed setting, is
a use case: profiler/pipeline/sweeps.py.)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

from memq.pipeline.history import run_history
from memq.store import report_queries as rq
from memq.store.report_queries import Scope, Window


class SqlReportSource:
    """The report's queries (profiler/store/report_queries.py) on one session."""

    def __init__(self, session):
        self.session = session

    def window_runs(self, window: Window, scope: Scope) -> list[dict[str, Any]]:
        return rq.window_runs(self.session, window, scope)

    def run_metrics(self, window: Window, scope: Scope) -> dict[int, dict[str, Any]]:
        return rq.run_metrics(self.session, window, scope)

    def epoch_floors(self, window: Window, scope: Scope) -> dict[int, list[dict[str, Any]]]:
        return rq.epoch_floors(self.session, window, scope)

    def diagnosis_parts(self, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
        return rq.diagnosis_parts(self.session, run_ids)

    def version_stats(self, window: Window, scope: Scope) -> list[dict[str, Any]]:
        return rq.version_stats(self.session, window, scope)

    def previous_report(self, day: dt.date, scope: Scope) -> dict[str, Any] | None:
        return rq.previous_report(self.session, day, scope)

    def stored_reports(self, scope: Scope, first: dt.date, last: dt.date) -> list[dict[str, Any]]:
        return rq.stored_reports(self.session, scope, first, last)

    def run_history(self, run_name: str, points: int) -> dict[str, Any]:
        """`memq history --json` of the run, for its memory timeline."""
        return run_history(self.session, run_name, points=points, max_snapshots=500)
