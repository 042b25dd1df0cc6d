"""The server's threads for blocking work (database queries, decoding a stored snapshot, analysis),
all started before the first request and kept for the server's life.

Decoding a snapshot caps the whole process's address space while it runs (memq.codec: a hostile
pickle must end in an input error, not an OOM). Starlette's own pool (anyio) starts a thread when a
request finds none idle and lets idle ones go after ten seconds, so a request that arrived while
another was decoding could need a new thread stack inside that cap, and was answered 500 ("can't
start new thread"). Threads made up front, and never let go, need no address space later.
Static files are held in memory (`StaticAssets`), so serving them needs no thread at all."""

from __future__ import annotations

import asyncio
import hashlib
import mimetypes
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from starlette.responses import Response


class BlockingPool:
    """`threads` threads, every one started by `start()` (or by the first `run`)."""

    def __init__(self, threads: int):
        self.threads = threads
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        self.idents: frozenset[int] = frozenset()  # the threads' idents, once started

    def start(self) -> None:
        with self._lock:
            if self._pool is not None:
                return
            pool = ThreadPoolExecutor(self.threads, thread_name_prefix="memq-serve")
            # The executor starts a thread only when none is idle: tasks that wait for one another make it
            # start all of them now.
            everyone = threading.Barrier(self.threads)

            def arrive() -> int:
                everyone.wait()
                return threading.get_ident()

            self.idents = frozenset(f.result() for f in [pool.submit(arrive) for _ in range(self.threads)])
            self._pool = pool

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        if self._pool is None:
            self.start()
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


class StaticAssets:
    """The packaged static files (a script and a style sheet, a few tens of KB), read once and served
    from memory with an ETag, so a browser's revalidation is a 304."""

    def __init__(self, folder: Path):
        self.files: dict[str, tuple[bytes, str, str]] = {}
        for path in sorted(folder.iterdir()):
            if path.is_file():
                body = path.read_bytes()
                kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
                if kind.startswith("text/") or kind.endswith("javascript"):
                    kind += "; charset=utf-8"
                self.files[path.name] = (body, kind, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')

    def response(self, name: str, if_none_match: str | None, head: bool) -> Response | None:
        """The file's response, or None when there is no such file."""
        found = self.files.get(name)
        if found is None:
            return None
        body, kind, etag = found
        headers = {"etag": etag, "cache-control": "no-cache"}
        if if_none_match and etag in [t.strip() for t in if_none_match.split(",")]:
            return Response(status_code=304, headers=headers)
        response = Response(b"" if head else body, media_type=kind, headers=headers)
        if head:
            response.headers["content-length"] = str(len(body))
        return response
