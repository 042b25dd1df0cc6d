"""`memq fit FILE... | --run R [--rank N] [--batch B --from-batch B0] [--seq T --from-seq T0]
[--optimizer NAME] [--limit SIZE | --gpu NAME] [--json]`: the peak at another batch size, sequence
length or optimizer, predicted from one measured run (profiler/analysis/fit.py), whether it fits the
limit, and the largest batch (or length) that does. No services for files; --run reads the history."""

from __future__ import annotations

import json
import sys

import click

from memq.analysis.fit import Question, choose
from memq.cli import SIZE
from memq.cli._listing import open_cli_store
from memq.config import load_settings
from memq.errors import BadInput
from memq.gpus import gpu_limit
from memq.load import load_snapshot_file
from memq.pipeline.fit import answer_for, fit_for_run
from memq.render.fit_text import render_fit


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=False))
@click.option("--run", "run_name", help="Take the measured run from the history (the earliest trace that holds a "
                                        "whole training step, from the run's start where one does).")
@click.option("--rank", type=int, help="With --run: this rank's snapshots (default: any rank, rank 0 first).")
@click.option("--batch", type=int, help="The batch size to predict (needs --from-batch).")
@click.option("--from-batch", type=int, help="The batch size the measured run used (the snapshot does not say).")
@click.option("--seq", type=int, help="The sequence length to predict (needs --from-seq).")
@click.option("--from-seq", type=int, help="The sequence length the measured run used.")
@click.option("--optimizer", help="Predict with this optimizer's state instead of the recorded one: "
                                  "sgd, sgd_momentum, adam, adamw, adafactor, adamw_8bit.")
@click.option("--limit", type=SIZE, help="What the allocator may reserve (a cap or the card), e.g. 39GiB.")
@click.option("--gpu", help='A card, e.g. "A100 40GB", "H100", "T4" (its memory less the CUDA context).')
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def fit(files, run_name, rank, batch, from_batch, seq, from_seq, optimizer, limit, gpu, as_json):
    """Will batch B (or length T) fit? Replays a measured training step at the new shape."""
    if bool(files) == bool(run_name):
        what = "give snapshot FILE(s) or --run R"
        raise BadInput(f"{what}, not both" if files else what)
    if rank is not None and not run_name:
        raise BadInput("--rank goes with --run")
    if limit is not None and gpu:
        raise BadInput("--limit and --gpu are exclusive")
    limit_source = "--limit" if limit is not None else None
    if gpu:
        limit, limit_source = gpu_limit(gpu)
    doc = _answer(files, run_name, rank, batch, from_batch, seq, from_seq, optimizer, limit, limit_source)
    if as_json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    sys.stdout.write(render_fit(doc))


def _answer(files, run_name, rank, batch, from_batch, seq, from_seq, optimizer, limit, limit_source) -> dict:
    q = Question(batch=batch, from_batch=from_batch, seq=seq, from_seq=from_seq,
                 optimizer=optimizer.lower() if optimizer else None, limit=limit, limit_source=limit_source)
    if run_name:
        return fit_for_run(open_cli_store(), run_name, rank, q)
    cap = load_settings().decode_max_bytes
    loaded = [load_snapshot_file(f, max_bytes=cap) for f in files]
    # one run's snapshots: a trace that holds a whole clean step (fit.choose says which and why)
    pick, why = choose([x.snapshot for x in loaded]) if len(loaded) > 1 else (0, "")
    snap = loaded[pick].snapshot
    why = f": {why}" if why else ""
    return answer_for(snap, f"{files[pick]} ({len(snap.trace)} trace entries{why})", q, (None, None))
