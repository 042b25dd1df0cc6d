"""The alert outbox: verdicts recorded in SQL, claimed with a lease, sent, and the outcome recorded.

What "exactly once" means here. For each (run, verdict) there is one row (unique key), so a verdict
is recorded once however many sweeps, hooks or workers find it at the same time. The row is sent
by whoever claims it: the claim is one conditional UPDATE (pending and due, or sending with an
expired lease) that sets a fresh `claim_token`, so of two racing workers one wins and the other
sends nothing. The winner POSTs, then records `sent` only if it still holds the token. A sender
that dies after the receiver got the POST but before `sent` was committed (SIGKILL, a lost
database connection) leaves the row `sending`; when its lease (MEMQ_ALERT_LEASE_S, longer than the
POST timeout) expires, the next sweep claims it and POSTs the same document again with the same
`Idempotency-Key`. So the receiver gets each verdict at least once, and more than once only after
such a failure, always under one key: a receiver that drops a key it has already accepted (the
test's receiver does; Alertmanager-shaped receivers can key on `groupKey`) handles each verdict
exactly once. A plain Slack webhook ignores the header: there a crash in that window, and only
there, shows a message twice. A verdict is never lost once recorded: until `sent`, `failed`
(refused by the receiver, or MEMQ_ALERT_MAX_ATTEMPTS used up) or `suppressed` (rate limit) it is
pending, sending or retried by the beat sweep.

Rate limits, decided at claim time and serialised per job (a PostgreSQL advisory lock on the job;
SQLite serialises writers anyway), so two workers cannot both take the last slot:
- per run: a run's next verdict is held back until MEMQ_ALERT_RUN_INTERVAL_S after its previous
  alert was claimed (then sent; nothing is dropped);
- per job: at most MEMQ_ALERT_JOB_MAX_PER_HOUR alerts claimed per (cluster, job) in any hour;
  verdicts beyond that are `suppressed`: kept, counted by the exporter, not sent one by one (a job
  whose 200 runs all fail in one sweep pages ten times, not 200), but summarised (below).
Verdicts recorded while no webhook is configured are `recorded` (never sent later: they would
arrive as a stale flood the day a URL is set).

Summaries: what the per-job limit held back is not lost on the person paged. Once the job's window
opens again (fewer than MEMQ_ALERT_JOB_MAX_PER_HOUR alerts claimed in the last hour), or at the
latest an hour after the oldest verdict it covers (a job that keeps its window full, or a limit
of 0, still gets one summary per hour), `summarise_job` records ONE row in `alert_summaries` for
the (cluster, job) covering every suppressed verdict no summary covers yet: the count, the causes
with counts, the first and last run, the time span, the link to the job's runs list
(`<MEMQ_PUBLIC_URL>/runs?cluster=C&job=J`); summary.py words it, payload.py renders it for Slack
and Alertmanager (alertname MemqAlertsSummarised). In the same transaction the covered rows get
`summarised_by` = the summary (they stay `suppressed`, so the exporter's memq_alerts{state} and
memq_verdicts_total do not move). No verdict is covered twice and none is left out: the covering
UPDATE only takes rows whose `summarised_by` is NULL and the transaction is rolled back unless it
took every row it read; PostgreSQL serialises summarisers of a job with the same advisory lock as
the claims, and on SQLite a summariser that read before another's commit inserts the same key
(below) and writes nothing. The key is derived from the ids covered, so a crash between the POST
and `sent` resends the same document under the same Idempotency-Key, exactly as for an alert: a
summary is claimed (`claim_summary`), leased, retried with back-off and failed after
MEMQ_ALERT_MAX_ATTEMPTS like an alert (`finish`, `document` take either). No rate limit holds a
summary back, but it takes one of the job's slots in the hour it is claimed, so a job over its
limit pages at most MEMQ_ALERT_JOB_MAX_PER_HOUR times an hour (one more in an hour where new
verdicts took the reopened slots before the sweep summarised). A summary that ends `failed` keeps
its rows covered (they are not summarised again: its last_error says why).
"""

