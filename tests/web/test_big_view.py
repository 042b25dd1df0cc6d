"""`memq view` of the real 1,000,000-entry H200 capture in Chromium: the page opens with the overview,
unpacks the per-event detail, and a zoom into any window draws it at full detail (every event when
the window has fewer than two per pixel), with the y axis rescaled to the window. Also the packed
detail against the Python replay it came from. Screenshots are kept and checked to be non-blank; how
fast is measured by benchmarks/bench_big.py --view, not asserted here."""

from __future__ import annotations

import base64
import gzip
import json
import re
import subprocess
import sys
from array import array

from memq.web.snapshot_view import MAX_POINTS, NO_CHANGE
from tests.web.conftest import ROOT
from tests.web.test_browser import Browser, assert_not_blank, shot

BIG = ROOT / "benchmarks" / "data" / "h200_1m_trace.pickle.gz"


def _view(tmp_path):
    out = tmp_path / "big.html"
    env = {"PATH": "/usr/bin:/bin", "MEMQ_DATA_DIR": str(tmp_path), "MEMQ_DECODE_BUDGET_BYTES": str(2 * 1024**3)}
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(BIG), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    data = json.loads(re.search(r'<script type="application/json" id="page-data">(.*?)</script>', html, re.S).group(1))
    return out, data


def _unpack(detail: dict) -> tuple[array, array, bytes]:
    raw = gzip.decompress(base64.b64decode(detail["gzip_b64"]))
    n, c, k = detail["n"], detail["categories"], detail["checkpoints"]
    delta, times, ckpt = array("d"), array("d"), array("d")
    delta.frombytes(raw[:8 * n])
    times.frombytes(raw[8 * n:16 * n])
    ckpt.frombytes(raw[16 * n:16 * n + 8 * k * c])
    return delta, ckpt, raw[16 * n + 8 * k * c:]


def test_the_packed_detail_replays_to_the_overview(tmp_path):
    _, data = _view(tmp_path)
    tl = data["timeline"]
    assert tl["events"] == 1_000_000 and len(tl["levels"]) <= 1001
    delta, ckpt, cats = _unpack(tl["detail"])
    assert len(cats) == 1_000_000
    C = len(tl["categories"])
    level = list(ckpt[:C])
    want = dict(zip(tl["idx"], tl["levels"], strict=True))
    per = -(-tl["events"] // MAX_POINTS)  # events per overview point
    lows, lo = [], None
    checked = 0
    for i in range(tl["events"]):
        if not i % tl["detail"]["checkpoint"]:
            assert list(ckpt[i // tl["detail"]["checkpoint"] * C:][:C]) == level, i
        c = cats[i]
        if c != NO_CHANGE:
            level[c] += delta[i]
        total = sum(level)
        lo = total if lo is None else min(lo, total)
        if i % per == per - 1 or i == tl["events"] - 1:
            lows.append(lo)
            lo = None
        if i in want:
            assert level == want[i], i
            checked += 1
    assert checked == len(tl["idx"])
    # each overview point is the highest of its bucket: no total between two points exceeds both
    assert max(map(sum, tl["levels"])) == tl["peak_bytes"]
    # ... and carries its bucket's lowest total, which the flat band of highs alone would hide
    assert tl["low"] == lows
    assert all(lw <= sum(r) for lw, r in zip(tl["low"], tl["levels"], strict=True))
    assert sum(sum(r) - lw for lw, r in zip(tl["low"], tl["levels"], strict=True)) / len(lows) > 64 * 2**20


def test_zoom_to_a_window_draws_every_event_and_rescales(tmp_path):
    from playwright.sync_api import sync_playwright

    out, data = _view(tmp_path)
    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            page = b.open(out.as_uri())
            assert b.requests == [out.as_uri()]
            assert "1000000 trace entries" in page.text_content("#cat-svg")
            page.wait_for_selector("#cat-timeline[data-detail='ready']", timeout=30_000)
            whole_top = float(page.get_attribute("#cat-svg", "data-ymax"))
            assert page.get_attribute("#cat-svg", "data-low") == "drawn"  # 1,000 events a column
            assert page.locator("#cat-low").get_attribute("d").count("L") == len(data["timeline"]["idx"]) - 1
            assert_not_blank(shot(page, tmp_path / "big-whole.png", full_page=True))
            a = 500_000
            page.evaluate(f"window.memqZoom({a}, {a + 10_000})")  # a 1% window
            assert page.get_attribute("#cat-svg", "data-window") == f"{a},{a + 10_000}"
            assert f"entries {a}-{a + 9_999} of 1000000" in page.text_content("#cat-svg")
            # 8 events a column: the highs are the trace, troughs within LOW_GAP_SHARE of the axis
            assert page.get_attribute("#cat-svg", "data-low") == "none"
            page.evaluate(f"window.memqZoom({a}, {a + 300})")  # fewer events than pixels: every one
            d = page.locator("#cat-svg path.band").first.get_attribute("d")
            assert d.count("L") == 2 * 300 - 1
            assert page.get_attribute("#cat-svg", "data-low") == "none"  # every event drawn: no troughs hidden
            assert float(page.get_attribute("#cat-svg", "data-ymax")) < whole_top  # the axis is the window's
            assert_not_blank(shot(page, tmp_path / "big-zoom.png", full_page=True))
            # a drag across the chart zooms too; "whole trace" comes back
            box = page.locator("#cat-svg").bounding_box()
            page.mouse.move(box["x"] + box["width"] * 0.3, box["y"] + 100)
            page.mouse.down()
            page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + 100)
            page.mouse.up()
            lo, hi = map(int, page.get_attribute("#cat-svg", "data-window").split(","))
            assert a < lo < hi < a + 300
            page.click("#cat-zoom-all")
            assert page.get_attribute("#cat-svg", "data-window") == "0,1000000"
            page.locator("#segmap-svg rect.block").first.hover()
            assert "segment" in page.text_content("#seg-readout")
            assert page.text_content("#segmap-scale").endswith("iB")
            b.clean()
        finally:
            b.browser.close()
