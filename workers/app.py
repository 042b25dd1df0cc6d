"""The Celery app: `celery -A memq.workers.app worker` (or `memq worker`) runs it.

`make_app(settings)` builds an app from memq settings; the module-level `app` reads them from the
environment lazily (when Celery first looks at its configuration, not at import).

Reliability settings (ARCHITECTURE.md, "Reliability design"; research anchors §3 and Appendix B):
- task_acks_late + task_reject_on_worker_lost: a task whose pool process dies is redelivered;
  tasks are idempotent (they take ids, re-read state, claim a lease, and write upserts).
- worker_prefetch_multiplier=1: a worker reserves one task per process.
- soft time limit < hard time limit < analysis lease, and hard limit < visibility timeout (the same
  value in broker and result-backend transport options); a hard-limit kill acknowledges the message,
  so the SQL lease and the reaper re-drive it.
- JSON only; no result backend (state lives in SQL: snapshots.state / lease_until / attempts).
- Queues memq.ingest (cheap bookkeeping: reaper), memq.analyze (CPU: per-snapshot analysis and
  run-level diagnosis) and memq.report (the nightly report), routed by task name.

Beat: `beat_schedule(settings)` builds the schedule. The report engineer extends it from
`workers/reports.py` by defining `beat_entries(settings) -> dict` there; tasks named
`memq.workers.reports.*` are routed to memq.report. Run exactly one beat.
"""

from __future__ import annotations

import importlib.util
import logging
import socket

from celery import Celery, signals
from kombu import Queue

from memq.config import Settings, load_settings
from memq.errors import ConfigError
from memq.store.db import configure_orm as configure
from memq.workers import runtime
from memq.workers.heartbeat import Heartbeat, heartbeat_key
from memq.workers.queues import QUEUE_ANALYZE, QUEUE_INGEST, QUEUE_REPORT, QUEUES

log = logging.getLogger("memq.workers")

ROUTES = {
    "workers.tasks.analyze_snapshot": {"queue": QUEUE_ANALYZE},
    "workers.tasks.recompute_run": {"queue": QUEUE_ANALYZE},
    "workers.tasks.refresh_forecast": {"queue": QUEUE_ANALYZE},
    "workers.tasks.reap": {"queue": QUEUE_INGEST},
    "memq.workers.reports.*": {"queue": QUEUE_REPORT},
    "workers.retention.trim_stream": {"queue": QUEUE_INGEST},
    "memq.workers.retention.*": {"queue": QUEUE_REPORT},
}

REPORTS_MODULE = "memq.workers.reports"
#: Modules with tasks of their own; each may define `beat_entries(settings) -> dict` for the schedule.
EXTENSION_MODULES = (REPORTS_MODULE, "memq.workers.retention", "memq.workers.alerts")


def check_limits(st: Settings) -> None:
    """soft < hard < lease, hard < visibility, back-off well under visibility: else ConfigError."""
    if not 0 < st.task_soft_time_limit_s < st.task_time_limit_s:
        raise ConfigError("MEMQ_TASK_SOFT_TIME_LIMIT_S must be positive and below MEMQ_TASK_TIME_LIMIT_S")
    if not st.task_time_limit_s < st.analysis_lease_s:
        raise ConfigError("MEMQ_ANALYSIS_LEASE_S must exceed MEMQ_TASK_TIME_LIMIT_S (a lease outlives its task)")
    if not st.task_time_limit_s < st.visibility_timeout_s:
        raise ConfigError("MEMQ_VISIBILITY_TIMEOUT_S must exceed MEMQ_TASK_TIME_LIMIT_S, or running tasks "
                          "are redelivered while they still run")
    if not 2 * st.retry_backoff_max_s < st.visibility_timeout_s:
        raise ConfigError("MEMQ_RETRY_BACKOFF_MAX_S must stay well under MEMQ_VISIBILITY_TIMEOUT_S "
                          "(retries are ETA messages)")


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _has_reports() -> bool:
    return _has(REPORTS_MODULE)


def beat_schedule(st: Settings) -> dict:
    """The periodic tasks: the lease reaper, plus whatever the `beat_entries(settings)` of each of
    EXTENSION_MODULES adds (the nightly report, the daily retention run). Times are UTC."""
    schedule = {
        "memq-reaper": {"task": "workers.tasks.reap", "schedule": float(st.reaper_interval_s),
                        "options": {"queue": QUEUE_INGEST, "expires": float(st.reaper_interval_s)}},
    }
    for name in EXTENSION_MODULES:
        if not _has(name):
            continue
        extra = getattr(importlib.import_module(name), "beat_entries", None)
        if callable(extra):
            schedule.update(extra(st) or {})
    return schedule


