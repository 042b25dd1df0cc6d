"""Typed settings, read from the environment and an optional TOML file, in one place.

Precedence: environment variable > config file (`MEMQ_CONFIG`, default `<data dir>/memq.toml`)
> default. Every setting is declared once, as a field of `Settings` made by `setting(...)`: its
default, environment variable, meaning and allowed values. The loader (`load_settings`), its
validation (a value outside its range or choices is a ConfigError naming the variable and what is
allowed) and the configuration reference deploy/CONFIG.md (deploy/gen_config.py) all read that one
declaration; `SETTINGS` is its read-only view.
Secrets (passwords in URLs) are never printed: use `redact_url` for anything shown to people.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from memq.codec import raw_limit
from memq.errors import ConfigError

MIN_DECODE_BUDGET = 768 * 1024**2  # the budget before it scaled with memory: what small pods had
DECODE_MEMORY_SHARE = 4  # a decode may take 1/4 of the process's memory (deploy/CAPACITY.md, "Big snapshots")
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


def auto_decode_budget(memory_bytes: int | None) -> int:
    """The decode budget for a process that may use `memory_bytes` (None: unknown)."""
    if not memory_bytes:
        return MIN_DECODE_BUDGET
    return max(MIN_DECODE_BUDGET, memory_bytes // DECODE_MEMORY_SHARE)


def process_memory_bytes() -> int | None:
    """What this process may use: its cgroup's memory limit when it has one, else physical memory."""
    phys = None
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and (phys is None or int(text) < phys):
            return int(text)  # "max" (v2) or a huge number (v1) mean no limit: physical memory
    return phys


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "share")
    return Path(base) / "memq"


def setting(default: object, env: str, doc: str, *, shown: str | None = None, minimum: int | None = None,
            maximum: int | None = None, choices: tuple[str, ...] = (), url: bool = False,
            from_file: bool = False):
    """A field of `Settings`, with all that is said about it: `env` its variable, `doc` its meaning,
    `shown` the default as documented where the real one is computed at load time (paths under the
    data dir), `minimum`/`maximum`/`choices` what is allowed, `url` a URL whose port is checked,
    `from_file` also readable from `<env>_FILE` (a mounted secret)."""
    return field(default=default, metadata={"env": env, "doc": doc, "shown": shown, "minimum": minimum,
                                            "maximum": maximum, "choices": tuple(choices), "url": url,
                                            "from_file": from_file})


@dataclass(frozen=True)
class Spec:
    """One setting as declared on `Settings` (read-only view, for the loader and the docs)."""

    name: str
    env: str
    type: type
    default: object
    doc: str
    minimum: int | None = None
    maximum: int | None = None
    choices: tuple[str, ...] = ()
    url: bool = False
    from_file: bool = False

    def allowed(self) -> str:
        """What the loader accepts, as the docs and the error messages say it."""
        if self.choices:
            return " | ".join(self.choices)
        if self.url:
            return "URL, port 1..65535"
        if self.minimum is not None and self.maximum is not None:
            return f"{self.minimum}..{self.maximum}"
        if self.minimum is not None:
            return f">= {self.minimum}"
        if self.maximum is not None:
            return f"<= {self.maximum}"
        return ""


