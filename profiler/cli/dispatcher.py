"""`memq dispatcher`: the stream consumer (workers/dispatcher.py) until SIGTERM or SIGINT: it moves the
agents' stream into the history and enqueues analyses."""

from __future__ import annotations

import logging
import sys

import click

from memq.config import load_settings
from memq.workers.dispatcher import Dispatcher


@click.command()
@click.option("--consumer", help="Consumer name in the group (default: host-pid).")
@click.option("--batch", type=click.IntRange(1, 10_000), default=100, show_default=True,
              help="Stream entries read at once.")
@click.option("--block-ms", type=click.IntRange(10, 60_000), default=1000, show_default=True)
@click.option("-l", "--loglevel", default="INFO", show_default=True)
def dispatcher(consumer, batch, block_ms, loglevel):
    """Move the agents' stream into the history and enqueue analyses, until SIGTERM."""
    logging.basicConfig(level=loglevel.upper(), stream=sys.stderr,
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    st = load_settings()
    Dispatcher(st, consumer=consumer, batch=batch, block_ms=block_ms).run()
