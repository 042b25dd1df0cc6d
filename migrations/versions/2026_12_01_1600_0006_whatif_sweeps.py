"""whatif_sweeps: the standard allocator-settings sweep of each OOM snapshot, replayed by a worker.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 16:00 UTC

One row per (snapshot bytes, analyzer version, context): the context key hashes what the replay used
besides the snapshot (the run's limit, the earlier snapshots that seeded it, whether the run is known
to have run out of memory there), so a rerun with the same inputs replaces nothing and adds nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "whatif_sweeps",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("analyzer_version", sa.String(length=64), nullable=False),
        sa.Column("context_key", sa.String(length=64), server_default="", nullable=False),
        sa.Column("limit_bytes", sa.BigInteger(), nullable=True),
        sa.Column("result", JSON_DOC, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("CURRENT_TIMESTAMP"),
                  nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_whatif_sweeps")),
        sa.UniqueConstraint("sha256", "analyzer_version", "context_key",
                            name=op.f("uq_whatif_sweeps__sha256_analyzer_version_context_key")),
    )


def downgrade() -> None:
    op.drop_table("whatif_sweeps")