@dataclass(frozen=True)
class Settings:
    database_url: str = setting("", "MEMQ_DATABASE_URL",
        "SQL database. postgresql:// URLs use the psycopg 3 driver; the SQLite default migrates itself.",
        shown="sqlite:///<data dir>/memq.db", url=True, from_file=True)
    blob_dir: str = setting("", "MEMQ_BLOB_DIR",
        "Content-addressed store of raw snapshots.",
        shown="<data dir>/blobs")
    redis_url: str = setting("redis://127.0.0.1:6379/0", "MEMQ_REDIS_URL",
        "Redis for the ingest stream, blobs and the Celery broker. rediss:// for TLS.",
        url=True, from_file=True)
    stream_key: str = setting("memq:ingest", "MEMQ_STREAM",
        "Redis stream the agents append to.")
    dead_letter_key: str = setting("memq:dead", "MEMQ_DEAD_STREAM",
        "Redis stream of entries that failed.")
    key_prefix: str = setting("memq:", "MEMQ_KEY_PREFIX",
        "Prefix of every other Redis key memq writes.")
    stream_maxlen: int = setting(1_000_000, "MEMQ_STREAM_MAXLEN",
        "Approximate cap of the ingest stream.",
        minimum=1)
    blob_ttl_s: int = setting(7 * 24 * 3600, "MEMQ_BLOB_TTL_S",
        "TTL of snapshot blobs waiting in Redis.",
        minimum=1)
    # A real 1,000,000-entry trace with frames is 7 MB compressed (85-260 MB of pickle): 64 MiB takes
    # ten of those and keeps one value far from Redis' own 512 MB limit (deploy/CAPACITY.md).
    max_blob_bytes: int = setting(64 * 1024**2, "MEMQ_MAX_BLOB_BYTES",
        ("Largest compressed snapshot the agent and `memq push` put into Redis (bytes). The agent keeps a "
         "bigger one in its spool folder's `oversize/` (counted `oversize`) for `memq analyze`; push refuses it."),
        minimum=1024**2)
    max_deliveries: int = setting(5, "MEMQ_MAX_DELIVERIES",
        "Deliveries before an entry is dead-lettered.",
        minimum=1)
    max_snapshot_bytes: int = setting(4 * 1024**3, "MEMQ_MAX_SNAPSHOT_BYTES",
        "Largest uncompressed snapshot accepted anywhere (bytes).",
        minimum=1)
    # 0 = a share of the memory this process may use (`auto_decode_budget`), so a worker given more
    # memory admits bigger snapshots with no setting changed.
    decode_budget_bytes: int = setting(0, "MEMQ_DECODE_BUDGET_BYTES",
        ("Memory one snapshot decode may take (bytes): admits uncompressed snapshots up to 1/"
         "DECODE_BYTES_PER_RAW_BYTE of it (dispatcher blob checks, workers, CLI); larger ones are refused "
         "as bad input. 0: a quarter of the memory the process may use (its cgroup limit, else the "
         "machine's memory), at least 768 MiB."),
        shown="0 (auto)", minimum=0)
    pipe_idle_timeout_s: int = setting(30, "MEMQ_PIPE_IDLE_TIMEOUT_S",
        ("A FIFO or pipe given as a snapshot file (`memq analyze <(zcat x.gz)`) that sends nothing for this "
         "many seconds (no writer ever came, or it stalled) is abandoned with an error."),
        minimum=1)
    max_clock_skew_s: int = setting(86_400, "MEMQ_MAX_CLOCK_SKEW_S",
        ("Dispatcher: envelopes and stat samples stamped more than this many seconds ahead of its clock "
         "(or before 2020) are dead-lettered."),
        minimum=0)
    report_dir: str = setting("", "MEMQ_REPORT_DIR",
        "Where nightly reports are written.",
        shown="<data dir>/reports")
    report_scopes: str = setting("all", "MEMQ_REPORT_SCOPES",
        "Nightly report scopes, comma separated: all, cluster=NAME, job=NAME.")
    report_hour_utc: int = setting(0, "MEMQ_REPORT_HOUR_UTC",
        "Beat: UTC hour of the nightly report (of the day before).",
        minimum=0, maximum=23)
    report_minute_utc: int = setting(30, "MEMQ_REPORT_MINUTE_UTC",
        "Beat: UTC minute of the nightly report.",
        minimum=0, maximum=59)
    report_catchup_days: int = setting(7, "MEMQ_REPORT_CATCHUP_DAYS",
        "Nightly report: days back it fills in when a report is missing (missed ticks, downtime).",
        minimum=0)
    report_webhook_url: str = setting("", "MEMQ_REPORT_WEBHOOK_URL",
        'Optional http(s) URL that receives the Markdown summary as JSON {"text": ...}; \'\' = none.',
        url=True)
    report_webhook_timeout_s: int = setting(10, "MEMQ_REPORT_WEBHOOK_TIMEOUT_S",
        "Webhook POST timeout (seconds).",
        minimum=1)
    data_dir: str = setting("", "MEMQ_DATA_DIR",
        "Base of the embedded defaults.",
        shown="~/.local/share/memq")
    # In-job agent (memq.agent). Options given to agent.start() override these.
    spool_dir: str = setting("", "MEMQ_SPOOL_DIR",
        "Agent: on-disk spool for messages Redis could not take (one subfolder per process).",
        shown="<data dir>/spool")
    spool_max_bytes: int = setting(1024**3, "MEMQ_SPOOL_MAX_BYTES",
        "Agent: spool size cap per process; the oldest messages are dropped (and counted) beyond it.",
        minimum=0)
    stats_interval_s: int = setting(10, "MEMQ_STATS_INTERVAL_S",
        "Agent: seconds between memory_stats samples.",
        minimum=0)
    snapshot_every_s: int = setting(1800, "MEMQ_SNAPSHOT_EVERY_S",
        "Agent: seconds between periodic snapshots (0 = none).",
        minimum=0)
    agent_history: str = setting("auto", "MEMQ_AGENT_HISTORY",
        ("Agent: allocator history recording: auto (first steps, one step per periodic snapshot, on near "
         "the limit) | on | off."),
        choices=("auto", "on", "off"))
    agent_max_entries: int = setting(50_000, "MEMQ_AGENT_MAX_ENTRIES",
        "Agent: history ring-buffer entries.",
        minimum=0)
    agent_signal: str = setting("SIGUSR2", "MEMQ_AGENT_SIGNAL",
        "Agent: signal that takes a snapshot ('' = none).")
    # Dispatcher and Celery workers (workers/). Soft limit < hard limit < lease, and hard limit <
    # visibility timeout: workers refuse to start otherwise.
    broker_url: str = setting("", "MEMQ_BROKER_URL",
        "Workers: Celery broker (Redis).",
        shown="<MEMQ_REDIS_URL>", url=True, from_file=True)
    broker_key_prefix: str = setting("", "MEMQ_BROKER_KEY_PREFIX",
        "Workers: prefix of every Celery key and channel in the broker Redis.",
        shown="<key prefix>celery:")
    visibility_timeout_s: int = setting(3600, "MEMQ_VISIBILITY_TIMEOUT_S",
        "Workers: seconds before an unacknowledged task is redelivered by the broker.",
        minimum=1)
    task_soft_time_limit_s: int = setting(300, "MEMQ_TASK_SOFT_TIME_LIMIT_S",
        "Workers: an analysis is asked to stop after this many seconds (recorded as a failed attempt).",
        minimum=1)
    task_time_limit_s: int = setting(360, "MEMQ_TASK_TIME_LIMIT_S",
        "Workers: an analysis is killed after this.",
        minimum=1)
    analysis_lease_s: int = setting(420, "MEMQ_ANALYSIS_LEASE_S",
        "Workers: lease of a snapshot being analysed; the reaper re-enqueues it once expired.",
        minimum=1)
    task_max_retries: int = setting(10, "MEMQ_TASK_MAX_RETRIES",
        "Workers: retries of a task on database/Redis outages (exponential back-off with jitter).",
        minimum=0)
    retry_backoff_max_s: int = setting(60, "MEMQ_RETRY_BACKOFF_MAX_S",
        "Workers: longest back-off between retries.",
        minimum=0)
    reaper_interval_s: int = setting(60, "MEMQ_REAPER_INTERVAL_S",
        "Workers: beat period of the lease reaper.",
        minimum=1)
    pending_requeue_s: int = setting(600, "MEMQ_PENDING_REQUEUE_S",
        "Workers: a snapshot pending longer than this is enqueued again by the reaper (lost messages).",
        minimum=1)
    claim_idle_s: int = setting(60, "MEMQ_CLAIM_IDLE_S",
        ("Dispatcher: stream entries unacknowledged this long by another consumer are claimed "
         "(XAUTOCLAIM)."),
        minimum=1)
    run_diagnosis_delay_ms: int = setting(2000, "MEMQ_RUN_DIAGNOSIS_DELAY_MS",
        "Workers: run-level diagnoses are recomputed at most once per this delay per run and rank.",
        minimum=0)
    heartbeat_s: int = setting(10, "MEMQ_HEARTBEAT_S",
        "Workers/dispatcher: heartbeat period shown by `memq status`.",
        minimum=1)
    worker_max_tasks_per_child: int = setting(500, "MEMQ_WORKER_MAX_TASKS_PER_CHILD",
        "Workers: a pool process is replaced after this many tasks.",
        minimum=0)
    worker_max_memory_per_child_kb: int = setting(4_000_000, "MEMQ_WORKER_MAX_MEMORY_PER_CHILD_KB",
        "Workers: a pool process is replaced once its resident memory exceeds this (KiB).",
        minimum=0)
    worker_cache_mb: int = setting(256, "MEMQ_WORKER_CACHE_MB",
        ("Workers: decoded snapshots kept per pool process for the run diagnosis, which decodes a run's "
         "newest snapshot (estimated MiB; 0 = none)."),
        minimum=0)
    # Retention (`memq gc` and the beat task workers.retention.gc). Snapshot rows and their analyses
    # stay; raw blobs of OOM / non-healthy snapshots stay; nothing still referenced is removed.
    retention_days: int = setting(30, "MEMQ_RETENTION_DAYS",
        "Retention: days raw snapshot blobs and stat samples are kept (0 = keep forever).",
        minimum=0)
    retention_clusters: str = setting("", "MEMQ_RETENTION_CLUSTERS",
        "Retention: per-cluster overrides, comma separated `cluster=days` (e.g. `dev=7,prod=90`).")
    stat_partition_days_ahead: int = setting(7, "MEMQ_STAT_PARTITION_DAYS_AHEAD",
        ("PostgreSQL: stat_samples has a partition per UTC day; the dispatcher (at start, then hourly) and "
         "`memq gc` make them this many days ahead. Samples outside them land in the default partition."),
        minimum=0)
    gc_hour_utc: int = setting(3, "MEMQ_GC_HOUR_UTC",
        "Beat: UTC hour of the daily retention run (`memq gc`).",
        minimum=0, maximum=23)
    gc_minute_utc: int = setting(15, "MEMQ_GC_MINUTE_UTC",
        "Beat: UTC minute of the daily retention run.",
        minimum=0, maximum=59)
    doctor_max_lag: int = setting(10_000, "MEMQ_DOCTOR_MAX_LAG",
        "`memq doctor`: stream entries not yet read by the dispatcher above which it warns.",
        minimum=0)
    stream_trim_interval_s: int = setting(60, "MEMQ_STREAM_TRIM_INTERVAL_S",
        ("Beat: seconds between trims of the ingest stream to its oldest unacknowledged entry (0 = never; "
         "the agents' MAXLEN is then the only bound)."),
        minimum=0)
    dead_blob_grace_s: int = setting(3600, "MEMQ_DEAD_BLOB_GRACE_S",
        ("Dead-blob cleanup: seconds after a snapshot entry is dead-lettered before its blob file goes from "
         "the blob store, where no snapshot row names it (checked on the stream-trim tick and by `memq gc`; "
         "the entry's own Redis blob goes at once)."),
        minimum=0)
    stream_keep_s: int = setting(600, "MEMQ_STREAM_KEEP_S",
        ("Stream trim: acknowledged entries younger than this many seconds are kept (for `memq status`, "
         "debugging)."),
        minimum=0)
    agent_key: str = setting("", "MEMQ_AGENT_KEY",
        ('Agent and `memq push`: the signing key, JSON `{"kid": ..., "secret": ...}` (profiler/identity.py); '
         "'' = envelopes go unsigned. Give it as a mounted file: MEMQ_AGENT_KEY_FILE."),
        from_file=True)
    agent_keyring: str = setting("", "MEMQ_AGENT_KEYRING",
        ('Dispatcher: the keyring, JSON `{"keys": [{"kid", "principal", "secret", "clusters", "jobs"}]}`. '
         "Set, it takes only signed envelopes, each within its key's clusters and jobs, and binds every "
         "run to the principal that created it; '' = unsigned envelopes are taken. Use MEMQ_AGENT_KEYRING_FILE."),
        from_file=True)
    serve_token: str = setting("", "MEMQ_SERVE_TOKEN",
        ("`memq serve`: bearer token every request must carry (Authorization: Bearer T, or open a page "
         "once with ?token=T); '' = none (then bind to localhost or put an authenticating proxy in front)."),
        from_file=True)
    serve_allowed_hosts: str = setting("", "MEMQ_SERVE_ALLOWED_HOSTS",
        ("`memq serve`: comma-separated Host names it answers (a `*.` prefix takes subdomains). '' = "
         "localhost, 127.0.0.1 and [::1] only while no MEMQ_SERVE_TOKEN is set (a page on another site that "
         "rebinds its name to 127.0.0.1 is refused), any Host once a token is set."))
    serve_header_timeout_s: int = setting(10, "MEMQ_SERVE_HEADER_TIMEOUT_S",
        ("`memq serve`: seconds a connection has to send a whole request head; a client that trickles "
         "its headers (or sends nothing) is disconnected, so slow connections cannot hold every file "
         "descriptor."), minimum=1, maximum=300)
    serve_threads: int = setting(8, "MEMQ_SERVE_THREADS",
        ("`memq serve`: threads per server process for the pages' blocking work (queries, decoding and "
         "analysing a stored snapshot), all started with the server; more requests than this wait their "
         "turn."), minimum=1, maximum=64)
    serve_max_connections: int = setting(512, "MEMQ_SERVE_MAX_CONNECTIONS",
        ("`memq serve`: open connections per server process before new requests are answered 503; keep it "
         "under the process' file limit (LimitNOFILE=4096 in deploy/systemd/memq-serve.service)."),
        minimum=8, maximum=65536)
    # Live metrics (`memq exporter`) and alerts (workers/alerts.py, profiler/alerts/).
    public_url: str = setting("", "MEMQ_PUBLIC_URL",
        ("Base URL of the memq web pages; alerts link to `<MEMQ_PUBLIC_URL>/runs/<run name>` ('' = no "
         "link)."),
        url=True)
    alert_webhook_url: str = setting("", "MEMQ_ALERT_WEBHOOK_URL",
        ("Alerts: http(s) webhook that receives OOM, leak and near-miss verdicts ('' = verdicts are "
         "recorded, not sent). Holds a token for Slack: prefer MEMQ_ALERT_WEBHOOK_URL_FILE."),
        url=True, from_file=True)
    alert_format: str = setting("slack", "MEMQ_ALERT_FORMAT",
        ('Alerts: body of the webhook POST: slack (`{"text": ...}`) or alertmanager (Alertmanager\'s '
         "webhook shape)."),
        choices=("slack", "alertmanager"))
    alert_headroom_pct: int = setting(5, "MEMQ_ALERT_HEADROOM_PCT",
        ("Alerts: a run without an OOM whose peak reserved bytes leave less than this % of its limit is a "
         "near miss."),
        minimum=0, maximum=100)
    alert_run_interval_s: int = setting(600, "MEMQ_ALERT_RUN_INTERVAL_S",
        "Alerts: a run's next verdict waits until this long after its previous alert was sent.",
        minimum=0)
    alert_job_max_per_hour: int = setting(10, "MEMQ_ALERT_JOB_MAX_PER_HOUR",
        ("Alerts: alerts sent per job (principal, cluster, job: another principal's runs under the same job "
         "name count on their own) in any hour; beyond it verdicts are recorded as suppressed and sent as one "
         "summary per job once its hour has room again (at the latest an hour after the first of them)."),
        minimum=0)
    forecast_alert_s: int = setting(6 * 3600, "MEMQ_FORECAST_ALERT_S",
        ("Alerts: a running run whose forecast OOM comes sooner than this many seconds is alerted (once, and "
         "again only when the forecast moves to under half the time the last alert gave); 0 = never."),
        minimum=0)
    forecast_refresh_s: int = setting(30, "MEMQ_FORECAST_REFRESH_S",
        ("Dispatcher: a run's OOM forecast is moved on by its stats batches at most once per this many "
         "seconds per rank (snapshots recompute it regardless); 0 = every batch."),
        minimum=0)
    alert_max_per_hour: int = setting(60, "MEMQ_ALERT_MAX_PER_HOUR",
        ("Alerts: pages of all jobs together in any hour (alerts and summaries); beyond it a principal still "
         "pages up to its share (this limit divided among the principals with a verdict in the last hour), "
         "other verdicts are suppressed and summarised per job as with MEMQ_ALERT_JOB_MAX_PER_HOUR, and "
         "summaries wait for room."),
        minimum=1)
    alert_lookback_h: int = setting(24, "MEMQ_ALERT_LOOKBACK_H",
        "Alerts: the sweep looks for new verdicts among runs updated in the last this many hours.",
        minimum=1)
    alert_sweep_s: int = setting(15, "MEMQ_ALERT_SWEEP_S",
        "Beat: seconds between alert sweeps (new verdicts, due retries, expired send leases).",
        minimum=1)
    alert_timeout_s: int = setting(10, "MEMQ_ALERT_TIMEOUT_S",
        "Alerts: webhook POST timeout (seconds).",
        minimum=1)
    alert_lease_s: int = setting(60, "MEMQ_ALERT_LEASE_S",
        ("Alerts: a claimed alert is sent again (same Idempotency-Key) when its sender has not finished "
         "after this long; must exceed MEMQ_ALERT_TIMEOUT_S."),
        minimum=1)
    alert_max_attempts: int = setting(8, "MEMQ_ALERT_MAX_ATTEMPTS",
        "Alerts: sends of one alert before it is recorded as failed.",
        minimum=1)
    alert_backoff_max_s: int = setting(300, "MEMQ_ALERT_BACKOFF_MAX_S",
        "Alerts: longest wait between retries (exponential back-off with full jitter).",
        minimum=0)
    exporter_active_minutes: int = setting(60, "MEMQ_EXPORTER_ACTIVE_MINUTES",
        ("`memq exporter`: running runs updated within this many minutes get headroom and `pieces` "
         "gauges (the default spans two periodic snapshots, MEMQ_SNAPSHOT_EVERY_S)."),
        minimum=1)
    exporter_max_jobs: int = setting(200, "MEMQ_EXPORTER_MAX_JOBS",
        ("`memq exporter`: at most this many (cluster, job) pairs (and clusters) get series of their own; "
         "the rest are summed under cluster and job_name \"other\", whatever names agents send, so a "
         "flood of run_starts with new names cannot grow /metrics without bound. Pairs with the most "
         "analysed snapshots, then the most active runs, are kept."),
        minimum=1)
    exporter_top_k: int = setting(10, "MEMQ_EXPORTER_TOP_K",
        ("`memq exporter`: the active runs with the least headroom are exported with a `run` label (the "
         "rest only per cluster and job), which bounds the number of series."),
        minimum=0)
    exporter_resync_s: int = setting(600, "MEMQ_EXPORTER_RESYNC_S",
        ("`memq exporter`: seconds between full recounts of the snapshot counters (between them a scrape "
         "adds the snapshots done since the last one; a recount also sees rows retention deleted)."),
        minimum=0)
    extra: dict = field(default_factory=dict)

    @property
    def decode_budget(self) -> int:
        """MEMQ_DECODE_BUDGET_BYTES, or when 0 the share of this process's memory it stands for."""
        return self.decode_budget_bytes or auto_decode_budget(process_memory_bytes())

    @property
    def decode_max_bytes(self) -> int:
        """Largest uncompressed snapshot this process decodes: the decode budget's share, at most
        MEMQ_MAX_SNAPSHOT_BYTES."""
        return raw_limit(self.decode_budget, self.max_snapshot_bytes)

    @property
    def dead_letter_total_key(self) -> str:
        """A counter of every dead letter ever written: the dead stream is trimmed, so its length stops
        growing once full; `memq status` and the exporter's memq_dead_lettered_total read this."""
        return self.dead_letter_key + ":total"

    @property
    def dead_blobs_key(self) -> str:
        """A sorted set of the sha256s of dead-lettered snapshots whose blob was in the blob store, scored
        by when (ms): the dead-blob cleanup removes those no row names once MEMQ_DEAD_BLOB_GRACE_S passed."""
        return self.dead_letter_key + ":blobs"

    @property
    def is_embedded_db(self) -> bool:
        return self.database_url.startswith("sqlite")

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)



