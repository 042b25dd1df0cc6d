"""`memq serve`: the read-only web app over the run history (profiler/web), on uvicorn."""

from __future__ import annotations

import logging

import click
import uvicorn

from memq.config import load_settings
from memq.errors import ConfigError
from memq.web.app import create_app
from memq.web.protocol import HeaderDeadlineProtocol, RedactToken


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Anything but localhost needs MEMQ_SERVE_TOKEN or an authenticating proxy.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--workers", type=click.IntRange(1, 64), default=1, show_default=True,
              help="Server processes (each with its own database pool).")
@click.option("--root-path", default="", help="URL prefix when served behind a reverse proxy under a path.")
@click.option("--log-level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info",
              show_default=True)
def serve(host, port, workers, root_path, log_level):
    """Runs, snapshots, comparisons and reports in a browser, with the JSON API behind every page."""
    settings = load_settings()
    local = host in ("127.0.0.1", "::1", "localhost")
    if not local and not settings.serve_token:
        click.echo(f"memq serve: warning: binding {host} without MEMQ_SERVE_TOKEN: anyone who can reach "
                   "this port reads the history (put an authenticating proxy in front, or set a token)", err=True)
    if workers > 1 and settings.is_embedded_db:
        raise ConfigError("several --workers need a server database (MEMQ_DATABASE_URL=postgresql://...)")
    HeaderDeadlineProtocol.header_timeout_s = float(settings.serve_header_timeout_s)
    logging.getLogger("uvicorn.access").addFilter(RedactToken())
    common = dict(host=host, port=port, root_path=root_path, log_level=log_level, server_header=False,
                  proxy_headers=True, timeout_graceful_shutdown=10,
                  http=HeaderDeadlineProtocol,
                  limit_concurrency=settings.serve_max_connections)
    if workers > 1:
        uvicorn.run("memq.web.app:app_from_env", factory=True, workers=workers, **common)
    else:
        uvicorn.run(create_app(settings), **common)
