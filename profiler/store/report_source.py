"""What the report reads, bound to one open session: `memq.report.data.build_report` asks this
object for plain dicts and never sees SQLAlchemy.

    with store.session() as s:
        doc = build_report(SqlReportSource(s), day, scope, simulate=whatif_simulator(store, s))

`whatif_simulator` replays the top fragmented runs' last snapshot under a proposed setting (it reads
stored sweeps and blobs, so it lives beside the queries, not in the pure report code).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy.orm import Session

from memq.store import report_queries as rq
from memq.store.report_queries import Scope, Window


class SqlReportSource:
    """The report's queries (profiler/store/report_queries.py) on one session."""

    def __init__(self, session: Session):
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
        from memq.store.queries import run_history

        return run_history(self.session, run_name, points=points, max_snapshots=500)


def whatif_simulator(store, session: Session,
                     max_trace_entries: int = 200_000) -> Callable[[dict, str], dict | None]:
    """A `simulate` for build_report: the run's last snapshot (its OOM snapshot when it has one)
    under the recorded settings and under `setting`, at the run's limit: the sweep the worker stored
    for it (profiler/store/sweeps.py) when it holds the setting, else replayed here from the blob
    store with the rank's earlier snapshots as seeds. The result carries the verdict and its reason
    (not assessable, or a success over the recorded window only), never an outcome alone. Returns
    None when the blob is not stored or the trace is too long to replay here."""
    from sqlalchemy import case, select

    from memq.errors import MemqError
    from memq.store.orm import Snapshot

    def simulate(run: dict, setting: str) -> dict | None:
        from memq.store import sweeps

        row = session.execute(
            select(Snapshot.id, Snapshot.sha256, Snapshot.source, Snapshot.trigger)
            .where(Snapshot.run_id == run["id"])
            .order_by(case((Snapshot.trigger == "oom", 0), else_=1), Snapshot.taken_at.desc(), Snapshot.id.desc())
            .limit(1)).one_or_none()
        if row is None:
            return None
        stored = sweeps.sweeps_by_sha(session, [row.sha256]).get(row.sha256)
        results = {r["conf"]: r for r in (stored or {}).get("results") or []}
        source = "stored sweep"
        if "" not in results or setting not in results:
            if not store.blobs.exists(row.sha256):
                return None
            try:
                from memq.store.blob_snapshots import load_blob

                def load(sha, src):
                    ld = load_blob(store, sha, src)
                    if sum(len(t) for t in ld.snapshot.traces) > max_trace_entries:
                        raise ValueError("trace too long to replay in the report")
                    return ld

                plan = sweeps.plan_for(session, int(row.id))
                doc = sweeps.run_plan(plan, load, confs=[setting],
                                      limit_bytes=run["memory_limit_bytes"] or plan.limit_bytes)
            except ValueError as exc:
                if "too long" in str(exc):
                    return None
                return {"conf": setting, "error": f"{type(exc).__name__}: {exc}"[:300]}
            except MemqError as exc:
                return {"conf": setting, "error": f"{type(exc).__name__}: {exc}"[:300]}
            results = {r["conf"]: r for r in doc["results"]}
            source = "replayed for this report"
        recorded, proposed = results[""], results[setting]
        return {"conf": setting, "snapshot": row.sha256[:12], "trigger": row.trigger, "source": source,
                "limit_bytes": proposed.get("limit_bytes", (stored or {}).get("limit_bytes")),
                "recorded_predicted_oom": recorded.get("predicted_oom"),
                "predicted_oom": proposed.get("predicted_oom"),
                "verdict": proposed.get("verdict"),
                "reason": proposed.get("reason"),
                "recorded_reason": recorded.get("reason"),
                "recorded_peak_reserved_bytes": recorded.get("peak_reserved_bytes"),
                "peak_reserved_bytes": proposed.get("peak_reserved_bytes"),
                "confidence": proposed.get("confidence"),
                "note": (proposed.get("notes") or [None])[-1]}

    return simulate