@dataclass(frozen=True)
class AgentOptions:
    """The in-job agent's options: the keyword arguments of `agent.start()` (and `MEMQ_AGENT_OPTIONS`),
    one typed object. A field left None takes its `Settings` value in `resolve()`; the job's own objects
    (model, optimizer) and the injected parts (source, client factory) are not options and are passed
    beside it."""

    job: str | None = None
    rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    redis_url: str | None = None          # Settings.redis_url
    stream: str | None = None             # Settings.stream_key
    key_prefix: str | None = None         # Settings.key_prefix
    stream_maxlen: int | None = None      # Settings.stream_maxlen
    blob_ttl_s: int | None = None         # Settings.blob_ttl_s
    spool_dir: str | None = None          # Settings.spool_dir
    spool_max_bytes: int | None = None    # Settings.spool_max_bytes
    fsync: bool = True
    stats_interval_s: float | None = None  # Settings.stats_interval_s
    stats_flush_s: float = 30.0
    snapshot_every_s: float | None = None  # Settings.snapshot_every_s
    snapshot_on_epoch: bool = True
    history: str | None = None            # Settings.agent_history: auto | on | off
    stacks: str = "python"
    context: str = "all"
    max_entries: int | None = None        # Settings.agent_max_entries
    warmup_steps: int = 3
    warmup_s: float = 120.0
    periodic_record_s: float = 2.0
    headroom: float = 0.10
    signal: str | int | None = "default"  # "default": Settings.agent_signal; None or "": no signal
    oom: bool = True
    max_oom_snapshots: int = 4
    oom_message_wait_s: float = 2.0
    codec: str | None = None              # None: zstd where zstandard is installed, else gzip
    send_timeout_s: float = 2.0
    queue_size: int = 256
    stop_timeout_s: float = 5.0
    backoff_s: tuple[float, float] = (0.5, 30.0)
    tick_s: float = 0.5
    metadata: dict | None = None
    device: int | None = None
    announce: str = "eager"               # "eager": run_start at start(); "on_ready": once CUDA is initialised
    comparable_every_steps: int = 100
    comparable_min_s: float = 300.0
    growth_window_steps: int = 500
    step_hook: bool = True
    step_budget: float = 0.002
    roles: bool = True                    # send the roles of the optimizer's and the model's tensors
    role_devices: tuple = ("cuda",)       # the device types whose tensors those are

    def resolve(self, st: Settings) -> AgentOptions:
        """These options with every unset one taken from `st` (as agent.start() always did: an empty
        URL, name or size also falls back, a zero interval or entry count does not)."""
        return dataclasses.replace(
            self, redis_url=self.redis_url or st.redis_url, stream=self.stream or st.stream_key,
            key_prefix=self.key_prefix or st.key_prefix, stream_maxlen=self.stream_maxlen or st.stream_maxlen,
            blob_ttl_s=self.blob_ttl_s or st.blob_ttl_s, spool_dir=self.spool_dir or st.spool_dir,
            spool_max_bytes=self.spool_max_bytes or st.spool_max_bytes,
            stats_interval_s=float(st.stats_interval_s if self.stats_interval_s is None else self.stats_interval_s),
            stats_flush_s=float(self.stats_flush_s),
            snapshot_every_s=float(st.snapshot_every_s if self.snapshot_every_s is None else self.snapshot_every_s),
            history=self.history or st.agent_history,
            max_entries=int(st.agent_max_entries if self.max_entries is None else self.max_entries),
            signal=st.agent_signal if self.signal == "default" else self.signal,
            periodic_record_s=float(self.periodic_record_s), step_budget=float(self.step_budget),
            role_devices=tuple(self.role_devices), metadata=dict(self.metadata or {}))


