"""What `memq serve` refuses before the app sees a request, all pure but the protocol class:

- `host_allowed`: the Host header against MEMQ_SERVE_HOSTS (DNS rebinding: a page on evil.example
  whose name is re-pointed at 127.0.0.1 would otherwise read the token-less loopback server).
- `site_local`: a redirect target that stays on this server, whatever a percent-decoded path holds
  (browsers drop tabs and newlines from a Location and read `\\` as `/`, so `/%09/evil.example`
  would become `//evil.example`).
- `RedactToken`: a logging filter that blanks `token=` in the access log's request lines.
- `HeaderTimeoutH11`: uvicorn's h11 protocol with a deadline on each request head: uvicorn times
  out only idle keep-alive connections, so a client that sends one header byte every few seconds
  holds its socket (and a file descriptor) for ever; 1,100 of them exhaust a 1,024-fd limit.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from urllib.parse import quote

from uvicorn.protocols.http.h11_impl import H11Protocol

TOKEN_RE = re.compile(r"(?i)([?&](?:token|access_token)=)[^&\s\"]*")
# characters a path keeps as they are in a Location (RFC 3986 pchar + "/"); the rest is percent-encoded
PATH_SAFE = "/:@!$&'()*+,;=-._~"


def host_name(header: str) -> str:
    """The name of a Host header value, lower-case, without its port: 'a:80' -> 'a', '[::1]:8' -> '[::1]'."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return h[:end + 1] if end > 0 else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def host_allowed(header: str | None, allowed: tuple[str, ...]) -> bool:
    if "*" in allowed:
        return True
    return bool(header) and host_name(header) in allowed


def site_local(path: str) -> str:
    """A Location for `path` (percent-decoded, as ASGI gives it) that names this server: '/' when the
    path holds a control character or a backslash, or starts with '//' or '/' and whitespace;
    otherwise the path, percent-encoded (so nothing in it is read as anything but a path)."""
    if any(unicodedata.category(c)[0] == "C" or c == "\\" for c in path) or not path.startswith("/"):
        return "/"
    rest = path[1:]
    # whitespace right after the first slash (a browser may drop it), or a second slash: another host
    if rest.startswith("/") or rest[:1].isspace() or (rest[:1] and unicodedata.category(rest[0])[0] == "Z"):
        return "/"
    return quote(path, safe=PATH_SAFE)


def redact(text: str) -> str:
    return TOKEN_RE.sub(r"\1[redacted]", text)


class RedactToken(logging.Filter):
    """Blanks `token=` in every string argument and message of a log record (the access log gets the
    request line with its query string)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        return True


def log_config(level: str) -> dict:
    """uvicorn's logging config with RedactToken on both of its loggers' handlers."""
    import copy

    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg.setdefault("filters", {})["redact_token"] = {"()": "memq.web.guard.RedactToken"}
    for h in cfg["handlers"].values():
        h.setdefault("filters", []).append("redact_token")
    cfg["loggers"]["uvicorn"]["level"] = level.upper()
    return cfg


@functools.cache
def header_timeout() -> float:
    from memq.config import load_settings

    return float(load_settings().serve_header_timeout_s)


class HeaderTimeoutH11(H11Protocol):
    """Each request head (the first, and each one after a response on a kept-alive connection) must
    arrive whole within MEMQ_SERVE_HEADER_TIMEOUT_S seconds, else the connection is closed. uvicorn
    builds the protocol itself (in each --workers process, from the class's import path), so the
    timeout is read from the settings once per process."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        self._head_timer = None
        self.header_timeout = header_timeout()
        super().connection_made(transport)
        self._arm()

    def _arm(self) -> None:
        self._disarm()
        self._waiting_for = self.cycle  # a new cycle object = a new request head was parsed
        self._head_timer = self.loop.call_later(self.header_timeout, self._head_expired)

    def _disarm(self) -> None:
        if getattr(self, "_head_timer", None) is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self._head_timer is not None and self.cycle is not self._waiting_for:
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm()

    def _head_expired(self) -> None:
        self._head_timer = None
        # a head parsed and its request still being answered (pipelined) is not a slow head
        idle = self.cycle is None or self.cycle.response_complete
        if idle and not self.transport.is_closing():
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
