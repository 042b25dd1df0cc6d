"""Index on snapshots.analysed_at: `memq exporter` reads only the snapshots done since its last scrape.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 16:50 UTC
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(op.f("ix_snapshots__analysed_at"), "snapshots", ["analysed_at"])


def downgrade() -> None:
    op.drop_index(op.f("ix_snapshots__analysed_at"), table_name="snapshots")
