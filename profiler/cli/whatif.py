"""`memq whatif FILE... [--limit SIZE] [--conf SETTING]... [--sweep] [--json]` and
`memq whatif --run R [--rank N] [...]`: replay a snapshot's trace through the caching-allocator model
under other PYTORCH_CUDA_ALLOC_CONF settings.

Several files are one process's snapshots in time order: the last is replayed, the earlier ones join
its trace where they overlap and seed the cache other settings start from. With `--run`, the snapshot
(the run's last OOM snapshot, else its last one), the earlier snapshots of its rank and the limit come
from the history."""

from __future__ import annotations

import json
import sys

import click

from memq.analysis.alloc_conf import parse_alloc_conf
from memq.analysis.limits import resolve_limits
from memq.analysis.whatif import run_whatif, sweep_confs
from memq.cli import SIZE, build_context
from memq.cli._listing import open_cli_store
from memq.config import load_settings
from memq.errors import BadInput
from memq.load import load_snapshot_file
from memq.render.reasons import said_once
from memq.render.words import plural, said
from memq.store.blob_snapshots import load_blob
from memq.units import fmt_bytes


def _fmt(n: int | None) -> str:
    return fmt_bytes(n)


@click.command()
@click.argument("files", nargs=-1, type=click.Path(dir_okay=True))
@click.option("--run", "run_name", help="Take the snapshot and the limit from this run's history instead of files.")
@click.option("--rank", type=int, help="With --run: this rank's last OOM snapshot (default: the run's last one).")
@click.option("--limit", type=SIZE,
              help="What the allocator may reserve (per-process cap), bytes or units (e.g. 18.85GiB). Without it, "
                   "the run's limit (--run) or the recorded OOM (reserved + CUDA free bytes) is used.")
@click.option("--conf", "confs", multiple=True, metavar="SETTING",
              help="A PYTORCH_CUDA_ALLOC_CONF value to try (repeatable; join settings with commas). "
                   "'' is the recorded configuration.")
@click.option("--oom-message", metavar="TEXT",
              help="The 'CUDA out of memory...' text from the log: its 'allowed' cap (or the device) is the limit "
                   "when --limit is not given, read as `memq analyze` reads it.")
