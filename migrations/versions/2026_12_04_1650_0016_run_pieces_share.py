"""runs.pieces_share: the run lists' `in pieces` column.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-04 16:50 UTC

At the OOM, the share of reserved memory that was free in pieces (analysis/memory.py `pieces_share`);
NULL for a run without an OOM. It replaces the fragmentation ratio in the lists, which ranked healthy
runs (0.76-0.79 between steps) above a real fragmentation OOM (0.55). Filled when a run's diagnosis is
(re)computed (`memq reanalyze`). Plain ADD/DROP COLUMN.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("pieces_share", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "pieces_share")
