"""`memq analyze FILE...`: offline diagnosis, no services at all."""

from __future__ import annotations

import sys

import click

from memq.cli import SIZE, build_context, keep_until_exit, oom_options
from memq.config import load_settings
from memq.pipeline.offline import analyse_files
from memq.render.jsonout import write_json


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@oom_options
@click.option("--optimizer", help="Optimizer class (e.g. AdamW, SGD), sharpens recommendations.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON contract instead of the report.")
@click.option("--no-details", is_flag=True, help="With --json: only the contract keys.")
@click.option("--max-bytes", type=SIZE, default=None, help="Refuse snapshots larger than this (uncompressed).")
def analyze(files, limit, device_total, oom_message, optimizer, as_json, no_details, max_bytes):
    """Diagnose snapshots of one run (in time order): .pickle, .pickle.gz, .zst, or a segment list."""
    cap = load_settings().decode_max_bytes  # --max-bytes may lower the decode budget's cap, not raise it
    max_b = min(max_bytes or cap, cap)
    done = analyse_files(files, build_context(limit, device_total, oom_message), optimizer=optimizer, max_bytes=max_b)
    for line in done.warnings:
        click.echo(f"memq: warning: {line}", err=True)
    _emit(done.result, as_json, no_details)
    keep_until_exit(done.loaded, done.result)


def _emit(result: dict, as_json: bool, no_details: bool) -> None:
    if as_json:
        write_json(result, sys.stdout, details=not no_details)
    else:
        from memq.render.terminal import render_analysis  # rich: never for --json (pinned)

        render_analysis(result, sys.stdout)
