"""`memq serve` over 100,000 runs in PostgreSQL, and `memq view` of the 100,000-entry snapshot in Chromium.

    python benchmarks/bench_web.py [--runs 100000] [--repeat 15] [--skip-view] [--skip-serve]

Goals (issue 14): the runs page over 100,000 runs in PostgreSQL answers in under 300 ms server time;
`memq view` of the 100,000-entry fixture renders and is interactive in under 2 s in Chromium.

1. Serve: a database of its own (`memq_bench_<pid>_<hex>`, dropped at the end; see bench_history.py),
   `memq db upgrade`, 100,000 runs generated server-side with bench_history's statements (one
   analysed snapshot and one run diagnosis each, no stat samples), then `memq serve` started as a
   real process. Each URL is fetched `repeat` times after one warm-up; the figure is the server's own
   `Server-Timing: app;dur=` (handler, queries and rendering) and the client's wall time beside it.
2. View: `memq view benchmarks/data/big.pickle.gz` (time of the command), then Chromium (Debian's,
   through playwright) opens the file and a block is clicked: the figure is from navigation start
   to the frames shown, `repeat` times in one browser (a fresh page each time).
Prints every figure and a markdown block for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_history  # noqa: E402 - the database helper and the generating statements

URLS = [
    ("runs page, newest first (HTML)", "/runs"),
    ("runs API, newest first", "/api/runs"),
    ("runs page, cluster filter", "/runs?cluster=c07"),
    ("runs page, status=oom sorted by peak reserved", "/runs?status=oom&sort=peak_reserved&order=desc"),
    ("runs page, torch 2.11 + since 30 days ago", "/runs?torch=2.11&since={since}"),
    ("runs page, page 1000 (offset 49,950)", "/runs?offset=49950"),
    ("runs page, last page (offset 99,950)", "/runs?offset=99950"),
    ("runs page, last page by its cursor (what the page's 'next' links use)", "/runs?after={cursor}&offset=99950"),
    ("runs API, 500 rows, cause filter, sorted by fragmentation",
     "/api/runs?cause=fragmentation&limit=500&sort=fragmentation"),
    ("run page of a synthetic run", "/runs/run-050000"),
]


def summary(ms: list[float]) -> str:
    q = sorted(ms)
    p95 = q[min(len(q) - 1, int(round(0.95 * (len(q) - 1))))]
    return f"median {statistics.median(ms):.1f} ms, p95 {p95:.1f} ms, max {max(ms):.1f} ms"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(env: dict):
    """A real `memq serve` process with `env` on a free port, once it answers /healthz: its base URL.
    Stopped (SIGTERM) on the way out."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "memq", "serve", "--port", str(port), "--log-level",
                             "warning"], cwd=ROOT, env=env, start_new_session=True)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                fetch(base + "/healthz")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.2)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def fetch(url: str) -> tuple[float, float, int]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
        timing = r.headers.get("server-timing", "app;dur=nan")
    wall = (time.perf_counter() - t) * 1000
    return float(timing.split("dur=")[1]), wall, len(body)


