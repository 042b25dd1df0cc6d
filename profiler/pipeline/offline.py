"""Snapshot files analysed with no services at all: the one use case behind `memq analyze` and
`memq view`, and the replay the advice cites, which the service path's run diagnosis
(pipeline/analyse.recompute_run) asks for too, so the same files give the same advice text however
they came in.

- `analyse_files(files, ctx, ...)`: decode the files (one run's snapshots in time order), check an
  OOM message given with them against the last one (another OOM's message: the snapshot's figures
  win, and the mismatch is a warning), replay the last trace for the advice, and analyse them all;
- `advice_replay(last, ctx, earlier)`: the allocator model's replay of the last snapshot under the
  settings the advice names, when it recorded an OOM and a limit is known (the earlier snapshots
  join or seed the replay: docs/whatif.md). The diagnosis never depends on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memq import codec
from memq.analysis import analyze
from memq.analysis.labels import infer_from_name, snapshot_label
from memq.analysis.limits import resolve_limits
from memq.analysis.message_check import reconcile
from memq.analysis.recommend import DEFAULTS_CONF
from memq.load import LoadedSnapshot, load_snapshot_file
from memq.model import OomContext, Snapshot


@dataclass
class OfflineAnalysis:
    loaded: list[LoadedSnapshot]
    result: dict
    whatif: list[dict] | None
    warnings: list[str] = field(default_factory=list)


def file_label(path: str) -> str | None:
    """Where a file was taken, from its name (`epoch2.pickle.gz`, `step0040...`, `oom...`), for the
    evidence; snapshots the agent sent carry their own trigger, step and epoch, which win."""
    got = infer_from_name(path)
    return snapshot_label(got.get("trigger"), got.get("step"), got.get("epoch")) if got else None


def advice_replay(last: Snapshot, ctx: OomContext | None,
                  earlier: Sequence[Snapshot] | Callable[[], Sequence[Snapshot]] = ()) -> list[dict] | None:
    """See the module docstring. `earlier` may be a function, called only when a replay is made (the
    service path decodes the earlier snapshots only then)."""
    if last.oom_event() is None:
        return None
    from memq.analysis.whatif import simulate_whatif  # the allocator model: only for an OOM

    limit = resolve_limits(last, ctx, None).limit
    if not limit:
        return None
    confs = ["", "expandable_segments:True", "max_split_size_mb:128"]
    if last.settings.non_default:
        confs.append(DEFAULTS_CONF)
    seeds = earlier() if callable(earlier) else earlier
    return simulate_whatif(last, limit, confs, earlier=list(seeds))


def analyse_files(files: Sequence[str], ctx: OomContext, *, optimizer: str | None = None,
                  max_bytes: int = codec.DEFAULT_MAX_BYTES, digest: bool = False) -> OfflineAnalysis:
    """See the module docstring. `digest`: also hash the files (a page that names them by sha256)."""
    with codec.gc_paused(freeze=True):  # a million parsed events: the GC would rescan them, for nothing
        loaded = [load_snapshot_file(f, max_bytes=max_bytes, digest=digest) for f in files]
        ctx, mismatch = reconcile(ctx, loaded[-1].snapshot)  # another OOM's message: the snapshot's figures win
        whatif = advice_replay(loaded[-1].snapshot, ctx, [x.snapshot for x in loaded[:-1]])
        result = analyze(loaded, ctx, names=list(files), optimizer=optimizer, whatif=whatif,
                         labels=[file_label(f) for f in files])
    if mismatch:
        result["details"]["warnings"] = sorted({*result["details"].get("warnings", []), *mismatch})
    return OfflineAnalysis(loaded, result, whatif, list(mismatch))
