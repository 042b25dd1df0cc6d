"""`memq serve` pages and a `memq view` file in headless Chromium (Debian's /usr/bin/chromium driven
by playwright, as tests/report/test_browser.py does): no console error, no failed request, nothing
loaded from outside the server; the runs table filters and pages; a click on a block shows its
frames; the run page's timeline marks the OOM. Screenshots are kept in the test's tmp_path and
checked to be non-blank."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers import REAL
from tests.report.conftest import chromium_path
from tests.report.test_browser import png_rows, png_size
from tests.web.conftest import ROOT

WIDTH, HEIGHT = 1280, 900


class Browser:
    def __init__(self, p, base: str | None):
        self.base = base
        self.browser = p.chromium.launch(executable_path=chromium_path(),
                                         args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        self.page = self.browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
        self.errors: list[str] = []
        self.requests: list[str] = []
        pg = self.page
        pg.on("console", lambda m: self.errors.append(f"console {m.type}: {m.text}")
              if m.type in ("error", "warning") else None)
        pg.on("pageerror", lambda e: self.errors.append(f"page error: {e}"))
        pg.on("requestfailed", lambda r: self.errors.append(f"request failed: {r.url} {r.failure}"))
        pg.on("request", lambda r: self.requests.append(r.url))
        pg.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)

    def open(self, path: str):
        self.page.goto(self.base + path if self.base else path, wait_until="load")
        self.page.wait_for_selector("html[data-ready='1']", timeout=30_000)
        return self.page

    def clean(self) -> None:
        assert self.errors == [], self.errors
        outside = [u for u in self.requests if not (self.base and u.startswith(self.base)) and not u.startswith("file:")
                   and not u.startswith("data:")]
        assert outside == [], outside


@pytest.fixture
def browser(server):
    from playwright.sync_api import sync_playwright

    assert Path(chromium_path()).exists(), f"Chromium not found at {chromium_path()} (apt-get install chromium)"
    with sync_playwright() as p:
        b = Browser(p, server.url)
        try:
            yield b
        finally:
            b.browser.close()


def assert_not_blank(png: bytes, *, red: bool = False) -> None:
    w, _ = png_size(png)
    assert w == WIDTH
    rows = png_rows(png)
    bpp = len(rows[0]) // w
    pixels = [r[i:i + 3] for r in rows[::4] for i in range(0, len(r), 4 * bpp)]
    background = Counter(pixels).most_common(1)[0][0]  # the most frequent colour
    share = sum(p != background for p in pixels) / len(pixels)
    assert share > 0.04, f"screenshot nearly blank ({share:.1%} non-background)"
    assert len(set(pixels)) > 40
    if red:  # the OOM marks / failed fit test
        assert any(p[0] > 150 and p[1] < 90 and p[2] < 90 for p in pixels)


def shot(page, path: Path, **kw) -> bytes:
    png = page.screenshot(path=str(path), **kw)
    assert path.read_bytes() == png
    return png


def test_every_page_loads_clean(browser, web_history, tmp_path):
    rid = None
    pages = ["/runs", "/runs/seed_adamw", "/runs/capacity", "/runs/frag_synthetic", "/runs/frag_dyn",
             f"/snapshots/{web_history.snapshot_id('seed_adamw')}", f"/snapshots/{web_history.snapshot_id('capacity')}",
             f"/snapshots/{web_history.snapshot_id('frag_synthetic', 'oom')}",
             f"/snapshots/{web_history.snapshot_id('frag_dyn')}",  # corrupt blob: says so, no console error
             "/compare", "/compare?a=seed_adamw&b=seed_sgd", "/versions", "/versions?job=gpt", "/reports"]
    for i, path in enumerate(pages):
        page = browser.open(path)
        assert page.title().endswith("· memq"), path
        assert page.evaluate("document.body.scrollWidth") <= WIDTH, f"{path} overflows sideways"
        png = shot(page, tmp_path / f"page{i:02d}.png")
        assert_not_blank(png)
        browser.clean()
    rid = browser.page.eval_on_selector("a.report-link", "a => a.getAttribute('href')")
    browser.page.click("a.report-link")
    browser.page.wait_for_load_state("load")
    assert browser.page.url.endswith(rid) and "memq report 2026-11-30" in browser.page.title()
    browser.clean()


def test_the_snapshot_page_zooms_into_its_trace_at_full_detail(browser, web_history, tmp_path):
    """Issue 23 item 7 / issue 27: the served snapshot page (not only `memq view`) unpacks the
    per-event detail and draws a window of 100 events event by event; a click on a band still shows
    its stacks after a zoom."""
    page = browser.open(f"/snapshots/{web_history.snapshot_id('capacity')}")
    page.wait_for_selector("#cat-timeline[data-detail='ready']", timeout=30_000)
    n = page.evaluate("JSON.parse(document.getElementById('page-data').textContent).timeline.events")
    page.evaluate(f"window.memqZoom({n - 100}, {n})")  # the last 100 entries, where the OOM is
    assert page.get_attribute("#cat-svg", "data-window") == f"{n - 100},{n}"
    d = page.locator("#cat-svg path.band.cat-activations").get_attribute("d")
    assert d.count("L") == 2 * 100 - 1
    assert page.locator("#cat-svg .oom-mark").count() == 1
    page.dispatch_event("#cat-svg path.band.cat-activations", "click")
    assert "band: activations" in page.text_content("#frames")
    shot(page, tmp_path / "snapshot-zoom.png", full_page=True)
    browser.clean()


def test_no_page_overflows_at_800_px(browser, web_history, tmp_path):
    """Issue 23 item 7: at 800 px the pages scrolled sideways (wide tables, the snapshot page's split)."""
    browser.page.set_viewport_size({"width": 800, "height": 900})
    pages = ["/runs", "/runs/seed_adamw", "/runs/capacity", f"/snapshots/{web_history.snapshot_id('capacity')}",
             f"/snapshots/{web_history.snapshot_id('frag_synthetic', 'oom')}", "/compare",
             "/compare?a=seed_adamw&b=seed_sgd", "/versions", "/versions?job=gpt", "/reports", "/fit", "/playbook"]
    wide = {}
    for i, path in enumerate(pages):
        page = browser.open(path)
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 800:
            wide[path] = width
        page.screenshot(path=str(tmp_path / f"narrow{i:02d}.png"), full_page=True)
    assert wide == {}, wide
    browser.clean()


def test_run_timeline_shows_the_peak_a_step_reached_beside_the_sampled_line(browser, server, web_history, tmp_path):
    """Issue 23 item 6: the allocated line (samples read between steps) was the only allocated figure
    drawn, far below the run's peak allocated; the peak is drawn and labelled beside it."""
    run = server.json("/api/runs/seed_adamw")["run"]
    page = browser.open("/runs/seed_adamw")
    line = page.locator("#peak-allocated-line")
    assert line.count() == 1
    label = page.text_content("#timeline-svg .peak-alloc-label")
    mib = run["peak_allocated_bytes"] / 2**20
    assert label.startswith(f"peak allocated {mib / 1024:.2f} GiB" if mib >= 1024 else f"peak allocated {mib:.2f} MiB")
    y_peak = float(line.get_attribute("y1"))
    d = page.get_attribute("#timeline-svg path.allocated", "d")
    ys = [float(v) for v in re.findall(r"[ML][\d.]+,([\d.]+)", d)]
    assert ys and y_peak <= min(ys)  # above every sample: no sample exceeds the run's peak
    shot(page, tmp_path / "run-peak.png", full_page=True)
    browser.clean()


def test_compare_and_versions_offer_what_to_pick(browser, web_history, tmp_path):
    """Issue 23 item 7: /compare and /versions opened as empty forms with nothing to pick."""
    page = browser.open("/compare")
    runs = page.eval_on_selector_all("#run-names option", "os => os.map(o => o.value)")
    assert set(runs) >= {"seed_adamw", "seed_sgd", "capacity", "frag_synthetic"}
    page.click("#compare-suggestion a")
    page.wait_for_selector("#compare-table")
    assert page.locator("#explanation").count() == 1
    page = browser.open("/versions")
    jobs = page.locator("#job-picks a").all_text_contents()
    assert "gpt" in jobs
    page.click("#job-picks a >> text=gpt")
    page.wait_for_selector("#versions-table")
    shot(page, tmp_path / "versions.png", full_page=True)
    browser.clean()


def test_compare_shows_each_limit_as_a_size_with_its_source(server, web_history):
    """Issue 23 item 6: compare showed one limit as "-" and the other as raw bytes."""
    doc = json.loads(web_history.cli("compare", "capacity", "seed_adamw", "--json"))
    (lim,) = [d for d in doc["differences"] if d["field"] == "limit"]
    assert lim["a"] and lim["a_source"] and lim["kind"] == "bytes"
    assert not any(d["field"] == "memory_limit_bytes" for d in doc["differences"])
    text = web_history.cli("compare", "capacity", "seed_adamw")
    assert re.search(r"limit\s.*GiB \((the run's cap|the OOM analysis)\)", text), text
    assert str(lim["a"]) not in text
    code, _, page = server.get("/compare?a=capacity&b=seed_adamw")
    shown = page.split(b"Settings and versions that differ", 1)[1].split(b"</table>", 1)[0]
    assert code == 200 and str(lim["a"]).encode() not in shown and b"GiB (" in shown


def test_runs_table_filters_sorts_and_pages(browser, tmp_path):
    page = browser.open("/runs")
    assert page.locator("#runs-table tbody tr").count() == 5 and page.text_content("#total") == "5"
    page.fill("input[name=cluster]", "b")
    page.select_option("select[name=status]", "oom")
    page.click("#apply-filters")
    page.wait_for_selector("html[data-ready='1']")
    runs = page.locator("a.run-link").all_text_contents()
    assert sorted(runs) == ["capacity", "frag_dyn", "frag_synthetic"] and "cluster=b" in page.url
    page.select_option("select[name=cause]", "fragmentation")
    page.click("#apply-filters")
    page.wait_for_selector("html[data-ready='1']")
    assert sorted(page.locator("a.run-link").all_text_contents()) == ["frag_dyn", "frag_synthetic"]

    page = browser.open("/runs?limit=2&sort=run&order=asc")
    seen = page.locator("a.run-link").all_text_contents()
    assert page.locator("#prev-page").count() == 0
    while page.locator("#next-page").count():
        page.click("#next-page")
        page.wait_for_selector("html[data-ready='1']")
        seen += page.locator("a.run-link").all_text_contents()
    assert seen == sorted(["seed_adamw", "seed_sgd", "frag_synthetic", "capacity", "frag_dyn"])
    assert "runs 5–5 of 5" in page.text_content("#pager")
    page = browser.open("/runs?limit=2")  # newest first: the links carry keyset cursors
    newest = page.locator("a.run-link").all_text_contents()
    while page.locator("#next-page").count():
        assert "after=" in page.get_attribute("#next-page", "href")
        page.click("#next-page")
        page.wait_for_selector("html[data-ready='1']")
        newest += page.locator("a.run-link").all_text_contents()
    assert sorted(newest) == sorted(seen) and len(newest) == 5
    page.click("#prev-page")
    page.wait_for_selector("html[data-ready='1']")
    assert page.locator("a.run-link").all_text_contents() == newest[2:4]
    page.click("th a[data-sort=peak_reserved]")  # sort by a column header (keeps the filters, first page)
    page.wait_for_selector("html[data-ready='1']")
    assert "sort=peak_reserved" in page.url and page.locator("a.run-link").count() == 2
    assert_not_blank(shot(page, tmp_path / "runs.png"))
    browser.clean()


def test_run_timeline_marks_the_oom(browser, tmp_path):
    page = browser.open("/runs/frag_synthetic")
    marks = page.locator("#timeline-svg .oom-mark")
    assert marks.count() == 1
    assert page.locator("#timeline-svg .snap-mark").count() == 1  # the fragmented snapshot before it
    assert page.locator("#timeline-svg .limit").count() == 1
    assert "OOM" in page.text_content("#timeline-svg")
    box = marks.first.bounding_box()
    assert box and box["width"] > 4 and box["height"] > 4
    assert page.locator("#lanes svg circle").count() == 2
    assert_not_blank(shot(page, tmp_path / "run-frag.png", full_page=True), red=True)
    marks.first.click()  # the mark links to the OOM snapshot's page
    page.wait_for_selector("html[data-ready='1']")
    assert "/snapshots/" in page.url and "oom" in page.text_content("#snap-title")

    page = browser.open("/runs/capacity")  # the failing step's need, said once above the evidence
    need = page.text_content("#step-need")
    assert need.startswith("the failing step needed more than the 16.00 GiB limit: its live bytes and the request "
                           "alone (16.08 GiB) exceed it"), need
    assert "would settle it" not in need
    assert page.locator("#step-need").count() == 1 and page.locator("#step-need").is_visible()
    assert_not_blank(shot(page, tmp_path / "run-capacity.png", full_page=True), red=True)

    page = browser.open("/runs/seed_adamw")  # stat samples: reserved and allocated lines, 4 snapshot marks
    assert page.locator("#timeline-svg path.reserved").count() == 1
    assert page.locator("#timeline-svg path.allocated").count() == 1
    assert page.locator("#timeline-svg .snap-mark").count() == 4
    assert page.locator("#timeline-svg .oom-mark").count() == 0
    assert_not_blank(shot(page, tmp_path / "run-seed.png", full_page=True))
    page = browser.open("/runs/seed_sgd")  # two ranks: two lanes, each with its snapshot marks
    assert page.locator("#lanes svg rect.lane").count() == 2
    assert page.locator("#lanes svg circle.snap-mark").count() == 7
    assert page.locator("#lanes svg text").all_text_contents() == ["rank 0", "rank 1"]
    browser.clean()


def test_click_a_block_shows_its_frames(browser, web_history, tmp_path):
    page = browser.open(f"/snapshots/{web_history.snapshot_id('capacity')}")
    # a capacity OOM: its stranded bytes are shown, not alarming (issue 23 item 5)
    assert page.locator("#stranded").count() == 1 and page.locator("#stranded.stranded-text").count() == 0
    frag = browser.open(f"/snapshots/{web_history.snapshot_id('frag_synthetic', 'oom')}")
    assert frag.locator("#stranded.stranded-text").count() == 1  # there it is the problem
    page = browser.open(f"/snapshots/{web_history.snapshot_id('capacity')}")
    assert page.locator("#segmap-svg rect.block").count() > 100
    assert page.locator("#segmap-svg rect.stranded").count() > 0
    assert page.locator("#fit-svg").count() == 1 and "does not fit" in page.text_content("#fit-svg")
    assert page.locator("#cat-svg path.band.cat-activations").count() == 1
    assert page.locator("#cat-svg .oom-mark").count() == 1
    # the largest live block, by its drawn width
    block = max(page.locator("#segmap-svg rect.block.cat-activations").all(),
                key=lambda b: float(b.get_attribute("width")))
    block.click()
    frames = page.locator("#frame-list li")
    assert frames.count() > 3
    text = page.text_content("#frames")
    assert "category activations" in text and ".py:" in text
    assert_not_blank(shot(page, tmp_path / "snapshot-capacity.png", full_page=True), red=True)
    # a band shows the stacks of its category (dispatched: a thin band's box centre may lie outside it)
    page.dispatch_event("#cat-svg path.band.cat-activations", "click")
    assert "band: activations" in page.text_content("#frames") and page.locator("#frames ol.stack li").count() > 0
    browser.clean()


def test_memq_view_is_self_contained_and_interactive(tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "view.html"
    files = [str(REAL / "frag_synthetic" / f"{s}.pickle.gz") for s in ("fragmented", "oom")]
    res = subprocess.run([sys.executable, "-m", "memq", "view", *files, "--limit", "8GiB", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert "<link" not in html and "src=" not in html and "http://" not in html.split("<script type")[0]
    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            page = b.open(out.as_uri())
            assert b.requests == [out.as_uri()]
            assert page.locator("nav").count() == 0 and "fragmentation" in page.text_content("#verdict")
            assert page.locator("#segmap-svg rect.block").count() > 10
            assert page.locator("#segmap-svg rect.largest-free").count() == 1
            page.locator("#segmap-svg rect.block.cat-activations, #segmap-svg rect.block.cat-parameters,"
                         " #segmap-svg rect.block.cat-other").first.click()
            assert page.locator("#frame-list li").count() > 0
            assert_not_blank(shot(page, tmp_path / "view.png", full_page=True), red=True)
            b.clean()
        finally:
            b.browser.close()


def test_memq_view_of_the_100k_entry_snapshot_renders_and_answers_a_click(tmp_path):
    """The 100,000-entry fixture (benchmarks/data): the page draws its trace and a click shows frames.
    How fast is measured by benchmarks/bench_web.py, not asserted here."""
    from playwright.sync_api import sync_playwright

    big = ROOT / "benchmarks" / "data" / "big.pickle.gz"
    assert big.exists(), f"{big} is missing (the 100,000-entry fixture of benchmarks/)"
    out = tmp_path / "big.html"
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(big), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            page = b.open(out.as_uri())
            assert "100000 trace entries" in page.text_content("#cat-svg")
            assert page.locator("#cat-svg path.band").count() >= 2
            page.locator("#segmap-svg rect.block.cat-parameters").first.click()
            page.wait_for_selector("#frame-list li")
            assert_not_blank(shot(page, tmp_path / "big.png"))
            b.clean()
        finally:
            b.browser.close()


def test_a_recommendations_playbook_link_lands_on_its_entry(browser, tmp_path):
    """The run page links each recommendation to its playbook entry; following it shows the measured
    section (the generated docs/playbook.md, packaged), scrolled to that entry, with its table drawn."""
    page = browser.open("/runs/frag_synthetic")
    href = page.eval_on_selector("a[href^='/playbook#']", "a => a.getAttribute('href')")
    entry = href.split("#", 1)[1]
    page.click(f"a[href='{href}']")
    page.wait_for_selector(f"[id='{entry}']")
    page.wait_for_function("document.readyState === 'complete'")
    assert page.url.endswith(href)
    top = page.eval_on_selector(f"[id='{entry}']", "e => e.getBoundingClientRect().top")
    assert 0 <= top < HEIGHT / 2, f"#{entry} is not scrolled into view (top {top})"
    assert page.locator("table").count() >= 8  # the measured tables, drawn as tables, not Markdown text
    assert "tests/fixtures/" not in page.inner_text("body")  # the user's playbook speaks of situations
    assert page.evaluate("document.body.scrollWidth") <= WIDTH, "/playbook overflows sideways"
    assert_not_blank(shot(page, tmp_path / "playbook.png"))
    browser.clean()


def test_run_page_fit_form_predicts_the_batch(browser, forecast_server, tmp_path):
    """The run page says the run's own headroom and its form asks `memq fit`'s question: batch 14 of a
    run measured at 2 is predicted at 4.9 GiB, over the 4.81 GiB cap but inside the 3% interval's reach of it
    (a GPT: its own ops decide every size), so the answer is undetermined, not a false "no"; 15 (5.3 GiB) is
    over by more than the interval and a "no"; 13 is the largest batch (14 ran out for real)."""
    browser.base = forecast_server.url
    page = browser.open("/runs/fit_m")
    own = page.text_content("#fit-own")
    assert own.startswith("Fit: peak 2.76 GiB reserved at its own batch; 6."), own
    page.fill("#fit-form input[name=batch]", "14")
    page.fill("#fit-form input[name=from_batch]", "2")
    page.click("#fit-form button")
    page.wait_for_selector("#fit-result")
    assert page.text_content("#fit-verdict").strip().startswith("undetermined"), page.text_content("#fit-verdict")
    assert page.text_content("#fit-max").strip().startswith("13")
    margin = page.text_content("#fit-margin")
    assert margin.startswith("±3%: the trace shows no size a library chooses by shape"), margin
    page = browser.open("/fit?run=fit_m&batch=15&from_batch=2")
    page.wait_for_selector("#fit-result")
    assert page.text_content("#fit-verdict").strip().startswith("no"), page.text_content("#fit-verdict")
    peak = page.text_content("#fit-peak")
    assert peak.startswith("5.2") or peak.startswith("5.3"), peak  # the real run at batch 16 reserved 5.51 GiB
    assert "the run's cap" in page.text_content("#fit-table")
    assert_not_blank(shot(page, tmp_path / "fit.png", full_page=True))
    bad = browser.open("/fit?run=fit_m&batch=16")
    assert "--batch needs --from-batch" in bad.text_content("body")
    assert len(browser.errors) == 2 and all("400" in e for e in browser.errors)  # that refusal, no other error
    browser.errors.clear()
    browser.clean()


def test_fit_page_says_what_the_terminal_says_of_a_partial_step(browser, forecast_server, tmp_path):
    """A run measured by one dump after the first backward: the /fit page gives `memq fit --run`'s answer,
    its reason, what was measured (a modelled peak: part of a step) and every line the prediction inferred
    (the optimizer state assumed, its temporaries, the steps added), in the terminal's words."""
    browser.base = forecast_server.url
    page = browser.open("/fit?run=fit_partial&batch=8&from_batch=4")
    page.wait_for_selector("#fit-result")
    lines = forecast_server.history.cli("fit", "--run", "fit_partial", "--batch", "8", "--from-batch", "4").splitlines()
    answer = lines[0].removeprefix("answer: ")
    assert page.text_content("#fit-answer").strip() == answer
    inferred = [ln.removeprefix("inferred: ") for ln in lines if ln.startswith("inferred: ")]
    assert len(inferred) == 3 and "optimizer state inferred from parameters for adamw (assumed" in inferred[0]
    shown = [t.strip().removeprefix("inferred: ") for t in page.locator("#fit-inferred li").all_text_contents()]
    assert shown == inferred
    measured = next(ln.strip() for ln in lines if "modelled peak reserved" in ln)
    assert measured in page.text_content("#fit-result")
    reason = next(ln.strip() for ln in lines if ln.strip().startswith("because "))
    assert page.text_content("#fit-reason").strip() == reason
    assert_not_blank(shot(page, tmp_path / "fit-partial.png", full_page=True))
    browser.clean()


def test_run_page_draws_the_forecast(browser, forecast_server, tmp_path):
    """A running leak run: the forecast said once above the timeline, and its projection drawn from the
    last point up to the limit."""
    browser.base = forecast_server.url  # its own history, beside the shared one
    page = browser.open("/runs/fc_leak")
    text = page.text_content("#forecast")
    assert text.startswith("Forecast: will run out of memory in epoch "), text
    assert page.locator("#forecast").count() == 1 and page.locator("#forecast").is_visible()
    line = page.locator("#timeline-svg #forecast-line")
    assert line.count() == 1
    box = line.bounding_box()
    # from the steps' peak now up to the limit, towards the OOM moment (this run's OOM came 2 s after its
    # forecast, so the line is steep on an axis of its whole history)
    assert box and box["height"] > 5 and box["width"] >= 1
    assert "forecast OOM" in page.text_content("#timeline-svg")
    assert_not_blank(shot(page, tmp_path / "run-forecast.png", full_page=True), red=True)
    browser.clean()


def test_segment_map_and_composition_bar_show_one_class_per_block(tmp_path):
    """A published 3.4B-parameter AdamW full step (stacks="all"): the segment map's blocks and the
    composition bar show the same classes (parameters, gradients, optimizer state), and the bar's
    bytes are the map's blocks summed by class."""
    from playwright.sync_api import sync_playwright

    snap = ROOT / "tests/fixtures/public_snapshots/cs336_2.7b_memory_ctx128_fullstep.pickle.gz"
    out = tmp_path / "view.html"
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(snap), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            page = b.open(out.as_uri())
            on_map = page.evaluate("""() => { const s = {}; document.querySelectorAll('#segmap-svg rect.block')
                .forEach(r => r.classList.forEach(c => { if (c.startsWith('cat-')) s[c.slice(4)] = 1; }));
                return Object.keys(s).sort(); }""")
            bar = page.evaluate("""() => Array.from(document.querySelectorAll('#composition rect'))
                .map(r => (r.querySelector('title') || {}).textContent).filter(Boolean)""")
            in_bar = sorted(t.split(" ")[0] for t in bar)
            assert on_map == in_bar
            assert {"parameters", "gradients", "optimizer_state"} <= set(in_bar)
            assert "other" not in in_bar
            by_map = page.evaluate("""() => { const s = {};
                const DATA = JSON.parse(document.getElementById('page-data').textContent);
                DATA.segments.forEach(g => g.blocks.forEach(b => {
                if (b.c) s[b.c] = (s[b.c] || 0) + b.s; })); return s; }""")
            assert by_map == {k: v for k, v in page.evaluate(
                "() => JSON.parse(document.getElementById('page-data').textContent).composition").items() if v}
            # what nothing names (a few small buffers outside the optimizer) stays unknown: 1.3 MB of 51 GiB
            assert by_map.get("unknown", 0) <= 0.001 * sum(by_map.values())
            page.locator("#composition").scroll_into_view_if_needed()
            assert_not_blank(shot(page, tmp_path / "one_class.png", full_page=True))
            b.clean()
        finally:
            b.browser.close()


def _view(snap_path: Path, out: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(snap_path), "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr


MAP_CLASSES = """() => { const s = {}; document.querySelectorAll('#segmap-svg rect.block')
    .forEach(r => r.classList.forEach(c => { if (c.startsWith('cat-')) s[c.slice(4)] = 1; }));
    return Object.keys(s).sort(); }"""
PAGE_DATA = "() => JSON.parse(document.getElementById('page-data').textContent)"


def test_every_screen_of_an_oom_page_shows_one_class_per_block_and_where_it_came_from(tmp_path):
    """The page the issue found split (tests/fixtures/real/frag_dynamic_1.15/oom: its 4.12 GiB frameless
    block was `other` on the segment map and `unknown` in the composition bar), and the published
    forward-only snapshot with the roles an agent sends (its weights known from the job). On each: the
    segment map, the composition bar and the fit test's live bar show the same classes with the same
    bytes, each block says where its class came from, and the bar says it per class."""
    import gzip
    import pickle

    from playwright.sync_api import sync_playwright

    from memq import codec
    from memq.model import AGENT_ROLES

    # the forward-only snapshot as an agent would send it: no trace, the optimizer's parameters' storages
    raw = codec.loads_restricted(gzip.decompress(
        (ROOT / "tests/fixtures/public_snapshots/cs336_2.7b_memory_ctx128_forward.pickle.gz").read_bytes()))
    raw["device_traces"] = [[] for _ in raw.get("device_traces") or [[]]]
    weights = [[b["address"], b["requested_size"], AGENT_ROLES.index("parameter")]
               for s in raw["segments"] for b in s["blocks"]
               if b["state"] == "active_allocated" and not b.get("frames")]
    raw["memq_agent"] = {"run": "r", "rank": 0, "trigger": "manual", "roles": {"v": 1, "ranges": weights}}
    roles_file = tmp_path / "agent_roles.pickle"
    roles_file.write_bytes(pickle.dumps(raw, protocol=4))  # our own data, read back by memq's safe decoder

    untraced = Path(__file__).resolve().parent.parent / "fixtures/composition_h200/untraced"
    # and a training step recorded without stacks from the job's start: every class from the trace's order
    order = ROOT / "tests/fixtures/composition_h200/full_eager_fp32_none_start/snapshot.pickle.gz"
    # and a ring that wrapped mid-step, its stacks removed: what is older than it, by its layout
    raw = codec.loads_restricted(gzip.decompress(
        (ROOT / "tests/fixtures/composition_late/late_deep_bf16_oom_fwd_py_ring/snapshot.pickle.gz").read_bytes()))
    for trace in raw.get("device_traces") or []:
        for ev in trace:
            ev["frames"] = []
    for seg in raw["segments"]:
        for blk in seg["blocks"]:
            blk["frames"] = []
    before = tmp_path / "ring_without_stacks.pickle"
    before.write_bytes(pickle.dumps(raw, protocol=4))  # our own data, read back by memq's safe decoder
    pages = {"oom": REAL / "frag_dynamic_1.15" / "oom.pickle.gz", "roles": roles_file,
             "untraced": untraced / "oom_fwd_eager_bf16_off" / "snapshot.pickle.gz", "order": order,
             "before_trace": before}
    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            for name, path in pages.items():
                out = tmp_path / f"{name}.html"
                _view(path, out)
                page = b.open(out.as_uri())
                data = page.evaluate(PAGE_DATA)
                comp = {k: v for k, v in data["composition"].items() if v}
                by_map: Counter = Counter()
                for seg in data["segments"]:
                    for blk in seg["blocks"]:
                        if blk["c"]:
                            by_map[blk["c"]] += blk["s"]
                            assert blk["v"] in data["source_words"], blk  # every live block says why
                assert dict(by_map) == comp, name
                assert page.evaluate(MAP_CLASSES) == sorted(comp)
                bar = page.evaluate("""() => Array.from(document.querySelectorAll('#composition rect'))
                    .map(r => (r.querySelector('title') || {}).textContent).filter(Boolean)""")
                assert sorted(t.split(" ")[0] for t in bar) == sorted(comp)
                note = page.text_content("#composition-origin")
                if name == "oom":
                    assert "other" not in comp and comp.get("activations", 0) > 11 * 2**30
                    assert note == ", ".join(c.replace("_", " ") for c in
                                             ("parameters", "optimizer_state", "activations", "workspace")
                                             if c in comp) + ": inferred from the trace"
                    fit_live = page.evaluate("""() => Array.from(document.querySelectorAll('#fit-svg rect.live'))
                        .map(r => r.querySelector('title').textContent.split(' ')[0]).sort()""")
                    assert fit_live == sorted(comp)  # the fit test's live bar, by the same classes
                    block = max(page.locator("#segmap-svg rect.block.cat-activations").all(),
                                key=lambda r: float(r.get_attribute("width")))
                elif name == "untraced":  # no trace at all: the model's state by its sizes and addresses
                    assert "unknown" not in comp and comp["optimizer_state"] > 0.8 * 2**30
                    assert note == ("parameters, optimizer state, activations, workspace: inferred from sizes "
                                    "and addresses"), note
                elif name == "before_trace":
                    assert comp["parameters"] > 0.1 * 2**30
                    assert "inferred from sizes and addresses" in note and note.startswith("parameters"), note
                    block = max(page.locator("#segmap-svg rect.block.cat-parameters").all(),
                                key=lambda r: float(r.get_attribute("width")))
                elif name == "order":
                    assert "unknown" not in comp and comp["gradients"] > 0.4 * 2**30
                    assert " · " not in note and note.endswith(": inferred from the trace's order"), note
                    block = max(page.locator("#segmap-svg rect.block.cat-optimizer_state").all(),
                                key=lambda r: float(r.get_attribute("width")))
                else:
                    assert comp["parameters"] > 12 * 2**30 and "unknown" not in comp
                    assert "parameters: known from the job" in note
                    assert "activations" in note and note.endswith("inferred from the trace")
                    block = max(page.locator("#segmap-svg rect.block.cat-parameters").all(),
                                key=lambda r: float(r.get_attribute("width")))
                block.scroll_into_view_if_needed()
                block.click()
                panel = page.text_content("#frames")
                assert "_" not in panel.split("category ")[1].split(":")[0], panel  # a class in words
                want = {"roles": "known from the job", "untraced": "inferred from sizes and addresses",
                        "order": "inferred from the trace's order",
                        "before_trace": "inferred from sizes and addresses"}.get(name, "inferred from the trace")
                assert want in panel, panel
                block.hover()  # the readout under the map says the same origin
                assert f"({want})" in page.text_content("#seg-readout"), name
                page.locator("#composition").scroll_into_view_if_needed()
                assert_not_blank(shot(page, tmp_path / f"one_class_{name}.png", full_page=True))
            b.clean()
        finally:
            b.browser.close()
