"""Analyse what is stored and store the result: the use case behind a worker's snapshot task, the
run-level diagnosis, `memq reanalyze` and the forecast refresh. No Redis, no worker.

- `analyse_claimed(store, claimed, load)`: the worker's one call for a snapshot it leased (the claim
  carries the row): analysed unless a result exists, completed, an OOM's run moved to `oom`.
- `analyse_snapshot(store, snapshot_id, loaded)`: one snapshot's result, reused when one exists for
  (sha256, analyzer version, context) (`memq ingest`, `memq reanalyze`).
- `recompute_run(store, run_id, rank)`: the run-level diagnosis from the rank's snapshots in time order;
  `diagnose_rank(store, run_id, rank, load)`: the worker's one call for it (status, the OOM snapshots
  to sweep).
- `reanalyze(store, run_name=None)`: recompute from blobs every result made by an older analyzer
  version, then the run-level diagnoses.
- `refresh_forecast(store, run_id, rank, figures)`: the stored forecast moved on by a stats batch.
The analysis itself is `memq.analysis.analyze`, imported when first needed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memq import analysis
from memq.analysis.forecast import refresh
from memq.analysis.labels import snapshot_label
from memq.analysis.per_snapshot import SnapshotDigest, digest
from memq.errors import BadInput, MemqError, NotFound, SnapshotError
from memq.load import LoadedSnapshot
from memq.model import OomContext
from memq.oom_message import parse_oom_message
from memq.pipeline import runs
from memq.pipeline.offline import advice_replay
from memq.pipeline.sweeps import sweep_rank
from memq.store import repository as repo
from memq.store.blob_snapshots import load_blob
from memq.store.connection import Store
from memq.store.sweeps import oom_snapshot_ids

#: A run-level diagnosis reads at most this many of a rank's most recent snapshots, and stops adding
#: older ones once their uncompressed sizes pass MAX_RUN_BYTES (parsed, a snapshot takes ~6x its
#: pickle size in memory; the newest two are always read).
MAX_RUN_SNAPSHOTS = 64
MAX_RUN_BYTES = 256 * 1024 * 1024

Progress = Callable[[str], None]


def analyzer() -> tuple[Callable[..., dict], str]:
    return analysis.analyze, analysis.ANALYZER_VERSION  # read when called: the version in force now


def _label(row) -> str | None:
    """How evidence names a stored snapshot: where in the run it was taken, not its stream id
    (`source` is "memq:ingest/<id>" for what the agent sent)."""
    return snapshot_label(row.trigger, row.step, row.epoch)


def oom_facts(limit: int | None, device_total: int | None, message: str | None = None,
              requested: int | None = None, device_free: int | None = None) -> dict[str, Any]:
    """What a snapshot row keeps of its OOM's context (the run's limit and device, the message): the
    known values only, so equal contexts compare equal."""
    facts = {"limit_bytes": limit, "device_total_bytes": device_total, "message": message,
             "requested_bytes": requested, "device_free_bytes": device_free}
    return {k: v for k, v in facts.items() if v not in (None, "")}


def oom_context(facts: Mapping[str, Any]) -> OomContext | None:
    """The analysis context from stored facts (see Snapshot.context)."""
    if not facts:
        return None
    msg = None
    if facts.get("message"):
        try:
            msg = parse_oom_message(str(facts["message"]))
        except BadInput:
            msg = None
    return OomContext(requested_bytes=facts.get("requested_bytes"), limit_bytes=facts.get("limit_bytes"),
                      device_total_bytes=facts.get("device_total_bytes"),
                      device_free_bytes=facts.get("device_free_bytes"), message=msg)


Loader = Callable[[str, str | None], LoadedSnapshot]


@dataclass(frozen=True)
class SnapshotOutcome:
    """What the analysis of one snapshot row did: the ids its caller schedules the run diagnosis with."""

    snapshot_id: int
    run_id: int
    rank: int
    analysis_id: int | None  # None: a settled snapshot, whose analysis was not looked up
    computed: bool
    oom: bool  # an OOM snapshot: its run was moved to `oom` with it


def analyse_snapshot(store: Store, snapshot_id: int, loaded: LoadedSnapshot | None = None,
                     optimizer: str | None = None) -> tuple[int, bool]:
    """Attach the current analyzer's result to one snapshot row, computing it only when no result
    for (sha256, version, context) exists (`memq ingest`, `memq reanalyze`). The run's optimizer is
    used when none is given: the stored result does not depend on who asked. Returns (analysis id,
    whether it was computed now)."""
    with store.session() as s:
        row = repo.snapshot_row(s, snapshot_id)
        if row is None:
            raise NotFound(f"no snapshot with id {snapshot_id}")
    out = _analyse_row(store, row, lambda sha, src: loaded if loaded is not None else load_blob(store, sha, src),
                       optimizer=optimizer, move_status=False)
    return out.analysis_id, out.computed


def analyse_claimed(store: Store, claimed: repo.ClaimedSnapshot, load: Loader) -> SnapshotOutcome:
    """The worker's analysis of a snapshot it leased: the claim carries the row (it is not read again),
    the result is reused or computed from `load(sha256, source)`, the row completed and an OOM
    snapshot's run moved to `oom` in the same transaction. The caller schedules the run diagnosis."""
    return _analyse_row(store, claimed, load, optimizer=None, move_status=True)


