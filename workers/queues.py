"""The queue and consumer-group names, as the workers import them (defined in profiler/queues.py, where
the CLI and the status use case read them without importing workers)."""

from __future__ import annotations

from memq.queues import GROUP, QUEUE_ANALYZE, QUEUE_INGEST, QUEUE_REPORT, QUEUES  # noqa: F401
