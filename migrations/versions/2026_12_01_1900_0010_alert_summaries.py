"""alert_summaries, alerts.summarised_by: one alert per job for the verdicts its rate limit held back.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 19:00 UTC

A verdict beyond MEMQ_ALERT_JOB_MAX_PER_HOUR stays `suppressed` (the exporter counts it as before);
when the job's window opens again, one summary row covers all of them (counts per cause, first and
last run) and goes through the same claim / send / retry as an alert (profiler/alerts/outbox.py).
`alerts.summarised_by` marks the rows a summary covered, so none is summarised twice or left out.
Written out in full (no imports from memq.store.orm).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATES = "state IN ('pending', 'sending', 'sent', 'failed')"


def upgrade() -> None:
    op.create_table(
        "alert_summaries",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("cluster", sa.String(length=200), nullable=True),
        sa.Column("job", sa.String(length=200), nullable=True),
        sa.Column("idem_key", sa.String(length=64), nullable=False),
        sa.Column("covered", sa.Integer(), nullable=False),
        sa.Column("body", JSON_DOC, nullable=False),
        sa.Column("state", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claim_token", sa.String(length=36), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("CURRENT_TIMESTAMP"),
                  nullable=False),
        sa.Column("claimed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(STATES, name=op.f("ck_alert_summaries__state")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alert_summaries")),
        sa.UniqueConstraint("idem_key", name=op.f("uq_alert_summaries__idem_key")),
    )
    op.create_index(op.f("ix_alert_summaries__state_next_attempt_at"), "alert_summaries",
                    ["state", "next_attempt_at"])
    op.create_index(op.f("ix_alert_summaries__cluster_job_claimed_at"), "alert_summaries",
                    ["cluster", "job", "claimed_at"])
    # batch mode: SQLite adds a foreign key only by rebuilding the table (rows are copied)
    with op.batch_alter_table("alerts") as batch:
        batch.add_column(sa.Column("summarised_by", BIG_ID, nullable=True))
        batch.create_foreign_key(op.f("fk_alerts__summarised_by__alert_summaries"), "alert_summaries",
                                 ["summarised_by"], ["id"])
        batch.create_index(op.f("ix_alerts__state_summarised_by"), ["state", "summarised_by"])


def downgrade() -> None:
    with op.batch_alter_table("alerts") as batch:
        batch.drop_index(op.f("ix_alerts__state_summarised_by"))
        batch.drop_constraint(op.f("fk_alerts__summarised_by__alert_summaries"), type_="foreignkey")
        batch.drop_column("summarised_by")
    op.drop_index(op.f("ix_alert_summaries__cluster_job_claimed_at"), table_name="alert_summaries")
    op.drop_index(op.f("ix_alert_summaries__state_next_attempt_at"), table_name="alert_summaries")
    op.drop_table("alert_summaries")
