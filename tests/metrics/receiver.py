"""A local webhook receiver for the alert tests: a real HTTP server on a free port that records every
POST (its Idempotency-Key and JSON body) and answers as the test tells it. `distinct()` counts the
deliveries a receiver that dedupes on the key would act on."""

from __future__ import annotations

import json
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    def __init__(self, statuses: list[int] | None = None):
        self.requests: list[dict] = []
        self.statuses = list(statuses or [])  # answered in order; 200 once used up
        self.hold = False  # hold_next(): the next POST gets no answer until release (or never)
        self.held = threading.Event()
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.delay_s = 0.0
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                n = int(self.headers.get("Content-Length") or 0)
                doc = json.loads(self.rfile.read(n) or b"{}")
                with rec.lock:
                    rec.requests.append({"key": self.headers.get("Idempotency-Key"), "path": self.path,
                                         "body": doc, "content_type": self.headers.get("Content-Type")})
                    hold, rec.hold = rec.hold, False
                    status = rec.statuses.pop(0) if rec.statuses else 200
                if hold:
                    rec.held.set()
                    rec.release.wait(120)  # the sender is killed meanwhile: nobody reads the answer
                if rec.delay_s:
                    threading.Event().wait(rec.delay_s)
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except OSError:
                    pass

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def hold_next(self) -> None:
        with self.lock:
            self.hold = True
            self.held.clear()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def keys(self) -> Counter:
        with self.lock:
            return Counter(r["key"] for r in self.requests)

    def distinct(self) -> dict[str, dict]:
        """key -> the first body received under it (what a deduping receiver keeps)."""
        out: dict[str, dict] = {}
        with self.lock:
            for r in self.requests:
                out.setdefault(r["key"], r["body"])
        return out