def celery_config(st: Settings) -> dict:
    """Celery settings from memq settings (see the module docstring for why each is set)."""
    check_limits(st)
    transport = {"visibility_timeout": st.visibility_timeout_s, "global_keyprefix": st.broker_key_prefix,
                 "socket_timeout": 30, "socket_connect_timeout": 10, "health_check_interval": 25}
    return {
        "broker_url": st.broker_url or st.redis_url,
        "broker_transport_options": transport,
        "result_backend_transport_options": {"visibility_timeout": st.visibility_timeout_s},
        "visibility_timeout": st.visibility_timeout_s,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,  # a worker waits for Redis rather than exiting
        "result_backend": None,
        "task_ignore_result": True,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "task_soft_time_limit": st.task_soft_time_limit_s,
        "task_time_limit": st.task_time_limit_s,
        "task_queues": tuple(Queue(q, routing_key=q) for q in QUEUES),
        "task_default_queue": QUEUE_INGEST,
        "task_create_missing_queues": False,
        "task_routes": ROUTES,
        "task_publish_retry": True,
        "task_publish_retry_policy": {"max_retries": 3, "interval_start": 0.2, "interval_step": 0.5,
                                      "interval_max": 1.0},
        "worker_max_tasks_per_child": st.worker_max_tasks_per_child,
        "worker_max_memory_per_child": st.worker_max_memory_per_child_kb,
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "enable_utc": True,
        "timezone": "UTC",
        "beat_schedule": beat_schedule(st),
    }


def _includes() -> list[str]:
    return ["memq.workers.tasks", *(m for m in EXTENSION_MODULES if _has(m))]


def make_app(settings: Settings | None = None) -> Celery:
    """A Celery app for `settings` (default: from the environment, read when first needed)."""
    celery_app = Celery("memq", include=_includes(), set_as_current=settings is None)
    # Settings stay off the Celery configuration: `celery report` would print their URLs.
    celery_app.memq_settings = settings
    if settings is not None:
        celery_app.conf.update(celery_config(settings))
    else:
        celery_app.add_defaults(lambda: celery_config(load_settings()))
    return celery_app


def settings_of(celery_app: Celery) -> Settings:
    """The memq settings of `celery_app` (for the default app: the process's, `runtime.settings()`)."""
    st = getattr(celery_app, "memq_settings", None)
    if st is None:
        st = celery_app.memq_settings = runtime.settings()
    return st


app = make_app()


# ----------------------------------------------------------------------------- worker heartbeats
# Heartbeat lives in memq.workers.heartbeat (the dispatcher beats without a Celery app); named here too
# for the callers that know it from this module.
__all__ = ["app", "make_app", "settings_of", "celery_config", "beat_schedule", "check_limits", "Heartbeat",
           "heartbeat_key", "configure_orm"]

_heartbeat: Heartbeat | None = None


@signals.worker_ready.connect
def _worker_ready(sender=None, **_):
    global _heartbeat
    try:
        consumer = sender
        hostname = getattr(consumer, "hostname", None) or socket.gethostname()
        st = settings_of(consumer.app)
        queues = sorted(q.name for q in consumer.task_consumer.queues) if consumer.task_consumer else []
        _heartbeat = Heartbeat(st, "worker", hostname, {"queues": queues,
                                                        "concurrency": consumer.pool.num_processes
                                                        if hasattr(consumer.pool, "num_processes") else None})
        _heartbeat.start()
    except Exception:  # noqa: BLE001
        log.warning("memq worker heartbeat not started", exc_info=True)


@signals.worker_shutdown.connect
def _worker_shutdown(**_):
    if _heartbeat is not None:
        _heartbeat.stop()


@signals.worker_process_init.connect
def _child_init(**_):
    """A forked pool process must not share the parent's database or Redis connections. Its ORM
    mappers are configured here, before any task runs: configured lazily inside the first task, a soft
    time limit (SoftTimeLimitExceeded) could interrupt SQLAlchemy's one-time configuration and leave
    every later task of the process failing with "mappers failed to initialize"."""
    runtime.reset()
    configure_orm()


def configure_orm() -> None:
    configure()