def bench_serve(args, say) -> list[str]:
    import datetime as dt

    from click.testing import CliRunner
    from sqlalchemy import text

    from memq.cli import cli
    from memq.store.db import make_engine

    rows = []
    with bench_history.bench_database() as url, tempfile.TemporaryDirectory(prefix="memq-bench-web-") as tmp:
        env = {"MEMQ_DATABASE_URL": url, "MEMQ_BLOB_DIR": f"{tmp}/blobs", "MEMQ_DATA_DIR": tmp,
               "MEMQ_CONFIG": f"{tmp}/none.toml", "MEMQ_SERVE_TOKEN": ""}
        os.environ.update(env)
        assert CliRunner().invoke(cli, ["db", "upgrade"]).exit_code == 0
        engine = make_engine(url)
        t = time.perf_counter()
        with engine.begin() as c:
            c.execute(text("SET LOCAL session_replication_role = replica"))  # synthetic load only
            for stmt in bench_history.GENERATE:
                c.execute(text(stmt), {"runs": args.runs})
        with engine.begin() as c:
            c.execute(text("ANALYZE"))
        engine.dispose()
        say(f"generated {args.runs:,} runs in {time.perf_counter() - t:.1f} s")
        with served({**os.environ, **env}) as base:
            since = (dt.datetime.now(dt.UTC) - dt.timedelta(days=30)).date().isoformat()
            # the cursor of the 99,950th run, newest first: the 51st oldest
            with urllib.request.urlopen(base + f"/api/runs?order=asc&limit={args.runs - 99_950 + 1}") as r:
                import json

                cursor = json.loads(r.read())["next_cursor"]
            for label, path in URLS:
                u = base + path.format(since=since, cursor=urllib.parse.quote(cursor))
                fetch(u)  # warm-up
                server, wall, size = [], [], 0
                for _ in range(args.repeat):
                    s, w, size = fetch(u)
                    server.append(s)
                    wall.append(w)
                say(f"{label}: server {summary(server)}; client wall median {statistics.median(wall):.1f} ms; "
                    f"{size:,} bytes")
                shown = path.format(since="<30 days ago>", cursor="<cursor>")
                rows.append(f"| {label} | `{shown}` | {statistics.median(server):.1f} | "
                            f"{max(server):.1f} | {statistics.median(wall):.1f} |")
    return rows


def bench_view(args, say) -> list[str]:
    from playwright.sync_api import sync_playwright

    big = ROOT / "benchmarks" / "data" / "big.pickle.gz"
    out = Path(tempfile.mkdtemp(prefix="memq-bench-view-")) / "big.html"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "memq", "view", str(big), "--out", str(out)], cwd=ROOT, check=True,
                   capture_output=True)
    t_cli = time.perf_counter() - t
    say(f"memq view {big.name} -> {out.stat().st_size / 1024:.0f} KiB HTML in {t_cli:.2f} s (process start included)")
    times, drawn = [], []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=os.environ.get("MEMQ_TEST_CHROMIUM", "/usr/bin/chromium"),
                              args=["--no-sandbox", "--disable-gpu"])
        for i in range(args.repeat + 1):
            page = b.new_page(viewport={"width": 1280, "height": 900})
            t = time.perf_counter()
            page.goto(out.as_uri(), wait_until="load")
            page.wait_for_selector("html[data-ready='1']")
            t_ready = time.perf_counter() - t
            page.locator("#segmap-svg rect.block.cat-parameters").first.click()
            page.wait_for_selector("#frame-list li")
            t_click = time.perf_counter() - t
            if i:  # the first opens the browser's caches
                drawn.append(t_ready * 1000)
                times.append(t_click * 1000)
            page.close()
        b.close()
    say(f"Chromium: drawn (script done) {summary(drawn)}; to a clicked block's frames {summary(times)}")
    return [f"| `memq view` of the 100,000-entry snapshot, in Chromium: navigation to drawn | "
            f"{statistics.median(drawn):.0f} ms | max {max(drawn):.0f} ms |",
            f"| ... to a clicked block's frames shown | {statistics.median(times):.0f} ms | max {max(times):.0f} ms |",
            f"| `memq view big.pickle.gz --out big.html` (CLI, process start included) | {t_cli * 1000:.0f} ms | |"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--skip-serve", action="store_true")
    ap.add_argument("--skip-view", action="store_true")
    args = ap.parse_args()
    lines: list[str] = []

    def say(msg: str) -> None:
        print(msg, flush=True)
        lines.append(msg)

    say(f"machine: {bench_history.machine()}")
    serve_rows = [] if args.skip_serve else bench_serve(args, say)
    view_rows = [] if args.skip_view else bench_view(args, say)
    print("\n--- markdown for benchmarks/RESULTS.md ---")
    if serve_rows:
        print(f"| `memq serve`, {args.runs:,} runs in PostgreSQL | URL | server median ms | server max ms | "
              "client median ms |\n|---|---|---|---|---|")
        print("\n".join(serve_rows))
    if view_rows:
        print("\n| `memq view` | median | |\n|---|---|---|")
        print("\n".join(view_rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
