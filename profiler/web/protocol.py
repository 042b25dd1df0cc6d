"""The HTTP protocol `memq serve` runs on: uvicorn's h11 protocol with a deadline for the request head.

uvicorn closes idle keep-alive connections, but a connection that sends nothing, or trickles its
headers a byte at a time, is held forever: a thousand of them take every file descriptor a service
gets and lock every other client out. Here each connection has MEMQ_SERVE_HEADER_TIMEOUT_S to deliver
a whole request head, from when it opens and again from when it starts the next request on a kept-alive
connection; the body and the response are not timed (they are the app's, and bounded elsewhere).
At MEMQ_SERVE_MAX_CONNECTIONS a new connection closes the one idle longest (no request in progress), so
idle connections cannot hold the limit against clients that send requests."""

from __future__ import annotations

import asyncio
import logging
import re

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from memq.config import load_settings

log = logging.getLogger("memq.serve")


class HeaderDeadlineProtocol(H11Protocol):
    """A module-level class (server processes started by --workers import it by name)."""

    #: MEMQ_SERVE_HEADER_TIMEOUT_S, read once per process
    header_timeout_s: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if type(self).header_timeout_s is None:
            type(self).header_timeout_s = float(load_settings().serve_header_timeout_s)
        self._head_deadline: asyncio.TimerHandle | None = None
        self._arm()
        self._make_room()

    def _make_room(self) -> None:
        """At MEMQ_SERVE_MAX_CONNECTIONS, close the connections that have waited longest without a request
        in progress (a head not yet complete, or kept alive between requests), so that this one is served.
        uvicorn answers 503 to any request while the limit is reached: without this, as many idle
        connections as the limit (re-opened whenever the head deadline closes them) locked every client
        out. A connection in the middle of a request is never closed; a browser's idle keep-alive
        connection that is closed simply reconnects."""
        limit = self.limit_concurrency
        if not limit:
            return
        open_ = [c for c in self.connections if not c.transport.is_closing()]
        excess = len(open_) - (limit - 1)
        if excess <= 0:
            return
        idle = sorted((c for c in open_ if c is not self and getattr(c, "_idle_since", None) is not None),
                      key=lambda c: c._idle_since)
        for c in idle[:excess]:
            log.debug("closing %s: idle at the connection limit (%s)", c.client, limit)
            c.transport.close()

    def _arm(self) -> None:
        self._idle_since = self.loop.time() if getattr(self, "_idle_since", None) is None else self._idle_since
        if getattr(self, "_head_deadline", None) is None:
            self._head_deadline = self.loop.call_later(float(self.header_timeout_s or 10), self._head_late)

    def _disarm(self) -> None:
        self._idle_since = None
        if getattr(self, "_head_deadline", None) is not None:
            self._head_deadline.cancel()
            self._head_deadline = None

    def _head_late(self) -> None:
        self._head_deadline = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            log.debug("closing %s: no complete request head in %s s", self.client, self.header_timeout_s)
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self._arm()  # still waiting for a whole head: the deadline set when it began stands
        else:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()  # the next request's head must come in time too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class RedactToken(logging.Filter):
    """The access log never records a `?token=` value (a browser's first visit carries it)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str) and "token=" in record.msg:
            record.msg = redact(record.msg)
        return True


def redact(text: str) -> str:
    return re.sub(r"(?i)([?&]token=)[^&\s\"]*", r"\1[redacted]", text)
