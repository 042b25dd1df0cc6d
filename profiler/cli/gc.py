"""`memq gc [--dry-run] [--json]`: apply the retention policy now (profiler/store/retention.py).

Removes raw snapshot blobs and stat samples older than MEMQ_RETENTION_DAYS (per-cluster overrides in
MEMQ_RETENTION_CLUSTERS), keeping the blobs of snapshots with an OOM or a non-healthy diagnosis and
every blob another snapshot still references. Snapshot rows and analyses stay. Blob files of
dead-lettered snapshots past MEMQ_DEAD_BLOB_GRACE_S go too, where no row names them (needs Redis). On PostgreSQL, whole
days of stat samples go as partitions, and the coming days' partitions are made. The beat task
`workers.retention.gc` runs the same daily at MEMQ_GC_HOUR_UTC:MEMQ_GC_MINUTE_UTC.
"""

from __future__ import annotations

import click

from memq.cli._listing import write_json
from memq.config import load_settings
from memq.pipeline.dead_blobs import clean
from memq.redis_client import make_client
from memq.store.connection import open_store
from memq.store.retention import Policy, collect


@click.command()
@click.option("--dry-run", is_flag=True, help="Show what would be removed; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON document.")
def gc(dry_run: bool, as_json: bool) -> None:
    """Remove raw blobs and stat samples past the retention policy."""
    st = load_settings()
    policy = Policy.from_settings(st)
    store = open_store(st)
    try:
        summary = collect(store, policy, dry_run=dry_run, partition_days_ahead=st.stat_partition_days_ahead)
        summary["dead_blobs"] = _dead_blobs(st, store, dry_run)
    finally:
        store.close()
    if as_json:
        write_json(summary)
        return
    verb = "would remove" if dry_run else "removed"
    pol = policy.describe()
    clusters = ", ".join(f"{c}={d}" for c, d in pol["clusters"].items()) or "none"
    click.echo(f"retention: {pol['default_days'] or 'forever'} days by default; overrides: {clusters}")
    click.echo(f"{verb}: {summary['stat_samples_removed']} stat samples, {summary['blobs_removed']} blobs "
               f"({summary['snapshots_unlinked']} snapshots), {summary['orphans_removed']} orphan blobs, "
               f"{summary['temp_files_removed']} temporary files; {summary['bytes_freed']} bytes")
    kept = summary["kept"]
    click.echo(f"kept past retention: {kept['oom']} OOM snapshots, {kept['diagnosis']} with a diagnosis, "
               f"{kept['active_run']} of runs still going, {kept['referenced']} blobs still referenced")
    if summary["stat_partitions_dropped"]:
        click.echo(f"{verb} whole days of stat samples: {', '.join(summary['stat_partitions_dropped'])}")
    if summary["stat_partitions_created"]:
        click.echo(f"made stat_samples partitions: {', '.join(summary['stat_partitions_created'])}")
    dead = summary["dead_blobs"]
    if "error" in dead:
        click.echo(f"warning: blobs of dead-lettered snapshots not checked: {dead['error']}", err=True)
    else:
        click.echo(f"dead-lettered snapshots: {verb} {dead.get('dead_blobs_removed', 0)} blob files past "
                   f"MEMQ_DEAD_BLOB_GRACE_S ({st.dead_blob_grace_s} s), {dead.get('dead_blobs_waiting', 0)} "
                   "still in their grace")
    if summary.get("restored"):
        click.echo(f"put back: {summary['restored']} blobs that gained a reference while being removed")
    for err in summary["errors"] + dead.get("errors", []):
        click.echo(f"warning: {err}", err=True)


def _dead_blobs(st, store, dry_run: bool) -> dict:
    """The dead-blob cleanup (memq.pipeline.dead_blobs), which needs Redis: unreachable, it is reported
    and the retention above stands."""
    try:
        return clean(st, store, make_client(st.redis_url, 5), dry_run=dry_run)
    except Exception as exc:  # noqa: BLE001 - Redis unreachable or refusing: say so, keep gc's result
        return {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
