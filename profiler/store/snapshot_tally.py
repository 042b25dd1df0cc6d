"""`SnapshotTally`: the history counters of the snapshots table, kept up to date from the rows done
since the previous scrape instead of recounted at every scrape.

A done snapshot never changes what it contributes (its run's cluster and job, whether it was an OOM and
its cause, `analysed_at - created_at`: `analysed_at` is set once), so the done rows' totals only grow. A
scrape reads the rows whose `analysed_at` is at or after the high-water mark minus an overlap (index
ix_snapshots__analysed_at) and adds those it has not counted yet (their ids within the overlap are
remembered; the mark never runs ahead of the database's clock). The overlap covers transactions that
stamped `analysed_at` (their start time) before the mark but committed after the previous scrape read;
it is far longer than the short transaction that marks a snapshot done. A full recount runs at the first
scrape and then every MEMQ_EXPORTER_RESYNC_S, so what the increments cannot see (rows deleted by
retention, a reanalysis that changed an OOM snapshot's cause) is corrected within that period, and two
exporters report the same totals. Snapshots not yet done (pending, running, failed: few) are counted
live.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import func, literal, or_, select
from sqlalchemy.orm import Session

from memq.store import metric_queries as q
from memq.store import repository as repo
from memq.store.orm import AnalysisResult, Run, Snapshot

OVERLAP = dt.timedelta(seconds=120)


@dataclass
class Totals:
    done: dict[tuple, int] = field(default_factory=lambda: defaultdict(int))  # (cluster, job)
    ooms: dict[tuple, int] = field(default_factory=lambda: defaultdict(int))  # (cluster, job, cause)
    per_bucket: list[int] = field(default_factory=lambda: [0] * (len(q.LATENCY_BUCKETS) + 1))
    latency_sum: float = 0.0

    def latency(self) -> tuple[list[int], int, float]:
        cumulative, acc = [], 0
        for n in self.per_bucket:
            acc += n
            cumulative.append(acc)
        return cumulative, acc, self.latency_sum


def bucket_index(seconds: float) -> int:
    """The first `le` bound that holds `seconds` (len(bounds) = +Inf), as analysis_latency does."""
    for i, b in enumerate(q.LATENCY_BUCKETS):
        if seconds <= b:
            return i
    return len(q.LATENCY_BUCKETS)


class SnapshotTally:
    def __init__(self, resync_s: float):
        self.resync_s = resync_s
        self.totals: Totals | None = None
        self.mark: dt.datetime | None = None  # highest analysed_at counted
        self.recent: dict[int, dt.datetime] = {}  # ids counted with analysed_at >= mark - OVERLAP
        self.last_full = 0.0
        self.lock = threading.Lock()
        self.full_recounts = 0

    def refresh(self, session: Session) -> Totals:
        with self.lock:
            if self.totals is None or time.monotonic() - self.last_full >= self.resync_s:
                self._recount(session)
            else:
                self._increment(session)
            return self.totals

    # ---------------------------------------------------------------------------------------

    def _recount(self, session: Session) -> None:
        t = Totals()
        # the mark first: rows done meanwhile are found again by the next increment (ids dedupe)
        mark = self._clamp(session, session.execute(select(func.max(Snapshot.analysed_at))).scalar_one())
        recent = {} if mark is None else self._recent_ids(session, mark)
        for cluster, job, state, n in q.snapshot_states(session):
            if state == "done":
                t.done[(cluster, job)] += int(n)
        for cluster, job, cause, n in q.oom_snapshots(session):
            t.ooms[(cluster, job, str(cause))] += int(n)
        cumulative, _, t.latency_sum = q.analysis_latency(session)
        t.per_bucket = [b - a for a, b in zip([0] + cumulative[:-1], cumulative, strict=True)]
        self.totals, self.mark, self.recent = t, mark, recent
        self.last_full = time.monotonic()
        self.full_recounts += 1

    @staticmethod
    def _clamp(session: Session, at) -> dt.datetime | None:
        """A mark never ahead of the database's clock: a row stamped in the future (a clock that
        jumped back) must not hide the rows done after it."""
        if at is None:
            return None
        now = repo.to_utc(session.execute(select(func.current_timestamp())).scalar_one())
        return min(repo.to_utc(at), now)

    def _recent_ids(self, session: Session, mark: dt.datetime) -> dict[int, dt.datetime]:
        rows = session.execute(select(Snapshot.id, Snapshot.analysed_at).where(
            Snapshot.state == "done", Snapshot.analysed_at >= repo.db_time(session, mark - OVERLAP)))
        return {int(i): repo.to_utc(a) for i, a in rows}

    def _increment(self, session: Session) -> None:
        t = self.totals
        since = self.mark - OVERLAP if self.mark is not None else None
        oom = or_(Snapshot.trigger == "oom", AnalysisResult.oom_requested_bytes.is_not(None))
        cause = func.coalesce(AnalysisResult.primary_cause, literal("unknown"))
        lat = q._seconds_between(session, Snapshot.analysed_at, Snapshot.created_at)
        stmt = (select(Snapshot.id, Snapshot.analysed_at, Run.cluster, Run.job, oom.label("oom"), cause.label("cause"),
                       lat.label("lat"))
                .join(Run, Run.id == Snapshot.run_id)
                .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
                .where(Snapshot.state == "done", Snapshot.analysed_at.is_not(None)))
        if since is not None:
            stmt = stmt.where(Snapshot.analysed_at >= repo.db_time(session, since))
        newest = None
        for r in session.execute(stmt):
            sid = int(r.id)
            if sid in self.recent:
                continue
            at = repo.to_utc(r.analysed_at)
            self.recent[sid] = at
            t.done[(r.cluster, r.job)] += 1
            if r.oom:
                t.ooms[(r.cluster, r.job, str(r.cause))] += 1
            seconds = float(r.lat)
            t.per_bucket[bucket_index(seconds)] += 1
            t.latency_sum += seconds
            newest = at if newest is None or at > newest else newest
        if newest is not None and (self.mark is None or newest > self.mark):
            self.mark = self._clamp(session, newest)
        if self.mark is not None:
            floor = self.mark - OVERLAP
            self.recent = {i: a for i, a in self.recent.items() if a >= floor}


def not_done(session: Session) -> list[tuple]:
    """(cluster, job, state, count) of snapshots pending, running or failed (the state index)."""
    return [tuple(r) for r in session.execute(
        select(Run.cluster, Run.job, Snapshot.state, func.count()).join(Run, Run.id == Snapshot.run_id)
        .where(Snapshot.state.in_(("pending", "running", "failed")))
        .group_by(Run.cluster, Run.job, Snapshot.state))]
