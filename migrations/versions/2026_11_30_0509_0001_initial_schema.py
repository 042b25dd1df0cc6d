"""Initial schema: runs, snapshots, analysis_results, run_diagnoses, stat_samples, reports.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 05:09:20 UTC

Written out in full (no imports from memq.store.orm) so later model changes cannot alter what
this revision creates.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None

# JSONB on PostgreSQL, JSON text on SQLite; 64-bit ids that SQLite still auto-increments.
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table('analysis_results',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('analyzer_version', sa.String(length=64), nullable=False),
    sa.Column('context_key', sa.String(length=64), server_default='', nullable=False),
    sa.Column('reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('allocated_bytes', sa.BigInteger(), nullable=True),
    sa.Column('active_bytes', sa.BigInteger(), nullable=True),
    sa.Column('largest_free_block_bytes', sa.BigInteger(), nullable=True),
    sa.Column('fragmentation_ratio', sa.Float(), nullable=True),
    sa.Column('oom_requested_bytes', sa.BigInteger(), nullable=True),
    sa.Column('primary_cause', sa.String(length=32), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('result', JSON_DOC, nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_analysis_results')),
    sa.UniqueConstraint('sha256', 'analyzer_version', 'context_key', name=op.f('uq_analysis_results__sha256_analyzer_version_context_key'))
    )
    op.create_table('reports',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('report_date', sa.Date(), nullable=False),
    sa.Column('scope', sa.String(length=200), nullable=False),
    sa.Column('analyzer_version', sa.String(length=64), nullable=True),
    sa.Column('summary', JSON_DOC, nullable=False),
    sa.Column('path', sa.String(length=1000), nullable=True),
    sa.Column('generated_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_reports')),
    sa.UniqueConstraint('report_date', 'scope', name=op.f('uq_reports__report_date_scope'))
    )
    op.create_table('runs',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('job', sa.String(length=200), nullable=True),
    sa.Column('cluster', sa.String(length=200), nullable=True),
    sa.Column('host', sa.String(length=255), nullable=True),
    sa.Column('username', sa.String(length=200), nullable=True),
    sa.Column('project', sa.String(length=200), nullable=True),
    sa.Column('labels', JSON_DOC, nullable=False),
    sa.Column('torch_version', sa.String(length=64), nullable=True),
    sa.Column('cuda_version', sa.String(length=64), nullable=True),
    sa.Column('driver_version', sa.String(length=64), nullable=True),
    sa.Column('gpu_model', sa.String(length=128), nullable=True),
    sa.Column('gpu_memory_bytes', sa.BigInteger(), nullable=True),
    sa.Column('memory_limit_bytes', sa.BigInteger(), nullable=True),
    sa.Column('allocator_conf', sa.String(length=500), nullable=True),
    sa.Column('optimizer', sa.String(length=100), nullable=True),
    sa.Column('param_count', sa.BigInteger(), nullable=True),
    sa.Column('world_size', sa.Integer(), nullable=True),
    sa.Column('rank', sa.Integer(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('status', sa.String(length=16), server_default='running', nullable=False),
    sa.Column('primary_cause', sa.String(length=32), nullable=True),
    sa.Column('cause_confidence', sa.Float(), nullable=True),
    sa.Column('peak_reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('peak_allocated_bytes', sa.BigInteger(), nullable=True),
    sa.Column('fragmentation_ratio', sa.Float(), nullable=True),
    sa.Column('oom_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('snapshot_count', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.CheckConstraint("status IN ('running', 'completed', 'oom', 'crashed')", name=op.f('ck_runs__status')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs')),
    sa.UniqueConstraint('name', name=op.f('uq_runs__name'))
    )
    op.create_index(op.f('ix_runs__cluster_started_at'), 'runs', ['cluster', 'started_at'], unique=False)
    op.create_index(op.f('ix_runs__job_started_at'), 'runs', ['job', 'started_at'], unique=False)
    op.create_index(op.f('ix_runs__started_at'), 'runs', ['started_at'], unique=False)
    op.create_table('run_diagnoses',
    sa.Column('run_id', BIG_ID, nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('analyzer_version', sa.String(length=64), nullable=False),
    sa.Column('primary_cause', sa.String(length=32), nullable=True),
    sa.Column('confidence', sa.Float(), nullable=True),
    sa.Column('snapshot_count', sa.Integer(), nullable=False),
    sa.Column('peak_reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('peak_allocated_bytes', sa.BigInteger(), nullable=True),
    sa.Column('peak_composition', JSON_DOC, nullable=False),
    sa.Column('result', JSON_DOC, nullable=False),
    sa.Column('computed_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_run_diagnoses__run_id__runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', name=op.f('pk_run_diagnoses'))
    )
    op.create_table('snapshots',
    sa.Column('id', BIG_ID, autoincrement=True, nullable=False),
    sa.Column('run_id', BIG_ID, nullable=False),
    sa.Column('rank', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('epoch', sa.Integer(), nullable=True),
    sa.Column('trigger', sa.String(length=16), server_default='manual', nullable=False),
    sa.Column('taken_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('size_bytes', sa.BigInteger(), nullable=False),
    sa.Column('blob_ref', sa.String(length=300), nullable=True),
    sa.Column('source', sa.String(length=500), nullable=True),
    sa.Column('context', JSON_DOC, nullable=False),
    sa.Column('state', sa.String(length=16), server_default='pending', nullable=False),
    sa.Column('analyzer_version', sa.String(length=64), nullable=True),
    sa.Column('analysis_id', BIG_ID, nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('attempts', sa.Integer(), server_default=sa.text('0'), nullable=False),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('CURRENT_TIMESTAMP'), nullable=False),
    sa.CheckConstraint("state IN ('pending', 'running', 'done', 'failed')", name=op.f('ck_snapshots__state')),
    sa.CheckConstraint("trigger IN ('periodic', 'epoch_end', 'oom', 'manual', 'signal')", name=op.f('ck_snapshots__trigger')),
    sa.ForeignKeyConstraint(['analysis_id'], ['analysis_results.id'], name=op.f('fk_snapshots__analysis_id__analysis_results'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_snapshots__run_id__runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_snapshots')),
    sa.UniqueConstraint('run_id', 'rank', 'sha256', name=op.f('uq_snapshots__run_id_rank_sha256'))
    )
    op.create_index(op.f('ix_snapshots__analysis_id'), 'snapshots', ['analysis_id'], unique=False)
    op.create_index(op.f('ix_snapshots__run_id_rank_taken_at'), 'snapshots', ['run_id', 'rank', 'taken_at'], unique=False)
    op.create_index(op.f('ix_snapshots__sha256'), 'snapshots', ['sha256'], unique=False)
    op.create_index(op.f('ix_snapshots__state_lease_until'), 'snapshots', ['state', 'lease_until'], unique=False)
    op.create_table('stat_samples',
    sa.Column('run_id', BIG_ID, nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('sampled_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('step', sa.BigInteger(), nullable=True),
    sa.Column('epoch', sa.Integer(), nullable=True),
    sa.Column('allocated_bytes', sa.BigInteger(), nullable=True),
    sa.Column('reserved_bytes', sa.BigInteger(), nullable=True),
    sa.Column('active_bytes', sa.BigInteger(), nullable=True),
    sa.Column('inactive_split_bytes', sa.BigInteger(), nullable=True),
    sa.Column('alloc_retries', sa.Integer(), nullable=True),
    sa.Column('oom_count', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], name=op.f('fk_stat_samples__run_id__runs'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('run_id', 'rank', 'sampled_at', name=op.f('pk_stat_samples'))
    )


def downgrade() -> None:
    op.drop_table('stat_samples')
    op.drop_index(op.f('ix_snapshots__state_lease_until'), table_name='snapshots')
    op.drop_index(op.f('ix_snapshots__sha256'), table_name='snapshots')
    op.drop_index(op.f('ix_snapshots__run_id_rank_taken_at'), table_name='snapshots')
    op.drop_index(op.f('ix_snapshots__analysis_id'), table_name='snapshots')
    op.drop_table('snapshots')
    op.drop_table('run_diagnoses')
    op.drop_index(op.f('ix_runs__started_at'), table_name='runs')
    op.drop_index(op.f('ix_runs__job_started_at'), table_name='runs')
    op.drop_index(op.f('ix_runs__cluster_started_at'), table_name='runs')
    op.drop_table('runs')
    op.drop_table('reports')
    op.drop_table('analysis_results')
