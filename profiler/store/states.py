"""The states of the store's work tables, as plain tuples (no SQLAlchemy): the ORM's CHECK constraints
and the exporter's gauges read the same ones."""

#: The analysis work queue: pending -> running -> done | failed.
SNAPSHOT_STATES = ("pending", "running", "done", "failed")
#: An alert: recorded (no webhook), pending -> sending -> sent | failed, or suppressed by a rate limit.
ALERT_STATES = ("pending", "sending", "sent", "failed", "suppressed", "recorded")
#: A summary of suppressed alerts: pending -> sending -> sent | failed.
SUMMARY_STATES = ("pending", "sending", "sent", "failed")
