"""`memq db upgrade | downgrade | current`: the schema of the run history database."""

from __future__ import annotations

import click

from memq.cli._listing import write_json
from memq.config import load_settings, redact_url
from memq.errors import SchemaOutOfDate
from memq.store import schema
from memq.store.db import make_engine


def _engine():
    settings = load_settings()
    engine = make_engine(settings.database_url)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.call_on_close(engine.dispose)
    return engine


def _where(engine) -> str:
    return redact_url(engine.url.render_as_string(hide_password=True))


@click.group()
def db() -> None:
    """Create or migrate the run history database (MEMQ_DATABASE_URL)."""


@db.command()
@click.argument("revision", default="head")
def upgrade(revision: str) -> None:
    """Apply migrations up to REVISION (default: the newest)."""
    engine = _engine()
    before = schema.current_revision(engine)
    schema.upgrade(engine, revision)
    after = schema.current_revision(engine)
    if before == after:
        click.echo(f"{_where(engine)}: already at {after}")
    else:
        click.echo(f"{_where(engine)}: upgraded {before or 'empty'} -> {after}")


@db.command()
@click.argument("revision", default="-1")
def downgrade(revision: str) -> None:
    """Revert migrations down to REVISION (default: one step; `base` removes every table)."""
    engine = _engine()
    before = schema.current_revision(engine)
    schema.downgrade(engine, revision)
    after = schema.current_revision(engine)
    click.echo(f"{_where(engine)}: downgraded {before or 'empty'} -> {after or 'base'}")


@db.command()
@click.option("--json", "as_json", is_flag=True)
def current(as_json: bool) -> None:
    """Show the database's schema revision and this memq's; exit 3 when they differ."""
    engine = _engine()
    cur, head = schema.current_revision(engine), schema.head_revision()
    doc = {"database": _where(engine), "current": cur, "head": head, "up_to_date": cur == head}
    if as_json:
        write_json(doc)
    else:
        state = "up to date" if cur == head else "OUT OF DATE"
        click.echo(f"{doc['database']}: revision {cur or 'none'} (this memq: {head}) {state}")
    if cur != head:
        raise SchemaOutOfDate(f"schema revision {cur or 'none'} != {head}", hint="run `memq db upgrade`")
