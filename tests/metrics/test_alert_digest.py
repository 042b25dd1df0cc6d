"""Summaries of rate-limited alerts, against real databases (SQLite and PostgreSQL) and a real local HTTP
receiver: the verdicts a job's MEMQ_ALERT_JOB_MAX_PER_HOUR held back arrive as ONE summary per job
when its window opens again (or an hour after the first of them), with the right counts per cause;
racing senders make one summary; a failed send is retried under the same key; no verdict is covered
twice or left out. Time moves by `now=`, never by sleeping."""

from __future__ import annotations

import datetime as dt
import threading
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from sqlalchemy import delete, select, text

from memq.alerts import delivery, outbox, payload, send
from memq.alerts.summary import Covered, summary_body, summary_key
from memq.config import load_settings
from memq.metrics.exporter import registry_for
from memq.store import repository as repo
from memq.store import schema
from memq.store.db import make_engine
from memq.store.orm import Alert, AlertSummary, Run
from tests.conftest import memq_environ, temp_pg_database
from tests.metrics.history import add_run
from tests.metrics.receiver import Receiver
from tests.metrics.scrape import Samples

HOUR = dt.timedelta(seconds=outbox.JOB_WINDOW_S)
# 30 runs of one job: 18 OOMs of capacity, 7 of fragmentation, 5 leaks (no OOM)
MIX = ["capacity"] * 18 + ["fragmentation"] * 7 + ["leak"] * 5


@pytest.fixture(autouse=True)
def _no_summaries_left(request):
    # tests/conftest.py empties the shared PostgreSQL database from `runs` down (alerts cascade);
    # alert_summaries references nothing, so it is emptied here, before and after
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


def _add_runs(store, prefix: str, causes: list[str], job: str = "noisy") -> None:
    with store.session() as s:
        for i, cause in enumerate(causes):
            if cause == "leak":
                add_run(s, f"{prefix}-{i:02d}", cause="leak", job=job)
            else:
                add_run(s, f"{prefix}-{i:02d}", status="oom", cause=cause, oom_count=1, job=job)


def _alerts(store) -> list[Alert]:
    with store.session() as s:
        return list(s.execute(select(Alert).order_by(Alert.id)).scalars())


def _summaries(store) -> list[AlertSummary]:
    with store.session() as s:
        return list(s.execute(select(AlertSummary).order_by(AlertSummary.id)).scalars())


def _is_summary(req: dict) -> bool:
    b = req["body"]
    return "more alert" in b.get("text", "") or b.get("commonLabels", {}).get("alertname") == "MemqAlertsSummarised"


def _cause_of(req: dict) -> tuple[str, str]:
    """(kind, cause) of a single-verdict alert as the receiver got it (Slack text or Alertmanager labels)."""
    b = req["body"]
    if "alerts" in b:
        lab = b["alerts"][0]["labels"]
        return {"MemqOOM": "oom", "MemqLeak": "leak"}[lab["alertname"]], lab["cause"]
    line = b["text"].splitlines()[1]  # "cause: capacity (verdict oom:capacity)"
    verdict = line.split("(verdict ")[1].rstrip(")")
    return ("leak", "leak") if verdict == "leak" else ("oom", verdict.split(":")[1])


# ------------------------------------------------------------------------------------ the scenario


