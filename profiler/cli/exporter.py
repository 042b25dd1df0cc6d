"""`memq exporter [--host 127.0.0.1] [--port 9464] [--once]`: Prometheus metrics of the history and
the ingest path (profiler/metrics/collector.py lists them), until SIGTERM. `--once` prints one
scrape to stdout and exits (a check from a shell, no server)."""

from __future__ import annotations

import logging
import sys

import click
from prometheus_client import generate_latest

from memq.config import load_settings
from memq.metrics.exporter import registry_for, serve


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind (0.0.0.0 in a container; the metrics carry run and job names).")
@click.option("--port", type=click.IntRange(0, 65535), default=9464, show_default=True)
@click.option("--once", is_flag=True, help="Print one scrape in the text format and exit.")
@click.option("-l", "--loglevel", default="INFO", show_default=True)
def exporter(host, port, once, loglevel):
    """Serve Prometheus metrics: snapshots, OOMs, verdicts, headroom, stream lag, workers."""
    logging.basicConfig(level=loglevel.upper(), stream=sys.stderr,
                        format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    st = load_settings()
    if once:
        sys.stdout.write(generate_latest(registry_for(st)).decode())
        return
    serve(st, host, port)
