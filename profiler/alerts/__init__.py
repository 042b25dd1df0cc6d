"""Alerts on run verdicts: an OOM, a leak or a near miss, sent once per verdict to a webhook.

- `verdict.py`: pure: which verdict a run has, and what its alert says (cause, evidence line,
  recommendation, link to the run's page).
- `payload.py`: pure: the webhook bodies (Slack-compatible `{"text": ...}`, Alertmanager's shape).
- `outbox.py`: the `alerts` table: record verdicts, claim one with a lease, record the outcome;
  rate limits per run and per job, the summary of what the per-job limit held back; the delivery
  guarantee is stated there. Its statements are profiler/store/outbox.py's.
- `summary.py`: pure: what a summary says (count, causes with counts, first and last run, span, link).
- `send.py`: one HTTP POST with the Idempotency-Key header, classified as sent / retry / refused.
The Celery side (beat sweep, delivery task, the hook after a run diagnosis) is workers/alerts.py.
"""
