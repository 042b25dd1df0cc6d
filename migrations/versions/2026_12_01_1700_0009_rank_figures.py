"""rank_figures: each rank's own exit figures (run peaks, last step, limit, per-step peak summary).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 17:00 UTC

A data-parallel run fails on one rank and the launcher tears the others down; the comparison across
ranks (profiler/analysis/ranks.py) needs the figures of the ranks that took no snapshot.
Written out in full (no imports from memq.store.orm).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "rank_figures",
        sa.Column("run_id", BIG_ID, nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=True),
        sa.Column("peak_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("peak_reserved_bytes", sa.BigInteger(), nullable=True),
        sa.Column("figures", JSON_DOC, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_rank_figures__run_id__runs"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "rank", name=op.f("pk_rank_figures")),
    )


def downgrade() -> None:
    op.drop_table("rank_figures")