@pytest.mark.parametrize("fmt", ["slack", "alertmanager"])
def test_thirty_verdicts_three_alerts_then_one_summary_of_27(store, fmt):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=3, MEMQ_ALERT_FORMAT=fmt)
        _add_runs(store, "r", MIX)
        assert len(delivery.sweep(store, st, now=t0)) == 30  # one sweep finds all 30
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 3, "skipped": 27}
        # inside the hour: nothing more, however often the sweep comes
        for minutes in (1, 30, 59):
            assert delivery.deliver_due(store, st, now=t0 + dt.timedelta(minutes=minutes)) == {}
        assert _summaries(store) == []
        # the window opens again: one summary of the 27
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        assert delivery.deliver_due(store, st, now=t1) == {"summary_sent": 1}
        assert delivery.deliver_due(store, st, now=t1 + dt.timedelta(minutes=5)) == {}
        assert delivery.deliver_due(store, st, now=t1 + 2 * HOUR) == {}  # covered rows are never summarised again
    assert len(rx.requests) == 4 and len(rx.keys()) == 4
    singles, summaries = [r for r in rx.requests if not _is_summary(r)], [r for r in rx.requests if _is_summary(r)]
    assert len(singles) == 3 and len(summaries) == 1 and rx.requests[-1] is summaries[0]
    # what the summary must count: all 30 less the three that were sent on their own
    mix = Counter(("leak", "leak") if c == "leak" else ("oom", c) for c in MIX)
    expected = mix - Counter(_cause_of(r) for r in singles)
    assert sum(expected.values()) == 27

    rows = _alerts(store)
    suppressed = [a for a in rows if a.state == "suppressed"]
    (summary,) = _summaries(store)
    assert len(suppressed) == 27 and all(a.summarised_by == summary.id for a in suppressed)
    assert all(a.summarised_by is None for a in rows if a.state == "sent")
    assert summary.state == "sent" and summary.attempts == 1 and summary.covered == 27
    assert summary.idem_key == summary_key("c1", "noisy", [a.id for a in suppressed])
    assert summaries[0]["key"] == summary.idem_key
    b = summary.body
    assert b["count"] == 27 and b["kind"] == "oom" and b["kinds"] == {
        k: n for k, n in Counter(k for k, _ in expected.elements()).items()}
    assert {(c["kind"], c["cause"]): c["count"] for c in b["causes"]} == dict(expected)
    names = sorted(a.body["run"] for a in suppressed)
    by_time = [a.body["run"] for a in sorted(suppressed, key=lambda a: a.id)]
    assert {b["first_run"], b["last_run"]} <= set(names)
    assert (b["first_run"], b["last_run"]) == (by_time[0], by_time[-1])
    assert b["link"] == "https://memq.example/ui/runs?cluster=c1&job=noisy"

    doc = summaries[0]["body"]
    if fmt == "slack":
        lines = doc["text"].splitlines()
        assert lines[0] == "*memq: 27 more alerts of job c1 / noisy held back by the rate limit (3 per hour)*"
        for (kind, cause), n in expected.items():
            label = "memory leak" if kind == "leak" else f"CUDA out of memory ({cause})"
            assert f"{n} x {label}" in lines[1]
        assert f"first run {b['first_run']} at " in lines[2] and f"last run {b['last_run']} at " in lines[2]
        assert lines[3] == "<https://memq.example/ui/runs?cluster=c1&job=noisy|runs of c1 / noisy>"
    else:
        a = doc["alerts"][0]
        assert a["labels"] == {"alertname": "MemqAlertsSummarised", "severity": "critical", "cluster": "c1",
                               "job_name": "noisy"}
        assert a["annotations"]["count"] == "27" and a["annotations"]["runs_url"] == b["link"]
        assert a["annotations"]["first_run"] == b["first_run"] and a["annotations"]["last_run"] == b["last_run"]
        got = dict(part.split("=") for part in a["annotations"]["causes"].split(", "))
        assert {k: int(v) for k, v in got.items()} == {c: n for (_, c), n in expected.items()}
        assert a["startsAt"] == b["first_at"] and doc["groupKey"] == f"memq:{summary.idem_key}"
        assert doc["groupLabels"] == {"alertname": "MemqAlertsSummarised", "cluster": "c1", "job_name": "noisy"}


