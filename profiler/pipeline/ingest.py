"""Files to stored, analysed snapshots: `memq ingest`, `memq demo` and `memq ingest --stats`.

- `ingest_files(store, meta, inputs)`: for each snapshot file, in time order: read and hash it,
  keep the raw bytes in the blob store, insert the snapshot row (idempotent), analyse it unless a
  result for (sha256, analyzer version, context) exists (pipeline/analyse.py), sweep an OOM snapshot
  (pipeline/sweeps.py), then recompute the run-level diagnosis from all the run's snapshots of that
  rank in time order.
- `ingest_stats(store, run, rows)`: stat samples (a JSON-lines file of them: `iter_stats_jsonl`).
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memq.analysis import run_status
from memq.analysis.labels import infer_from_name as infer
from memq.analysis.run_verdict import undetermined
from memq.errors import BadInput, MemqError
from memq.load import LoadedSnapshot, load_snapshot_file
from memq.pipeline import runs
from memq.pipeline.analyse import Progress, analyse_snapshot, oom_facts, recompute_run, stored_run_result
from memq.pipeline.sweeps import sweep_snapshot
from memq.store import repository as repo
from memq.store.blob_snapshots import load_blob
from memq.store.connection import Store


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
    #: no deciding test settled the snapshot's OOM: its cause is the best candidate (run_verdict.undetermined)
    undetermined: bool = False


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
    return infer(path)


def _trace_time(loaded: LoadedSnapshot) -> dt.datetime | None:
    times = [ev.time_us for ev in loaded.snapshot.trace if ev.time_us]
    if not times:
        return None
    t = max(times) / 1e6
    if t < 946684800:  # before 2000: a relative clock, not wall time
        return None
    return dt.datetime.fromtimestamp(t, dt.UTC)


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
        existed = repo.find_run_id(s, meta.name) is not None
        run_id = repo.upsert_run(s, meta)
        run_row = repo.run_settings(s, run_id)
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
        ref = store.blobs.put(ld.sha256, ld.raw) if ld.raw is not None else store.blobs.claim(ld.sha256)
        facts = oom_facts(run_row.memory_limit_bytes, run_row.gpu_memory_bytes, inp.oom_message,
                       inp.requested_bytes, inp.device_free_bytes)
        with store.session() as s:
            sid, created = repo.insert_snapshot(s, repo.NewSnapshot(
                run_id=run_id, sha256=ld.sha256, size_bytes=ld.raw_size, rank=rank, step=step, epoch=epoch,
                trigger=trigger, taken_at=when, blob_ref=ref, source=inp.path, context=facts))
        aid, computed = analyse_snapshot(store, sid, ld, optimizer=run_row.optimizer)
        with store.session() as s:
            diagnosis = repo.analysis_diagnosis(s, aid) or {}
        cause, weak = diagnosis.get("primary_cause"), undetermined(diagnosis)
        ld.snapshot.release_held()  # kept for the run's diagnosis: not the frames the parser dropped
        cache[ld.sha256] = ld
        while len(cache) > INGEST_CACHE:
            cache.pop(next(iter(cache)))
        report.snapshots.append(IngestedSnapshot(file=inp.path, snapshot_id=sid, sha256=ld.sha256, created=created,
                                                 analysed=computed, primary_cause=cause, step=step, epoch=epoch,
                                                 trigger=trigger, undetermined=weak))
        if progress:
            progress(f"{Path(inp.path).name}: {cause}")
    first = next((i for i, t in enumerate(times) if t is not None), None)
    fixed = [times[first] - step_ms * (first - i) if first is not None else repo.utcnow() + step_ms * i
             for i in range(first if first is not None else len(times))]
    with store.session() as s:
        for snap, t in zip(report.snapshots, fixed, strict=False):
            if snap.created:
                repo.set_snapshot_time(s, snap.snapshot_id, t)
        times[:len(fixed)] = fixed
        repo.upsert_run(s, repo.RunMeta(name=meta.name, started_at=min(times)))
    stored = None if any(x.created for x in report.snapshots) else stored_run_result(store, run_id, rank)
    report.diagnosis = stored if stored is not None else recompute_run(store, run_id, rank, cache=cache)
    for snap in report.snapshots:  # OOM snapshots: the what-if sweep, as a worker stores it (others: a no-op)
        sweep_snapshot(store, snap.snapshot_id, load=lambda sha, src: cache.get(sha) or load_blob(store, sha, src))
    if progress:
        progress("run diagnosis")
    oom = bool(report.diagnosis and report.diagnosis.get("oom"))
    with store.session() as s:
        if run_status.after_ingest(meta.status, oom, created=not existed) is not None:
            repo.upsert_run(s, repo.RunMeta(name=meta.name, ended_at=max(times)))
        runs.ingested(s, run_id, meta.status, oom, created=not existed, ended_at=max(times))
        report.status = repo.run_status(s, run_id)
    return report


def iter_stats_jsonl(path: str | Path) -> Iterable[dict[str, Any]]:
    """Rows of a stats.jsonl file (one `torch.cuda.memory_stats()` subset per line, with `t` in
    epoch seconds, `step`, `epoch`), as the agent and the fixtures write them."""
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