from __future__ import annotations

import datetime as dt
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from memq.alerts import payload
from memq.alerts.send import Outcome
from memq.alerts.summary import Covered, summary_body, summary_key
from memq.alerts.verdict import RunFacts, alert_body, forecast_verdict, idempotency_key, verdict_of
from memq.config import Settings
from memq.errors import ConfigError
from memq.store import outbox as rows
from memq.store import repository as repo
from memq.store.run_verdicts import verdict_result

JOB_WINDOW_S = 3600


def check_settings(st: Settings) -> None:
    if st.alert_format not in payload.FORMATS:
        raise ConfigError(f"MEMQ_ALERT_FORMAT must be one of {', '.join(payload.FORMATS)}, got {st.alert_format!r}")
    if not st.alert_lease_s >= 2 * st.alert_timeout_s:
        raise ConfigError("MEMQ_ALERT_LEASE_S must be at least twice MEMQ_ALERT_TIMEOUT_S (a lease outlives "
                          "the POST it covers, or a slow receiver gets the alert twice)")


def backoff_s(attempts: int, cap_s: float, rand: Callable[[], float] = random.random) -> float:
    """Wait before the next try after `attempts` tries: exponential (2 s, 4 s, ...) up to `cap_s`,
    with "equal jitter" (half fixed, half random) so that senders which failed together (a receiver
    outage) do not retry together, yet no retry comes sooner than half the step."""
    step = min(float(cap_s), 2.0 ** max(1, attempts))
    return step / 2 + rand() * step / 2


# ----------------------------------------------------------------------------------- recording


def _facts(r) -> RunFacts:
    return RunFacts(run_id=int(r.id), name=r.name, cluster=r.cluster, job=r.job, status=r.status,
                    primary_cause=r.primary_cause, oom_count=int(r.oom_count or 0),
                    peak_reserved_bytes=r.peak_reserved_bytes, limit_bytes=r.limit,
                    oom_forecast_at=_utc(r.oom_forecast_at))


def _utc(t: dt.datetime | None) -> dt.datetime | None:
    return t if t is None or t.tzinfo else t.replace(tzinfo=dt.UTC)  # SQLite hands back naive UTC


def _last_forecasts(session, run_ids: list[int]) -> dict[int, tuple[int, dt.datetime, dt.datetime]]:
    """Each run's latest forecast alert: (n, the OOM moment it gave, when it was recorded)."""
    out: dict[int, tuple[int, dt.datetime, dt.datetime]] = {}
    for rid, verdict, body, created in rows.forecast_alert_rows(session, run_ids):
        try:
            n = int(str(verdict).split(":", 1)[1])
            at = dt.datetime.fromisoformat((body or {})["oom_at"])
        except (IndexError, ValueError, KeyError, TypeError):
            continue
        if int(rid) not in out or n > out[int(rid)][0]:
            out[int(rid)] = (n, _utc(at), _utc(created))
    return out