def test_the_exporter_still_counts_the_summarised_verdicts_as_suppressed(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=2)
        _add_runs(store, "x", ["capacity"] * 6)
        delivery.sweep(store, st, now=t0)
        delivery.deliver_due(store, st, now=t0)

        def scrape():
            return Samples(generate_latest(registry_for(st, store)).decode())

        before = scrape()
        assert delivery.deliver_due(store, st, now=t0 + HOUR + dt.timedelta(seconds=1)) == {"summary_sent": 1}
        after = scrape()
    assert before.get("memq_alerts", state="suppressed") == after.get("memq_alerts", state="suppressed") == 4
    assert after.get("memq_alerts", state="sent") == 2  # the summary is no verdict: the outbox gauge is unchanged
    verdicts = dict(cluster="c1", job_name="noisy", kind="oom", cause="capacity")
    assert before.get("memq_verdicts_total", **verdicts) == after.get("memq_verdicts_total", **verdicts) == 6
    # the summaries have their own gauge
    assert before.get("memq_alert_summaries", state="sent") == 0
    assert after.get("memq_alert_summaries", state="sent") == 1


def test_a_job_that_stays_over_its_limit_gets_a_summary_at_the_end_of_the_hour(store):
    """MAX_PER_HOUR=0: the window never opens; the summary comes an hour after the first verdict it covers."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=0)
        _add_runs(store, "z", ["capacity", "leak", "capacity", "fragmentation"])
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"skipped": 4}
        assert delivery.deliver_due(store, st, now=t0 + HOUR - dt.timedelta(seconds=1)) == {}
        assert delivery.deliver_due(store, st, now=t0 + HOUR + dt.timedelta(seconds=1)) == {"summary_sent": 1}
        # later verdicts of the still-silenced job: the next summary an hour after the first of them
        t2 = t0 + 2 * HOUR
        _add_runs(store, "z2", ["capacity"] * 2)
        delivery.sweep(store, st, now=t2)
        assert delivery.deliver_due(store, st, now=t2) == {"skipped": 2}
        assert delivery.deliver_due(store, st, now=t2 + HOUR / 2) == {}
        assert delivery.deliver_due(store, st, now=t2 + HOUR + dt.timedelta(seconds=1)) == {"summary_sent": 1}
    assert [s.covered for s in _summaries(store)] == [4, 2]
    docs = [r["body"]["text"] for r in rx.requests]
    assert docs[0].startswith("*memq: 4 more alerts of job c1 / noisy") and "(0 per hour)" in docs[0]
    assert "2 x CUDA out of memory (capacity)" in docs[0] and "1 x memory leak" in docs[0]
    assert docs[1].startswith("*memq: 2 more alerts") and "z2-00" in docs[1] and "z2-01" in docs[1]


# -------------------------------------------------------------------------- exactly one, none twice


def test_racing_senders_make_exactly_one_summary(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        rx.delay_s = 0.2
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=2)
        _add_runs(store, "race", ["capacity"] * 5 + ["fragmentation"] * 5)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 2, "skipped": 8}
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        barrier = threading.Barrier(4)
        results, errors = [], []

        def sender():
            try:
                barrier.wait()
                results.append(delivery.deliver_due(store, st, now=t1))  # each its own sessions
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=sender) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not errors
    (summary,) = _summaries(store)
    assert summary.covered == 8 and summary.state == "sent" and summary.attempts == 1
    assert sum(r.get("summary_sent", 0) for r in results) == 1
    summary_keys = {r["key"] for r in rx.requests if _is_summary(r)}
    assert summary_keys == {summary.idem_key} and rx.keys()[summary.idem_key] == 1
    assert sorted(a.summarised_by for a in _alerts(store) if a.state == "suppressed") == [summary.id] * 8


def test_a_second_summariser_of_the_same_job_waits_then_writes_nothing(store):
    """Below the delivery loop: summariser A has covered the rows but not committed when B starts on
    the same job in its own session. PostgreSQL: B waits on the job's lock, then finds nothing left.
    SQLite: B read the rows before A's commit (WAL readers do not wait), waits for the write lock,
    then inserts the same key, which the unique index keeps once: B writes nothing either way."""
    t0 = repo.utcnow()
    st = _st(store, "http://127.0.0.1:9/none", MEMQ_ALERT_JOB_MAX_PER_HOUR=1)
    _add_runs(store, "two", ["capacity"] * 4)
    delivery.sweep(store, st, now=t0)
    for a in _alerts(store):
        with store.session() as s:
            outbox.claim(s, st, a.id, now=t0)  # the first takes the slot, three are suppressed
    t1 = t0 + HOUR + dt.timedelta(seconds=1)
    second: list = []

    def summariser_b():
        try:
            with store.session() as b:
                second.append(outbox.summarise_job(b, st, "c1", "noisy", now=t1))
        except Exception as exc:  # noqa: BLE001 - reported below
            second.append(exc)

    with store.session() as a:
        first = outbox.summarise_job(a, st, "c1", "noisy", now=t1)
        assert first is not None
        t = threading.Thread(target=summariser_b)
        t.start()
        t.join(1.0)
        assert t.is_alive() and second == []  # B is held until A commits
    t.join(60)
    assert second == [None]
    (summary,) = _summaries(store)
    assert summary.idem_key == first and summary.covered == 3
    with store.session() as s:
        assert outbox.summarise_job(s, st, "c1", "noisy", now=t1 + 3 * HOUR) is None  # nothing left to cover


def test_nothing_is_summarised_twice_or_left_out_across_sweeps(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=2)
        _add_runs(store, "a", ["capacity"] * 10)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 2, "skipped": 8}
        # the window opens: a summary of 8; new verdicts come at the same time and take what is left
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        _add_runs(store, "b", ["fragmentation"] * 6)
        delivery.sweep(store, st, now=t1)
        out = delivery.deliver_due(store, st, now=t1)
        assert out == {"summary_sent": 1, "sent": 1, "skipped": 5}  # the summary took one of the two slots
        # sweep after sweep in the next hour: the window is full again, the 5 wait
        for minutes in range(0, 60, 7):
            delivery.sweep(store, st, now=t1 + dt.timedelta(minutes=minutes))
            assert delivery.deliver_due(store, st, now=t1 + dt.timedelta(minutes=minutes)) == {}
        t2 = t1 + HOUR + dt.timedelta(seconds=1)
        assert delivery.deliver_due(store, st, now=t2) == {"summary_sent": 1}
        for hours in (1, 2, 5):
            delivery.sweep(store, st, now=t2 + hours * HOUR)
            assert delivery.deliver_due(store, st, now=t2 + hours * HOUR) == {}
    first, second = _summaries(store)
    assert (first.covered, second.covered) == (8, 5)
    rows = _alerts(store)
    covered = {s.id: {a.body["run"] for a in rows if a.summarised_by == s.id} for s in (first, second)}
    assert covered[first.id] == {f"a-{i:02d}" for i in range(10)} - {a.body["run"] for a in rows if a.state == "sent"}
    assert len(covered[second.id]) == 5 and all(n.startswith("b-") for n in covered[second.id])
    assert all(a.summarised_by is not None for a in rows if a.state == "suppressed")  # none left out
    assert first.body["causes"] == [{"kind": "oom", "cause": "capacity", "count": 8,
                                     "label": "CUDA out of memory (capacity)"}]
    assert second.body["causes"][0]["cause"] == "fragmentation" and second.body["count"] == 5
    summary_reqs = [r for r in rx.requests if _is_summary(r)]
    assert [r["key"] for r in summary_reqs] == [first.idem_key, second.idem_key]
    assert len(rx.requests) == 2 + 1 + 1 + 1  # two alerts, a summary, one alert, a summary


def test_jobs_are_summarised_separately(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1)
        _add_runs(store, "p", ["capacity"] * 3, job="pretrain")
        _add_runs(store, "f", ["leak"] * 2, job="finetune")
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 2, "skipped": 3}
        assert delivery.deliver_due(store, st, now=t0 + HOUR + dt.timedelta(seconds=1)) == {"summary_sent": 2}
    by_job = {s.job: s for s in _summaries(store)}
    assert by_job["pretrain"].covered == 2 and by_job["finetune"].covered == 1
    assert by_job["finetune"].body["kind"] == "leak" and by_job["finetune"].body["link"].endswith("job=finetune")
    assert len({r["key"] for r in rx.requests}) == 4


# ------------------------------------------------------------------------------------ retries


def test_a_failed_summary_send_is_retried_with_the_same_key_and_document(store):
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1, MEMQ_ALERT_BACKOFF_MAX_S=60,
                 MEMQ_ALERT_FORMAT="alertmanager")
        _add_runs(store, "f", ["capacity"] * 4)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 1, "skipped": 3}
        rx.statuses = [503]
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        assert delivery.deliver_due(store, st, now=t1) == {"summary_pending": 1}
        (s1,) = _summaries(store)
        nxt = repo.to_utc(s1.next_attempt_at)
        assert s1.attempts == 1 and "503" in s1.last_error
        assert t1 + dt.timedelta(seconds=1) <= nxt <= t1 + dt.timedelta(seconds=2)  # back-off: 1 to 2 s
        assert delivery.deliver_due(store, st, now=t1 + dt.timedelta(milliseconds=500)) == {}  # not due yet
        # the retry: nothing new is summarised, the same document goes again under the same key
        assert delivery.deliver_due(store, st, now=nxt) == {"summary_sent": 1}
        # a sender dies after its POST, before recording it: the lease expires, the next one resends
        _add_runs(store, "g", ["capacity"] * 2)
        t2 = t1 + 3 * HOUR
        delivery.sweep(store, st, now=t2)
        assert delivery.deliver_due(store, st, now=t2) == {"sent": 1, "skipped": 1}
        t3 = t2 + HOUR + dt.timedelta(seconds=1)
        delivery.summarise(store, st, now=t3)
        sid = _summaries(store)[-1].id
        with store.session() as s:
            dying = outbox.claim_summary(s, st, sid, now=t3)
        assert send.post(st.alert_webhook_url, outbox.document(st, dying), dying.idem_key, 3).result == "sent"
        with store.session() as s:
            assert outbox.claim_summary(s, st, sid, now=t3) is None  # leased
        assert delivery.deliver_due(store, st, now=t3 + dt.timedelta(seconds=st.alert_lease_s + 1)) == \
            {"summary_sent": 1}
        with store.session() as s:
            assert outbox.finish(s, st, dying, send.Outcome("sent", "HTTP 200", 200)) is None  # not its own now
    first, second = _summaries(store)
    assert first.state == second.state == "sent" and (first.attempts, second.attempts) == (2, 2)
    assert (first.covered, second.covered) == (3, 1)
    reqs = [r for r in rx.requests if _is_summary(r)]
    assert [r["key"] for r in reqs] == [first.idem_key] * 2 + [second.idem_key] * 2
    assert reqs[0]["body"] == reqs[1]["body"] and reqs[2]["body"] == reqs[3]["body"]
    assert reqs[2]["body"]["commonAnnotations"]["count"] == "1"


def test_a_summary_out_of_attempts_fails_and_its_rows_stay_covered(store):
    t0 = repo.utcnow()
    with Receiver(statuses=[200, 500]) as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1, MEMQ_ALERT_MAX_ATTEMPTS=1)
        _add_runs(store, "h", ["capacity"] * 3)
        delivery.sweep(store, st, now=t0)
        delivery.deliver_due(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0 + HOUR + dt.timedelta(seconds=1)) == {"summary_failed": 1}
        assert delivery.deliver_due(store, st, now=t0 + 5 * HOUR) == {}
    (summary,) = _summaries(store)
    assert summary.state == "failed" and summary.last_error == "HTTP 500"
    assert len(rx.requests) == 2
    # MemqAlertsFailing reads this (deploy/monitoring/memq-rules.yml)
    m = Samples(generate_latest(registry_for(st, store)).decode())
    assert m.get("memq_alert_summaries", state="failed") == 1 and m.get("memq_alert_summaries", state="sent") == 0


# ------------------------------------------------------------------------------- pure, schema


@pytest.mark.parametrize("limit", [5, 6])
def test_a_flood_of_job_names_pages_at_most_the_global_limit(store, limit):
    """30 OOM runs under 30 job names (what forged names look like): MEMQ_ALERT_MAX_PER_HOUR pages in
    the hour, the rest suppressed; an hour later their per-job summaries go out within the same limit,
    the others wait, and every verdict is covered by exactly one page in the end."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=10, MEMQ_ALERT_MAX_PER_HOUR=limit)
        for i in range(30):
            _add_runs(store, f"f{i:02d}", ["capacity"], job=f"job-{i:02d}")
        assert len(delivery.sweep(store, st, now=t0)) == 30
        assert delivery.deliver_due(store, st, now=t0)["sent"] == limit
        later = delivery.deliver_due(store, st, now=t0 + dt.timedelta(minutes=30))
        assert "sent" not in later and "summary_sent" not in later  # summaries wait for the window
        assert len(rx.requests) == limit
        t = t0 + HOUR + dt.timedelta(seconds=1)
        hours = 0
        while len(rx.requests) < 30 and hours < 10:
            before = len(rx.requests)
            for minutes in range(0, 60, 5):  # the sweep runs all along; held summaries retry
                delivery.deliver_due(store, st, now=t + dt.timedelta(minutes=minutes))
            assert len(rx.requests) - before <= limit  # never more than the limit in any hour
            t += HOUR
            hours += 1
    assert len(rx.requests) == 30 and len(rx.keys()) == 30
    summaries = _summaries(store)
    assert len(summaries) == 30 - limit and all(x.state == "sent" and x.covered == 1 for x in summaries)
    rows = _alerts(store)
    assert sum(a.state == "sent" for a in rows) == limit
    assert all(a.summarised_by is not None for a in rows if a.state == "suppressed")
    assert all("MEMQ_ALERT_MAX_PER_HOUR" in (a.last_error or "") for a in rows if a.state == "suppressed")