@click.option("--sweep", is_flag=True, help="Also try the standard list of settings.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per setting.")
@click.option("--max-bytes", type=SIZE, default=None, help="Refuse snapshots larger than this (uncompressed).")
def whatif(files, run_name, rank, limit, confs, sweep, oom_message, as_json, max_bytes):
    """Would another allocator setting have avoided this OOM? Replays the recorded alloc/free trace."""
    if bool(files) == bool(run_name):
        what = "give snapshot FILE(s) or --run R"
        raise BadInput(f"{what}, not both" if files else what)
    if rank is not None and not run_name:
        raise BadInput("--rank goes with --run")
    if oom_message and run_name:
        raise BadInput("--oom-message goes with snapshot files; a run's history already holds its OOM")
    # refused before any file is read
    ctx = build_context(limit, None, oom_message) if oom_message is not None else None
    for c in confs:  # refuse bad settings before reading anything
        parse_alloc_conf(c)
    if run_name:
        results, title = _from_run(run_name, rank, limit, confs, sweep, max_bytes)
    else:
        results, title = _from_files(files, limit, confs, sweep, max_bytes, ctx)
    if as_json:
        json.dump(results, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    render_text(results, title, sys.stdout)


def _wanted(confs, sweep: bool, snapshot) -> list[str]:
    wanted = [""]
    for c in list(confs) + (sweep_confs(snapshot) if sweep else []):
        if c not in wanted:
            wanted.append(c)
    return wanted


def _from_files(files, limit, confs, sweep, max_bytes, ctx=None) -> tuple[list[dict], str]:
    cap = load_settings().decode_max_bytes  # --max-bytes may lower the decode budget's cap, not raise it
    max_b = min(max_bytes or cap, cap)
    loaded = [load_snapshot_file(f, max_bytes=max_b) for f in files]
    last = loaded[-1].snapshot
    if limit is None and ctx is not None:
        limit = resolve_limits(last, ctx, None).limit  # the message's cap, as `memq analyze` resolves it
    results = run_whatif(last, limit, _wanted(confs, sweep, last), earlier=[x.snapshot for x in loaded[:-1]])
    out = []
    for r in results:
        d = r.to_dict()
        inputs = d.get("inputs") or {}
        for k in ("joined", "seeds"):
            inputs[k] = [str(files[i]) for i in inputs.get(k) or [] if i < len(files) - 1]
        out.append(d)
    title = f"{files[-1]}: {len(last.trace)} trace entries"
    return out, title


def _from_run(run_name, rank, limit, confs, sweep, max_bytes) -> tuple[list[dict], str]:
    from memq.pipeline.sweeps import replay_for_run  # sqlalchemy: never on the FILE path (pinned)

    store = open_cli_store()
    doc = replay_for_run(store, run_name, rank, list(confs), sweep=sweep, limit_bytes=limit,
                         load=lambda sha, src: load_blob(store, sha, src))
    snap = doc["snapshot"]
    for r in doc["results"]:
        r["snapshot"] = snap
        r["limit_source"] = doc["limit_source"]
    where = f"step {snap['step']}" if snap.get("step") is not None else f"snapshot {snap['id']}"
    title = (f"run {run_name} rank {snap['rank']}, {snap['trigger']} snapshot at {where}"
             + (f" (epoch {snap['epoch']})" if snap.get("epoch") is not None else "")
             + f"; limit from {doc['limit_source']}")
    return doc["results"], title


def answer_line(results: list[dict]) -> str:
    """The sweep's answer in one line: the best setting that avoids the OOM and its headroom, or that
    none does, or why the question has no answer."""
    rec = next((r for r in results if not r.get("conf")), None)
    others = [r for r in results if r.get("conf")]
    best = max((r for r in others if r.get("verdict") in ("fits", "survives_window")),
               key=lambda r: (r["verdict"] == "fits", r.get("headroom_bytes") or 0), default=None)
    if rec is not None and rec.get("predicted_oom") is False:
        return f"answer: the recorded settings already fit ({_fmt(rec.get('headroom_bytes'))} headroom)"
    if best is not None:
        window = "" if best["verdict"] == "fits" else " over the recorded window"
        return (f"answer: {best['conf']} avoids the OOM{window}, {_fmt(best.get('headroom_bytes'))} headroom "
                f"(confidence {best.get('confidence')})")
    ooms = sum(1 for r in others if r.get("predicted_oom"))
    unknown = sum(1 for r in others if r.get("predicted_oom") is None)
    if ooms and not unknown:
        return "answer: no allocator setting tried avoids the OOM"
    if ooms:
        return (f"answer: no setting is shown to avoid the OOM: {plural(ooms, 'setting')} still "
                f"{'runs' if ooms == 1 else 'run'} out, "
                f"{unknown} not assessable (why below)")
    return "answer: not assessable (why below)"


def render_text(results: list[dict], title: str, out) -> None:
    lim = results[0]["limit_bytes"] if results else None
    out.write(f"{title}, limit {_fmt(lim)}\n")
    if results:
        out.write(answer_line(results) + "\n")
    width = max(len(r["conf"] or "(recorded)") for r in results)
    out.write(f"{'setting'.ljust(width)}  {'outcome':<19} {'peak reserved':>14} {'headroom':>18}  confidence\n")
    for r in results:
        outcome = said(r.get("verdict")) if r.get("verdict") else ("OOM" if r["predicted_oom"] else "fits")
        room = _fmt(r["headroom_bytes"]) if r["predicted_oom"] is not None else "-"
        if r["predicted_oom"] and r.get("shortfall_bytes") is not None:
            room = f"short {_fmt(r['shortfall_bytes'])}"  # what the failing request lacked under the limit
        # a replay that cannot answer has no peak worth a figure: the table shows none beside "not assessable"
        peak = _fmt(r["peak_reserved_bytes"]) if r["predicted_oom"] is not None else "-"
        out.write(f"{(r['conf'] or '(recorded)').ljust(width)}  {outcome:<19} {peak:>14} "
                  f"{room:>18}  {r['confidence']}\n")
    if any(r["predicted_oom"] and r.get("shortfall_bytes") is not None for r in results):
        # "short" and a reason's "live + request exceed the limit" are two figures of one failure: say which
        out.write("  short: what the allocator lacked at the failure (reserved there + the segment it asked for - "
                  "the limit); live + request - the limit, in a reason, is the part no cache layout avoids\n")
    for r, why in zip(results, said_once(results), strict=True):  # why an answer is missing or partial
        if why:
            out.write(f"  {r['conf'] or '(recorded)'}: {why}\n")
    fid = results[0].get("fidelity") if results else None
    if fid:
        out.write(f"model check on the recorded run: {fid['segment_events_matched']}/{fid['segment_events_recorded']} "
                  f"segment events reproduced, reserved bytes off by at most {fid['max_reserved_deviation']:.1%}, "
                  f"{fid['alloc_address_share']:.1%} of allocations at the recorded address\n")
    seen = set()
    for r in results:
        for n in r.get("notes") or []:
            if n not in seen and not n.startswith("not assessable: "):
                seen.add(n)
                out.write(f"note: {n}\n")
