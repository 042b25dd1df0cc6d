"""Run by test_serve_hardening: the real app on a real uvicorn server in this process, asked for six
pages at once while a decode's address-space cap holds the process (as memq.codec sets it), with
ROOM bytes of address space left. Prints the six status codes as JSON (or the error each request met).

    python -m tests.web.cap_probe ROOM       (the history from MEMQ_DATABASE_URL and the other MEMQ_* variables)
"""

from __future__ import annotations

import json
import resource
import socket
import sys
import threading
import time
import urllib.error
import urllib.request

import uvicorn

from memq.codec import decode_turn
from memq.config import load_settings
from memq.web.app import create_app

PATHS = ["/api/runs", "/runs", "/static/memq.js", "/static/memq.css", "/healthz", "/playbook"]


def get(url: str) -> int | str:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception as e:  # noqa: BLE001 - reported, not raised: the test reads every answer
        return repr(e)


def main(room: int) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(load_settings()), port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    while get(base + "/healthz") != 200:
        time.sleep(0.1)
    for p in PATHS:  # each page once, one at a time, before the cap
        assert get(base + p) == 200, p
    go = threading.Event()
    codes: list = [None] * len(PATHS)

    def client(i: int) -> None:
        go.wait()
        codes[i] = get(base + PATHS[i])

    clients = [threading.Thread(target=client, args=(i,)) for i in range(len(PATHS))]
    for c in clients:  # made before the cap: only the server's own threads are under test
        c.start()
    time.sleep(0.5)
    with open("/proc/self/statm") as fh:
        used = int(fh.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with decode_turn():
        resource.setrlimit(resource.RLIMIT_AS, (used + room, hard))
        try:
            go.set()
            for c in clients:
                c.join()
        finally:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
    print(json.dumps(codes))


if __name__ == "__main__":
    main(int(sys.argv[1]))
