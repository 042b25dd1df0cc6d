"""Analyse and store, with no Redis and no worker: `memq ingest`, `memq reanalyze`, `memq demo`.

- `ingest_files(store, meta, inputs)`: for each snapshot file, in time order: read and hash it,
  keep the raw bytes in the blob store, insert the snapshot row (idempotent), analyse it unless a
  result for (sha256, analyzer version, context) exists, then recompute the run-level diagnosis
  from all the run's snapshots of that rank in time order.
- `process_snapshot(store, snapshot_id)`: what an analysis worker does for one snapshot id
  (claim with a lease, analyse unless already analysed, mark done, recompute the run diagnosis;
  failures recorded on the row). Idempotent: a duplicate delivery returns state "skipped".
- `recompute_run(store, run_id, rank)`: the run-level diagnosis alone.
- `reanalyze(store, run_name=None)`: recompute from blobs every result made by an older analyzer
  version, then the run-level diagnoses.
The analysis itself is `memq.analysis.analyze`, imported when first needed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import func, select, update

from memq.errors import BadInput, MemqError, NotFound, SnapshotError
from memq.load import LoadedSnapshot, load_snapshot_file
from memq.model import OomContext
from memq.store import repository as repo
from memq.store.blob_snapshots import load_blob
from memq.store.connection import Store
from memq.store.orm import AnalysisResult, Run, RunDiagnosis, Snapshot

#: A run-level diagnosis reads at most this many of a rank's most recent snapshots, and stops adding
#: older ones once their uncompressed sizes pass MAX_RUN_BYTES (parsed, a snapshot takes ~6x its
#: pickle size in memory; the newest two are always read).
MAX_RUN_SNAPSHOTS = 64
MAX_RUN_BYTES = 256 * 1024 * 1024

Progress = Callable[[str], None]


def analyzer() -> tuple[Callable[..., dict], str]:
    from memq.analysis import ANALYZER_VERSION, analyze

    return analyze, ANALYZER_VERSION


@dataclass(frozen=True)
class SnapshotInput:
    """One file to ingest and what is known about when it was taken."""

    path: str
    step: int | None = None
    epoch: int | None = None
    trigger: str | None = None
    taken_at: dt.datetime | None = None
    oom_message: str | None = None
    requested_bytes: int | None = None
    device_free_bytes: int | None = None


@dataclass
class IngestedSnapshot:
    file: str
    snapshot_id: int
    sha256: str
    created: bool
    analysed: bool
    primary_cause: str | None
    step: int | None
    epoch: int | None
    trigger: str


@dataclass
class IngestReport:
    run: str
    run_id: int
    snapshots: list[IngestedSnapshot] = field(default_factory=list)
    diagnosis: dict | None = None
    status: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"run": self.run, "status": self.status,
                "snapshots": [vars(s) for s in self.snapshots], "diagnosis": self.diagnosis}


def infer_from_name(path: str) -> dict[str, Any]:
    """Step, epoch and trigger from a file name (memq.analysis.labels.infer_from_name)."""
    from memq.analysis.labels import infer_from_name as infer

    return infer(path)


def _label(row) -> str | None:
    """How evidence names a stored snapshot: where in the run it was taken, not its stream id
    (`source` is "memq:ingest/<id>" for what the agent sent)."""
    from memq.analysis.labels import snapshot_label

    return snapshot_label(row.trigger, row.step, row.epoch)


def _trace_time(loaded: LoadedSnapshot) -> dt.datetime | None:
    times = [ev.time_us for ev in loaded.snapshot.trace if ev.time_us]
    if not times:
        return None
    t = max(times) / 1e6
    if t < 946684800:  # before 2000: a relative clock, not wall time
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC)


def _facts(limit: int | None, device_total: int | None, message: str | None = None,
           requested: int | None = None, device_free: int | None = None) -> dict[str, Any]:
    facts = {"limit_bytes": limit, "device_total_bytes": device_total, "message": message,
             "requested_bytes": requested, "device_free_bytes": device_free}
    return {k: v for k, v in facts.items() if v not in (None, "")}


def oom_context(facts: Mapping[str, Any]) -> OomContext | None:
    """The analysis context from stored facts (see Snapshot.context)."""
    if not facts:
        return None
    msg = None
    if facts.get("message"):
        from memq.oom_message import parse_oom_message

        try:
            msg = parse_oom_message(str(facts["message"]))
        except BadInput:
            msg = None
    return OomContext(requested_bytes=facts.get("requested_bytes"), limit_bytes=facts.get("limit_bytes"),
                      device_total_bytes=facts.get("device_total_bytes"),
                      device_free_bytes=facts.get("device_free_bytes"), message=msg)


def analyse_snapshot(store: Store, snapshot_id: int, loaded: LoadedSnapshot | None = None,
                     optimizer: str | None = None) -> tuple[int, bool]:
    """Attach the current analyzer's result to one snapshot row, computing it only when no result
    for (sha256, version, context) exists. Returns (analysis id, whether it was computed now)."""
    analyze, version = analyzer()
    with store.session() as s:
        row = s.execute(select(Snapshot.sha256, Snapshot.context, Snapshot.trigger, Snapshot.source,
                               Snapshot.step, Snapshot.epoch)
                        .where(Snapshot.id == snapshot_id)).one_or_none()
        if row is None:
            raise NotFound(f"no snapshot with id {snapshot_id}")
        key = repo.context_key(row.context)
        aid = repo.find_analysis(s, row.sha256, version, key)
        if aid is not None:
            repo.complete_snapshot(s, snapshot_id, aid, version)
            return aid, False
    if loaded is None:
        loaded = load_blob(store, row.sha256, row.source)
    result = analyze([loaded], oom_context(row.context), names=[row.source or row.sha256[:12]],
                     triggers=[row.trigger], optimizer=optimizer, labels=[_label(row)])
    from memq.analysis.per_snapshot import digest

    with store.session() as s:
        aid = repo.store_analysis(s, row.sha256, version, result, key, digest=digest(loaded.snapshot, version))
        repo.complete_snapshot(s, snapshot_id, aid, version)
    return aid, True


@dataclass
class ProcessOutcome:
    snapshot_id: int
    state: str  # "done" | "skipped" (not claimable: done, leased elsewhere, out of attempts)
    analysis_id: int | None = None
    analysed: bool = False
    run_diagnosis: dict | None = None


def process_snapshot(store: Store, snapshot_id: int, lease_s: int = repo.DEFAULT_LEASE_S,
                     max_attempts: int = repo.DEFAULT_MAX_ATTEMPTS) -> ProcessOutcome:
    """The whole job of an analysis worker for one snapshot id: claim it (lease), analyse it unless
    a result for its bytes and context exists, mark it done, recompute its run's diagnosis.
    A failure records the error on the row (back to pending while attempts remain) and re-raises,
    so the caller decides about retrying; a second caller for the same id gets state "skipped"."""
    with store.session() as s:
        claimed = repo.claim_snapshot(s, snapshot_id, lease_s, max_attempts)
    if claimed is None:
        return ProcessOutcome(snapshot_id=snapshot_id, state="skipped")
    try:
        aid, computed = analyse_snapshot(store, snapshot_id)
        diag = recompute_run(store, claimed.run_id, claimed.rank)
    except Exception as exc:
        retry = not isinstance(exc, BadInput)  # a snapshot that cannot be decoded never will be
        with store.session() as s:
            repo.fail_snapshot(s, snapshot_id, f"{type(exc).__name__}: {exc}", retry=retry,
                               max_attempts=max_attempts)
        raise
    return ProcessOutcome(snapshot_id=snapshot_id, state="done", analysis_id=aid, analysed=computed,
                          run_diagnosis=diag)


#: Parsed snapshots kept in memory while ingesting, for the run-level diagnosis at the end (a parsed
#: 8,000-entry snapshot takes ~13 MB; older ones are read back from the blob store when needed).
INGEST_CACHE = 16


def ingest_files(store: Store, meta: repo.RunMeta, inputs: list[SnapshotInput], *, rank: int = 0,
                 limit_bytes: int | None = None, device_total_bytes: int | None = None,
                 progress: Progress | None = None,
                 preloaded: Mapping[str, LoadedSnapshot] | None = None) -> IngestReport:
    """Store and analyse `inputs` (one rank of run `meta.name`, in time order); see module doc.
    Files are handled one at a time (memory stays bounded however many there are)."""
    if not inputs:
        raise BadInput("no snapshot files given")
    meta = replace(meta, memory_limit_bytes=limit_bytes or meta.memory_limit_bytes,
                   gpu_memory_bytes=device_total_bytes or meta.gpu_memory_bytes)
    with store.session() as s:
        existed = s.execute(select(Run.id).where(Run.name == meta.name)).scalar_one_or_none() is not None
        run_id = repo.upsert_run(s, meta)
        run_row = s.execute(select(Run.memory_limit_bytes, Run.gpu_memory_bytes, Run.optimizer)
                            .where(Run.id == run_id)).one()
    report = IngestReport(run=meta.name, run_id=run_id)
    cache: dict[str, LoadedSnapshot] = {}
    times: list[dt.datetime | None] = []
    step_ms = dt.timedelta(milliseconds=1)
    for inp in inputs:
        try:
            ld = (preloaded or {}).get(inp.path) or load_snapshot_file(
                inp.path, max_bytes=store.settings.decode_max_bytes, keep_raw=True)
        except MemqError:
            # What was stored so far stays (a re-run skips it); its run diagnosis is brought up to date.
            if any(x.created for x in report.snapshots):
                recompute_run(store, run_id, rank, cache=cache)
            raise
        # Files are given in time order: one without a time of its own sits just after the previous
        # file; leading ones without a time are placed before the first timed file at the end.
        when = inp.taken_at or _trace_time(ld)
        known = next((t for t in reversed(times) if t is not None), None)
        if when is None and known is not None:
            when = known + step_ms * (len(times) - max(i for i, t in enumerate(times) if t is not None))
        times.append(when)
        guessed = infer_from_name(inp.path)
        trigger = inp.trigger or guessed.get("trigger") or "manual"
        step = inp.step if inp.step is not None else guessed.get("step")
        epoch = inp.epoch if inp.epoch is not None else guessed.get("epoch")
        ref = store.blobs.put(ld.sha256, ld.raw) if ld.raw is not None else store.blobs.ref(ld.sha256)
        facts = _facts(run_row.memory_limit_bytes, run_row.gpu_memory_bytes, inp.oom_message,
                       inp.requested_bytes, inp.device_free_bytes)
        with store.session() as s:
            sid, created = repo.insert_snapshot(s, repo.NewSnapshot(
                run_id=run_id, sha256=ld.sha256, size_bytes=ld.raw_size, rank=rank, step=step, epoch=epoch,
                trigger=trigger, taken_at=when, blob_ref=ref, source=inp.path, context=facts))
        aid, computed = analyse_snapshot(store, sid, ld, optimizer=run_row.optimizer)
        with store.session() as s:
            cause = s.execute(select(AnalysisResult.primary_cause).where(AnalysisResult.id == aid)).scalar_one()
        ld.snapshot.release_held()  # kept for the run's diagnosis: not the frames the parser dropped
        cache[ld.sha256] = ld
        while len(cache) > INGEST_CACHE:
            cache.pop(next(iter(cache)))
        report.snapshots.append(IngestedSnapshot(file=inp.path, snapshot_id=sid, sha256=ld.sha256, created=created,
                                                 analysed=computed, primary_cause=cause, step=step, epoch=epoch,
                                                 trigger=trigger))
        if progress:
            progress(f"{Path(inp.path).name}: {cause}")
    first = next((i for i, t in enumerate(times) if t is not None), None)
    fixed = [times[first] - step_ms * (first - i) if first is not None else repo.utcnow() + step_ms * i
             for i in range(first if first is not None else len(times))]
    with store.session() as s:
        for snap, t in zip(report.snapshots, fixed, strict=False):
            if snap.created:
                s.execute(update(Snapshot).where(Snapshot.id == snap.snapshot_id)
                          .values(taken_at=repo.db_time(s, t)))
        times[:len(fixed)] = fixed
        repo.upsert_run(s, repo.RunMeta(name=meta.name, started_at=min(times)))
    stored = None if any(x.created for x in report.snapshots) else stored_run_result(store, run_id, rank)
    report.diagnosis = stored if stored is not None else recompute_run(store, run_id, rank, cache=cache)
    from memq.store.sweeps import sweep_snapshot

    for snap in report.snapshots:  # OOM snapshots: the what-if sweep, as a worker stores it (others: a no-op)
        sweep_snapshot(store, snap.snapshot_id, load=lambda sha, src: cache.get(sha) or load_blob(store, sha, src))
    if progress:
        progress("run diagnosis")
    status = meta.status
    if status is None:
        oom = bool(report.diagnosis and report.diagnosis.get("oom"))
        status = "oom" if oom else (None if existed else "completed")
    with store.session() as s:
        if status is not None:
            current = s.execute(select(Run.status).where(Run.id == run_id)).scalar_one()
            if not (current == "crashed" and meta.status is None):
                repo.set_run_status(s, meta.name, status, ended_at=max(times))
        report.status = s.execute(select(Run.status).where(Run.id == run_id)).scalar_one()
    return report


def refresh_forecast(store: Store, run_id: int, rank: int, figures: list[dict], as_of_time: float | None) -> str:
    """Move a rank's OOM forecast on with the per-step figures of a stats batch (the agent sends them
    between snapshots). Only the `forecast` of the stored run diagnosis and the run's forecast columns
    change, and only when the diagnosis is still the one read: a recompute that lands meanwhile wins.
    Returns refreshed | unchanged | none (no diagnosis, or one from before forecasts were kept)."""
    from memq.analysis.forecast import refresh

    with store.session() as s:
        row = s.execute(select(RunDiagnosis.result, RunDiagnosis.computed_at)
                        .where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank)).one_or_none()
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
        if fc is not None and fc.get("oom_expected"):
            fc["site"], fc["advice"] = kept.get("site"), kept.get("advice")
        result["forecast"] = fc
        result["details"] = dict(details, forecast_input=nxt)
        done = s.execute(update(RunDiagnosis)
                         .where(RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank,
                                RunDiagnosis.computed_at == row.computed_at)
                         .values(result=result).execution_options(synchronize_session=False))
        if not done.rowcount:
            return "unchanged"
        diags = s.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == run_id)).scalars().all()
        s.execute(update(Run).where(Run.id == run_id).values(**repo.forecast_summary(diags),
                                                             updated_at=func.current_timestamp()))
    return "refreshed"


def stored_run_result(store: Store, run_id: int, rank: int) -> dict | None:
    """The stored run-level result when it was made by the current analyzer version, else None."""
    _, version = analyzer()
    with store.session() as s:
        row = s.execute(select(RunDiagnosis.result).where(
            RunDiagnosis.run_id == run_id, RunDiagnosis.rank == rank,
            RunDiagnosis.analyzer_version == version)).scalar_one_or_none()
    return dict(row) if row is not None else None


def recompute_run(store: Store, run_id: int, rank: int = 0,
                  cache: Mapping[str, LoadedSnapshot] | None = None,
                  load: Callable[[str, str | None], LoadedSnapshot] | None = None) -> dict | None:
    """analyze() over the rank's snapshots in time order (the most recent, see MAX_RUN_SNAPSHOTS), stored
    as its run-level diagnosis; the run row's summary is refreshed. Returns the stored result.
    Only the newest snapshot is decoded (from `cache`, else `load(sha256, source)`, else the blob
    store); earlier ones come from the digests stored with their analyses, and are decoded only
    when they have none (their digest is filled in then)."""
    analyze, version = analyzer()
    from memq.analysis.per_snapshot import SnapshotDigest, digest

    cache = cache or {}
    with store.session() as s:
        run = s.execute(select(Run.memory_limit_bytes, Run.gpu_memory_bytes, Run.optimizer)
                        .where(Run.id == run_id)).one_or_none()
        if run is None:
            raise NotFound(f"no run with id {run_id}")
        newest_first = s.execute(
            select(Snapshot.id, Snapshot.sha256, Snapshot.trigger, Snapshot.source, Snapshot.context,
                   Snapshot.step, Snapshot.epoch, Snapshot.size_bytes, AnalysisResult.id.label("analysis_id"),
                   AnalysisResult.allocated_bytes,
                   AnalysisResult.reserved_bytes, AnalysisResult.analyzer_version, AnalysisResult.digest)
            .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
            .where(Snapshot.run_id == run_id, Snapshot.rank == rank)
            .order_by(Snapshot.taken_at.desc(), Snapshot.id.desc()).limit(MAX_RUN_SNAPSHOTS)).all()

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
    facts = _facts(run.memory_limit_bytes or last_ctx.get("limit_bytes"),
                   run.gpu_memory_bytes or last_ctx.get("device_total_bytes"),
                   last_ctx.get("message"), last_ctx.get("requested_bytes"), last_ctx.get("device_free_bytes"))
    result = analyze(loaded, oom_context(facts), names=[r.source or r.sha256[:12] for r in used],
                     triggers=[r.trigger for r in used], optimizer=run.optimizer, labels=[_label(r) for r in used])
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
            peak_doc = s.execute(select(AnalysisResult.result)
                                 .where(AnalysisResult.id == peak_row.analysis_id)).scalar_one_or_none()
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
              progress: Progress | None = None) -> ReanalyzeReport:
    """Bring every snapshot (of one run, or all) and run-level diagnosis to the current analyzer
    version, recomputing from the stored blobs. `force` also redoes the run-level diagnoses that
    are already current."""
    _, version = analyzer()
    rep = ReanalyzeReport(analyzer_version=version)
    with store.session() as s:
        q = select(Snapshot.id, Snapshot.run_id, Snapshot.rank, Snapshot.sha256)
        if run_name is not None:
            run_id = repo.run_id_for(s, run_name)
            q = q.where(Snapshot.run_id == run_id)
        snaps = s.execute(q.where((Snapshot.analyzer_version.is_(None)) | (Snapshot.analyzer_version != version)
                                  | (Snapshot.state != "done")).order_by(Snapshot.id)).all()
        dq = select(Snapshot.run_id, Snapshot.rank).distinct()
        if run_name is not None:
            dq = dq.where(Snapshot.run_id == run_id)
        pairs = set(s.execute(dq).all())
        current = set(s.execute(select(RunDiagnosis.run_id, RunDiagnosis.rank)
                                .where(RunDiagnosis.analyzer_version == version)).all())
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
    from memq.store.sweeps import sweep_rank

    for run_id, rank in sorted(todo):
        recompute_run(store, run_id, rank)
        sweep_rank(store, run_id, rank)  # OOM snapshots' what-if sweeps under the current version
        rep.runs_recomputed += 1
        if progress:
            progress(f"run {run_id} rank {rank}")
    return rep


def iter_stats_jsonl(path: str | Path) -> Iterable[dict[str, Any]]:
    """Rows of a stats.jsonl file (one `torch.cuda.memory_stats()` subset per line, with `t` in
    epoch seconds, `step`, `epoch`), as the agent and the fixtures write them."""
    import gzip
    import json

    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise BadInput(f"{p}:{n}: not a JSON line ({exc})") from exc
                if not isinstance(row, dict) or "t" not in row:
                    raise BadInput(f"{p}:{n}: a stats line needs an object with `t` (epoch seconds)")
                yield row
    except OSError as exc:
        raise BadInput(f"{p}: cannot read ({exc.strerror or exc})") from exc


def ingest_stats(store: Store, run_name: str, rows: Iterable[Mapping[str, Any]], rank: int = 0) -> int:
    """Store stat samples of an existing run; returns the number of rows offered."""
    with store.session() as s:
        run_id = repo.run_id_for(s, run_name)
        n = repo.insert_stat_samples(s, (repo.stat_row(run_id, rank, r, r["t"]) for r in rows))
        repo.refresh_run_summary(s, run_id)
    return n