def test_summary_wording_of_a_single_verdict():
    at = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
    body = summary_body(None, "solo", [Covered(7, "only", "near_miss", "near_miss", "healthy", at)], "", 5)
    assert body["link"] is None and body["kind"] == "near_miss" and body["span_s"] == 0
    doc = payload.render("slack", body, "k" * 40, body["first_at"])
    assert doc == {"text": "*memq: 1 more alert of job solo held back by the rate limit (5 per hour)*\n"
                           "causes: 1 x near miss (memory almost full), cause healthy\n"
                           "run only at 2026-12-01T10:00:00Z"}
    am = payload.render("alertmanager", body, "k" * 40, body["first_at"])
    assert am["alerts"][0]["labels"]["severity"] == "warning" and "runs_url" not in am["alerts"][0]["annotations"]
    assert summary_key(None, "solo", [3, 1, 2]) == summary_key(None, "solo", [1, 2, 3])
    assert summary_key(None, "solo", [1, 2, 3]) != summary_key(None, "solo", [1, 2])
    with pytest.raises(ValueError):
        summary_body("c", "j", [], "", 5)


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_alert_rows_survive_migration_0010_both_ways(kind, tmp_path, request):
    """0010 rebuilds `alerts` on SQLite (batch mode, to add the foreign key): rows written under 0009
    keep every column and are unsummarised after it; a downgrade keeps them too."""
    import contextlib

    if kind == "postgresql":
        request.getfixturevalue("pg_server")
        cm = temp_pg_database("d")
    else:
        cm = contextlib.nullcontext(f"sqlite:///{tmp_path / 'm.db'}")
    with cm as url:
        engine = make_engine(url)
        try:
            schema.upgrade(engine, "0009")
            with engine.begin() as conn:
                rid = conn.execute(text("INSERT INTO runs (name, labels, status) VALUES ('r', '{}', 'oom') "
                                        "RETURNING id")).scalar_one()
                conn.execute(text("INSERT INTO alerts (run_id, verdict, kind, cause, cluster, job, idem_key, body, "
                                  "state) VALUES (:r, 'oom:capacity', 'oom', 'capacity', 'c', 'j', 'k1', '{}', "
                                  "'suppressed')"), {"r": rid})
            schema.upgrade(engine)
            with engine.connect() as conn:
                row = conn.execute(text("SELECT run_id, verdict, state, idem_key, summarised_by FROM alerts")).one()
            assert tuple(row) == (rid, "oom:capacity", "suppressed", "k1", None)
            with engine.begin() as conn:
                sid = conn.execute(text("INSERT INTO alert_summaries (idem_key, covered, body) VALUES "
                                        "('s1', 1, '{}') RETURNING id")).scalar_one()
                conn.execute(text("UPDATE alerts SET summarised_by = :s"), {"s": sid})
            with pytest.raises(Exception, match="(?i)foreign key|violates"), engine.begin() as conn:
                conn.execute(text("UPDATE alerts SET summarised_by = :s"), {"s": sid + 1000})
            with pytest.raises(Exception, match="(?i)check"), engine.begin() as conn:
                conn.execute(text("UPDATE alerts SET state = 'bogus'"))  # the rebuilt table keeps its check
            schema.downgrade(engine, "0009")
            with engine.connect() as conn:
                assert conn.execute(text("SELECT count(*) FROM alerts WHERE state = 'suppressed'")).scalar_one() == 1
        finally:
            engine.dispose()


