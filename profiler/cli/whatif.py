"""`memq whatif FILE --limit SIZE [--conf SETTING]... [--sweep] [--json]`: replay the snapshot's trace
through the caching-allocator model under other PYTORCH_CUDA_ALLOC_CONF settings."""

from __future__ import annotations

import json
import sys

import click

from profiler.cli.analyze import SIZE
from profiler.errors import MemqError
from profiler.render.safe import safe_text


def _fmt(n: int | None) -> str:
    from profiler.units import fmt_bytes

    return fmt_bytes(n)


@click.command()
@click.argument("file", type=click.Path(dir_okay=True))
@click.option("--limit", type=SIZE,
              help="What the allocator may reserve (per-process cap), bytes or units (e.g. 18.85GiB). Without it, "
                   "the limit is taken from the recorded OOM (reserved + CUDA free bytes) when there is one.")
@click.option("--conf", "confs", multiple=True, metavar="SETTING",
              help="A PYTORCH_CUDA_ALLOC_CONF value to try (repeatable; join settings with commas). "
                   "'' is the recorded configuration.")
@click.option("--sweep", is_flag=True, help="Also try the standard list of settings.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per setting.")
@click.option("--max-bytes", type=SIZE, default=None, help="Refuse snapshots larger than this (uncompressed).")
def whatif(file, limit, confs, sweep, as_json, max_bytes):
    """Would another allocator setting have avoided this OOM? Replays the recorded alloc/free trace."""
    try:
        _whatif(file, limit, confs, sweep, as_json, max_bytes)
    except MemqError as exc:  # one line, the exit code of the error (2 for bad input), no traceback
        click.echo(f"memq: error: {safe_text(exc)}", err=True)
        sys.exit(exc.exit_code)


def _whatif(file, limit, confs, sweep, as_json, max_bytes) -> None:
    from profiler.analysis.whatif import run_whatif, sweep_confs
    from profiler.conf import parse_alloc_conf
    from profiler.config import load_settings
    from profiler.load import load_snapshot_file

    for c in confs:  # refuse bad settings before reading the file
        parse_alloc_conf(c)
    cap = load_settings().decode_max_bytes  # --max-bytes may lower the decode budget's cap, not raise it
    loaded = load_snapshot_file(file, max_bytes=min(max_bytes or cap, cap))
    wanted = [""]
    for c in list(confs) + (sweep_confs(loaded.snapshot) if sweep else []):
        if c not in wanted:
            wanted.append(c)
    results = run_whatif(loaded.snapshot, limit, wanted)
    if as_json:
        json.dump([r.to_dict() for r in results], sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    out = sys.stdout
    lim = results[0].limit_bytes if results else limit
    out.write(f"{file}: {len(loaded.snapshot.trace)} trace entries replayed, limit {_fmt(lim)}\n")
    width = max(len(r.conf or "(recorded)") for r in results)
    out.write(f"{'setting'.ljust(width)}  {'outcome':<8} {'peak reserved':>14} {'headroom':>18}  confidence\n")
    for r in results:
        outcome = "OOM" if r.predicted_oom else "fits"
        room = _fmt(r.headroom_bytes)
        if r.predicted_oom and r.shortfall_bytes is not None:
            room = f"short {_fmt(r.shortfall_bytes)}"  # what the failing request lacked under the limit
        out.write(f"{(r.conf or '(recorded)').ljust(width)}  {outcome:<8} {_fmt(r.peak_reserved_bytes):>14} "
                  f"{room:>18}  {r.confidence}\n")
    fid = results[0].fidelity if results else None
    if fid:
        out.write(f"model check on the recorded run: {fid['segment_events_matched']}/{fid['segment_events_recorded']} "
                  f"segment events reproduced, reserved bytes off by at most {fid['max_reserved_deviation']:.1%}, "
                  f"{fid['alloc_address_share']:.1%} of allocations at the recorded address\n")
    seen = set()
    for r in results:
        for n in r.notes:
            if n not in seen:
                seen.add(n)
                out.write(f"note: {n}\n")
