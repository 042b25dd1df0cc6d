"""memq workers: the path from the agents' Redis stream to the run history in SQL.

    agent --XADD--> memq:ingest --(dispatcher: consumer group)--> snapshots row, blob store
                                        |-- enqueue analyze_snapshot(snapshot_id) --> Celery (Redis broker)
                                        `-- XACK                                       |
                                                              analysis_results, run_diagnoses, runs

Modules
- `queues`: the names everyone agrees on (Celery queues, the stream's consumer group); no imports.
- `heartbeat`: the heartbeat key of workers and dispatchers (no Celery app needed).
- `app`: the Celery app factory (`make_app(settings)`, module-level `app` for `celery -A memq.workers.app`),
  routes, time limits, the beat schedule (`beat_schedule(settings)`), the worker's heartbeat signals.
- `base`: `MemqTask`, the base task: retries with back-off on outages only; bad data is quarantined.
- `runtime`: per-process resources (settings, store, Redis client), dead letters, debounce keys.
- `jobs`: the work itself as plain functions over ids (what the tasks call); what they send next
  goes through `jobs.Senders`, callbacks the tasks pass in.
- `tasks`: thin Celery tasks: analyze_snapshot, recompute_run, whatif_sweep, reap.
- `dispatcher`: stream consumer: insert, store blob, commit, enqueue, acknowledge; reclaim; dead letters.
Imports go one way (tests/workers/test_import_graph.py): queues <- runtime <- heartbeat <- app <- base
<- tasks, and jobs <- tasks; nothing imports the tasks but the dispatcher (to send an analysis).

Running it (one Redis, one database, a blob directory all processes share):
    memq db upgrade
    memq dispatcher                       # one or more; they share the consumer group
    memq worker -c 2                      # = celery -A memq.workers.app worker -Q memq.ingest,memq.analyze,memq.report
    memq worker -Q memq.ingest -B         # exactly one process runs beat (the reaper, the nightly report)
    memq status                           # backlog, dead letters, heartbeats
The broker Redis should keep its data (AOF, `appendfsync everysec` or `always`) and never evict
(`maxmemory-policy noeviction`): the stream, the blobs waiting in it and Celery's queues live there.

Guarantees (tests/workers/test_worker_faults.py kills, restarts and stops each part): every snapshot
an agent got into the stream ends as exactly one row, analysed once per (sha256, analyzer version,
context), or quarantined with its reason (state `failed` plus a dead letter in MEMQ_DEAD_STREAM).
Delivery is at least once everywhere; idempotent writes make it exactly once in SQL.
"""
