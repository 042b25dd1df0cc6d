"""runs.non_pytorch_bytes: device memory held outside the run's PyTorch when it started.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 14:00 UTC

The agent reads it at run_start (device total - device free - reserved). An uncapped run's limit is
its card less this, known before any OOM. Plain ADD/DROP COLUMN (a batch rebuild of `runs` on SQLite
would cascade to the tables that reference it).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("non_pytorch_bytes", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "non_pytorch_bytes")
