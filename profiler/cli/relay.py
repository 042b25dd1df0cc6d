"""`memq relay load|version`: the Redis function library that relays the agents' inbox into the ingest
stream (profiler/redis_functions.py). The dispatcher loads it by itself; an operator loads it ahead,
with the memq (services) user, where agents write through the inbox before any dispatcher ran."""

from __future__ import annotations

import click

from memq import redis_functions as rf
from memq.config import load_settings, redact_url
from memq.errors import BrokerUnavailable
from memq.redis_client import make_client


@click.command()
@click.argument("action", type=click.Choice(["load", "version"]))
@click.option("--redis-url", envvar="MEMQ_REDIS_URL", help="The memq services user's URL (default MEMQ_REDIS_URL).")
def relay(action, redis_url):
    """Load the relay library into Redis (FUNCTION LOAD REPLACE when missing or older), or show its version."""
    url = redis_url or load_settings().redis_url
    client = make_client(url, 10.0)
    try:
        if action == "load":
            click.echo(f"{rf.LIBRARY} library version {rf.VERSION}: {rf.ensure_library(client)} at {redact_url(url)}")
        else:
            click.echo(f"loaded: {rf.loaded_version(client)}; shipped: {rf.VERSION}")
    except Exception as exc:  # noqa: BLE001 - redis-py errors: one line, password hidden
        raise BrokerUnavailable(f"cannot reach Redis {redact_url(url)}: {type(exc).__name__}: {exc}",
                                hint="check MEMQ_REDIS_URL and the memq user's password") from exc
    finally:
        client.close()
