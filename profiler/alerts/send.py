"""One webhook POST, classified. The only network code of the alerts.

`post(url, doc, key, timeout_s)` -> Outcome("sent" | "retry" | "refused", detail):
- 2xx: sent;
- 408, 409 (a receiver still working on the same Idempotency-Key), 425, 429 and 5xx, timeouts and
  connection errors: retry (the outbox backs off);
- other 4xx: refused (the receiver will not take it however often it is sent: a wrong URL or a
  revoked token), recorded as failed at once.
Headers: `Idempotency-Key: <key>` (the same for every resend of one alert) and `X-Memq-Alert-Key`
(the same value, for receivers that only pass X- headers through).
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RETRY_STATUSES = frozenset({408, 409, 425, 429})


@dataclass(frozen=True)
class Outcome:
    result: str  # sent | retry | refused
    detail: str
    status: int | None = None


def classify(status: int) -> str:
    if 200 <= status < 300:
        return "sent"
    if status >= 500 or status in RETRY_STATUSES:
        return "retry"
    return "refused"


def _cut(conn: http.client.HTTPConnection) -> None:
    """The deadline: shut the socket down, which wakes a read blocked on a receiver that trickles."""
    sock = conn.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def post(url: str, doc: Mapping[str, Any], key: str, timeout_s: float) -> Outcome:
    """POST within `timeout_s` for the whole request, not per read: a receiver that answers a byte a
    second cannot hold the sender (and its outbox lease) past it. No proxy from the environment, no
    redirects (an alert goes where it was configured to, or nowhere).

    Past the deadline with the whole alert already sent, the outcome is "sent" (unconfirmed): a resend
    would reach a receiver that may not honour Idempotency-Key (Slack does not) a second time; the
    detail says the answer never came."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        return Outcome("refused", "MEMQ_ALERT_WEBHOOK_URL must be an http(s) URL with a host")
    data = json.dumps(doc, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, "X-Memq-Alert-Key": key,
               "User-Agent": "memq-alerts", "Content-Length": str(len(data))}
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    try:
        port = u.port
    except ValueError:
        return Outcome("refused", "MEMQ_ALERT_WEBHOOK_URL has an invalid port")
    if u.scheme == "https":
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            u.hostname, port, timeout=timeout_s, context=ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(u.hostname, port, timeout=timeout_s)
    started = time.monotonic()
    timer = threading.Timer(timeout_s, _cut, (conn,))
    timer.daemon = True
    sent = False
    status: int | None = None
    timer.start()
    try:
        conn.request("POST", path, body=data, headers=headers)
        sent = True
        resp = conn.getresponse()
        status = resp.status
        resp.read(4096)
    except (OSError, http.client.HTTPException) as exc:  # timeouts, resets, the deadline; a garbled answer
        if status is not None:  # the answer's status came; only its body was cut off
            return Outcome(classify(status), f"HTTP {status} (body cut off)", status)
        late = time.monotonic() - started >= timeout_s
        if sent and late:
            return Outcome("sent", f"sent whole; no answer within {timeout_s:g} s (not resent: the receiver "
                                   "may not deduplicate)")
        reason = getattr(exc, "reason", exc)
        return Outcome("retry", f"{type(exc).__name__}: {reason}"[:500])
    finally:
        timer.cancel()
        conn.close()
    return Outcome(classify(status), f"HTTP {status}", status)
