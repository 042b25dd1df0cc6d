"""analysis_results.digest: what a run diagnosis needs of an earlier snapshot.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 08:30 UTC

A run-level diagnosis reads every snapshot of the run; with the digest of each (a few KB of figures
and live blocks, profiler/analysis/per_snapshot.py) stored beside its analysis, it decodes only the
last blob instead of all of them. NULL for rows written before this revision: those are decoded from
the blob store as before, and their digest is filled in then.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    with op.batch_alter_table("analysis_results") as batch:
        batch.add_column(sa.Column("digest", JSON_DOC, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("analysis_results") as batch:
        batch.drop_column("digest")
