"""Pages render whatever state a snapshot is in (round 4, attack 7): a run page and a snapshot page
answer 200, saying what the snapshot is doing, while a snapshot waits for analysis, is being analysed,
or is quarantined; a real `memq serve` over its own SQLite history, and the run page in Chromium
(screenshot in the test's tmp_path)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import memq_environ
from tests.report.conftest import chromium_path
from tests.web.conftest import History, _start, _stop
from tests.web.test_browser import Browser, assert_not_blank, shot

LEAK = Path(__file__).resolve().parents[1] / "fixtures" / "captured" / "leak_epochs"


@pytest.fixture(scope="module")
def states(tmp_path_factory):
    root = tmp_path_factory.mktemp("states")
    h = History(memq_environ(f"sqlite:///{root / 'memq.db'}", root), root)
    h.cli("ingest", *(str(LEAK / f"epoch{i}.pickle.gz") for i in range(3)), "--run", "half-done",
          "--trigger", "epoch_end", "--limit", "7516192768", "--json")
    server = _start(h, root, None)
    yield h, server
    _stop(server)


@pytest.mark.parametrize("state,words", [("pending", "waiting for analysis"), ("running", "being analysed"),
                                         ("failed", "quarantined (could not be analysed)")])
def test_run_and_snapshot_pages_render_a_snapshot_without_analysis(states, state, words):
    h, server = states
    sid = h.snapshot_id("half-done")
    (aid,) = h.sql("SELECT analysis_id FROM snapshots WHERE id = ?", sid)[0]
    h.sql("UPDATE snapshots SET analysis_id = NULL, state = ?, last_error = ? WHERE id = ?", state,
          "SnapshotError: refused" if state == "failed" else None, sid)
    try:
        code, _, body = server.get("/runs/half-done")
        assert code == 200, body[:2000]
        assert words in body.decode()
        code, _, body = server.get(f"/snapshots/{sid}")
        assert code == 200, body[:2000]
        text = body.decode()
        assert words in text and 'id="snap-state"' in text
        assert ("memq reanalyze --run half-done" in text) == (state == "failed")
        assert server.json("/api/runs/half-done")["snapshots"][-1]["state"] == state
    finally:
        h.sql("UPDATE snapshots SET analysis_id = ?, state = 'done', last_error = NULL WHERE id = ?", aid, sid)


def test_run_page_with_a_quarantined_snapshot_in_chromium(states, tmp_path):
    from playwright.sync_api import sync_playwright

    h, server = states
    sid = h.snapshot_id("half-done")
    (aid,) = h.sql("SELECT analysis_id FROM snapshots WHERE id = ?", sid)[0]
    h.sql("UPDATE snapshots SET analysis_id = NULL, state = 'failed', last_error = 'SnapshotError: refused' "
          "WHERE id = ?", sid)
    assert Path(chromium_path()).exists()
    try:
        with sync_playwright() as p:
            b = Browser(p, server.url)
            try:
                page = b.open("/runs/half-done")
                cell = page.locator("#snapshots tbody tr").last.locator("td").last
                assert cell.inner_text() == "quarantined (could not be analysed)"
                assert_not_blank(shot(page, tmp_path / "run-quarantined.png", full_page=True))
                b.clean()
            finally:
                b.browser.close()
    finally:
        h.sql("UPDATE snapshots SET analysis_id = ?, state = 'done', last_error = NULL WHERE id = ?", aid, sid)