def record_verdicts(session, st: Settings, run_ids: Iterable[int] | None = None,
                    now: dt.datetime | None = None) -> list[str]:
    """Record the current verdict of the given runs (default: every run updated within
    MEMQ_ALERT_LOOKBACK_H that may have one) where it is not recorded yet. Returns the new keys."""
    now = now or repo.utcnow()
    # only runs that can have a verdict: the filter mirrors verdict_of, so a sweep over a large
    # history reads the few interesting rows
    fetched = rows.verdict_candidates(session, run_ids, now - dt.timedelta(hours=st.alert_lookback_h),
                                      st.alert_headroom_pct / 100.0)
    candidates = []
    owners = {int(r.id): r.owner for r in fetched}
    facts = [_facts(r) for r in fetched]
    last = _last_forecasts(session, [f.run_id for f in facts if f.oom_forecast_at is not None]) if facts else {}
    for f in facts:
        v = verdict_of(f, st.alert_headroom_pct)
        if v is not None:
            candidates.append((f, v))
        fv = forecast_verdict(f.status, f.oom_forecast_at, now, st.forecast_alert_s, last.get(f.run_id))
        if fv is not None:
            candidates.append((f, fv))
    if not candidates:
        return []
    known = rows.recorded_verdicts(session, {f.run_id for f, _ in candidates})
    state = "pending" if st.alert_webhook_url else "recorded"
    new = []
    for f, v in candidates:
        if (f.run_id, v.key) in known:
            continue
        result = verdict_result(session, f.run_id, forecast=v.kind == "forecast")
        body = alert_body(f, v, result, st.public_url, st.alert_headroom_pct, now=_utc(now))
        key = idempotency_key(f.name, v.key)
        if rows.insert_alert(session, now, run_id=f.run_id, verdict=v.key, kind=v.kind, cause=v.cause,
                             cluster=f.cluster, job=f.job, owner=owners.get(f.run_id), idem_key=key, body=body,
                             state=state):
            new.append(key)
    return new


# ------------------------------------------------------------------------------------- claiming


@dataclass(frozen=True)
class Claim:
    id: int
    token: str
    idem_key: str
    body: dict[str, Any]
    attempts: int
    created_at: dt.datetime
    summary: bool = False  # an alert_summaries row (else an alerts row)


def due_ids(session, limit: int, now: dt.datetime | None = None) -> list[int]:
    return rows.due(session, limit, now or repo.utcnow())


def due_summary_ids(session, limit: int, now: dt.datetime | None = None) -> list[int]:
    return rows.due(session, limit, now or repo.utcnow(), summary=True)


def _job_recent(session, owner: str | None, cluster: str | None, job: str | None, now: dt.datetime,
                other_than: int | None = None) -> int:
    """Alerts of the job claimed in the last JOB_WINDOW_S: its verdicts' (suppressed ones never
    are) and its summaries' (a summary is a page too, so it takes a slot)."""
    return rows.job_recent(session, owner, cluster, job, now - dt.timedelta(seconds=JOB_WINDOW_S), other_than)


#: A summary held back by the limit of all jobs is tried again this much later.
GLOBAL_RETRY_S = 300


#: Pages an hour every principal keeps whatever the number of principals: with more principals than
#: MEMQ_ALERT_MAX_PER_HOUR the share rounded down to 0, and a team holding many keys (or a deployment
#: with one key per job) could fill the hour and hold every other team's first page until it drained
#: (tests/metrics/test_alert_round5.py). The cost: an hour may carry up to the limit plus one page per
#: principal with a verdict (bounded by the keyring).
MIN_SHARE = 1


