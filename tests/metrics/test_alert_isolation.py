"""One job must never silence, delay or rename another's pages: the alert outbox against real databases
(SQLite and PostgreSQL) and a real local HTTP receiver, attacked the way a hostile job would.
Time moves by `now=`, never by sleeping."""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest
from sqlalchemy import delete, select, text, update

from memq.alerts import delivery, outbox, payload
from memq.config import load_settings
from memq.store import repository as repo
from memq.store.orm import Alert, AlertSummary, Run
from tests.conftest import memq_environ
from tests.metrics.history import add_run, set_run
from tests.metrics.receiver import Receiver

HOUR = dt.timedelta(seconds=outbox.JOB_WINDOW_S)
HOSTILE = "c-1 <!channel> URGENT <https://evil.example/login|memq: re-authenticate here>"


@pytest.fixture(autouse=True)
def _no_summaries_left(request):
    if "store" not in request.fixturenames:
        yield
        return
    store = request.getfixturevalue("store")
    with store.session() as s:
        s.execute(delete(AlertSummary))
    yield
    with store.session() as s:
        s.execute(text("UPDATE alerts SET summarised_by = NULL"))
        s.execute(delete(AlertSummary))


def _st(store, url: str, **kw):
    env = memq_environ(store.settings.database_url, Path(store.settings.data_dir).parent)
    env.update({"MEMQ_ALERT_WEBHOOK_URL": url, "MEMQ_PUBLIC_URL": "https://memq.example/ui/",
                "MEMQ_ALERT_TIMEOUT_S": "3", "MEMQ_ALERT_LEASE_S": "6"})
    env.update({k: str(v) for k, v in kw.items()})
    return load_settings(env)


def _markup(slack_text: str) -> list[str]:
    """Every `<...>` Slack would read as markup (a mention, a channel ping, a link)."""
    return re.findall(r"<[^<>]*>", slack_text)


# ------------------------------------------------------------------- attack 4: markup from names


