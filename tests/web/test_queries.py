"""The runs listing's paging on SQLite and PostgreSQL (the `store` fixture runs each test on both):
offsets and keyset cursors visit every run exactly once, also when runs share a start time, and the
sorts with NULLs and ties do not repeat or skip a run across page boundaries."""

from __future__ import annotations

import datetime as dt

import pytest

from memq.store.page_queries import RunPage, page_runs
from memq.store.queries import RunFilter
from memq.store.repository import RunMeta, upsert_run

T0 = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def runs(store):
    with store.session() as s:
        for i in range(23):
            # pairs of runs share a start time, so the id tie-break matters at page boundaries
            upsert_run(s, RunMeta(name=f"r{i:02d}", cluster="a" if i % 3 else "b", job=f"j{i % 4}",
                                  started_at=T0 + dt.timedelta(minutes=i // 2), status="completed"))
    return store


def walk(session, make, limit: int) -> list[str]:
    out, page, guard = [], make(None, 0), 0
    while True:
        doc = page_runs(session, page)
        out += [r["run"] for r in doc["runs"]]
        if doc["next_offset"] is None:
            return out
        page = make(doc, doc["next_offset"])
        guard += 1
        assert guard < 100


@pytest.mark.parametrize("order", ["desc", "asc"])
@pytest.mark.parametrize("limit", [1, 4, 7, 50])
def test_keyset_and_offset_paging_agree(runs, order, limit):
    f = RunFilter()
    with runs.session() as s:
        everything = [r["run"] for r in page_runs(s, RunPage(filter=f, order=order, limit=500))["runs"]]
        by_offset = walk(s, lambda d, off: RunPage(filter=f, order=order, limit=limit, offset=off), limit)
        by_cursor = walk(s, lambda d, off: RunPage(filter=f, order=order, limit=limit, offset=off,
                                                   after=_cursor(d["next_cursor"]) if d else None), limit)
    assert len(everything) == 23 and len(set(everything)) == 23
    assert by_offset == everything == by_cursor
    starts = sorted(everything, key=lambda n: (int(n[1:]) // 2, int(n[1:])), reverse=order == "desc")
    assert everything == starts


def test_cursor_back_and_filters(runs):
    f = RunFilter(cluster="a")
    with runs.session() as s:
        p1 = page_runs(s, RunPage(filter=f, limit=5))
        p2 = page_runs(s, RunPage(filter=f, limit=5, offset=5, after=_cursor(p1["next_cursor"])))
        back = page_runs(s, RunPage(filter=f, limit=5, offset=0, before=_cursor(p2["prev_cursor"])))
        assert [r["run"] for r in back["runs"]] == [r["run"] for r in p1["runs"]]
        assert p1["total"] == 15 and all(r["cluster"] == "a" for r in p1["runs"] + p2["runs"])
        until = page_runs(s, RunPage(filter=f, until=T0 + dt.timedelta(minutes=3), limit=50))
        assert {r["run"] for r in until["runs"]} == {"r01", "r02", "r04", "r05"}


def test_sorted_by_a_column_with_ties_pages_without_repeats(runs):
    f = RunFilter()
    with runs.session() as s:
        seen = walk(s, lambda d, off: RunPage(filter=f, sort="job", order="asc", limit=3, offset=off), 3)
    assert sorted(seen) == sorted(f"r{i:02d}" for i in range(23))
    assert [int(n[1:]) % 4 for n in seen] == sorted(int(n[1:]) % 4 for n in seen)


def _cursor(text: str | None):
    from memq.web.params import cursor

    return cursor({"c": text}, "c") if text else None
