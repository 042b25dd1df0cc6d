"""Big snapshots: `memq analyze` with default settings against plain `pickle.loads` of the same file,
side by side in one run (each a fresh process; CPU seconds and peak RSS from wait4, wall time).

Inputs (all real H200 trace entries with their Python frames):
- the real 100,000-entry snapshot (benchmarks/data/big.pickle.gz);
- a real 1,000,000-entry capture (benchmarks/data/h200_1m_trace.pickle.gz, `max_entries=1_000_000`);
- 1,000,000 entries tiled from the 100k one: ten copies of its trace, each with its own objects (as a
  real file has), times shifted so they follow each other; written to a temporary file.

Goals (issue "Snapshots of any size"): on each file memq takes at most 1.0x the time and 1.0x the
peak RSS of the plain load (the interpreter's start-up counts on both sides), the 1M-entry files in
at most 10 s, and memq's cost per event is flat from 100k to 1M entries.

    python benchmarks/bench_big.py [--rounds 3] [--json out.json]
    python benchmarks/bench_big.py --view [--memory-viz-js MemoryViz.js] [--json out.json]
    python benchmarks/bench_big.py --serve [--json out.json]

`--view` times the page of `memq view` in headless Chromium (Debian's /usr/bin/chromium): open (until
the overview is drawn), the per-event detail unpacked, and a zoom into a 1% window drawn and painted.
Beside it, the same file in PyTorch's own viewer: `torch.cuda._memory_viz.trace_plot`'s HTML, whose
script and d3 are fetched from CDNs when opened; given `--memory-viz-js` (a copy of
torch/utils/viz/MemoryViz.js from the PyTorch repository) those requests are answered from that copy
and from Debian's node-d3 5.16 (`apt-get install node-d3`), so it opens offline as it would online.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import codec  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
import trace_shapes  # noqa: E402

DATA = ROOT / "benchmarks" / "data"
REAL_100K = DATA / "big.pickle.gz"
REAL_1M = DATA / "h200_1m_trace.pickle.gz"
PLAIN = "import gzip, pickle, sys; pickle.loads(gzip.decompress(open(sys.argv[1], 'rb').read()))"


def tiled(raw: bytes, copies: int) -> bytes:
    """A snapshot whose trace is `copies` copies of the real trace, one after the other."""
    base = codec.loads_restricted(raw)
    trace = base["device_traces"][0]
    t0, t1 = trace[0].get("time_us", 0), trace[-1].get("time_us", 0)
    out = list(trace)
    for k in range(1, copies):
        part = codec.loads_restricted(raw)["device_traces"][0]
        for e in part:
            if "time_us" in e:
                e["time_us"] += k * (t1 - t0 + 1000)
        out.extend(part)
    base["device_traces"][0] = out
    return pickle.dumps(base, protocol=4)  # torch's _dump_snapshot: pickle.dump, protocol 4


def measure(cmd: list[str], env: dict) -> dict:
    t = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    err = p.stderr.read().decode(errors="replace")
    p.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed: {err[-400:]}")
    return {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024}


def _row(label: str, path: Path, events: int, rounds: int, env: dict) -> dict:
    raw_size = codec.inflated_digest(path.read_bytes(), 2**40)[1]  # streamed: this process stays small
    runs: dict[str, list[dict]] = {"plain": [], "memq": []}
    for _ in range(rounds):
        runs["plain"].append(measure([sys.executable, "-c", PLAIN, str(path)], env))
        runs["memq"].append(measure([sys.executable, "-m", "memq", "analyze", str(path), "--json"], env))
    med = {k: {m: statistics.median(r[m] for r in v) for m in ("wall_s", "cpu_s", "rss_mib")}
           for k, v in runs.items()}
    row = {"file": label, "events": events, "pickle_bytes": raw_size, **med,
           "time_ratio": med["memq"]["cpu_s"] / med["plain"]["cpu_s"],
           "wall_ratio": med["memq"]["wall_s"] / med["plain"]["wall_s"],
           "rss_ratio": med["memq"]["rss_mib"] / med["plain"]["rss_mib"],
           "us_per_event": 1e6 * med["memq"]["cpu_s"] / events}
    ok = row["time_ratio"] <= 1.0 and row["rss_ratio"] <= 1.0 and (events < 1e6 or med["memq"]["wall_s"] <= 10)
    print(f"{label:>24} ({raw_size / 1e6:.0f} MB pickle): plain {med['plain']['cpu_s']:.2f} s cpu "
          f"{med['plain']['wall_s']:.2f} s wall {med['plain']['rss_mib']:.0f} MiB | memq "
          f"{med['memq']['cpu_s']:.2f} s cpu {med['memq']['wall_s']:.2f} s wall "
          f"{med['memq']['rss_mib']:.0f} MiB"
          f" | time {row['time_ratio']:.2f}x rss {row['rss_ratio']:.2f}x, {row['us_per_event']:.2f} us/event "
          f"{'OK' if ok else 'MISSED'}", flush=True)
    return row


def _build_shape(shape: str, events: int, path: Path) -> None:
    # in a child: ru_maxrss survives exec, so the children measured later must not fork from a
    # process that once held the whole trace
    subprocess.run([sys.executable, __file__, "--make-shape", shape, str(events), str(path)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--make-tiled", help=argparse.SUPPRESS)
    ap.add_argument("--make-shape", nargs=3, help=argparse.SUPPRESS)
    ap.add_argument("--shapes", default=",".join(trace_shapes.SHAPES),
                    help="trace shapes to build and measure at 100k and 1M entries (benchmarks/trace_shapes.py)")
    ap.add_argument("--sizes", default="100000,1000000", help="entries per shape")
    ap.add_argument("--stream", type=int, default=0, metavar="EVENTS",
                    help="also analyse one trace of EVENTS entries (10000000) with memq alone, under the "
                         "decode budget it needs, and report its cost per event")
    ap.add_argument("--stream-shape", default="python", choices=trace_shapes.SHAPES)
    ap.add_argument("--no-real", action="store_true", help="skip the stored real files")
    ap.add_argument("--view", action="store_true", help="time the memq view page and memory_viz instead")
    ap.add_argument("--memory-viz-js", help="a copy of torch/utils/viz/MemoryViz.js")
    ap.add_argument("--d3", default="/usr/share/nodejs/d3/dist/d3.min.js", help="d3 v5 UMD build")
    ap.add_argument("--serve", action="store_true",
                    help="time the snapshot page of `memq serve` for the stored 1M capture instead")
    args = ap.parse_args()
    if args.serve:
        serve_benchmark(args)
        return
    if args.view:
        view_benchmark(args)
        return
    if args.make_tiled:
        Path(args.make_tiled).write_bytes(gzip.compress(tiled(codec.decompress(REAL_100K.read_bytes()), 10), 6))
        return
    if args.make_shape:
        shape, n, out = args.make_shape
        Path(out).write_bytes(gzip.compress(trace_shapes.build(shape, int(n)), 1))
        return
    # default settings; byte code written once, as an installed package has it
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_") and k != "PYTHONDONTWRITEBYTECODE"}
    sizes = [int(x) for x in args.sizes.split(",") if x]
    shapes = [x for x in args.shapes.split(",") if x]
    with tempfile.TemporaryDirectory() as tmp:
        env["MEMQ_DATA_DIR"] = tmp  # nothing of the user's
        subprocess.run([sys.executable, "-m", "memq", "analyze", str(REAL_100K), "--json"], env=env,
                       stdout=subprocess.DEVNULL, check=True)  # warm-up: byte code compiled
        print(f"machine: {platform.machine()} {os.cpu_count()} cores, CPython {platform.python_version()}, "
              f"load average {os.getloadavg()[0]:.1f}; {args.rounds} interleaved rounds, medians; "
              "memq = `memq analyze FILE --json`, plain = python -c 'pickle.loads(gzip.decompress(...))'",
              flush=True)
        out = []
        if not args.no_real:
            tiled_path = Path(tmp) / "tiled_1m.pickle.gz"
            subprocess.run([sys.executable, __file__, "--make-tiled", str(tiled_path)], check=True)
            for label, path, events in (("real 100k", REAL_100K, 100_000), ("real 1M capture", REAL_1M, 1_000_000),
                                        ("1M tiled from the 100k", tiled_path, 1_000_000)):
                out.append(_row(label, path, events, args.rounds, env))
            tiled_path.unlink()
        for shape in shapes:
            rows = []
            for n in sizes:
                path = Path(tmp) / f"{shape}_{n}.pickle.gz"
                _build_shape(shape, n, path)
                rows.append(_row(f"{shape} {n // 1000}k", path, n, args.rounds, env) | {"shape": shape})
                path.unlink()
            growth = rows[-1]["us_per_event"] / rows[0]["us_per_event"]
            print(f"{'':>24} {shape}: cost per event {sizes[-1] // 1000}k / {sizes[0] // 1000}k = {growth:.2f} "
                  "(flat = 1.00)", flush=True)
            out.extend(rows)
        stream = stream_benchmark(args.stream, args.stream_shape, Path(tmp), env) if args.stream else None
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.platform(), "rows": out, "stream": stream},
                                              indent=1))


def stream_benchmark(events: int, shape: str, tmp: Path, env: dict) -> dict:
    """One `shape` trace of `events` entries through `memq analyze` alone (a plain load of it would need
    more memory than this machine lends a benchmark twice), with the decode budget such a file needs
    (DECODE_BYTES_PER_RAW_BYTE x its pickle): its cost per event beside the 1M figures above, and its
    peak RSS beside that budget."""
    path = tmp / f"{shape}_{events}.pickle.gz"
    _build_shape(shape, events, path)
    raw = codec.inflated_digest(path.read_bytes(), 2**40)[1]
    budget = codec.DECODE_BYTES_PER_RAW_BYTE * raw + 2**30
    r = measure([sys.executable, "-m", "memq", "analyze", str(path), "--json"],
                env | {"MEMQ_DECODE_BUDGET_BYTES": str(budget)})
    path.unlink()
    row = {"shape": shape, "events": events, "pickle_bytes": raw, "budget_bytes": budget, **r,
           "us_per_event": 1e6 * r["cpu_s"] / events}
    print(f"{shape + ' ' + str(events // 1_000_000) + 'M':>24} ({raw / 1e6:.0f} MB pickle, memq alone, decode budget "
          f"{budget / 2**30:.1f} GiB): {r['cpu_s']:.1f} s cpu {r['wall_s']:.1f} s wall {r['rss_mib']:.0f} MiB, "
          f"{row['us_per_event']:.2f} us/event", flush=True)
    return row


PAINTED = "new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
CDN_VIZ = "https://cdn.jsdelivr.net/gh/pytorch/pytorch@main/torch/utils/viz/MemoryViz.js"


def _browser(p):
    return p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"])


def time_memq_view(p, html: Path | str) -> dict:
    """`html`: a page written by `memq view`, or the URL of a snapshot page of `memq serve`."""
    b = _browser(p)
    try:
        page = b.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        t = time.perf_counter()
        response = page.goto(html.as_uri() if isinstance(html, Path) else html)
        page.wait_for_selector("html[data-ready='1']", timeout=60_000)
        page.evaluate(PAINTED)
        opened = time.perf_counter() - t
        page.wait_for_selector("#cat-timeline[data-detail='ready']", timeout=60_000)
        detail = time.perf_counter() - t
        # memq view's page carries the view itself; the served page carries it in the snapshot's document
        n = page.evaluate("(d => (d.timeline || d.view.timeline).events)"
                          "(JSON.parse(document.getElementById('page-data').textContent))")
        zooms = []
        for start in (0.1, 0.5, 0.9):
            a = int(n * start)
            z = time.perf_counter()
            page.evaluate(f"window.memqZoom({a}, {a + n // 100})")
            page.evaluate(PAINTED)
            zooms.append(time.perf_counter() - z)
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : null")
        size = html.stat().st_size if isinstance(html, Path) else len(response.body())  # what was sent
        return {"open_s": opened, "detail_s": detail, "zoom_1pct_s": max(zooms), "js_heap_mib": (heap or 0) / 2**20,
                "html_mib": size / 2**20, "errors": errors}
    finally:
        b.close()


def memory_viz_html(path: Path, out: Path, d3_js: str | None) -> None:
    from torch.cuda import _memory_viz

    snap = codec.loads_restricted(codec.decompress(path.read_bytes(), 2**40))
    html = _memory_viz.trace_plot(snap)
    if d3_js:  # the page imports d3 from a CDN as modules; offline it gets the same d3 as a script
        html = html.replace("<head>", "<head>\n<script>" + d3_js + "</script>", 1)
    out.write_text(html)


def time_memory_viz(p, html: Path, viz_js: str | None) -> dict:
    b = _browser(p)
    try:
        page = b.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)[:200]))
        if viz_js is not None:
            body = viz_js
            for line in [ln for ln in viz_js.splitlines() if ln.startswith("import ")]:
                names = line.split(" from ")[0][len("import "):]
                body = body.replace(line, "const d3 = window.d3;" if names.startswith("* as d3") else
                                    f"const {names} = window.d3;")
            page.route(CDN_VIZ, lambda route: route.fulfill(
                status=200, body=body, headers={"content-type": "text/javascript", "access-control-allow-origin": "*"}))
        t = time.perf_counter()
        page.goto(html.as_uri(), timeout=300_000)
        try:
            page.wait_for_function("document.querySelectorAll('svg polygon').length > 1", timeout=300_000)
            page.evaluate(PAINTED)
            opened = time.perf_counter() - t
        except Exception as exc:  # noqa: BLE001 - a viewer that never draws is a result too
            return {"open_s": None, "failed": f"{type(exc).__name__}: {str(exc)[:160]}", "errors": errors,
                    "html_mib": html.stat().st_size / 2**20}
        polys = page.evaluate("document.querySelectorAll('svg polygon').length")
        box = page.locator("svg").first.bounding_box()
        z = time.perf_counter()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.wheel(0, -800)  # its d3 zoom on the plot
        page.evaluate(PAINTED)
        zoom = time.perf_counter() - z
        heap = page.evaluate("performance.memory ? performance.memory.usedJSHeapSize : null")
        return {"open_s": opened, "zoom_s": zoom, "polygons": polys, "js_heap_mib": (heap or 0) / 2**20,
                "html_mib": html.stat().st_size / 2**20, "errors": errors}
    finally:
        b.close()


def serve_benchmark(args) -> None:
    """The real 1M capture ingested into a fresh SQLite history and opened from `memq serve` (a real
    process): the first open decodes the stored blob and builds the view on the server, later opens
    get it from the server's cache."""
    from bench_web import served  # the same start-and-wait as the web benchmark's
    from playwright.sync_api import sync_playwright

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        env.update(MEMQ_DATA_DIR=tmp, MEMQ_CONFIG=str(Path(tmp) / "none.toml"), MEMQ_SERVE_TOKEN="")
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "memq", "ingest", str(REAL_1M), "--run", "big1m", "--json"],
                       env=env, check=True, stdout=subprocess.DEVNULL)
        ingest_s = time.perf_counter() - t
        with served(env) as base:
            rows = [time_memq_view(p, base + "/snapshots/1") | {"open": k} for k in ("first", "second", "third")]
    print(f"memq ingest of the 1M capture: {ingest_s:.1f} s")
    for r in rows:
        print(f"memq serve /snapshots/1, {r['open']} open: opens in {r['open_s']:.2f} s, full detail in "
              f"{r['detail_s']:.2f} s, 1% zoom {1000 * r['zoom_1pct_s']:.0f} ms, JS heap {r['js_heap_mib']:.0f} MiB, "
              f"page {r['html_mib']:.1f} MiB"
              + (f", page errors {r['errors']}" if r["errors"] else ""))
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.platform(), "ingest_s": ingest_s,
                                               "serve": rows}, indent=1))


