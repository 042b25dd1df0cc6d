"""Use cases: what the adapters (cli, workers, web, metrics) ask for, built from the store, the analysis
and Redis. They point down only: nothing here imports an adapter."""
