"""`memq explain MESSAGE`: a diagnosis from the OOM message alone, no snapshot and no services."""

from __future__ import annotations

import sys

import click

from memq.analysis import explain_message
from memq.cli import SIZE, build_context
from memq.render.jsonout import write_json
from memq.render.terminal import render_analysis


@click.command()
@click.argument("message", nargs=-1, required=True)
@click.option("--limit", type=SIZE, help="Per-process cap, when the message does not say 'allowed'.")
@click.option("--device-total", type=SIZE)
@click.option("--json", "as_json", is_flag=True)
def explain(message, limit, device_total, as_json):
    """Diagnose from the OOM message alone ("CUDA out of memory. Tried to allocate ...")."""
    ctx = build_context(limit, device_total, " ".join(message))
    result = explain_message(ctx)
    if as_json:
        write_json(result, sys.stdout)
    else:
        render_analysis(result, sys.stdout)