def settled(store: Store, snapshot_id: int) -> SnapshotOutcome:
    """A snapshot already done (a duplicate delivery): its run's status as its analysis says, and the
    ids to schedule the run diagnosis with."""
    with store.session() as s:
        row = repo.snapshot_outcome(s, snapshot_id)
        oom = runs.snapshot_seen(s, row.run_id, row.trigger, row.oom_requested_bytes, row.oom)
    return SnapshotOutcome(snapshot_id, row.run_id, row.rank, None, False, oom)


def _analyse_row(store: Store, row, load: Loader, *, optimizer: str | None, move_status: bool) -> SnapshotOutcome:
    """`row`: a snapshot row or a claim (id, run_id, rank, sha256, context, trigger, source, step, epoch)."""
    analyze, version = analyzer()
    key = repo.context_key(row.context)
    with store.session() as s:
        run = repo.run_settings(s, row.run_id)
        found = repo.found_analysis(s, row.sha256, version, key)
        if found is not None:
            repo.complete_snapshot(s, row.id, found.id, version)
            oom = move_status and runs.snapshot_seen(s, row.run_id, row.trigger, found.oom_requested_bytes,
                                                     found.oom)
            return SnapshotOutcome(row.id, row.run_id, row.rank, int(found.id), False, oom)
    loaded = load(row.sha256, row.source)
    result = analyze([loaded], oom_context(row.context), names=[row.source or row.sha256[:12]],
                     triggers=[row.trigger], optimizer=optimizer or (run.optimizer if run is not None else None),
                     labels=[_label(row)])
    with store.session() as s:
        aid = repo.store_analysis(s, row.sha256, version, result, key, digest=digest(loaded.snapshot, version))
        repo.complete_snapshot(s, row.id, aid, version)
        oom = move_status and runs.snapshot_seen(s, row.run_id, row.trigger, (result.get("oom") or {}).get(
            "requested_bytes"), result.get("oom"))
    return SnapshotOutcome(row.id, row.run_id, row.rank, aid, True, oom)


def refresh_forecast(store: Store, run_id: int, rank: int, figures: list[dict], as_of_time: float | None) -> str:
    """Move a rank's OOM forecast on with the per-step figures of a stats batch (the agent sends them
    between snapshots). Only the `forecast` of the stored run diagnosis and the run's forecast columns
    change, and only when the diagnosis is still the one read: a recompute that lands meanwhile wins.
    Returns refreshed | verdict_changed (the growth model's leak verdict moved: the caller has the run
    diagnosed again) | unchanged | none (no diagnosis, or one from before forecasts were kept)."""
    with store.session() as s:
        row = repo.run_result_row(s, run_id, rank)
        if row is None:
            return "none"
        result = dict(row.result or {})
        details = dict(result.get("details") or {})
        kept = details.get("forecast_input")
        if not isinstance(kept, dict):
            return "none"
        out = refresh(kept, figures, as_of_time)
        if out is None:
            return "unchanged"
        fc, nxt = out
        was_leak = bool((details.get("leak") or {}).get("holds"))
        now_leak = ((fc or {}).get("growth") or {}).get("state") == "growing"
        if fc is not None and fc.get("oom_expected"):
            fc["site"], fc["advice"] = kept.get("site"), kept.get("advice")
        result["forecast"] = fc
        result["details"] = dict(details, forecast_input=nxt)
        if not repo.replace_run_result(s, run_id, rank, row.computed_at, result):
            return "unchanged"
    # the leak verdict reads the same growth model: when the new figures move it (a cache that stopped
    # growing, a leak that began), the run diagnosis is made again over the whole series
    return "verdict_changed" if was_leak != now_leak else "refreshed"


def _kept_figures(store: Store, run_id: int, rank: int) -> list[dict]:
    """The per-step figures the rank's stats batches added to its stored forecast inputs: the growth
    model reads the whole series, not only what the newest snapshot embeds."""
    with store.session() as s:
        result = repo.run_result(s, run_id, rank)
    kept = ((result or {}).get("details") or {}).get("forecast_input") or {}
    figs = kept.get("figures") if isinstance(kept, dict) else None
    return [f for f in figs if isinstance(f, dict)] if isinstance(figs, list) else []


