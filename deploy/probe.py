#!/usr/bin/env python3
"""Liveness probe of a memq dispatcher or worker container: `memq-probe dispatcher|worker`.

Exit 1 only when Redis answers and no heartbeat key `<prefix>heartbeat:<kind>:*` written from this
host (pod) is there: the process is stuck or gone. Exit 0 when it is there, and also when Redis
cannot be reached (a dependency outage must not restart every pod; `memq doctor` reports it).
"""

from __future__ import annotations

import json
import socket
import sys


def main(argv: list[str]) -> int:
    kind = argv[0] if argv else "worker"
    try:
        import redis

        from memq.config import load_settings

        st = load_settings()
        r = redis.Redis.from_url(st.redis_url, socket_timeout=3, socket_connect_timeout=3)
        me = socket.gethostname()
        for key in r.scan_iter(match=f"{st.key_prefix}heartbeat:{kind}:*", count=1000):
            try:
                if json.loads(r.get(key) or b"{}").get("host") == me:
                    return 0
            except ValueError:
                continue
    except Exception as exc:  # noqa: BLE001 - Redis down or refused: not this container's fault
        print(f"memq-probe: cannot check ({type(exc).__name__}); assuming alive", file=sys.stderr)
        return 0
    print(f"memq-probe: no {kind} heartbeat from {socket.gethostname()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
