"""`MemqCollector`: a prometheus-client custom collector; every scrape reads SQL and Redis afresh.

Metric families (label `job_name` is the training job: Prometheus attaches its own `job`, the
scrape job, to every series, and a metric label of that name would be renamed `exported_job`):

from SQL (counters are row counts, so restarts and several exporters agree; the done snapshots'
counts are kept up to date from the rows done since the last scrape, with a full recount every
MEMQ_EXPORTER_RESYNC_S: profiler/store/snapshot_tally.py)
- memq_snapshots_analysed_total{cluster, job_name}             snapshot rows analysed (state done)
- memq_snapshots{state}                                         snapshot rows per state (gauge)
- memq_oom_snapshots_total{cluster, job_name, cause}            analysed OOM snapshots, by the snapshot's cause
- memq_verdicts_total{cluster, job_name, kind, cause}           run verdicts reached (kind oom|leak|near_miss),
                                                                 by run-level cause; one per verdict change
- memq_alerts{state}                                            the alert outbox per state (gauge)
- memq_alert_summaries{state}                                   summaries of rate-limited verdicts per state (gauge)
- memq_runs{cluster, status}                                    runs per status (gauge)
- memq_run_causes{cluster, job_name, status, cause}             runs per run-level cause (gauge): what a
                                                                 dashboard shows as a run's cause (a leak
                                                                 run's OOM snapshot alone may read capacity)
- memq_analysis_latency_seconds (histogram)                     snapshot row -> its analysis attached
- memq_active_runs{cluster, job_name}                           running runs updated in the last
                                                                 MEMQ_EXPORTER_ACTIVE_MINUTES
- memq_job_headroom_min_ratio{cluster, job_name}                least headroom among them (1 - peak reserved / limit)
- memq_job_pieces_max_ratio{cluster, job_name}                  most `pieces` among them: the runs list's column, at
                                                                 an OOM the run caught and went on from, the share
                                                                 of reserved memory free in pieces (outside the
                                                                 largest free block); no series without an OOM
- memq_run_headroom_ratio{cluster, job_name, run}               the MEMQ_EXPORTER_TOP_K active runs with the
- memq_run_pieces_ratio{cluster, job_name, run}                 least headroom, and their `pieces`
- memq_job_fragmentation_max_ratio, memq_run_fragmentation_ratio  deprecated (1 - largest free / free, 0.7-0.8 in
                                                                 healthy runs): kept for existing queries; the
                                                                 dashboards read the `pieces` gauges
- memq_run_oom_eta_seconds{cluster, job_name, run}              seconds until the forecast OOM of the
                                                                 MEMQ_EXPORTER_TOP_K running runs whose OOM
                                                                 comes first (0 once it is due)
from Redis (the functions `memq status` uses)
- memq_stream_length, memq_stream_lag, memq_stream_pending      ingest stream, consumer group
- memq_inbox_length                                             the agents' inbox not yet relayed
- memq_dead_letters                                             entries in the dead-letter stream
- memq_dead_lettered_total                                      dead letters ever written (alert on this)
- memq_queue_depth{queue}, memq_queue_unacked                   Celery queues
- memq_workers, memq_dispatchers                                processes with a live heartbeat
- memq_heartbeat_age_seconds{kind, name}                        seconds since each one's last beat
health of the scrape itself
- memq_up{component}                                            1 when redis / database answered
- memq_scrape_duration_seconds{part}                            time spent per part of this scrape

Cardinality: per-run series exist only for the top-K active runs (default 10); everything else is
labelled by cluster, job, cause, state or kind. Cluster and job names come from agents, so they are
bounded here, not by the fleet's honesty: at most MEMQ_EXPORTER_MAX_JOBS (cluster, job) pairs and
clusters keep their names (the top-K runs' pairs, then the most analysed snapshots, verdicts and
active runs), the rest are
summed under "other" (a counter of "other" may step down when a pair earns its own series). Causes
and states are fixed sets. Heartbeat series: one per live process.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import defaultdict
from collections.abc import Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from memq.config import Settings
from memq.pipeline.status import collect_status
from memq.store import metric_queries as q
from memq.store import repository as repo
from memq.store.connection import open_store
from memq.store.snapshot_tally import SnapshotTally, not_done
from memq.store.states import ALERT_STATES, SNAPSHOT_STATES, SUMMARY_STATES

log = logging.getLogger("memq.exporter")

# name -> (type, help, labels); describe() and the tests read this one table
METRICS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "memq_snapshots_analysed": ("counter", "Snapshot rows analysed (state done).", ("cluster", "job_name")),
    "memq_snapshots": ("gauge", "Snapshot rows per analysis state.", ("state",)),
    "memq_oom_snapshots": ("counter", "Analysed snapshots taken at an OOM, by the snapshot's primary cause.",
                           ("cluster", "job_name", "cause")),
    "memq_verdicts": ("counter", "Run verdicts reached (OOM, leak, near miss), one per verdict change of a run, "
                                 "by run-level cause.", ("cluster", "job_name", "kind", "cause")),
    "memq_alerts": ("gauge", "Alerts in the outbox per delivery state.", ("state",)),
    "memq_alert_summaries": ("gauge", "Summaries of rate-limited verdicts per delivery state.", ("state",)),
    "memq_runs": ("gauge", "Runs per status.", ("cluster", "status")),
    "memq_run_causes": ("gauge", "Runs per run-level cause (the run's diagnosis over all its snapshots), of every "
                                 "source.", ("cluster", "job_name", "status", "cause")),
    "memq_analysis_latency_seconds": ("histogram", "Seconds from a snapshot's row (dispatcher) to its analysis "
                                                   "attached (computed, or reused for identical bytes).", ()),
    "memq_active_runs": ("gauge", "Running runs updated within MEMQ_EXPORTER_ACTIVE_MINUTES.",
                         ("cluster", "job_name")),
    "memq_job_headroom_min_ratio": ("gauge", "Least headroom (1 - peak reserved / limit) among the job's active "
                                             "runs.", ("cluster", "job_name")),
    "memq_job_pieces_max_ratio": ("gauge", "Most `pieces` among the job's active runs: at an OOM the run went on "
                                           "from, the share of reserved memory free in pieces (outside the largest "
                                           "free block), as the runs list shows it; no series without an OOM.",
                                  ("cluster", "job_name")),
    "memq_job_fragmentation_max_ratio": ("gauge", "Deprecated: memq_job_pieces_max_ratio says what failed. Most "
                                                  "fragmentation (1 - largest free / free, 0.7-0.8 in healthy runs) "
                                                  "among the job's active runs.", ("cluster", "job_name")),
    "memq_run_headroom_ratio": ("gauge", "Headroom of the MEMQ_EXPORTER_TOP_K active runs with the least.",
                                ("cluster", "job_name", "run")),
    "memq_run_pieces_ratio": ("gauge", "`pieces` of the same top-K runs (no series for a run without an OOM).",
                              ("cluster", "job_name", "run")),
    "memq_run_fragmentation_ratio": ("gauge", "Deprecated: memq_run_pieces_ratio says what failed. Fragmentation "
                                              "(1 - largest free / free) of the same top-K runs.",
                                     ("cluster", "job_name", "run")),
    "memq_run_oom_eta_seconds": ("gauge", "Seconds until the forecast OOM of the MEMQ_EXPORTER_TOP_K running runs "
                                          "whose OOM comes first (0 once due).", ("cluster", "job_name", "run")),
    "memq_stream_length": ("gauge", "Entries in the ingest stream.", ()),
    "memq_stream_lag": ("gauge", "Ingest stream entries not yet read by the dispatchers' group.", ()),
    "memq_stream_pending": ("gauge", "Ingest stream entries read but not acknowledged.", ()),
    "memq_inbox_length": ("gauge", "Envelopes in the agents' inbox list not yet relayed into the stream (an "
                                   "outage backlog waits here, never trimmed).", ()),
    "memq_dead_letters": ("gauge", "Entries in the dead-letter stream (trimmed at about 100,000).", ()),
    "memq_dead_lettered": ("counter", "Dead letters ever written (the stream is trimmed; this is not).", ()),
    "memq_queue_depth": ("gauge", "Tasks waiting in a Celery queue.", ("queue",)),
    "memq_queue_unacked": ("gauge", "Tasks taken by workers and not acknowledged yet.", ()),
    "memq_workers": ("gauge", "Celery workers with a live heartbeat.", ()),
    "memq_dispatchers": ("gauge", "Dispatchers with a live heartbeat.", ()),
    "memq_heartbeat_age_seconds": ("gauge", "Seconds since a process's last heartbeat.", ("kind", "name")),
    "memq_up": ("gauge", "1 when the component answered this scrape.", ("component",)),
    "memq_scrape_duration_seconds": ("gauge", "Seconds this scrape spent per part.", ("part",)),
}

_FAMILY = {"counter": CounterMetricFamily, "gauge": GaugeMetricFamily, "histogram": HistogramMetricFamily}



OTHER = "other"


class KeptJobs:
    """Which (cluster, job) pairs and clusters keep series of their own this scrape; the rest read
    as "other" (see MEMQ_EXPORTER_MAX_JOBS)."""

    def __init__(self, pairs: set, clusters: set):
        self.pairs, self.clusters = pairs, clusters

    def pair(self, cluster, job) -> tuple[str, str]:
        key = (_s(cluster), _s(job))
        return key if key in self.pairs else (OTHER, OTHER)

    def cluster(self, cluster) -> str:
        c = _s(cluster)
        return c if c in self.clusters else OTHER


def kept_jobs(done: Mapping, active: list, runs: list, limit: int, *, verdicts: list = (),
              top: list = ()) -> KeptJobs:
    """The `limit` pairs with the most analysed snapshots, then the most verdicts, then the most active
    runs (ties by name: the same pairs scrape after scrape), and the `limit` clusters with the most
    runs. The top-K runs' pairs always keep theirs (they are what a dashboard drills into)."""
    weight: dict[tuple, list] = defaultdict(lambda: [0, 0, 0])
    for (cluster, job), n in done.items():
        weight[(_s(cluster), _s(job))][0] += int(n)
    for cluster, job, _kind, _cause, _state, n in verdicts:
        weight[(_s(cluster), _s(job))][1] += int(n)
    for cluster, job, n, *_ in active:
        weight[(_s(cluster), _s(job))][2] += int(n)
    ranked = sorted(weight, key=lambda k: (-weight[k][0], -weight[k][1], -weight[k][2], k))
    first = list(dict.fromkeys((_s(c), _s(j)) for _n, c, j, *_ in top))
    taken = set(first)
    ranked = [*first, *(k for k in ranked if k not in taken)]
    per_cluster: dict[str, int] = defaultdict(int)
    for cluster, _status, n in runs:
        per_cluster[_s(cluster)] += int(n)
    clusters = sorted(per_cluster, key=lambda c: (-per_cluster[c], c))
    return KeptJobs(set(ranked[:limit]), set(clusters[:limit]))


