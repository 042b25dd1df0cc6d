"""The HTML report in headless Chromium: it renders with no console error, every plot is there,
and a screenshot is a non-blank PNG of the viewport's size.

Chromium is the system's (/usr/bin/chromium, or MEMQ_TEST_CHROMIUM); playwright drives it without
`playwright install`. A missing browser or playwright fails the test: CI installs both."""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from pathlib import Path

from tests.report.conftest import DAY1, DAY2, chromium_path, invoke

WIDTH, HEIGHT = 1280, 900


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    length, kind = struct.unpack(">I4s", data[8:16])
    assert kind == b"IHDR" and length == 13
    width, height, depth, color = struct.unpack(">IIBB", data[16:26])
    assert depth == 8 and color in (2, 6), (depth, color)  # 8-bit RGB / RGBA, as Chromium writes
    return width, height


def png_rows(data: bytes) -> list[bytes]:
    """The decoded pixel rows of an 8-bit RGB(A) PNG (stdlib only: zlib and the PNG filters).
    Up, the filter Chromium writes for most rows, is one bytewise addition of two big integers
    (SWAR: the low 7 bits of every byte are added without carrying into the next byte, the top
    bit is XORed back in); Sub, Average and Paeth go byte by byte."""
    width, height = png_size(data)
    bpp = 4 if data[25] == 6 else 3
    pos, idat = 8, b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        if kind == b"IDAT":
            idat += data[pos + 8:pos + 8 + length]
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * bpp
    high = int.from_bytes(b"\x80" * stride, "big")
    low = high >> 7 | high >> 6 | high >> 5 | high >> 4 | high >> 3 | high >> 2 | high >> 1  # 0x7f7f...
    rows, prev = [], bytes(stride)
    for y in range(height):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if f == 2:
            x, u = int.from_bytes(line, "big"), int.from_bytes(prev, "big")
            line = bytearray((((x & low) + (u & low)) ^ ((x ^ u) & high)).to_bytes(stride, "big"))
        elif f == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 255
        elif f == 3:
            for i in range(stride):
                line[i] = (line[i] + ((line[i - bpp] if i >= bpp else 0) + prev[i]) // 2) & 255
        elif f == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    return rows


def _open(html: Path, shot: Path, full_page: bool = False):
    from playwright.sync_api import sync_playwright

    errors: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(),
                                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type in (
                "error", "warning") else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"request failed: {r.url}"))
            requests: list[str] = []
            page.on("request", lambda r: requests.append(r.url))
            page.goto(html.as_uri(), wait_until="load")
            info = page.evaluate("""() => ({
                title: document.title,
                ooms: document.querySelector('#total-ooms').textContent,
                runs: document.querySelector('#total-runs').textContent,
                timelines: [...document.querySelectorAll('.timeline svg')].length,
                timelineRuns: [...document.querySelectorAll('.timeline')].map(e => e.dataset.run),
                causeBars: document.querySelectorAll('#plot-causes svg path').length,
                svgSizes: [...document.querySelectorAll('svg')].map(s => s.getBoundingClientRect().width),
                bodyWidth: document.body.scrollWidth,
            })""")
            png = page.screenshot(path=str(shot), full_page=full_page)
        finally:
            browser.close()
    return errors, requests, info, png


def test_html_report_renders_in_chromium_without_errors(history, tmp_path):
    assert Path(chromium_path()).exists(), f"Chromium not found at {chromium_path()} (apt-get install chromium)"
    assert invoke(history.env, ["report", "--date", DAY1, "--out", str(tmp_path / "day1.html")]).exit_code == 0
    out = tmp_path / "day2.html"
    res = invoke(history.env, ["report", "--date", DAY2, "--format", "html", "--out", str(out)])
    assert res.exit_code == 0, res.output
    text = out.read_text()
    assert "<script" not in text and "http://" not in text.split("</style>")[1].split("<svg")[0]
    shot = tmp_path / "day2.png"
    errors, requests, info, png = _open(out, shot)
    assert errors == []
    assert requests == [out.as_uri()]  # self-contained: no other file, no network
    assert info["title"] == f"memq report {DAY2} (all)"
    assert info["runs"] == "4" and info["ooms"] == "3"
    assert info["timelines"] == 4 and "leak_epochs" in info["timelineRuns"]
    assert info["causeBars"] > 3
    assert all(w > 100 for w in info["svgSizes"])
    assert info["bodyWidth"] <= WIDTH  # nothing overflows sideways

    assert shot.read_bytes() == png
    assert png_size(png) == (WIDTH, HEIGHT)
    rows = png_rows(png)
    bpp = len(rows[0]) // WIDTH
    pixels = [r[i:i + 3] for r in rows[::4] for i in range(0, len(r), 4 * bpp)]
    background = Counter(pixels).most_common(1)[0][0]  # the most frequent colour
    not_background = sum(p != background for p in pixels) / len(pixels)
    assert not_background > 0.05, f"screenshot nearly blank ({not_background:.1%} non-background)"
    assert len(set(pixels)) > 50  # text, bars and lines in several colours
    # red of the OOM bars/cards is on screen
    assert any(p[0] > 150 and p[1] < 110 and p[2] < 110 for p in pixels)

    # the same check with matplotlib's PNG reader (Pillow)
    import matplotlib.image

    img = matplotlib.image.imread(str(shot))
    assert img.shape[:2] == (HEIGHT, WIDTH) and img[..., :3].std() > 0.05
    # a full-page shot for people to look at (kept in the test's tmp dir)
    _open(out, tmp_path / "day2-full.png", full_page=True)