@pytest.mark.parametrize("fmt", ["slack", "alertmanager"])
def test_a_job_of_forecasts_over_its_limit_never_stops_another_jobs_pages(store, fmt):
    """Round 4, attack 1: eleven running runs of one leaky code base, each forecast to run out of
    memory within the alert horizon, pass their job's hourly limit. An hour later their summary is built (a
    summary of forecasts only), goes out, and another team's OOM recorded after it is paged in the
    same sweep: no verdict kind can fail a summary, and no row blocks the others."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=10, MEMQ_ALERT_FORMAT=fmt)
        with store.session() as s:
            for i in range(11):
                rid = add_run(s, f"leaky-{i:02d}", job="leaky")
                # 5 h ahead: an hour later it is still more than half as far (no second forecast page)
                s.execute(Run.__table__.update().where(Run.id == rid)
                          .values(oom_forecast_at=repo.db_time(s, t0 + 5 * HOUR)))
        assert len(delivery.sweep(store, st, now=t0)) == 11
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 10, "skipped": 1}
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        with store.session() as s:
            add_run(s, "other-team-oom", job="victim", status="oom", cause="capacity", oom_count=1)
        delivery.sweep(store, st, now=t1)
        assert delivery.deliver_due(store, st, now=t1) == {"summary_sent": 1, "sent": 1}
    (summary,) = _summaries(store)
    assert summary.body["kind"] == "forecast" and summary.body["kinds"] == {"forecast": 1}
    assert [c["label"] for c in summary.body["causes"]] == ["out of memory forecast"]
    runs = [r["body"] for r in rx.requests]
    assert any("other-team-oom" in str(b) for b in runs)


def test_summaries_rank_every_verdict_kind_and_tolerate_an_unknown_one():
    """Every kind a verdict can have orders a summary (a forecast is more severe than a leak and less
    than an OOM); a kind this version does not know, from a newer writer, ranks last."""
    from memq.alerts.verdict import KINDS, SEVERITY_ORDER
    assert sorted(SEVERITY_ORDER) == sorted(KINDS)
    at = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.UTC)
    for kind in KINDS:
        body = summary_body("c", "j", [Covered(1, "r", kind, kind, "leak", at)], "", 5)
        assert body["kind"] == kind and body["count"] == 1
    mixed = [Covered(1, "a", "leak", "leak", "leak", at), Covered(2, "b", "forecast:1", "forecast", "leak", at),
             Covered(3, "c", "x", "from_the_future", None, at)]
    body = summary_body("c", "j", mixed, "", 5)
    assert body["kind"] == "forecast" and list(body["kinds"]) == ["forecast", "leak", "from_the_future"]


def test_a_summary_that_cannot_be_built_blocks_neither_other_jobs_nor_alerts(store, monkeypatch):
    """One job whose summary raises (whatever the bug) is logged and skipped: another job's summary
    and every due alert still go out in the same sweep."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_JOB_MAX_PER_HOUR=1)
        _add_runs(store, "bad", ["capacity", "capacity"], job="broken")
        _add_runs(store, "good", ["capacity", "capacity"], job="fine")
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 2, "skipped": 2}
        real = outbox.summary_body

        def summary_body_failing_for_broken(cluster, job, *a, **kw):
            if job == "broken":
                raise RuntimeError("a bug in one job's summary")
            return real(cluster, job, *a, **kw)

        monkeypatch.setattr(outbox, "summary_body", summary_body_failing_for_broken)
        t1 = t0 + HOUR + dt.timedelta(seconds=1)
        with store.session() as s:
            add_run(s, "fresh", job="third", status="oom", cause="capacity", oom_count=1)
        delivery.sweep(store, st, now=t1)
        assert delivery.deliver_due(store, st, now=t1) == {"summary_sent": 1, "sent": 1}
    assert [x.job for x in _summaries(store)] == ["fine"]


