"""Live metrics for Prometheus (`memq exporter`).

- `store/metric_queries.py`: the few aggregate SQL queries a scrape runs (no per-run Python loops).
- `collector.py`: a prometheus-client custom Collector that turns those aggregates and the ingest
  path's Redis state (`memq status`'s own functions) into metric families, at scrape time.
- `exporter.py`: the HTTP server (`/metrics`, `/healthz`).
Counters are counts of SQL rows, not in-process increments: they survive exporter restarts, and
any number of exporters over one database report the same values.
"""
