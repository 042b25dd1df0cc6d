"""`memq view FILE... --out view.html`: the snapshot page of `memq serve` as one self-contained
file (CSS, script and data inline; nothing loaded from anywhere), for a snapshot that never entered
the history: attach it to a ticket, open it offline."""

from __future__ import annotations

from pathlib import Path

import click

from memq.cli import build_context, oom_options
from memq.config import load_settings
from memq.pipeline.offline import analyse_files
from memq.render.outfile import check_output, write_output
from memq.web.render import render_page
from memq.web.snapshot_view import snapshot_view


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@oom_options
@click.option("--optimizer", help="Optimizer class (e.g. AdamW), sharpens recommendations.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="The HTML file to write.")
def view(files, limit, device_total, oom_message, optimizer, out):
    """Draw the last of FILES (one run's snapshots in time order) with the diagnosis of all of them."""
    check_output(out)  # a device, FIFO or missing directory is refused before the work
    done = analyse_files(files, build_context(limit, device_total, oom_message), optimizer=optimizer,
                         max_bytes=load_settings().decode_max_bytes, digest=True)  # the page names its sha256
    for line in done.warnings:
        click.echo(f"memq: warning: {line}", err=True)
    loaded, result = done.loaded, done.result
    if done.whatif:
        result["whatif"] = done.whatif
    name = Path(files[-1]).name
    meta = {"file": name, "sha256": loaded[-1].sha256, "size_bytes": loaded[-1].raw_size, "files": list(files)}
    doc = snapshot_view(loaded[-1].snapshot, result, title=f"snapshot {name}", meta=meta)
    html = render_page("snapshot.html", data=doc, view=doc, row=None, raw_url=None, title=doc["title"], inline=True)
    write_output(out, html)
    click.echo(f"wrote {out} ({len(html.encode()) / 1024:.0f} KiB): {doc['diagnosis']['primary_cause']}", err=True)
