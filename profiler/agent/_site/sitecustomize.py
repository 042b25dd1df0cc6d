"""Put on PYTHONPATH by `memq run`: starts the memq agent in every Python process of the job that
uses CUDA (see profiler/agent/bootstrap.py), then runs any other `sitecustomize` further down the path."""

try:
    from profiler.agent.bootstrap import autostart as _memq_autostart

    _memq_autostart()
except Exception:  # noqa: BLE001 - the job must run even if the agent cannot
    pass

try:
    from profiler.agent.bootstrap import chain_sitecustomize as _memq_chain

    _memq_chain(__file__)
except Exception:  # noqa: BLE001
    pass
