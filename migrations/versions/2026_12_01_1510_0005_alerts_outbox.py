"""alerts: the outbox of webhook alerts, one row per (run, verdict).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 15:10 UTC

A verdict (an OOM, a leak, a near miss) is recorded here in the same database as the run, then a
worker claims the row with a lease and sends it (profiler/alerts/outbox.py). The unique (run_id,
verdict) is what makes one verdict alert once however many sweeps or workers find it.
Written out in full (no imports from memq.store.orm).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
STATES = "state IN ('pending', 'sending', 'sent', 'failed', 'suppressed', 'recorded')"


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("verdict", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("cause", sa.String(length=32), nullable=True),
        sa.Column("cluster", sa.String(length=200), nullable=True),
        sa.Column("job", sa.String(length=200), nullable=True),
        sa.Column("idem_key", sa.String(length=64), nullable=False),
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
        sa.CheckConstraint(STATES, name=op.f("ck_alerts__state")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_alerts__run_id__runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_alerts")),
        sa.UniqueConstraint("idem_key", name=op.f("uq_alerts__idem_key")),
        sa.UniqueConstraint("run_id", "verdict", name=op.f("uq_alerts__run_id_verdict")),
    )
    op.create_index(op.f("ix_alerts__state_next_attempt_at"), "alerts", ["state", "next_attempt_at"])
    op.create_index(op.f("ix_alerts__cluster_job_claimed_at"), "alerts", ["cluster", "job", "claimed_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_alerts__cluster_job_claimed_at"), table_name="alerts")
    op.drop_index(op.f("ix_alerts__state_next_attempt_at"), table_name="alerts")
    op.drop_table("alerts")
