"""`memq analyze FILE...` and `memq explain MESSAGE`: offline diagnosis, no services at all."""

from __future__ import annotations

import sys

import click

from memq import codec
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
    from memq.analysis import analyze as run_analysis
    from memq.load import load_snapshot_file

    cap = load_settings().decode_max_bytes  # --max-bytes may lower the decode budget's cap, not raise it
    max_b = min(max_bytes or cap, cap)
    ctx = build_context(limit, device_total, oom_message)
    with codec.gc_paused(freeze=True):  # a million parsed events: the GC would rescan them, for nothing
        loaded = [load_snapshot_file(f, max_bytes=max_b, digest=False) for f in files]  # never named by hash
        from memq.analysis.message_check import reconcile

        ctx, mismatch = reconcile(ctx, loaded[-1].snapshot)  # another OOM's message: the snapshot's figures win
        for line in mismatch:
            click.echo(f"memq: warning: {line}", err=True)
        result = run_analysis(loaded, ctx, names=list(files), optimizer=optimizer,
                              whatif=_whatif(loaded[-1], ctx, [x.snapshot for x in loaded[:-1]]),
                              labels=[_label(f) for f in files])
        if mismatch:
            result["details"]["warnings"] = sorted({*result["details"].get("warnings", []), *mismatch})
        _emit(result, as_json, no_details)
    keep_until_exit(loaded, result)


def _label(path: str) -> str | None:
    """Where a file was taken, from its name (`epoch2.pickle.gz`, `step0040...`, `oom...`), for the
    evidence; snapshots the agent sent carry their own trigger, step and epoch, which win."""
    from memq.analysis.labels import infer_from_name, snapshot_label

    got = infer_from_name(path)
    return snapshot_label(got.get("trigger"), got.get("step"), got.get("epoch")) if got else None


def _whatif(loaded, ctx, earlier=()) -> list[dict] | None:
    """Replay the last trace through the allocator model when it recorded an OOM and a limit is
    known, so recommendations can cite a simulated outcome, or why there is none (the earlier files
    join or seed the replay: docs/whatif.md). The diagnosis never depends on it."""
    snap = loaded.snapshot
    if snap.oom_event() is None:
        return None
    from memq.analysis.limits import resolve_limits
    from memq.analysis.recommend import DEFAULTS_CONF
    from memq.analysis.whatif import simulate_whatif  # the allocator model: only for an OOM

    limit = resolve_limits(snap, ctx, None).limit
    if not limit:
        return None
    confs = ["", "expandable_segments:True", "max_split_size_mb:128"]
    if snap.settings.non_default:
        confs.append(DEFAULTS_CONF)
    return simulate_whatif(snap, limit, confs, earlier=earlier)


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
