"""A fresh round against the limits issue 36 added, turned against another team: the per-principal
alert budget. Real databases (SQLite and PostgreSQL) and a real local HTTP receiver; time moves by `now=`.

Attack: the limit of all jobs is shared as MEMQ_ALERT_MAX_PER_HOUR divided by the principals with recent
verdicts. With more principals than the limit (a deployment that gives each job its own key, or a team
that holds many keys), that share rounded down to 0, so once the window was full no principal with no
page yet could page at all: a team with 70 keys filled the hour and every other team's first OOM waited
for the window to drain. Each principal now keeps at least one page an hour (outbox.MIN_SHARE)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from memq.alerts import delivery, outbox
from memq.store import repository as repo
from memq.store.orm import Alert
from tests.metrics.receiver import Receiver
from tests.metrics.test_alert_isolation import _no_summaries_left, _oom, _st  # noqa: F401 - the fixture

LIMIT = 6


def test_the_fair_share_never_rounds_down_to_nothing():
    assert outbox.fair_share(LIMIT, LIMIT) == 1
    assert outbox.fair_share(LIMIT, LIMIT + 1) == outbox.MIN_SHARE == 1  # just over: still one page
    assert outbox.fair_share(LIMIT, 1000) == 1
    assert outbox.fair_share(LIMIT, 2) == 3


@pytest.mark.timeout(300)
def test_many_principals_cannot_take_every_share_of_the_hour(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_MAX_PER_HOUR=LIMIT, MEMQ_ALERT_JOB_MAX_PER_HOUR=10)
        for i in range(LIMIT + 4):  # more principals than the hour's limit: their verdicts all recorded
            _oom(store, f"flood-{i}", f"swarm-{i}", "train", t0)
        delivery.sweep(store, st, now=t0)
        delivery.deliver_due(store, st, now=t0)
        t1 = t0 + dt.timedelta(minutes=1)
        _oom(store, "real-oom", "team-b", "train", t1)
        delivery.sweep(store, st, now=t1)
        delivery.deliver_due(store, st, now=t1)
    with store.session() as s:
        mine = list(s.execute(select(Alert.state).where(Alert.owner == "team-b")).scalars())
    assert mine == ["sent"], mine
    assert "real-oom" in str(rx.requests[-1]["body"])
