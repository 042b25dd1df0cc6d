"""The worker tests' fixtures (shared Redis, private servers) for the live-metrics tests too."""

from tests.workers.conftest import private_pg, private_redis, shared_redis  # noqa: F401