_TYPES = {"str": str, "int": int}


def _spec_of(f: dataclasses.Field) -> Spec:
    m = f.metadata
    return Spec(f.name, m["env"], _TYPES[str(f.type)], f.default if m["shown"] is None else m["shown"], m["doc"],
                m["minimum"], m["maximum"], m["choices"], m["url"], m["from_file"])


#: Every setting, in declaration order (the fields of `Settings` made by `setting`).
SETTINGS: tuple[Spec, ...] = tuple(_spec_of(f) for f in dataclasses.fields(Settings) if "env" in f.metadata)

#: Settings that may also be given as a file holding the value (`<ENV>_FILE`, e.g. a Kubernetes or
#: Docker secret mounted as a file), used when the variable itself is not set.
FILE_SETTINGS: tuple[str, ...] = tuple(s.name for s in SETTINGS if s.from_file)

#: Variables memq reads that are not settings (no file key, not in `Settings`); documented with them.
OTHER_VARIABLES: tuple[tuple[str, str], ...] = (
    ("MEMQ_CONFIG", "Path of the TOML config file (default `<data dir>/memq.toml`)."),
    ("MEMQ_DEBUG", "Set to show Python tracebacks instead of one-line errors."),
    ("MEMQ_AGENT_RUN", "Set by `memq run --run R`: the run name the agent started in every process of the job "
                       "reports under (profiler/agent/bootstrap.py); unset = no automatic agent."),
    ("MEMQ_AGENT_CLUSTER", "Set by `memq run --cluster C`: the cluster of that run (default `default`)."),
    ("MEMQ_AGENT_JOB", "Set by `memq run --job J`: the job of that run."),
    ("MEMQ_AGENT_OPTIONS", "Set by `memq run`: further `agent.start()` options as a JSON object."),
    ("MEMQ_AGENT_DISABLE", "`1` turns the automatic agent of `memq run` off in a process that inherits its "
                           "environment."),
    ("MEMQ_AGENT_SOURCE", "`replay:<folder>` makes the agent replay a recording instead of reading torch.cuda "
                          "(tests and benchmarks)."),
    ("MEMQ_JOB", "The job name the agent reports when `agent.start()` gets none (before SLURM_JOB_ID, "
                 "TORCHELASTIC_RUN_ID, JOB_NAME, LSB_JOBID, PBS_JOBID)."),
    ("MEMQ_DEVICE_FROM_LOCAL_RANK", "`1` (default): with several GPUs visible, the agent watches the GPU of "
                                    "LOCAL_RANK; `0`: the current CUDA device."),
    ("MEMQ_TEST_FAULT", "Test harness only: a point where `memq dispatcher` kills itself (crash tests). Ignored "
                        "unless MEMQ_TEST_HARNESS also holds (workers/faults.py); never set it in production."),
    ("MEMQ_TEST_HARNESS", "Test harness only: the marker file that the test harness writes for the processes it "
                          "starts (workers/faults.py); without a valid one MEMQ_TEST_FAULT is ignored."),
)


