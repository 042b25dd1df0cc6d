"""runs.owner: the principal whose signed envelope created the run (profiler/identity.py).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 05:40 UTC

NULL for runs created unsigned (no keyring configured) or by `memq ingest`. Plain ADD/DROP COLUMN: a
batch rebuild of `runs` on SQLite would cascade to the tables that reference it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("owner", sa.String(200), nullable=True))


def downgrade() -> None:
    op.drop_column("runs", "owner")
