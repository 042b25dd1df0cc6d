"""Typed settings, read from the environment and an optional TOML file, in one place.

Precedence: environment variable > config file (`MEMQ_CONFIG`, default `<data dir>/memq.toml`)
> default. Every setting is declared once in `SETTINGS` with its type, default and meaning; the
configuration reference in deploy/CONFIG.md is written from the same table.
Secrets (passwords in URLs) are never printed: use `redact_url` for anything shown to people.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from profiler.errors import ConfigError


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME", "~")).expanduser() / ".local" / "share")
    return Path(base) / "memq"


@dataclass(frozen=True)
class Spec:
    name: str
    env: str
    type: type
    default: object
    doc: str


@dataclass(frozen=True)
class Settings:
    database_url: str = ""
    blob_dir: str = ""
    redis_url: str = "redis://127.0.0.1:6379/0"
    stream_key: str = "memq:ingest"
    dead_letter_key: str = "memq:dead"
    key_prefix: str = "memq:"
    stream_maxlen: int = 1_000_000
    blob_ttl_s: int = 7 * 24 * 3600
    max_deliveries: int = 5
    max_snapshot_bytes: int = 4 * 1024**3
    decode_budget_bytes: int = 768 * 1024**2
    max_clock_skew_s: int = 86_400
    report_dir: str = ""
    report_scopes: str = "all"
    report_hour_utc: int = 0
    report_minute_utc: int = 30
    report_catchup_days: int = 7
    report_webhook_url: str = ""
    report_webhook_timeout_s: int = 10
    data_dir: str = ""
    spool_dir: str = ""
    spool_max_bytes: int = 1024**3
    stats_interval_s: int = 10
    snapshot_every_s: int = 1800
    agent_history: str = "auto"
    agent_max_entries: int = 50_000
    agent_signal: str = "SIGUSR2"
    broker_url: str = ""
    broker_key_prefix: str = ""
    visibility_timeout_s: int = 3600
    task_soft_time_limit_s: int = 300
    task_time_limit_s: int = 360
    analysis_lease_s: int = 420
    task_max_retries: int = 10
    retry_backoff_max_s: int = 60
    reaper_interval_s: int = 60
    pending_requeue_s: int = 600
    claim_idle_s: int = 60
    run_diagnosis_delay_ms: int = 2000
    heartbeat_s: int = 10
    worker_max_tasks_per_child: int = 500
    worker_max_memory_per_child_kb: int = 4_000_000
    worker_cache_mb: int = 256
    retention_days: int = 30
    stat_partition_days_ahead: int = 7
    retention_clusters: str = ""
    gc_hour_utc: int = 3
    gc_minute_utc: int = 15
    doctor_max_lag: int = 10_000
    stream_trim_interval_s: int = 60
    stream_keep_s: int = 600
    serve_token: str = ""
    public_url: str = ""
    alert_webhook_url: str = ""
    alert_format: str = "slack"
    alert_headroom_pct: int = 5
    alert_run_interval_s: int = 600
    alert_job_max_per_hour: int = 10
    alert_lookback_h: int = 24
    alert_sweep_s: int = 15
    alert_timeout_s: int = 10
    alert_lease_s: int = 60
    alert_max_attempts: int = 8
    alert_backoff_max_s: int = 300
    exporter_active_minutes: int = 60
    exporter_top_k: int = 10
    exporter_resync_s: int = 600
    extra: dict = field(default_factory=dict)

    @property
    def decode_max_bytes(self) -> int:
        """Largest uncompressed snapshot this process decodes: the decode budget's share, at most
        MEMQ_MAX_SNAPSHOT_BYTES."""
        from profiler.codec import raw_limit

        return raw_limit(self.decode_budget_bytes, self.max_snapshot_bytes)

    @property
    def is_embedded_db(self) -> bool:
        return self.database_url.startswith("sqlite")

    def replace(self, **changes) -> Settings:
        return dataclasses.replace(self, **changes)


SETTINGS: tuple[Spec, ...] = (
    Spec("database_url", "MEMQ_DATABASE_URL", str, "sqlite:///<data dir>/memq.db",
         "SQL database. postgresql:// URLs use the psycopg 3 driver; the SQLite default migrates itself."),
    Spec("blob_dir", "MEMQ_BLOB_DIR", str, "<data dir>/blobs", "Content-addressed store of raw snapshots."),
    Spec("redis_url", "MEMQ_REDIS_URL", str, "redis://127.0.0.1:6379/0",
         "Redis for the ingest stream, blobs and the Celery broker. rediss:// for TLS."),
    Spec("stream_key", "MEMQ_STREAM", str, "memq:ingest", "Redis stream the agents append to."),
    Spec("dead_letter_key", "MEMQ_DEAD_STREAM", str, "memq:dead", "Redis stream of entries that failed."),
    Spec("key_prefix", "MEMQ_KEY_PREFIX", str, "memq:", "Prefix of every other Redis key memq writes."),
    Spec("stream_maxlen", "MEMQ_STREAM_MAXLEN", int, 1_000_000, "Approximate cap of the ingest stream."),
    Spec("blob_ttl_s", "MEMQ_BLOB_TTL_S", int, 7 * 24 * 3600, "TTL of snapshot blobs waiting in Redis."),
    Spec("max_deliveries", "MEMQ_MAX_DELIVERIES", int, 5, "Deliveries before an entry is dead-lettered."),
    Spec("max_snapshot_bytes", "MEMQ_MAX_SNAPSHOT_BYTES", int, 4 * 1024**3,
         "Largest uncompressed snapshot accepted anywhere (bytes)."),
    # Below every deploy/ memory limit of a process that decodes (dispatcher 1-2 GiB, worker pool
    # process ~4 GiB): a decode needs up to 16x the pickle (profiler/codec.py), so 768 MiB admits
    # pickles up to 48 MiB (~230k trace entries; the agent's default 50k entries make ~10 MB).
    Spec("decode_budget_bytes", "MEMQ_DECODE_BUDGET_BYTES", int, 768 * 1024**2,
         "Memory one snapshot decode may take (bytes): admits uncompressed snapshots up to 1/16 of it "
         "(dispatcher blob checks, workers, CLI); larger ones are refused as bad input. Keep it under "
         "the process's memory limit."),
    Spec("max_clock_skew_s", "MEMQ_MAX_CLOCK_SKEW_S", int, 86_400,
         "Dispatcher: envelopes and stat samples stamped more than this many seconds ahead of its clock "
         "(or before 2020) are dead-lettered."),
    Spec("report_dir", "MEMQ_REPORT_DIR", str, "<data dir>/reports", "Where nightly reports are written."),
    Spec("report_scopes", "MEMQ_REPORT_SCOPES", str, "all",
         "Nightly report scopes, comma separated: all, cluster=NAME, job=NAME."),
    Spec("report_hour_utc", "MEMQ_REPORT_HOUR_UTC", int, 0, "Beat: UTC hour of the nightly report (of the day before)."),
    Spec("report_minute_utc", "MEMQ_REPORT_MINUTE_UTC", int, 30, "Beat: UTC minute of the nightly report."),
    Spec("report_catchup_days", "MEMQ_REPORT_CATCHUP_DAYS", int, 7,
         "Nightly report: days back it fills in when a report is missing (missed ticks, downtime)."),
    Spec("report_webhook_url", "MEMQ_REPORT_WEBHOOK_URL", str, "",
         "Optional http(s) URL that receives the Markdown summary as JSON {\"text\": ...}; '' = none."),
    Spec("report_webhook_timeout_s", "MEMQ_REPORT_WEBHOOK_TIMEOUT_S", int, 10, "Webhook POST timeout (seconds)."),
    Spec("data_dir", "MEMQ_DATA_DIR", str, "~/.local/share/memq", "Base of the embedded defaults."),
    # In-job agent (profiler.agent). Options given to agent.start() override these.
    Spec("spool_dir", "MEMQ_SPOOL_DIR", str, "<data dir>/spool",
         "Agent: on-disk spool for messages Redis could not take (one subfolder per process)."),
    Spec("spool_max_bytes", "MEMQ_SPOOL_MAX_BYTES", int, 1024**3,
         "Agent: spool size cap per process; the oldest messages are dropped (and counted) beyond it."),
    Spec("stats_interval_s", "MEMQ_STATS_INTERVAL_S", int, 10, "Agent: seconds between memory_stats samples."),
    Spec("snapshot_every_s", "MEMQ_SNAPSHOT_EVERY_S", int, 1800,
         "Agent: seconds between periodic snapshots (0 = none)."),
    Spec("agent_history", "MEMQ_AGENT_HISTORY", str, "auto",
         "Agent: allocator history recording: auto (first steps, one step per periodic snapshot, "
         "on near the limit) | on | off."),
    Spec("agent_max_entries", "MEMQ_AGENT_MAX_ENTRIES", int, 50_000, "Agent: history ring-buffer entries."),
    Spec("agent_signal", "MEMQ_AGENT_SIGNAL", str, "SIGUSR2", "Agent: signal that takes a snapshot ('' = none)."),
    # Dispatcher and Celery workers (workers/). Soft limit < hard limit < lease, and hard limit <
    # visibility timeout: workers refuse to start otherwise.
    Spec("broker_url", "MEMQ_BROKER_URL", str, "<MEMQ_REDIS_URL>", "Workers: Celery broker (Redis)."),
    Spec("broker_key_prefix", "MEMQ_BROKER_KEY_PREFIX", str, "<key prefix>celery:",
         "Workers: prefix of every Celery key and channel in the broker Redis."),
    Spec("visibility_timeout_s", "MEMQ_VISIBILITY_TIMEOUT_S", int, 3600,
         "Workers: seconds before an unacknowledged task is redelivered by the broker."),
    Spec("task_soft_time_limit_s", "MEMQ_TASK_SOFT_TIME_LIMIT_S", int, 300,
         "Workers: an analysis is asked to stop after this many seconds (recorded as a failed attempt)."),
    Spec("task_time_limit_s", "MEMQ_TASK_TIME_LIMIT_S", int, 360, "Workers: an analysis is killed after this."),
    Spec("analysis_lease_s", "MEMQ_ANALYSIS_LEASE_S", int, 420,
         "Workers: lease of a snapshot being analysed; the reaper re-enqueues it once expired."),
    Spec("task_max_retries", "MEMQ_TASK_MAX_RETRIES", int, 10,
         "Workers: retries of a task on database/Redis outages (exponential back-off with jitter)."),
    Spec("retry_backoff_max_s", "MEMQ_RETRY_BACKOFF_MAX_S", int, 60, "Workers: longest back-off between retries."),
    Spec("reaper_interval_s", "MEMQ_REAPER_INTERVAL_S", int, 60, "Workers: beat period of the lease reaper."),
    Spec("pending_requeue_s", "MEMQ_PENDING_REQUEUE_S", int, 600,
         "Workers: a snapshot pending longer than this is enqueued again by the reaper (lost messages)."),
    Spec("claim_idle_s", "MEMQ_CLAIM_IDLE_S", int, 60,
         "Dispatcher: stream entries unacknowledged this long by another consumer are claimed (XAUTOCLAIM)."),
    Spec("run_diagnosis_delay_ms", "MEMQ_RUN_DIAGNOSIS_DELAY_MS", int, 2000,
         "Workers: run-level diagnoses are recomputed at most once per this delay per run and rank."),
    Spec("heartbeat_s", "MEMQ_HEARTBEAT_S", int, 10, "Workers/dispatcher: heartbeat period shown by `memq status`."),
    Spec("worker_max_tasks_per_child", "MEMQ_WORKER_MAX_TASKS_PER_CHILD", int, 500,
         "Workers: a pool process is replaced after this many tasks."),
    Spec("worker_max_memory_per_child_kb", "MEMQ_WORKER_MAX_MEMORY_PER_CHILD_KB", int, 4_000_000,
         "Workers: a pool process is replaced once its resident memory exceeds this (KiB)."),
    Spec("worker_cache_mb", "MEMQ_WORKER_CACHE_MB", int, 256,
         "Workers: decoded snapshots kept per pool process for the run diagnosis, which decodes a run's "
         "newest snapshot (estimated MiB; 0 = none)."),
    # Retention (`memq gc` and the beat task workers.retention.gc). Snapshot rows and their analyses
    # stay; raw blobs of OOM / non-healthy snapshots stay; nothing still referenced is removed.
    Spec("retention_days", "MEMQ_RETENTION_DAYS", int, 30,
         "Retention: days raw snapshot blobs and stat samples are kept (0 = keep forever)."),
    Spec("retention_clusters", "MEMQ_RETENTION_CLUSTERS", str, "",
         "Retention: per-cluster overrides, comma separated `cluster=days` (e.g. `dev=7,prod=90`)."),
    Spec("stat_partition_days_ahead", "MEMQ_STAT_PARTITION_DAYS_AHEAD", int, 7,
         "PostgreSQL: stat_samples has a partition per UTC day; the dispatcher (at start, then hourly) and "
         "`memq gc` make them this many days ahead. Samples outside them land in the default partition."),
    Spec("gc_hour_utc", "MEMQ_GC_HOUR_UTC", int, 3, "Beat: UTC hour of the daily retention run (`memq gc`)."),
    Spec("gc_minute_utc", "MEMQ_GC_MINUTE_UTC", int, 15, "Beat: UTC minute of the daily retention run."),
    Spec("doctor_max_lag", "MEMQ_DOCTOR_MAX_LAG", int, 10_000,
         "`memq doctor`: stream entries not yet read by the dispatcher above which it warns."),
    Spec("stream_trim_interval_s", "MEMQ_STREAM_TRIM_INTERVAL_S", int, 60,
         "Beat: seconds between trims of the ingest stream to its oldest unacknowledged entry (0 = never; "
         "the agents' MAXLEN is then the only bound)."),
    Spec("stream_keep_s", "MEMQ_STREAM_KEEP_S", int, 600,
         "Stream trim: acknowledged entries younger than this many seconds are kept (for `memq status`, debugging)."),
    Spec("serve_token", "MEMQ_SERVE_TOKEN", str, "",
         "`memq serve`: bearer token every request must carry (Authorization: Bearer T, or open a page once "
         "with ?token=T); '' = none (then bind to localhost or put an authenticating proxy in front)."),
    # Live metrics (`memq exporter`) and alerts (workers/alerts.py, profiler/alerts/).
    Spec("public_url", "MEMQ_PUBLIC_URL", str, "",
         "Base URL of the memq web pages; alerts link to `<MEMQ_PUBLIC_URL>/runs/<run name>` ('' = no link)."),
    Spec("alert_webhook_url", "MEMQ_ALERT_WEBHOOK_URL", str, "",
         "Alerts: http(s) webhook that receives OOM, leak and near-miss verdicts ('' = verdicts are recorded, "
         "not sent). Holds a token for Slack: prefer MEMQ_ALERT_WEBHOOK_URL_FILE."),
    Spec("alert_format", "MEMQ_ALERT_FORMAT", str, "slack",
         "Alerts: body of the webhook POST: slack (`{\"text\": ...}`) or alertmanager (Alertmanager's webhook shape)."),
    Spec("alert_headroom_pct", "MEMQ_ALERT_HEADROOM_PCT", int, 5,
         "Alerts: a run without an OOM whose peak reserved bytes leave less than this % of its limit is a near miss."),
    Spec("alert_run_interval_s", "MEMQ_ALERT_RUN_INTERVAL_S", int, 600,
         "Alerts: a run's next verdict waits until this long after its previous alert was sent."),
    Spec("alert_job_max_per_hour", "MEMQ_ALERT_JOB_MAX_PER_HOUR", int, 10,
         "Alerts: alerts sent per job (cluster, job) in any hour; beyond it verdicts are recorded as suppressed."),
    Spec("alert_lookback_h", "MEMQ_ALERT_LOOKBACK_H", int, 24,
         "Alerts: the sweep looks for new verdicts among runs updated in the last this many hours."),
    Spec("alert_sweep_s", "MEMQ_ALERT_SWEEP_S", int, 15,
         "Beat: seconds between alert sweeps (new verdicts, due retries, expired send leases)."),
    Spec("alert_timeout_s", "MEMQ_ALERT_TIMEOUT_S", int, 10, "Alerts: webhook POST timeout (seconds)."),
    Spec("alert_lease_s", "MEMQ_ALERT_LEASE_S", int, 60,
         "Alerts: a claimed alert is sent again (same Idempotency-Key) when its sender has not finished after "
         "this long; must exceed MEMQ_ALERT_TIMEOUT_S."),
    Spec("alert_max_attempts", "MEMQ_ALERT_MAX_ATTEMPTS", int, 8,
         "Alerts: sends of one alert before it is recorded as failed."),
    Spec("alert_backoff_max_s", "MEMQ_ALERT_BACKOFF_MAX_S", int, 300,
         "Alerts: longest wait between retries (exponential back-off with full jitter)."),
    Spec("exporter_active_minutes", "MEMQ_EXPORTER_ACTIVE_MINUTES", int, 60,
         "`memq exporter`: running runs updated within this many minutes get headroom and fragmentation gauges "
         "(the default spans two periodic snapshots, MEMQ_SNAPSHOT_EVERY_S)."),
    Spec("exporter_top_k", "MEMQ_EXPORTER_TOP_K", int, 10,
         "`memq exporter`: the active runs with the least headroom are exported with a `run` label (the rest "
         "only per cluster and job), which bounds the number of series."),
    Spec("exporter_resync_s", "MEMQ_EXPORTER_RESYNC_S", int, 600,
         "`memq exporter`: seconds between full recounts of the snapshot counters (between them a scrape adds "
         "the snapshots done since the last one; a recount also sees rows retention deleted)."),
)

#: Settings that may also be given as a file holding the value (`<ENV>_FILE`, e.g. a Kubernetes or
#: Docker secret mounted as a file), used when the variable itself is not set.
FILE_SETTINGS: tuple[str, ...] = ("redis_url", "database_url", "broker_url", "serve_token", "alert_webhook_url")


def _spec(name: str) -> Spec:
    return next(s for s in SETTINGS if s.name == name)


def _coerce(spec: Spec, raw: object) -> object:
    if spec.type is int:
        try:
            return int(str(raw).replace("_", ""))
        except ValueError as exc:
            raise ConfigError(f"{spec.env} must be an integer, got {raw!r}") from exc
    return str(raw)


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
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        return {}
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
        if spec.env in env and env[spec.env] != "":
            values[spec.name] = _coerce(spec, env[spec.env])
        elif spec.name in file_values:
            values[spec.name] = _coerce(spec, file_values[spec.name])
    # Credentials may live in files (Kubernetes / Docker secrets) rather than in the environment.
    for url_key in FILE_SETTINGS:
        file_env = _spec(url_key).env + "_FILE"
        if url_key not in values and env.get(file_env):
            try:
                values[url_key] = Path(env[file_env]).read_text().strip()
            except OSError as exc:
                raise ConfigError(f"cannot read {file_env}={env[file_env]}: {exc}") from exc
    values["data_dir"] = str(data_dir)
    values.setdefault("database_url", f"sqlite:///{data_dir / 'memq.db'}")
    values.setdefault("blob_dir", str(data_dir / "blobs"))
    values.setdefault("report_dir", str(data_dir / "reports"))
    values.setdefault("spool_dir", str(data_dir / "spool"))
    values.setdefault("broker_url", values.get("redis_url", Settings.redis_url))
    values.setdefault("broker_key_prefix", str(values.get("key_prefix", Settings.key_prefix)) + "celery:")
    values["database_url"] = normalize_database_url(str(values["database_url"]))
    return Settings(**values)