HOSTILE = "c-1 <!channel> URGENT <https://evil.example/login|memq: re-authenticate here>"


@pytest.mark.parametrize("fmt", ["slack", "alertmanager"])
def test_names_cannot_ping_or_link_from_an_alert(store, fmt):
    """Round 4, attack 4: a run, cluster and job named with Slack markup page as plain text: no
    `<!channel>`, no disguised link; the only link in the Slack text is memq's own run page; an
    Alertmanager label carries the name as a printable string, cut at MAX_LABEL_CHARS."""
    t0 = repo.utcnow()
    with Receiver() as rx:
        st = _st(store, rx.url, MEMQ_ALERT_FORMAT=fmt)
        with store.session() as s:
            add_run(s, HOSTILE, cluster="<!here>", job="j\n<!everyone>" + "x" * 180, status="oom",
                    cause="capacity", oom_count=1)
        delivery.sweep(store, st, now=t0)
        assert delivery.deliver_due(store, st, now=t0) == {"sent": 1}
    body = rx.requests[0]["body"]
    if fmt == "slack":
        text = body["text"]
        for markup in ("<!channel>", "<!here>", "<!everyone>", "<https://evil"):
            assert markup not in text
        assert "&lt;!channel&gt;" in text and "&lt;https://evil.example/login|memq: re-authenticate here&gt;" in text
        links = [part.split(">")[0] for part in text.split("<")[1:]]
        assert len(links) == 1 and links[0].startswith("https://memq.example/ui/runs/c-1%20%3C%21channel%3E")
        assert "\n<!everyone>" not in text and text.count("\n") == 4  # title, cause, evidence, advice, link
    else:
        labels = body["alerts"][0]["labels"]
        assert labels["run"] == HOSTILE and labels["cluster"] == "<!here>"
        assert labels["job_name"].startswith("j\ufffd<!everyone>") and "\n" not in labels["job_name"]


def test_slack_escaping_is_slacks_own():
    assert payload.slack_text("a & b <c> d\ne") == "a &amp; b &lt;c&gt; d e"
    assert payload.slack_url("https://x/runs/a|b>c") == "https://x/runs/a%7Cb%3Ec"
