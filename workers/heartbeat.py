"""Heartbeats of the long-running processes (workers, dispatchers), read by `memq status` and `memq doctor`.

Here rather than in `memq.workers.app`: a dispatcher beats too, and must not build a Celery app for it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time

from memq.config import Settings
from memq.workers import runtime

log = logging.getLogger("memq.workers")


def heartbeat_key(st: Settings, kind: str, name: str) -> str:
    return f"{st.key_prefix}heartbeat:{kind}:{name}"


class Heartbeat:
    """A key `<prefix>heartbeat:<kind>:<name>` refreshed every heartbeat_s with a TTL of three
    periods, holding what `memq status` shows. Redis errors are ignored (it is only a heartbeat)."""

    def __init__(self, st: Settings, kind: str, name: str, info: dict | None = None):
        self.st, self.key = st, heartbeat_key(st, kind, name)
        self.info = {"kind": kind, "name": name, "host": socket.gethostname(), "pid": os.getpid(),
                     "started": time.time(), **(info or {})}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = None

    def beat(self, **extra) -> None:
        try:
            if self._client is None:
                self._client = runtime.redis_client(self.st.redis_url)
            self.info.update(extra, last=time.time())
            self._client.set(self.key, json.dumps(self.info, default=str), ex=max(3, 3 * self.st.heartbeat_s))
        except Exception as exc:  # noqa: BLE001 - a missed heartbeat is what status reports
            log.debug("heartbeat failed: %s", exc)
            self._client = None

    def start(self) -> Heartbeat:
        def loop():
            while not self._stop.is_set():
                self.beat()
                self._stop.wait(self.st.heartbeat_s)

        self._thread = threading.Thread(target=loop, name="memq-heartbeat", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            if self._client is not None:
                self._client.delete(self.key)
        except Exception:  # noqa: BLE001
            pass