def _coerce(spec: Spec, raw: object, origin: str) -> object:
    if spec.type is int:
        try:
            return int(str(raw).replace("_", ""))
        except ValueError as exc:
            raise ConfigError(f"{spec.env} must be an integer{origin}, got {raw!r}") from exc
    return str(raw)


def _port_ok(url: str) -> bool:
    try:
        port = urlsplit(url).port
    except ValueError:  # out of 0..65535, or not a number
        return False
    return port is None or port >= 1


def check(spec: Spec, value: object, origin: str = "") -> None:
    """ConfigError naming the variable and what is allowed, when `value` is not (the URL itself is
    not shown: it may hold a password)."""
    bad = False
    if spec.type is int:
        bad = (spec.minimum is not None and value < spec.minimum) or (spec.maximum is not None
                                                                       and value > spec.maximum)
    elif spec.choices:
        bad = value not in spec.choices
    elif spec.url and value:
        if not _port_ok(str(value)):
            raise ConfigError(f"{spec.env}{origin}: the port must be a number in 1..65535")
    if bad:
        rule = spec.allowed()
        rule = f"one of {rule}" if spec.choices else (f"in {rule}" if ".." in rule else rule)
        raise ConfigError(f"{spec.env}{origin} must be {rule}, got {value!r}")


