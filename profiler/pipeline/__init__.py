"""Use cases: what the adapters (cli, workers, web, metrics) ask for, built from the store, the analysis
and Redis. They point down only: nothing here imports an adapter.

- `runs`: a run's status as each use case moves it (the one rule: analysis/run_status.py);
- `record`: what an agent's envelope records (run_start, run_end, stats, snapshot rows), for the dispatcher;
- `analyse`: a stored snapshot's analysis (the worker's `analyse_claimed`, ingest's and reanalyze's
  `analyse_snapshot`), the run diagnosis (`recompute_run`, the worker's `diagnose_rank`), the forecast's
  refresh, `memq reanalyze`;
- `ingest`: `memq ingest` of files and stats;
- `offline`: `memq analyze` and `memq view` on files, and the replay the advice cites on every path;
- `history`: the run history's documents (runs, history, compare, versions); `report_source`: what the
  nightly report reads;
- `sweeps`, `fit`, `dead_blobs`, `status`: the what-if sweeps, `memq fit --run`, the dead-blob cleanup,
  `memq status`.
"""
