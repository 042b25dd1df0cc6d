"""stat_samples: no foreign key to runs (ingest throughput).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 05:30 UTC

stat_samples is the high-volume, append-only table (millions of rows). The row-level foreign-key
check to runs cost about half of PostgreSQL's insert time in benchmarks/bench_history.py, so the
table keeps run_id without the constraint; repository.delete_run removes a run's samples first.
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

NAMING = {
    "ix": "ix_%(table_name)s__%(column_0_N_name)s",
    "uq": "uq_%(table_name)s__%(column_0_N_name)s",
    "ck": "ck_%(table_name)s__%(constraint_name)s",
    "fk": "fk_%(table_name)s__%(column_0_name)s__%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def upgrade() -> None:
    with op.batch_alter_table("stat_samples", naming_convention=NAMING) as batch:
        batch.drop_constraint("fk_stat_samples__run_id__runs", type_="foreignkey")


def downgrade() -> None:
    with op.batch_alter_table("stat_samples", naming_convention=NAMING) as batch:
        batch.create_foreign_key("fk_stat_samples__run_id__runs", "runs", ["run_id"], ["id"], ondelete="CASCADE")