def test_a_run_name_cannot_ping_the_channel_or_disguise_a_link_in_slack(store):
    """Round 4, attack 4: a run (and job) named with Slack markup. The alert and the summary of the
    verdict the job's limit held back show the names as text: no `<!channel>`, no link to
    evil.example; memq's own links to its pages still work."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1, MEMQ_ALERT_FORMAT="slack")
        with store.session() as s:
            add_run(s, HOSTILE, job="<!here> & co", status="oom", cause="capacity", oom_count=1,
                    evidence=f"run {HOSTILE} allocated 2 GiB <@U0ADMIN>")
            add_run(s, HOSTILE + " 2", job="<!here> & co", status="oom", cause="capacity", oom_count=1)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0).get("sent") == 1
        assert delivery.deliver_due(store, st, now=t0 + HOUR + dt.timedelta(seconds=1)) == {"summary_sent": 1}
    texts = [r["body"]["text"] for r in rx.requests]
    assert len(texts) == 2
    for t in texts:
        links = _markup(t)
        assert len(links) == 1 and links[0].startswith("<https://memq.example/ui/runs"), links
        assert "evil.example/login|" not in t.replace("&lt;", "<") or "&lt;https://evil.example" in t
        assert "<!" not in t and "<@" not in t and "<http" not in t.replace(links[0], "")
        assert "&lt;!channel&gt;" in t and "&lt;!here&gt; &amp; co" in t
    alert = texts[0]
    assert "&lt;@U0ADMIN&gt;" in alert
    assert "|run c-1 &lt;!channel&gt; URGENT &lt;https://evil.example/login|memq: re-authenticate here&gt;>" in alert
    assert "/runs/c-1%20%3C%21channel%3E%20URGENT" in alert  # memq's link: the name percent-encoded


def test_alertmanager_labels_and_annotations_are_plain_bounded_text(store):
    """The same names in the Alertmanager document stay what they are (plain strings: a receiver's
    template escapes for its own target), with no control character and no value past its cap."""
    hostile_evidence = "grew\x1b]0;owned\x07 \u202eevil\u202c " + "x" * (payload.ANNOTATION_MAX + 500)
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_FORMAT="alertmanager")
        with store.session() as s:
            add_run(s, HOSTILE, job="j" * 200, status="oom", cause="capacity", oom_count=1, evidence=hostile_evidence)
        delivery.sweep(store, st)
        assert delivery.deliver_due(store, st) == {"sent": 1}
    (alert,) = rx.requests[0]["body"]["alerts"]
    assert alert["labels"]["run"] == HOSTILE and alert["labels"]["job_name"] == "j" * 200
    desc = alert["annotations"]["description"]
    assert len(desc) == payload.ANNOTATION_MAX and desc.endswith("\u2026")
    assert desc.startswith("grew\ufffd]0;owned\ufffd \ufffdevil\ufffd x")
    for value in [*alert["labels"].values(), *alert["annotations"].values()]:
        assert isinstance(value, str) and not re.search(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", value)
        assert len(value) <= payload.ANNOTATION_MAX


def test_plain_caps_just_at_and_over_the_limit():
    assert payload.plain("a" * payload.LABEL_MAX, payload.LABEL_MAX) == "a" * payload.LABEL_MAX
    over = payload.plain("a" * (payload.LABEL_MAX + 1), payload.LABEL_MAX)
    assert len(over) == payload.LABEL_MAX and over.endswith("\u2026")
    assert payload.slack_text("a&b<c>d") == "a&amp;b&lt;c&gt;d"


# ------------------------------------------------------------- minor: a forecast that flaps


def test_a_flapping_forecast_is_paged_at_most_once_an_hour(store):
    """A run whose forecast swings between hours away and ever sooner (recomputed every 10 minutes)
    is paged for it once, then again only after FORECAST_MIN_INTERVAL_S, not every
    MEMQ_ALERT_RUN_INTERVAL_S for hours."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=100)
        with store.session() as s:
            rid = add_run(s, "flappy", job="flap")
        for step in range(18):  # 3 hours, a sweep every 10 minutes
            t = t0 + dt.timedelta(minutes=10 * step)
            # out to 5 h, then back in to a quarter of the last time it gave: "much earlier" each time
            at = t + (dt.timedelta(hours=5) if step % 2 else dt.timedelta(seconds=7200 / 4 ** (step // 2)))
            with store.session() as s:
                s.execute(update(Run).where(Run.id == rid).values(oom_forecast_at=repo.db_time(s, at),
                                                                  updated_at=repo.db_time(s, t)))
            delivery.sweep(store, st, now=t)
            delivery.deliver_due(store, st, now=t)
    with store.session() as s:
        kinds = list(s.execute(select(Alert.verdict).where(Alert.run_id == rid)).scalars())
    assert len(rx.requests) == len(kinds) and 2 <= len(kinds) <= 3, kinds


# ------------------------------------------------------ attack 2: the global limit as a weapon


def _oom(store, name: str, owner: str | None, job: str, t: dt.datetime) -> int:
    """An OOM run of `owner` (the principal whose signed envelope created it), recorded at `t`."""
    with store.session() as s:
        rid = add_run(s, name, job=job, status="oom", cause="capacity", oom_count=1)
        set_run(s, rid, owner=owner, updated_at=repo.db_time(s, t))
    return rid


def _states(store, owner: str | None) -> list[str]:
    with store.session() as s:
        return list(s.execute(select(Alert.state).where(Alert.owner == owner).order_by(Alert.id)).scalars())


def test_another_principals_runs_under_my_job_name_do_not_spend_my_budget(store):
    """Round 4, attack 2 (second half): with the default `jobs: ["*"]` any key may write job `train`.
    Five OOM runs of team-c under it pass the job's limit; team-b's own OOM in `train` a minute later
    is still paged: the budget is per (principal, cluster, job)."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=3)
        for i in range(5):
            _oom(store, f"squat-{i}", "team-c", "train", t0)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 3, "skipped": 2}
        t1 = t0 + dt.timedelta(minutes=1)
        _oom(store, "real-oom", "team-b", "train", t1)
        delivery.sweep(store, st, now=t1)
        assert delivery.deliver_due(store, st, now=t1) == {"sent": 1}
    assert _states(store, "team-b") == ["sent"]
    assert "real-oom" in str(rx.requests[-1]["body"])


def test_a_flood_of_one_principal_cannot_starve_anothers_page_or_summary(store):
    """Round 4, attack 2: team-a files two tiny OOM runs every 5 minutes under rotating job names for
    two hours, keeping the limit of all jobs (6 an hour here) full. team-b's two OOMs of one job (its
    job limit is 1) still go out: the first at once, the second in its job's summary within the hour
    after it, because each principal with recent verdicts is guaranteed its share of the limit."""
    t0 = repo.utcnow()
    victim_at = t0 + dt.timedelta(minutes=2)
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1, MEMQ_ALERT_MAX_PER_HOUR=6)
        n = 0
        for step in range(25):  # 2 h in 5-minute sweeps
            t = t0 + dt.timedelta(minutes=5 * step)
            for _ in range(2):
                _oom(store, f"flood-{n}", "team-a", f"rot-{n}", t)
                n += 1
            if step == 0:
                delivery.sweep(store, st, now=t)
                delivery.deliver_due(store, st, now=t)
                for i in range(2):
                    _oom(store, f"victim-{i}", "team-b", "train", victim_at)
                t = victim_at
            delivery.sweep(store, st, now=t)
            delivery.deliver_due(store, st, now=t)
            if step == 0:
                assert _states(store, "team-b") == ["sent", "suppressed"]
    with store.session() as s:
        summaries = list(s.execute(select(AlertSummary).where(AlertSummary.owner == "team-b")).scalars())
    assert len(summaries) == 1 and summaries[0].state == "sent", [(x.state, x.last_error) for x in summaries]
    assert repo.to_utc(summaries[0].sent_at) <= victim_at + 2 * HOUR
    # the flood itself stayed within its own budget: at most the limit an hour plus nothing of team-b's
    sent_a = sum(1 for r in rx.requests if "flood-" in str(r["body"]) and "victim" not in str(r["body"]))
    assert sent_a <= 6 * 3