def fair_share(max_per_hour: int, principals: int) -> int:
    """Pages of MEMQ_ALERT_MAX_PER_HOUR guaranteed to each principal with recent verdicts (at least
    MIN_SHARE)."""
    return max(MIN_SHARE, max_per_hour // max(1, principals))


def _global_room(session, st: Settings, owner: str | None, now: dt.datetime, *,
                 alert: int | None = None, summary: int | None = None) -> tuple[bool, str]:
    """Whether the limit of all jobs lets this page go, and if not why. It goes while the window of
    every principal holds fewer than MEMQ_ALERT_MAX_PER_HOUR pages, and in any case while its own
    principal has paged less than its fair share (the limit divided among the principals with recent
    verdicts): a principal that fills the window with its own volume cannot starve another's page.
    The cost: in an hour where one principal filled the window, the others' shares come on top of it
    (below twice the limit in all)."""
    since = now - dt.timedelta(seconds=JOB_WINDOW_S)
    every = rows.pages_since(session, since, alert=alert, summary=summary)
    if every < st.alert_max_per_hour:
        return True, ""
    share = fair_share(st.alert_max_per_hour, rows.principals_since(session, since))
    mine = rows.pages_since(session, since, owner=owner, alert=alert, summary=summary)
    if mine < share:
        return True, ""
    return False, (f"rate limit: {every} alerts of all jobs in the last hour (MEMQ_ALERT_MAX_PER_HOUR="
                   f"{st.alert_max_per_hour}), {mine} of them of this principal (its share: {share})")


def claim(session, st: Settings, alert_id: int, now: dt.datetime | None = None) -> Claim | None:
    """Take one alert for sending (see the module docstring). None when another sender has it, it
    is not due, it is held back or suppressed by a rate limit, or it is out of attempts (failed)."""
    now = now or repo.utcnow()
    token = str(uuid.uuid4())
    row = rows.take(session, alert_id, now, st.alert_lease_s, token)
    if row is None:
        return None
    if row.attempts > st.alert_max_attempts:
        rows.set_row(session, row.id, state="failed", lease_until=None,
                     last_error=f"gave up after {st.alert_max_attempts} attempts")
        return None
    rows.lock_job(session, row.owner, row.cluster, row.job)
    last_of_run = rows.last_claim_of_run(session, row.run_id, row.id)
    if last_of_run is not None:
        until = last_of_run + dt.timedelta(seconds=st.alert_run_interval_s)
        if until > now:
            rows.set_row(session, row.id, state="pending", lease_until=None, claim_token=None, claimed_at=None,
                         attempts=row.attempts - 1, next_attempt_at=repo.db_time(session, until))
            return None
    recent = _job_recent(session, row.owner, row.cluster, row.job, now, other_than=row.id)
    if recent >= st.alert_job_max_per_hour:
        rows.set_row(session, row.id, state="suppressed", lease_until=None, claim_token=None, claimed_at=None,
                     last_error=f"rate limit: {recent} alerts of this job in the last hour "
                                f"(MEMQ_ALERT_JOB_MAX_PER_HOUR={st.alert_job_max_per_hour})")
        return None
    rows.lock_global(session)
    room, why = _global_room(session, st, row.owner, now, alert=row.id)
    if not room:
        # a flood of forged or real job names cannot page more than this; held-back verdicts are
        # summarised per job as the job limit's are, and summaries wait for room in this window too
        rows.set_row(session, row.id, state="suppressed", lease_until=None, claim_token=None, claimed_at=None,
                     last_error=why)
        return None
    return Claim(id=int(row.id), token=token, idem_key=row.idem_key, body=dict(row.body),
                 attempts=int(row.attempts), created_at=repo.to_utc(row.created_at))


def finish(session, st: Settings, c: Claim, outcome: Outcome, now: dt.datetime | None = None,
           rand: Callable[[], float] = random.random) -> str | None:
    """Record what the POST did, if this sender still holds the claim. Returns the new state, or
    None when the lease was lost (another sender took the alert over)."""
    now = now or repo.utcnow()
    t = repo.db_time(session, now)
    if outcome.result == "sent":
        values: dict[str, Any] = {"state": "sent", "sent_at": t, "last_error": None}
    elif outcome.result == "retry" and c.attempts < st.alert_max_attempts:
        wait = backoff_s(c.attempts, st.alert_backoff_max_s, rand)
        values = {"state": "pending", "next_attempt_at": t + dt.timedelta(seconds=wait),
                  "last_error": outcome.detail[:2000]}
    else:
        values = {"state": "failed", "last_error": outcome.detail[:2000]}
    return values["state"] if rows.finish_row(session, c.id, c.token, c.summary, **values) else None


def document(st: Settings, c: Claim) -> dict[str, Any]:
    # a summary fires from its first verdict on: the same instant on every resend, like an alert's
    starts = c.body["first_at"] if c.summary else c.created_at.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return payload.render(st.alert_format, c.body, c.idem_key, starts)


# ------------------------------------------------------------------------------------ summaries


def summary_candidates(session) -> list[tuple[str | None, str | None, str | None]]:
    """(cluster, job, principal) with suppressed verdicts no summary covers yet (cheap: an index on
    (state, summarised_by)); whether a summary is due is decided per job by `summarise_job`."""
    return rows.summary_candidates(session)


def summarise_job(session, st: Settings, cluster: str | None, job: str | None,
                  now: dt.datetime | None = None, owner: str | None = None) -> str | None:
    """Record the summary of the job's suppressed, not yet summarised verdicts if one is due (the
    module docstring says when). Returns its key, or None (not due, nothing to cover, or another
    sender covered the rows first: then this transaction is rolled back and writes nothing)."""
    now = now or repo.utcnow()
    rows.lock_job(session, owner, cluster, job)  # PostgreSQL: one summariser per job at a time
    # whether one is due first, from one aggregate: the sweep asks every 15 s while a busy job's
    # rows wait out their hour, and reads them only when they go out
    oldest = rows.oldest_uncovered(session, owner, cluster, job)
    if oldest is None:
        return None
    window_open = _job_recent(session, owner, cluster, job, now) < st.alert_job_max_per_hour
    if not window_open and oldest > now - dt.timedelta(seconds=JOB_WINDOW_S):
        return None  # still inside the hour that held them back: they wait, nothing is lost
    found = rows.uncovered_rows(session, owner, cluster, job)
    if not found:
        return None
    covered = [Covered(alert_id=int(r.id), run=r.name, verdict=r.verdict, kind=r.kind, cause=r.cause,
                       at=repo.to_utc(r.created_at)) for r in found]
    ids = [c.alert_id for c in covered]
    key = summary_key(cluster, job, ids)  # the ids are unique across principals: so is the key
    body = summary_body(cluster, job, covered, st.public_url, st.alert_job_max_per_hour)
    sid = rows.insert_summary(session, now, owner=owner, cluster=cluster, job=job, idem_key=key, covered=len(ids),
                              body=body)
    if sid is None:  # the same rows were summarised by another sender a moment ago
        session.rollback()
        return None
    if rows.cover(session, ids, sid) != len(ids):
        # another sender covered some of them (SQLite: no advisory lock): leave it to it
        session.rollback()
        return None
    return key


def claim_summary(session, st: Settings, summary_id: int, now: dt.datetime | None = None) -> Claim | None:
    """Take one summary for sending, as `claim` takes an alert: same lease, same attempts limit. The
    job's limit does not hold it back (it is what that limit owes the on-call person), but it takes a
    slot; the limit of all jobs (MEMQ_ALERT_MAX_PER_HOUR) makes it wait GLOBAL_RETRY_S at a time."""
    now = now or repo.utcnow()
    t = repo.db_time(session, now)
    token = str(uuid.uuid4())
    row = rows.take(session, summary_id, now, st.alert_lease_s, token, summary=True)
    if row is None:
        return None
    if row.attempts > st.alert_max_attempts:
        rows.set_row(session, row.id, summary=True, state="failed", lease_until=None,
                     last_error=f"gave up after {st.alert_max_attempts} attempts")
        return None
    # its claimed_at counts in the job's window: committed under the job's lock, as a claim's
    # count of that window is read under it
    rows.lock_job(session, row.owner, row.cluster, row.job)
    rows.lock_global(session)
    if not _global_room(session, st, row.owner, now, summary=row.id)[0]:
        # the window of all jobs is full: the summary waits (its rows stay covered by it)
        rows.set_row(session, row.id, summary=True, state="pending", lease_until=None, claim_token=None,
                     claimed_at=None, attempts=row.attempts - 1,
                     next_attempt_at=t + dt.timedelta(seconds=GLOBAL_RETRY_S))
        return None
    return Claim(id=int(row.id), token=token, idem_key=row.idem_key, body=dict(row.body),
                 attempts=int(row.attempts), created_at=repo.to_utc(row.created_at), summary=True)


def counts(session) -> dict[str, int]:
    return rows.counts(session)


def summary_counts(session) -> dict[str, int]:
    return rows.counts(session, summary=True)
