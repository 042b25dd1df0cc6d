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
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("oom_forecast_step", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("oom_forecast_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("oom_forecast_at")
        batch.drop_column("oom_forecast_step")
