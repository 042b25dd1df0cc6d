"""stat_samples partitioned by UTC day on PostgreSQL (SQLite: unchanged).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 09:10 UTC

Retention then drops whole days instead of deleting ~86 million rows a day one by one at 10,000 GPUs
(profiler/store/partitions.py). The table is rebuilt: existing rows are copied into a partition per
day they cover (plus the default partition for anything else), so on a large stat_samples table plan
for the time of one full copy. Written out in full, like 0001, so later model changes cannot alter it.
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

COLUMNS = """
    run_id BIGINT NOT NULL,
    rank INTEGER NOT NULL,
    sampled_at TIMESTAMP WITH TIME ZONE NOT NULL,
    step BIGINT,
    epoch INTEGER,
    allocated_bytes BIGINT,
    reserved_bytes BIGINT,
    active_bytes BIGINT,
    inactive_split_bytes BIGINT,
    alloc_retries INTEGER,
    oom_count INTEGER,
    CONSTRAINT pk_stat_samples PRIMARY KEY (run_id, rank, sampled_at)"""
ALL = ("run_id, rank, sampled_at, step, epoch, allocated_bytes, reserved_bytes, active_bytes, "
       "inactive_split_bytes, alloc_retries, oom_count")


def _day_bounds(day: dt.date) -> tuple[str, str]:
    lo = dt.datetime.combine(day, dt.time(), dt.timezone.utc)
    return lo.isoformat(), (lo + dt.timedelta(days=1)).isoformat()


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    conn = op.get_bind()
    op.execute("ALTER TABLE stat_samples RENAME TO stat_samples_unpartitioned")
    op.execute("ALTER TABLE stat_samples_unpartitioned RENAME CONSTRAINT pk_stat_samples TO pk_stat_samples_old")
    op.execute(f"CREATE TABLE stat_samples ({COLUMNS}) PARTITION BY RANGE (sampled_at)")
    op.execute("CREATE TABLE stat_samples_default PARTITION OF stat_samples DEFAULT")
    days = conn.execute(sa.text("SELECT DISTINCT (sampled_at AT TIME ZONE 'UTC')::date "
                                "FROM stat_samples_unpartitioned ORDER BY 1")).scalars().all()
    for day in days:
        lo, hi = _day_bounds(day)
        op.execute(f"CREATE TABLE stat_samples_p{day:%Y%m%d} PARTITION OF stat_samples "
                   f"FOR VALUES FROM ('{lo}') TO ('{hi}')")
    op.execute(f"INSERT INTO stat_samples ({ALL}) SELECT {ALL} FROM stat_samples_unpartitioned")
    op.execute("DROP TABLE stat_samples_unpartitioned")


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute("ALTER TABLE stat_samples RENAME TO stat_samples_partitioned")
    op.execute("ALTER TABLE stat_samples_partitioned RENAME CONSTRAINT pk_stat_samples TO pk_stat_samples_new")
    op.execute(f"CREATE TABLE stat_samples ({COLUMNS})")
    op.execute(f"INSERT INTO stat_samples ({ALL}) SELECT {ALL} FROM stat_samples_partitioned")
    op.execute("DROP TABLE stat_samples_partitioned")  # its partitions go with it
