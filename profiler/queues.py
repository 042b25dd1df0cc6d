"""Names the workers, the dispatcher and the CLI agree on: Celery queues and the stream's consumer group.

A module of its own, with no imports, so that anything may read these names without building a
Celery app (the dispatcher, `memq status`, `memq doctor`).
"""

from __future__ import annotations

#: The dispatcher's consumer group on the ingest stream.
GROUP = "memq-dispatch"
#: Cheap bookkeeping: the reaper, stream trims, alert sweeps.
QUEUE_INGEST = "memq.ingest"
#: CPU: per-snapshot analysis, run-level diagnosis, what-if sweeps.
QUEUE_ANALYZE = "memq.analyze"
#: The nightly report and the retention run.
QUEUE_REPORT = "memq.report"
QUEUES = (QUEUE_INGEST, QUEUE_ANALYZE, QUEUE_REPORT)