def family(name: str):
    kind, doc, labels = METRICS[name]
    return _FAMILY[kind](name, doc, labels=list(labels))


def _s(v) -> str:
    return "" if v is None else str(v)


class MemqCollector(Collector):
    def __init__(self, st: Settings, store=None, redis_client=None):
        self.st, self._store, self._redis = st, store, redis_client
        self.tally = SnapshotTally(st.exporter_resync_s)

    def describe(self):
        # families without samples: registering must not run the queries
        return [family(n) for n in METRICS]

    # ------------------------------------------------------------------------------------ scrape

    def collect(self) -> Iterator:
        fams = {n: family(n) for n in METRICS}
        timing = {}
        t0 = time.perf_counter()
        db_ok = self._collect_db(fams)
        timing["database"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        redis_ok = self._collect_redis(fams)
        timing["redis"] = time.perf_counter() - t1
        fams["memq_up"].add_metric(["database"], 1.0 if db_ok else 0.0)
        fams["memq_up"].add_metric(["redis"], 1.0 if redis_ok else 0.0)
        for part, secs in timing.items():
            fams["memq_scrape_duration_seconds"].add_metric([part], secs)
        yield from fams.values()

    def _store_or_open(self):
        if self._store is None:
            self._store = open_store(self.st)
        return self._store

    def _collect_db(self, f: dict) -> bool:
        try:
            store = self._store_or_open()
            with store.session() as s:
                if s.get_bind().dialect.name == "postgresql":
                    # one snapshot of the database for every query of the scrape (the tally's
                    # recount and its high-water mark must see the same rows)
                    s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
                totals = self.tally.refresh(s)
                pending = not_done(s)
                runs = q.run_counts(s)
                causes = q.run_causes(s)
                verdicts = q.verdict_counts(s)
                summaries = q.summary_states(s)
                since = repo.utcnow() - dt.timedelta(minutes=self.st.exporter_active_minutes)
                active = q.active_by_job(s, since)
                top = q.least_headroom(s, since, self.st.exporter_top_k)
                soon = q.soonest_ooms(s, self.st.exporter_top_k)
                now = repo.utcnow()
        except Exception as exc:  # noqa: BLE001 - a scrape reports memq_up{component="database"} 0, never a 500
            log.warning("exporter: database part failed: %s: %s", type(exc).__name__, exc)
            return False
        keep = kept_jobs(totals.done, active, runs, self.st.exporter_max_jobs, verdicts=verdicts,
                         top=[*top, *((n, c, j, None, None) for n, c, j, _at in soon)])
        states: dict[str, int] = dict.fromkeys(SNAPSHOT_STATES, 0)
        states["done"] = sum(totals.done.values())
        for _cluster, _job, state, n in pending:
            states[state] = states.get(state, 0) + int(n)
        analysed: dict[tuple, int] = defaultdict(int)
        for (cluster, job), n in totals.done.items():
            analysed[keep.pair(cluster, job)] += n
        for labels, n in sorted(analysed.items()):
            f["memq_snapshots_analysed"].add_metric(list(labels), n)
        for state, n in sorted(states.items()):
            f["memq_snapshots"].add_metric([state], n)
        ooms: dict[tuple, int] = defaultdict(int)
        for (cluster, job, cause), n in totals.ooms.items():
            ooms[(*keep.pair(cluster, job), cause)] += n
        for labels, n in sorted(ooms.items()):
            f["memq_oom_snapshots"].add_metric(list(labels), n)
        buckets, _, total = totals.latency()
        bounds = [str(b) for b in q.LATENCY_BUCKETS] + ["+Inf"]
        f["memq_analysis_latency_seconds"].add_metric([], list(zip(bounds, buckets, strict=True)), total)
        per_status: dict[tuple, int] = defaultdict(int)
        for cluster, status, n in runs:
            per_status[(keep.cluster(cluster), status)] += int(n)
        for labels, n in sorted(per_status.items()):
            f["memq_runs"].add_metric(list(labels), n)
        per_cause: dict[tuple, int] = defaultdict(int)
        for cluster, job, status, cause, n in causes:
            per_cause[(*keep.pair(cluster, job), status, _s(cause))] += int(n)
        for labels, n in sorted(per_cause.items()):
            f["memq_run_causes"].add_metric(list(labels), n)
        per_verdict: dict[tuple, int] = defaultdict(int)
        alert_states: dict[str, int] = dict.fromkeys(ALERT_STATES, 0)
        for cluster, job, kind, cause, state, n in verdicts:
            per_verdict[(*keep.pair(cluster, job), kind, _s(cause))] += int(n)
            alert_states[state] = alert_states.get(state, 0) + int(n)
        for labels, n in sorted(per_verdict.items()):
            f["memq_verdicts"].add_metric(list(labels), n)
        for state, n in sorted(alert_states.items()):
            f["memq_alerts"].add_metric([state], n)
        for state in SUMMARY_STATES:
            f["memq_alert_summaries"].add_metric([state], summaries.get(state, 0))
        per_job: dict[tuple, list] = {}
        for cluster, job, n, headroom, frag, pieces in active:
            labels = keep.pair(cluster, job)
            cur = per_job.setdefault(labels, [0, None, None, None])
            cur[0] += int(n)  # "other" sums the runs, keeps the least headroom and the most fragmentation
            if headroom is not None:
                cur[1] = float(headroom) if cur[1] is None else min(cur[1], float(headroom))
            if frag is not None:
                cur[2] = float(frag) if cur[2] is None else max(cur[2], float(frag))
            if pieces is not None:
                cur[3] = float(pieces) if cur[3] is None else max(cur[3], float(pieces))
        for labels, (n, headroom, frag, pieces) in sorted(per_job.items()):
            f["memq_active_runs"].add_metric(list(labels), n)
            if headroom is not None:
                f["memq_job_headroom_min_ratio"].add_metric(list(labels), headroom)
            if pieces is not None:
                f["memq_job_pieces_max_ratio"].add_metric(list(labels), pieces)
            if frag is not None:
                f["memq_job_fragmentation_max_ratio"].add_metric(list(labels), frag)
        for name, cluster, job, headroom, frag, pieces in top:  # at most MEMQ_EXPORTER_TOP_K runs
            labels = [*keep.pair(cluster, job), name]
            f["memq_run_headroom_ratio"].add_metric(labels, float(headroom))
            if pieces is not None:
                f["memq_run_pieces_ratio"].add_metric(labels, float(pieces))
            if frag is not None:
                f["memq_run_fragmentation_ratio"].add_metric(labels, float(frag))
        for name, cluster, job, at in soon:  # at most MEMQ_EXPORTER_TOP_K runs
            at = at if at.tzinfo else at.replace(tzinfo=dt.UTC)  # SQLite returns naive UTC
            f["memq_run_oom_eta_seconds"].add_metric([*keep.pair(cluster, job), name],
                                                     max(0.0, (at - now).total_seconds()))
        return True

    def _collect_redis(self, f: dict) -> bool:
        try:
            doc = collect_status(self.st, with_db=False)
        except Exception as exc:  # noqa: BLE001 - redis-py errors: memq_up{component="redis"} 0
            log.warning("exporter: redis part failed: %s: %s", type(exc).__name__, exc)
            return False
        s = doc["stream"]
        f["memq_stream_length"].add_metric([], s["length"])
        f["memq_stream_pending"].add_metric([], s["pending"])
        f["memq_inbox_length"].add_metric([], s.get("inbox", 0))
        if s.get("lag") is not None:
            f["memq_stream_lag"].add_metric([], float(s["lag"]))
        elif s.get("group") is None:
            f["memq_stream_lag"].add_metric([], float(s["length"]))  # no group yet: nothing was read
        f["memq_dead_letters"].add_metric([], doc["dead_letters"]["count"])
        f["memq_dead_lettered"].add_metric([], doc["dead_letters"]["total"])
        for queue, n in doc["queues"].items():
            f["memq_queue_depth"].add_metric([queue], n)
        f["memq_queue_unacked"].add_metric([], doc["queues_unacked"])
        f["memq_workers"].add_metric([], len(doc["workers"]))
        f["memq_dispatchers"].add_metric([], len(doc["dispatchers"]))
        for kind, items in (("worker", doc["workers"]), ("dispatcher", doc["dispatchers"])):
            for w in items:
                f["memq_heartbeat_age_seconds"].add_metric([kind, _s(w.get("name"))], max(0.0, float(w["age_s"])))
        return True
