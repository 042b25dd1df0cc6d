"""The exporter's HTTP server: `/metrics` (Prometheus text format, or OpenMetrics when asked) and
`/healthz` (200 while the process serves; for liveness probes, without running the queries).

`serve(st, host, port)` blocks until SIGTERM or SIGINT; `start(st, host, port)` returns the running
server (tests and the benchmark scrape it over HTTP). Scrapes are served on threads; each runs the
collector's queries on its own pooled connection.
"""

from __future__ import annotations

import logging
import signal
import threading
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from memq.config import Settings
from memq.metrics.collector import MemqCollector

log = logging.getLogger("memq.exporter")


def registry_for(st: Settings, store=None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=True)
    reg.register(MemqCollector(st, store))
    return reg


def wsgi_app(registry: CollectorRegistry):
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        if environ.get("PATH_INFO") == "/healthz":
            start_response("200 OK", [("Content-Type", "text/plain")])
            return [b"ok\n"]
        if environ.get("PATH_INFO") in ("/", "/metrics"):
            return metrics(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: /metrics or /healthz\n"]

    return app


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args):  # one line per scrape would drown the real log
        pass


def start(st: Settings, host: str, port: int, store=None):
    """The server, already serving on a daemon thread. `server.server_port` is the bound port."""
    server = make_server(host, port, wsgi_app(registry_for(st, store)), ThreadingWSGIServer, handler_class=_Quiet)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="memq-exporter", daemon=True).start()
    return server


def serve(st: Settings, host: str, port: int) -> None:
    server = start(st, host, port)
    log.info("memq exporter on http://%s:%d/metrics", host, server.server_port)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.shutdown()
    server.server_close()
