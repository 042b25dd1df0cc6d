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
import urllib.error
import urllib.request
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


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    # a redirect would re-send the alert to a host nobody configured
    def redirect_request(self, *args, **kwargs):
        return None


def post(url: str, doc: Mapping[str, Any], key: str, timeout_s: float) -> Outcome:
    if not url.startswith(("http://", "https://")):
        return Outcome("refused", "MEMQ_ALERT_WEBHOOK_URL must be an http(s) URL")
    data = json.dumps(doc, separators=(",", ":")).encode()
    req = urllib.request.Request(url, data=data, method="POST", headers={
        "Content-Type": "application/json", "Idempotency-Key": key, "X-Memq-Alert-Key": key,
        "User-Agent": "memq-alerts"})
    opener = urllib.request.build_opener(_NoRedirect)
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            status = resp.status
            resp.read(4096)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except (OSError, http.client.HTTPException) as exc:  # URLError, timeouts, resets; a garbled answer
        reason = getattr(exc, "reason", exc)
        return Outcome("retry", f"{type(exc).__name__}: {reason}"[:500])
    return Outcome(classify(status), f"HTTP {status}", status)