def stored_run_result(store: Store, run_id: int, rank: int) -> dict | None:
    """The stored run-level result when it was made by the current analyzer version, else None."""
    _, version = analyzer()
    with store.session() as s:
        return repo.run_result(s, run_id, rank, version)


def recompute_run(store: Store, run_id: int, rank: int = 0,
                  cache: Mapping[str, LoadedSnapshot] | None = None,
                  load: Callable[[str, str | None], LoadedSnapshot] | None = None) -> dict | None:
    """analyze() over the rank's snapshots in time order (the most recent, see MAX_RUN_SNAPSHOTS), stored
    as its run-level diagnosis; the run row's summary is refreshed. Returns the stored result.
    Only the newest snapshot is decoded (from `cache`, else `load(sha256, source)`, else the blob
    store); earlier ones come from the digests stored with their analyses, and are decoded only
    when they have none (their digest is filled in then)."""
    analyze, version = analyzer()
    cache = cache or {}
    with store.session() as s:
        run = repo.run_settings(s, run_id)
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        newest_first = repo.rank_snapshots(s, run_id, rank, MAX_RUN_SNAPSHOTS)

    digests: dict[int, SnapshotDigest | None] = {}

    def stored_digest(r) -> SnapshotDigest | None:
        if r.id not in digests:
            try:
                ok = r.digest is not None and r.analyzer_version == version
                digests[r.id] = SnapshotDigest.from_json(r.digest) if ok else None
            except ValueError:
                digests[r.id] = None  # an older digest format: decode the blob instead
        return digests[r.id]

    def decode(r) -> LoadedSnapshot | None:
        try:
            ld = cache.get(r.sha256)
            if ld is None:
                ld = (load or (lambda sha, src: load_blob(store, sha, src)))(r.sha256, r.source)
        except NotFound:
            return None  # the blob was never stored here (e.g. expired before a worker saved it)
        except SnapshotError:
            return None  # a quarantined snapshot (refused or corrupt) must not block the run's diagnosis
        return ld

    # Memory bounds what is decoded (MAX_RUN_BYTES); a digest costs a few KB.
    rows, budget = [], 0
    for r in newest_first:
        if not rows or (r.sha256 not in cache and stored_digest(r) is None):
            budget += r.size_bytes or 0
            if len(rows) >= 2 and budget > MAX_RUN_BYTES:
                break
        rows.append(r)
    rows.reverse()
    if not rows:
        return None
    loaded, used, fill = [], [], {}

    def decoded(r) -> LoadedSnapshot | None:
        ld = decode(r)
        if ld is not None and r.analysis_id is not None and r.analyzer_version == version \
                and stored_digest(r) is None:  # stored without one (before 0003), or of an older format
            fill[r.analysis_id] = digest(ld.snapshot, version)
        return ld

    last = None
    for i in range(len(rows) - 1, -1, -1):  # the newest decodable snapshot is the last one analysed
        last = decoded(rows[i])
        if last is not None:
            break
    if last is None:
        return None
    for r in rows[:i]:
        item = (stored_digest(r) if r.sha256 not in cache else None) or decoded(r)
        if item is not None:
            loaded.append(item)
            used.append(r)
    loaded.append(last)
    used.append(rows[i])
    last_ctx = dict(used[-1].context or {})
    facts = oom_facts(run.memory_limit_bytes or last_ctx.get("limit_bytes"),
                   run.gpu_memory_bytes or last_ctx.get("device_total_bytes"),
                   last_ctx.get("message"), last_ctx.get("requested_bytes"), last_ctx.get("device_free_bytes"))
    ctx = oom_context(facts)

    def seeds() -> list:
        """The earlier snapshots themselves (not their digests), newest first within MAX_RUN_BYTES, for
        the replay the advice cites: what `memq analyze` gives it for the same files."""
        out, budget = [], 0
        for item, r in zip(reversed(loaded[:-1]), reversed(used[:-1]), strict=True):
            ld = item if isinstance(item, LoadedSnapshot) else decode(r)
            budget += r.size_bytes or 0
            if ld is None or budget > MAX_RUN_BYTES:
                break
            out.append(ld.snapshot)
        return out[::-1]

    result = analyze(loaded, ctx, names=[r.source or r.sha256[:12] for r in used],
                     triggers=[r.trigger for r in used], optimizer=run.optimizer, labels=[_label(r) for r in used],
                     figures=_kept_figures(store, run_id, rank), whatif=advice_replay(last.snapshot, ctx, seeds))
    analysed = [r for r in used if r.allocated_bytes is not None]
    peak_row = max(analysed, key=lambda r: r.allocated_bytes, default=None)
    details = result.get("details") or {}
    peak_reserved = repo.max_present(details.get("peak_reserved_bytes"), *(r.reserved_bytes for r in analysed),
                              (result.get("metrics") or {}).get("reserved_bytes"))
    # Peak live bytes inside the recorded traces (e.g. mid-backward), not only at snapshot time.
    trace_peaks = [p.get("peak_live_bytes") for p in details.get("per_snapshot") or [] if isinstance(p, dict)]
    trace_peaks.append((details.get("timeline") or {}).get("peak_live_bytes"))
    peak_allocated = repo.max_present(*(r.allocated_bytes for r in analysed), *trace_peaks,
                                      (result.get("metrics") or {}).get("allocated_bytes"))
    with store.session() as s:
        peak_comp = result.get("composition")
        if peak_row is not None:  # only that row's stored result is read back
            peak_doc = repo.analysis_doc(s, peak_row.analysis_id)
            peak_comp = (peak_doc or {}).get("composition")
        # snapshot_count: the rows this diagnosis considered (a snapshot whose blob is gone stays
        # counted, so a "fewer snapshots than rows" staleness check does not loop on it).
        repo.store_run_diagnosis(s, run_id, rank, version, result, len(rows), peak_reserved, peak_allocated,
                                 peak_comp or {})
        repo.refresh_run_summary(s, run_id)
        for aid, doc in fill.items():
            repo.fill_digest(s, aid, doc)
        if len(newest_first) >= MAX_RUN_SNAPSHOTS:
            repo.drop_digests_outside_window(s, run_id, rank, MAX_RUN_SNAPSHOTS)
    return repo.contract_only(result)


