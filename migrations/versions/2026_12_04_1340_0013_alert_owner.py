"""Alert budgets per principal: alerts.owner, alert_summaries.owner.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 13:40 UTC

Alert rows and summaries carry the principal of their run, so rate limits count per
principal (profiler/alerts/outbox.py). Plain ADD/DROP COLUMN: a batch rebuild on SQLite would cascade.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("alerts", sa.Column("owner", sa.String(200), nullable=True))
    op.add_column("alert_summaries", sa.Column("owner", sa.String(200), nullable=True))
    op.execute("UPDATE alerts SET owner = (SELECT runs.owner FROM runs WHERE runs.id = alerts.run_id)")


def downgrade() -> None:
    op.drop_column("alert_summaries", "owner")
    op.drop_column("alerts", "owner")
