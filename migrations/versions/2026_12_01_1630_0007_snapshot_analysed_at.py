"""snapshots.analysed_at: when the snapshot's analysis was first attached (state done).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 16:30 UTC

`memq exporter`'s analysis latency histogram is analysed_at - created_at over the snapshots table
alone: the same figure from a join to analysis_results cost most of a scrape on a large history
(benchmarks/bench_exporter.py). NULL for rows done before this revision (left out of the histogram).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.add_column(sa.Column("analysed_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.drop_column("analysed_at")
