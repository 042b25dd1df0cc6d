"""A run page renders whatever state its snapshots are in: pending (stored, not analysed yet),
running (a worker is analysing it), failed for good (quarantined, with the reason), and failed
while attempts remain. Live runs always have snapshots the workers have not caught up with, and a
quarantined snapshot stays unanalysed for good: neither may turn the run page into a 500.

A real `memq serve` process over its own history (SQLite, filled by `memq ingest` of real
snapshots); the states are set on the stored rows the way the workers set them (analysis cleared,
state and last_error written). Plus a Chromium screenshot of such a page."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import memq_environ
from tests.helpers import REAL
from tests.web.conftest import History, _start, _stop

STATES = {  # epoch file -> (state, last_error) as the workers leave them
    "epoch0": ("pending", None),
    "epoch1": ("running", None),
    "epoch2": ("failed", "bad snapshot: gave up after 5 attempts"),
}


@pytest.fixture(scope="module")
def states_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("states_history")
    h = History(memq_environ(f"sqlite:///{root / 'memq.db'}", root), root)
    sa = REAL / "seed_adamw"
    h.cli("ingest", *(str(sa / f"{s}.pickle.gz") for s in ("before_training", "epoch0", "epoch1", "epoch2")),
          "--run", "live", "--cluster", "a", "--job", "gpt", "--status", "running", "--json")
    ids = [i for i, _ in h.sql("SELECT s.id, s.trigger FROM snapshots s ORDER BY s.taken_at, s.id")]
    # the first stays analysed; the three others lose their analysis, each left in one state
    for sid, (state, err) in zip(ids[1:], STATES.values(), strict=True):
        h.sql("UPDATE snapshots SET analysis_id = NULL, state = ?, last_error = ? WHERE id = ?", state, err, sid)
    # a run whose only snapshot was quarantined: no analysis at all, no diagnosis
    h.cli("ingest", str(REAL / "capacity" / "oom.pickle.gz"), "--run", "quarantined", "--cluster", "a",
          "--job", "gpt", "--json")
    h.sql("UPDATE snapshots SET analysis_id = NULL, state = 'failed', last_error = 'blob missing: gone' "
          "WHERE run_id = (SELECT id FROM runs WHERE name = 'quarantined')")
    h.sql("DELETE FROM analysis_results WHERE id NOT IN (SELECT analysis_id FROM snapshots "
          "WHERE analysis_id IS NOT NULL)")
    s = _start(h, tmp_path_factory.mktemp("serve_states"), None)
    s.ids = ids
    yield s
    _stop(s)


@pytest.mark.parametrize("run", ["live", "quarantined"])
def test_run_page_renders_unanalysed_snapshots(states_server, run):
    code, _, body = states_server.get(f"/runs/{run}")
    page = body.decode()
    assert code == 200, page[-2000:]
    assert 'id="snapshots"' in page


def test_each_state_is_shown_on_its_row(states_server):
    code, _, body = states_server.get("/runs/live")
    assert code == 200
    page = body.decode()
    for sid, (state, err) in zip(states_server.ids[1:], STATES.values(), strict=True):
        row = page.split(f'href="/snapshots/{sid}"', 1)[1].split("</tr>", 1)[0]
        label = {"pending": "waiting for analysis", "running": "being analysed", "failed": "quarantined"}[state]
        assert label in row, (state, row)
        if err:
            assert err in row
    # the analysed one still shows its figures
    first = page.split(f'href="/snapshots/{states_server.ids[0]}"', 1)[1].split("</tr>", 1)[0]
    assert "GiB" in first or "MiB" in first


@pytest.mark.parametrize("which", [1, 2, 3])
def test_snapshot_page_of_each_state(states_server, which):
    sid = states_server.ids[which]
    code, _, body = states_server.get(f"/snapshots/{sid}")
    assert code == 200, body[-2000:]
    label = {1: "waiting for analysis", 2: "being analysed", 3: "quarantined: bad snapshot"}[which]
    assert label in body.decode()


def test_screenshot_of_a_pending_and_a_quarantined_snapshot(states_server, tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.web.test_browser import Browser, assert_not_blank, shot

    with sync_playwright() as p:
        b = Browser(p, states_server.url)
        try:
            page = b.open("/runs/live")
            assert page.locator("tr.state-pending").count() == 1
            assert page.locator("tr.state-failed").count() == 1
            # the unanalysed snapshots have no figures: the line joins the analysed one only
            assert page.locator("#timeline-svg path.reserved").get_attribute("d").endswith("h1")
            png = shot(page, Path(tmp_path) / "run_states.png", full_page=True)
            assert_not_blank(png)
            b.clean()
        finally:
            b.browser.close()
