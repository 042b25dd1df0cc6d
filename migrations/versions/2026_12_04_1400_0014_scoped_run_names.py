"""Run names scoped by principal: runs created by a signed envelope are renamed `<owner>/<name>`.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 14:00 UTC

With a keyring the dispatcher stores the run a signed envelope names as `<principal>/<run>`
(profiler/identity.py, scoped_run), so no key can claim another principal's run name. Runs written
before (`owner` set) are renamed the same way, so their owner's next envelopes find them, where the
scoped name fits runs.name (200 characters) and is not taken; any other keeps its name and stays bound
to its owner (the dispatcher's owner check). Unsigned runs (owner NULL) keep their names. The
downgrade strips the prefix again where the bare name is free.
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("UPDATE runs SET name = owner || '/' || name WHERE owner IS NOT NULL "
               "AND substr(name, 1, length(owner) + 1) <> owner || '/' "
               "AND length(owner) + 1 + length(name) <= 200 "
               "AND NOT EXISTS (SELECT 1 FROM runs r2 WHERE r2.name = runs.owner || '/' || runs.name)")


def downgrade() -> None:
    op.execute("UPDATE runs SET name = substr(name, length(owner) + 2) WHERE owner IS NOT NULL "
               "AND substr(name, 1, length(owner) + 1) = owner || '/' "
               "AND NOT EXISTS (SELECT 1 FROM runs r2 WHERE r2.name = substr(runs.name, length(runs.owner) + 2))")
