"""memq workers: the path from the agents' Redis stream to the run history in SQL.

    agent --XADD--> memq:ingest --(dispatcher: consumer group)--> snapshots row, blob store
                                        |-- enqueue analyze_snapshot(snapshot_id) --> Celery (Redis broker)
                                        `-- XACK                                       |
                                                              analysis_results, run_diagnoses, runs

Modules
- `app`: the Celery app factory (`make_app(settings)`, module-level `app` for `celery -A workers.app`),
  queues, routes, time limits, the beat schedule (`beat_schedule(settings)`), worker heartbeats.
- `base`: `MemqTask`, the base task: retries with back-off on outages only; bad data is quarantined.
- `runtime`: per-process resources (store, Redis client), dead letters, debounce keys, heartbeats.
- `jobs`: the work itself as plain functions over ids (what the tasks call).
- `tasks`: thin Celery tasks: analyze_snapshot, recompute_run, reap.
- `dispatcher`: stream consumer: insert, store blob, commit, enqueue, acknowledge; reclaim; dead letters.
"""
