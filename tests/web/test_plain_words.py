"""Pages speak words, not identifiers (issue 42 item 10): a cause such as external_memory and a what-if
verdict such as not_assessable are shown through the one mapping (memq.render.words), a run with one
snapshot says "1 snapshot"; a real `memq serve` over its own SQLite history, the run list and a run page in
Chromium (screenshots in the test's tmp_path)."""

from __future__ import annotations

import re

import pytest

from memq.render.words import WORDS
from tests.conftest import memq_environ
from tests.helpers import REAL, meta
from tests.report.conftest import chromium_path
from tests.web.conftest import History, _start, _stop
from tests.web.test_browser import Browser, assert_not_blank, shot


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("words")
    h = History(memq_environ(f"sqlite:///{root / 'memq.db'}", root), root)
    h.cli("ingest", str(REAL / "external" / "oom.pickle.gz"), "--run", "ext", "--device-total", "150109880320",
          "--json")
    h.cli("ingest", str(REAL / "frag_dynamic_1.15" / "oom.pickle.gz"), "--run", "dyn", "--limit", "20244645632",
          "--oom-message", meta("frag_dynamic_1.15")["oom_message"], "--json")
    server = _start(h, root, None)
    yield h, server
    _stop(server)


def _visible(html: str) -> str:
    """The page's text as a reader sees it: no tags, attributes or scripts."""
    html = re.sub(r"<(script|style)\b.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"<[^>]+>", " ", html)


def test_pages_show_words_not_identifiers(served, tmp_path):
    from playwright.sync_api import sync_playwright

    h, server = served
    runs = _visible(server.get("/runs")[2].decode())
    assert "external memory" in runs and "external_memory" not in runs
    ext = _visible(server.get("/runs/ext")[2].decode())
    assert "1 snapshot " in ext and "1 snapshots" not in ext
    dyn = _visible(server.get("/runs/dyn")[2].decode())
    assert "not assessable" in dyn
    raw = [k for k in WORDS if "_" in k]
    assert [w for w in raw for page in (runs, ext, dyn) if w in page] == []
    with sync_playwright() as p:
        b = Browser(p, server.url)
        try:
            for path, name in (("/runs", "runs.png"), ("/runs/ext", "ext.png"), ("/runs/dyn", "dyn.png")):
                page = b.open(path)
                assert_not_blank(shot(page, tmp_path / name, full_page=True))
                text = page.inner_text("body")
                assert not any(w in text for w in raw), (path, [w for w in raw if w in text])
            b.clean()
        finally:
            b.browser.close()
    assert chromium_path()