def view_benchmark(args) -> None:
    from playwright.sync_api import sync_playwright

    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    viz_js = Path(args.memory_viz_js).read_text() if args.memory_viz_js else None
    d3_js = Path(args.d3).read_text() if viz_js and Path(args.d3).exists() else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as p:
        env["MEMQ_DATA_DIR"] = tmp
        tiled_path = Path(tmp) / "tiled_1m.pickle.gz"
        subprocess.run([sys.executable, __file__, "--make-tiled", str(tiled_path)], check=True)
        for label, path in (("real 100k", REAL_100K), ("real 1M capture", REAL_1M), ("1M tiled", tiled_path)):
            out = Path(tmp) / f"{path.stem}.html"
            t = time.perf_counter()
            subprocess.run([sys.executable, "-m", "memq", "view", str(path), "--out", str(out)], env=env,
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            built = time.perf_counter() - t
            memq = time_memq_view(p, out) | {"build_s": built}
            viz: dict = {"skipped": "not measured: give --memory-viz-js (offline, its page cannot fetch its script)"}
            if viz_js:
                viz_html = Path(tmp) / f"{path.stem}.viz.html"
                memory_viz_html(path, viz_html, d3_js)
                viz = time_memory_viz(p, viz_html, viz_js)
            rows.append({"file": label, "memq": memq, "memory_viz": viz})
            if viz.get("skipped"):
                theirs = viz["skipped"]
            elif viz.get("open_s") is not None:
                theirs = (f"{viz['html_mib']:.1f} MiB: opens in {viz['open_s']:.2f} s ({viz['polygons']} polygons), "
                          f"a wheel zoom {1000 * viz['zoom_s']:.0f} ms, JS heap {viz['js_heap_mib']:.0f} MiB")
            else:
                theirs = f"{viz['html_mib']:.1f} MiB: never drew: {viz['failed']} {viz['errors'][:2]}"
            print(f"{label:>16}: memq view {memq['html_mib']:.1f} MiB (written in {built:.1f} s), opens in "
                  f"{memq['open_s']:.2f} s, full detail in {memq['detail_s']:.2f} s, "
                  f"1% zoom {1000 * memq['zoom_1pct_s']:.0f} ms,"
                  f" JS heap {memq['js_heap_mib']:.0f} MiB | memory_viz {theirs}")
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": platform.platform(), "view": rows}, indent=1))


if __name__ == "__main__":
    main()
