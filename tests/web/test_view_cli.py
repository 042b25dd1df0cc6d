"""`memq view` as a command: bad input is exit code 2 with one line, and text from a hostile snapshot
(frame names that try to close the script element) stays data."""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys

from tests.web.conftest import ROOT

EVIL = "</script><script>document.title='pwned'</script><!--"


def hostile_snapshot() -> dict:
    frames = [{"filename": "/w/train<b>.py", "line": 7, "name": EVIL}]
    base = 0x7F0000000000
    blocks = [{"address": base, "size": 2 << 20, "requested_size": 2 << 20, "state": "active_allocated",
               "frames": frames},
              {"address": base + (2 << 20), "size": 18 << 20, "requested_size": 0, "state": "inactive", "frames": []}]
    seg = {"device": 0, "address": base, "total_size": 20 << 20, "stream": 0, "segment_type": "large",
           "allocated_size": 2 << 20, "active_size": 2 << 20, "requested_size": 2 << 20, "blocks": blocks}
    return {"segments": [seg], "device_traces": [[{"action": "alloc", "addr": base, "size": 2 << 20, "stream": 0,
                                                    "time_us": 1, "frames": frames}]]}


def test_view_keeps_hostile_text_as_data(tmp_path):
    src = tmp_path / "evil.pickle"
    src.write_bytes(pickle.dumps(hostile_snapshot()))
    out = tmp_path / "evil.html"
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(src), "--out", str(out)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    html = out.read_text()
    assert EVIL not in html and "<script>document.title" not in html
    assert len(re.findall(r"<script", html)) == 2  # the JSON data element and the inlined script, no more
    data = re.search(r'<script type="application/json" id="page-data">(.*?)</script>', html, re.S).group(1)
    doc = json.loads(data)
    assert doc["stacks"][0][0] == ["/w/train<b>.py", 7, EVIL]  # the text itself, intact after parsing

    from playwright.sync_api import sync_playwright

    from tests.web.test_browser import Browser

    with sync_playwright() as p:
        b = Browser(p, None)
        try:
            page = b.open(out.as_uri())
            page.locator("#segmap-svg rect.block.cat-other, #segmap-svg rect.block.cat-unknown").first.click()
            assert EVIL in page.text_content("#frame-list") and "train<b>.py" in page.text_content("#frame-list")
            assert page.title() == "snapshot evil.pickle · memq"  # the frame's script never ran
            b.clean()
        finally:
            b.browser.close()


def test_view_bad_input_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "not-a-snapshot.pickle"
    bad.write_bytes(b"\x80\x04\x95garbage")
    res = subprocess.run([sys.executable, "-m", "memq", "view", str(bad), "--out", str(tmp_path / "x.html")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "Traceback" not in res.stderr and str(bad) in res.stderr
    assert not (tmp_path / "x.html").exists()