def diagnose_rank(store: Store, run_id: int, rank: int, load: Loader | None = None) -> tuple[dict | None, list[int]]:
    """The worker's run diagnosis of one rank: `recompute_run`, the run moved to `oom` when it found one,
    and the ids of the rank's analysed OOM snapshots (each gets its what-if sweep next, once the
    diagnosis has let the rank's analyses settle). Returns (the stored result, those ids)."""
    result = recompute_run(store, run_id, rank, load=load)
    with store.session() as s:
        runs.diagnosed(s, run_id, result)
        return result, oom_snapshot_ids(s, run_id, rank)


@dataclass
class ReanalyzeReport:
    analyzer_version: str
    snapshots_considered: int = 0
    analysed: int = 0
    reused: int = 0
    missing_blobs: int = 0
    failed: int = 0
    runs_recomputed: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def reanalyze(store: Store, run_name: str | None = None, *, force: bool = False,
              progress: Progress | None = None, limit_bytes: int | None = None) -> ReanalyzeReport:
    """Bring every snapshot (of one run, or all) and run-level diagnosis to the current analyzer
    version, recomputing from the stored blobs. `force` also redoes the run-level diagnoses that
    are already current. `limit_bytes` (one run only) is the run's limit given after the fact: stored,
    then its diagnoses and forecast are made again under it."""
    _, version = analyzer()
    rep = ReanalyzeReport(analyzer_version=version)
    if limit_bytes is not None and run_name is None:
        raise BadInput("a limit is given to one run: name it (--run RUN --limit SIZE)")
    with store.session() as s:
        run_id = None
        if run_name is not None:
            run_id = repo.run_id_for(s, run_name)
            if limit_bytes is not None:
                repo.set_run_limit(s, run_id, limit_bytes)
                force = True
        snaps, pairs, current = repo.reanalyze_targets(s, version, run_id)
    rep.snapshots_considered = len(snaps)
    touched: set[tuple[int, int]] = set()
    for sn in snaps:
        try:
            _, computed = analyse_snapshot(store, sn.id)
        except NotFound:
            rep.missing_blobs += 1
            continue
        except MemqError as exc:
            rep.failed += 1
            rep.errors.append(f"snapshot {sn.id} ({sn.sha256[:12]}): {exc}")
            with store.session() as s:
                repo.fail_snapshot(s, sn.id, str(exc), retry=False)
            continue
        rep.analysed += computed
        rep.reused += not computed
        touched.add((sn.run_id, sn.rank))
        if progress:
            progress(f"snapshot {sn.id}")
    todo = {p for p in pairs if force or p in touched or tuple(p) not in current}
    for run_id, rank in sorted(todo):
        recompute_run(store, run_id, rank)
        sweep_rank(store, run_id, rank)  # OOM snapshots' what-if sweeps under the current version
        rep.runs_recomputed += 1
        if progress:
            progress(f"run {run_id} rank {rank}")
    return rep
