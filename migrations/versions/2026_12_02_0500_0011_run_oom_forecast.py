"""runs.oom_forecast_step, runs.oom_forecast_at: the run's OOM forecast, for listings and the exporter.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 05:00 UTC

The forecast itself is in run_diagnoses.result (`forecast`); these two columns copy the step and the
wall-clock moment of the rank that runs out first, so `memq runs` and `memq_run_oom_eta_seconds` need no
JSON read per run. NULL where no OOM is expected (and for runs analysed before this revision).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("oom_forecast_step", sa.BigInteger(), nullable=True))
    op.add_column("runs", sa.Column("oom_forecast_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    # Plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+ and PostgreSQL): batch mode would rebuild `runs` on
    # SQLite, and dropping the old table cascades to every table that references it (alerts, snapshots).
    op.drop_column("runs", "oom_forecast_at")
    op.drop_column("runs", "oom_forecast_step")
