"""`memq analyze FILE...` and `memq explain MESSAGE`: offline diagnosis, no services at all."""

from __future__ import annotations

import sys

import click

from memq.cli import keep_until_exit
from memq.config import load_settings
from memq.errors import BadInput
from memq.model import OomContext
from memq.units import parse_size


class SizeType(click.ParamType):
    name = "SIZE"

    def convert(self, value, param, ctx):
        if isinstance(value, int):
            return value
        try:
            return parse_size(value)
        except BadInput as exc:
            self.fail(str(exc), param, ctx)


SIZE = SizeType()


def build_context(limit: int | None, device_total: int | None, oom_message: str | None,
                  requested: int | None = None) -> OomContext:
    msg = None
    if oom_message is not None:  # an empty one (a `grep` that found nothing) is refused, never dropped
        from memq.oom_message import parse_oom_message

        msg = parse_oom_message(oom_message)
    return OomContext(requested_bytes=requested, limit_bytes=limit, device_total_bytes=device_total, message=msg)


def oom_options(f):
    f = click.option("--oom-message", metavar="TEXT", help="The 'CUDA out of memory...' text from the log.")(f)
    f = click.option("--device-total", type=SIZE, help="Device memory in bytes or units (e.g. 139.8GiB).")(f)
    f = click.option("--limit", type=SIZE,
                     help="What the allocator may reserve (per-process cap), bytes or units (e.g. 16GiB).")(f)
    return f


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=True))
@oom_options
@click.option("--optimizer", help="Optimizer class (e.g. AdamW, SGD), sharpens recommendations.")
@click.option("--json", "as_json", is_flag=True, help="Print the JSON contract instead of the report.")
@click.option("--no-details", is_flag=True, help="With --json: only the contract keys.")
@click.option("--max-bytes", type=SIZE, default=None, help="Refuse snapshots larger than this (uncompressed).")
def analyze(files, limit, device_total, oom_message, optimizer, as_json, no_details, max_bytes):
    """Diagnose snapshots of one run (in time order): .pickle, .pickle.gz, .zst, or a segment list."""
    from memq.pipeline.offline import analyse_files

    cap = load_settings().decode_max_bytes  # --max-bytes may lower the decode budget's cap, not raise it
    max_b = min(max_bytes or cap, cap)
    done = analyse_files(files, build_context(limit, device_total, oom_message), optimizer=optimizer, max_bytes=max_b)
    for line in done.warnings:
        click.echo(f"memq: warning: {line}", err=True)
    _emit(done.result, as_json, no_details)
    keep_until_exit(done.loaded, done.result)


def _emit(result: dict, as_json: bool, no_details: bool) -> None:
    if as_json:
        from memq.render.jsonout import write_json

        write_json(result, sys.stdout, details=not no_details)
    else:
        from memq.render.terminal import render_analysis

        render_analysis(result, sys.stdout)


@click.command()
@click.argument("message", nargs=-1, required=True)
@click.option("--limit", type=SIZE, help="Per-process cap, when the message does not say 'allowed'.")
@click.option("--device-total", type=SIZE)
@click.option("--json", "as_json", is_flag=True)
def explain(message, limit, device_total, as_json):
    """Diagnose from the OOM message alone ("CUDA out of memory. Tried to allocate ...")."""
    from memq.analysis import explain_message

    ctx = build_context(limit, device_total, " ".join(message))
    _emit(explain_message(ctx), as_json, no_details=False)