def normalize_database_url(url: str) -> str:
    """Plain postgres URLs go to the psycopg 3 driver so users never need psycopg2."""
    for prefix in ("postgresql://", "postgres://", "postgresql+psycopg2://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def redact_url(url: str) -> str:
    """`redis://user:secret@host` -> `redis://user:***@host`."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", url)


def _read_file(path: Path) -> dict:
    try:
        fh = open(path, "rb")  # noqa: SIM115 - closed below; most commands run with no file at all
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    import tomllib  # only when there is a file to read

    with fh:
        try:
            data = tomllib.load(fh)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    return data.get("memq", data)


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    data_dir = Path(env.get("MEMQ_DATA_DIR") or default_data_dir(env)).expanduser()
    cfg_path = Path(env.get("MEMQ_CONFIG") or data_dir / "memq.toml").expanduser()
    file_values = _read_file(cfg_path)
    values: dict[str, object] = {}
    for spec in SETTINGS:
        origin = ""  # said in an error: where the refused value came from, when not the variable
        if spec.env in env and env[spec.env] != "":
            values[spec.name] = _coerce(spec, env[spec.env], origin)
        elif spec.name in file_values:
            origin = f" ({spec.name} in {cfg_path})"
            values[spec.name] = _coerce(spec, file_values[spec.name], origin)
        elif spec.from_file and env.get(spec.env + "_FILE"):
            # Credentials may live in files (Kubernetes / Docker secrets) rather than in the environment.
            file_env = spec.env + "_FILE"
            origin = f" (from {file_env})"
            try:
                values[spec.name] = Path(env[file_env]).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read {file_env}={env[file_env]}: {exc}") from exc
        if spec.name in values:
            check(spec, values[spec.name], origin)
    values["data_dir"] = str(data_dir)
    values.setdefault("database_url", f"sqlite:///{data_dir / 'memq.db'}")
    values.setdefault("blob_dir", str(data_dir / "blobs"))
    values.setdefault("report_dir", str(data_dir / "reports"))
    values.setdefault("spool_dir", str(data_dir / "spool"))
    values.setdefault("broker_url", values.get("redis_url", Settings.redis_url))
    values.setdefault("broker_key_prefix", str(values.get("key_prefix", Settings.key_prefix)) + "celery:")
    values["database_url"] = normalize_database_url(str(values["database_url"]))
    return Settings(**values)
