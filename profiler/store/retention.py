"""Retention: remove raw snapshot blobs and stat samples past a per-cluster policy.

What goes, per cluster (MEMQ_RETENTION_DAYS, overridden per cluster by MEMQ_RETENTION_CLUSTERS
`name=days,...`; 0 days = keep forever):
- stat samples older than the cutoff (samples whose run row is gone follow the default policy); on
  PostgreSQL, where stat_samples has a partition per UTC day (partitions.py), a whole day at a time:
  cutoffs are rounded down to midnight, and days past every policy in use go as a dropped partition;
- the raw blob (in the blob store) of a snapshot taken before the cutoff, once its analysis is
  finished (state done or failed). The snapshot row, its analysis result and the run diagnosis
  stay: `memq history` still shows them; only `memq reanalyze` of that snapshot is no longer possible.
- blob files that no snapshot row names at all (orphans) older than the default cutoff, and
  temporary files of interrupted writes older than a day.

What stays, whatever its age:
- the blob of a snapshot that carries an OOM (trigger `oom`, or an analysis that found one) or a
  diagnosis (an analysis whose primary cause is anything but `healthy`): the evidence behind a verdict;
- the blob of any snapshot still pending or running (the analysis needs it);
- the blobs of a run still active (status running, a snapshot newer than its cutoff): its run-level
  diagnosis re-reads up to 64 earlier snapshots of each rank (a leak shows across epochs);
- a blob that any other snapshot row still references (the same bytes under two runs share one blob):
  a file is removed only when every row naming its sha256 is itself past retention and unprotected.
Rows are updated first (blob_ref set to NULL, in one transaction that re-counts the references), the
files are removed after the commit: each is renamed aside (`<name>.held`) for RACE_GRACE_S and put back
if a row naming it appeared meanwhile (a dispatcher or `memq ingest` that found the file just before it
went; a writer that needs a held file takes it back itself, BlobStore.claim). A crash during the hold
leaves the held file on disk: a later run puts it back when a row names it, else removes it. A file
whose removal failed is an orphan for a later run.

Blobs of dead-lettered snapshots (`remove_dead_blobs`, fed by the dead-blob cleanup in
memq.workers.retention) go through the same guarded removal, whatever the retention policy: a blob
no row names with a blob_ref is removed, any other stays.

    policy = Policy.from_settings(settings)
    summary = collect(store, policy, dry_run=True)      # what would go; nothing changes
    summary = collect(store, policy)                    # remove

Every filter is a bound parameter (SQLAlchemy expressions), never formatted into SQL.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import delete, func, select, update

from memq.config import Settings
from memq.errors import ConfigError
from memq.store import partitions
from memq.store.blobs import HELD_SUFFIX
from memq.store.orm import AnalysisResult, Run, Snapshot, StatSample
from memq.store.repository import db_time, utcnow

CHUNK = 500
#: Removed blobs are held in memory this long, then put back if a row naming them appeared meanwhile.
RACE_GRACE_S = 10.0
#: ... at most this many bytes at a time (then the check runs early).
HOLD_MAX_BYTES = 256 * 1024**2
#: Stat samples are deleted in time windows of this length, one transaction each.
STAT_WINDOW = dt.timedelta(hours=6)
_BLOB_NAME = re.compile(r"^([0-9a-f]{64})\.(zst|gz)$")
_HELD_NAME = re.compile(r"^([0-9a-f]{64})\.(zst|gz)\.held$")
_BLOB_SHA = re.compile(r"^[0-9a-f]{64}$")
_TMP_MAX_AGE_S = 24 * 3600


def parse_overrides(text: str) -> dict[str, int]:
    """`dev=7,prod=90` -> {"dev": 7, "prod": 90}; ConfigError names the bad item."""
    out: dict[str, int] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, days = item.rpartition("=")
        name = name.strip()
        try:
            n = int(days.strip())
        except ValueError:
            n = -1
        if not sep or not name or n < 0:
            raise ConfigError(f"MEMQ_RETENTION_CLUSTERS: {item!r} is not `cluster=days` (days >= 0)")
        out[name] = n
    return out


@dataclass(frozen=True)
class Policy:
    default_days: int = 30
    clusters: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, st: Settings) -> Policy:
        if st.retention_days < 0:
            raise ConfigError("MEMQ_RETENTION_DAYS must be >= 0 (0 keeps everything)")
        return cls(int(st.retention_days), parse_overrides(st.retention_clusters))

    def days_for(self, cluster: str | None) -> int:
        return self.clusters.get(cluster, self.default_days) if cluster is not None else self.default_days

    def cutoff(self, days: int, now: dt.datetime) -> dt.datetime | None:
        return None if days <= 0 else now - dt.timedelta(days=days)

    def describe(self) -> dict:
        return {"default_days": self.default_days, "clusters": dict(sorted(self.clusters.items()))}


def _chunks(items: list, n: int = CHUNK) -> Iterator[list]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _protected(trigger: str, oom_requested: int | None, oom_doc, cause: str | None) -> str | None:
    """Why a snapshot's blob is kept whatever its age, or None."""
    if trigger == "oom" or oom_requested is not None or oom_doc:
        return "oom"
    if cause and cause != "healthy":
        return "diagnosis"
    return None


def _run_cutoffs(session, policy: Policy, now: dt.datetime) -> dict[int, dt.datetime]:
    """run id -> cutoff, for runs whose cluster's policy removes anything."""
    out: dict[int, dt.datetime] = {}
    for rid, cluster in session.execute(select(Run.id, Run.cluster)):
        cut = policy.cutoff(policy.days_for(cluster), now)
        if cut is not None:
            out[int(rid)] = cut
    return out


def _delete_samples(store, where_extra, cut: dt.datetime, dry_run: bool) -> int:
    """Samples matching `where_extra` older than `cut`, removed in windows of STAT_WINDOW, each its own
    transaction (a day of 10,000 GPUs is 86 million rows: never one transaction)."""
    with store.session() as s:
        first = s.execute(select(func.min(StatSample.sampled_at))
                          .where(*where_extra, StatSample.sampled_at < db_time(s, cut))).scalar_one()
    if first is None:
        return 0
    total, lo = 0, _aware(first)
    while lo < cut:
        hi = min(cut, lo + STAT_WINDOW)
        with store.session() as s:
            where = (*where_extra, StatSample.sampled_at >= db_time(s, lo), StatSample.sampled_at < db_time(s, hi))
            if dry_run:
                total += int(s.execute(select(func.count()).select_from(StatSample).where(*where)).scalar_one())
            else:
                total += int(s.execute(delete(StatSample).where(*where)).rowcount or 0)
        lo = hi
    return total


def _floor_day(t: dt.datetime) -> dt.datetime:
    t = t.astimezone(dt.UTC)
    return t.replace(hour=0, minute=0, second=0, microsecond=0)


def _whole_day_cut(session, policy: Policy, now: dt.datetime) -> dt.datetime | None:
    """Midnight (UTC) before which every stat sample is past retention, whatever its run's cluster:
    the cutoff of the longest retention in use (runs' clusters, and the default for samples of
    deleted runs); None when one of them keeps samples forever."""
    clusters = set(session.execute(select(Run.cluster).distinct()).scalars())
    days = {policy.days_for(c) for c in clusters} | {policy.default_days}
    if min(days) <= 0:
        return None
    return _floor_day(now - dt.timedelta(days=max(days)))


def _stat_samples(store, policy: Policy, now: dt.datetime, dry_run: bool, summary: dict) -> int:
    """On PostgreSQL (stat_samples partitioned by UTC day, profiler/store/partitions.py) whole days
    past every policy are dropped first, and every cutoff is rounded down to midnight, so samples go
    a whole day at a time (kept up to a day longer than the policy) and row deletes only remain for
    clusters with a shorter retention than others, and for the default partition."""
    total = 0
    with store.session() as s:
        cutoffs = _run_cutoffs(s, policy, now)
        partitioned = partitions.is_partitioned(s)
        if partitioned:
            cut = _whole_day_cut(s, policy, now)
            if cut is not None:
                dropped, rows = partitions.drop_days_before(s, cut.date(), dry_run)
                summary["stat_partitions_dropped"] = dropped
                total += rows  # 0 in a dry run: the row counts below include those rows
    default_cut = policy.cutoff(policy.default_days, now)
    if partitioned:
        cutoffs = {rid: _floor_day(c) for rid, c in cutoffs.items()}
        default_cut = _floor_day(default_cut) if default_cut is not None else None
    by_cut: dict[dt.datetime, list[int]] = defaultdict(list)
    for rid, cut in cutoffs.items():
        by_cut[cut].append(rid)
    for cut, rids in by_cut.items():
        for chunk in _chunks(sorted(rids)):
            total += _delete_samples(store, (StatSample.run_id.in_(chunk),), cut, dry_run)
    if default_cut is not None:  # samples of runs deleted since (stat_samples has no foreign key)
        total += _delete_samples(store, (StatSample.run_id.not_in(select(Run.id)),), default_cut, dry_run)
    return total


def _candidates(store, policy: Policy, now: dt.datetime, summary: dict) -> dict[str, list[int]]:
    """sha256 -> ids of snapshot rows past retention whose blob may go (unprotected, finished)."""
    out: dict[str, list[int]] = defaultdict(list)
    with store.session() as s:
        cutoffs = _run_cutoffs(s, policy, now)
        if not cutoffs:
            return {}
        oldest = max(cutoffs.values())
        active = _active_runs(s, cutoffs)
        q = (select(Snapshot.id, Snapshot.run_id, Snapshot.sha256, Snapshot.taken_at, Snapshot.created_at,
                    Snapshot.trigger, AnalysisResult.oom_requested_bytes, AnalysisResult.primary_cause,
                    AnalysisResult.result["oom"].label("oom_doc"))
             .outerjoin(AnalysisResult, AnalysisResult.id == Snapshot.analysis_id)
             .where(Snapshot.blob_ref.is_not(None), Snapshot.state.in_(("done", "failed")),
                    func.coalesce(Snapshot.taken_at, Snapshot.created_at) < db_time(s, oldest)))
        for row in s.execute(q):
            cut = cutoffs.get(int(row.run_id))
            when = row.taken_at or row.created_at
            if cut is None or when is None or _aware(when) >= cut:
                continue
            why = _protected(row.trigger, row.oom_requested_bytes, row.oom_doc, row.primary_cause)
            if why is None and int(row.run_id) in active:
                why = "active_run"
            if why:
                summary["kept"][why] += 1
                continue
            out[row.sha256].append(int(row.id))
    return out


def _active_runs(session, cutoffs: dict[int, dt.datetime]) -> set[int]:
    """Runs still running with a snapshot newer than their cutoff."""
    q = (select(Snapshot.run_id, func.max(func.coalesce(Snapshot.taken_at, Snapshot.created_at)))
         .join(Run, Run.id == Snapshot.run_id).where(Run.status == "running").group_by(Snapshot.run_id))
    out = set()
    for rid, newest in session.execute(q):
        cut = cutoffs.get(int(rid))
        if cut is not None and newest is not None and _aware(newest) >= cut:
            out.add(int(rid))
    return out


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def _reference_counts(session, shas: Iterable[str]) -> dict[str, int]:
    shas = list(shas)
    got = session.execute(select(Snapshot.sha256, func.count()).where(Snapshot.sha256.in_(shas))
                          .group_by(Snapshot.sha256)).all()
    return {sha: int(n) for sha, n in got}


def _blob_files(blob_dir: Path, sha: str) -> list[Path]:
    return [p for p in (blob_dir / sha[:2] / f"{sha}.zst", blob_dir / sha[:2] / f"{sha}.gz") if p.exists()]


def _unlink(paths: Iterable[Path], summary: dict, key: str, dry_run: bool) -> None:
    for p in paths:
        try:
            size = p.stat().st_size
            if not dry_run:
                p.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            summary["errors"].append(f"{p.name}: {exc.strerror or exc}")
            continue
        summary[key] += 1
        summary["bytes_freed"] += size


class _Late(Exception):
    """A row naming one of these blobs appeared during the transaction: roll back, keep them."""

    def __init__(self, shas: set[str]):
        super().__init__(len(shas))
        self.shas = shas


def _unref_chunk(store, chunk: list[str], cands: dict[str, list[int]], dry_run: bool,
                 summary: dict) -> list[str]:
    """Set blob_ref NULL on the candidate rows of the chunk's fully expired blobs, in one transaction
    that re-counts the references after the update; returns the sha256s whose files may go."""
    skip: set[str] = set()
    for _ in range(3):
        try:
            with store.session() as s:
                counts = _reference_counts(s, chunk)
                free = [sha for sha in chunk if sha not in skip and counts.get(sha, 0) == len(cands[sha])]
                ids = [i for sha in free for i in cands[sha]]
                if not dry_run and ids:
                    s.execute(update(Snapshot).where(Snapshot.id.in_(ids)).values(blob_ref=None))
                    again = _reference_counts(s, free)
                    late = {sha for sha in free if again.get(sha, 0) != len(cands[sha])}
                    if late:
                        raise _Late(late)
        except _Late as exc:
            skip |= exc.shas
            continue
        summary["kept"]["referenced"] += len(chunk) - len(free)
        summary["snapshots_unlinked"] += len(ids)
        return free
    summary["errors"].append(f"references kept changing for {len(chunk)} blobs; left for the next run")
    return []


def _hold(p: Path) -> Path:
    """Take a blob out of reach (BlobStore.ref no longer finds it) without losing it: rename it to
    `<name>.held` (same directory, atomic). A crash before `_settle` leaves it there for `_settle_held`;
    a writer that needs it meanwhile renames it back (BlobStore.claim)."""
    held = p.with_name(p.name + HELD_SUFFIX)
    os.replace(p, held)
    return held


def _settle(p: Path, held: Path, keep: bool) -> str:
    """The end of a hold: 'restored' (renamed back, or a writer already re-created or claimed it),
    or 'removed'. OSError propagates."""
    if keep:
        if p.exists():  # a writer re-created it meanwhile: the held copy is the same bytes
            held.unlink(missing_ok=True)
        else:
            try:
                os.replace(held, p)
            except FileNotFoundError:
                pass  # claimed back by a writer (BlobStore.claim)
        return "restored"
    try:
        held.unlink()
    except FileNotFoundError:
        return "restored"  # a writer claimed it back: a row names it now
    return "removed"


def _changed(expected: dict[str, int]):
    """keep-rule of retention: a blob whose row count is no longer the one it was removed at."""
    def keep(session, shas: set[str]) -> set[str]:
        counts = _reference_counts(session, shas)
        return {sha for sha in shas if counts.get(sha, 0) != expected[sha]}
    return keep


def _named(session, shas: set[str]) -> set[str]:
    """keep-rule of the dead-blob cleanup and of crash recovery: a blob some row names with a blob_ref
    (a row whose blob was removed by retention has none)."""
    if not shas:
        return set()
    return set(session.execute(select(Snapshot.sha256).where(Snapshot.sha256.in_(list(shas)),
                                                             Snapshot.blob_ref.is_not(None)).distinct()).scalars())


def _remove_guarded(store, files: dict[str, list[Path]], keep_rule, summary: dict, key: str,
                    grace_s: float) -> None:
    """Remove blob files: each is held (renamed aside, `_hold`); after `grace_s` (longer than a dispatcher
    or `memq ingest` transaction that found the file and is about to commit a row naming it)
    `keep_rule(session, shas)` is asked once more and what it keeps is put back. This closes the race
    between the reference check and the unlink; a crash in between leaves the held file on disk
    (`_settle_held`), so no blob a row needs is lost."""
    held: list[tuple[str, Path, Path, int]] = []
    held_bytes = 0

    def settle() -> None:
        nonlocal held_bytes
        if not held:
            return
        time.sleep(grace_s)
        with store.session() as s:
            keep = keep_rule(s, {sha for sha, *_ in held})
        for sha, p, h, size in held:
            try:
                what = _settle(p, h, sha in keep)
            except OSError as exc:
                summary["errors"].append(f"{p.name}: {exc.strerror or exc}")
                continue
            if what == "restored":
                summary["restored"] += 1
                summary[key] -= 1
                summary["bytes_freed"] -= size
        held.clear()
        held_bytes = 0

    for sha, paths in files.items():
        for p in paths:
            try:
                size = p.stat().st_size
                h = _hold(p)
            except FileNotFoundError:
                continue
            except OSError as exc:
                summary["errors"].append(f"{p.name}: {exc.strerror or exc}")
                continue
            held.append((sha, p, h, size))
            held_bytes += size
            summary[key] += 1
            summary["bytes_freed"] += size
            if held_bytes > HOLD_MAX_BYTES:
                settle()
    settle()


def _settle_held(store, helds: dict[str, list[Path]], summary: dict, older_than_s: float,
                 dry_run: bool = False) -> set[str]:
    """Held files (`<name>.held`) whose hold began more than `older_than_s` ago (the rename's ctime):
    by then a writer that found the file before the hold has committed its row. Each is put back when a
    row names its sha256 with a blob_ref, else removed: the rule is safe for any hold, whoever made it
    (retention's removals NULL their rows' blob_ref before holding; the others remove only what no row
    names). This settles the dead-blob cleanup's holds from one call to the next, and what a removal
    killed during its hold left behind. Returns the sha256s whose held files are still too young."""
    due = time.time() - older_than_s
    old: dict[str, list[Path]] = {}
    young: set[str] = set()
    for sha, paths in helds.items():
        for h in paths:
            try:
                if h.stat().st_ctime < due:
                    old.setdefault(sha, []).append(h)
                else:
                    young.add(sha)
            except OSError:
                continue
    if not old or dry_run:
        return young | set(old)
    with store.session() as s:
        keep = _named(s, set(old))
    for sha, paths in old.items():
        for h in paths:
            p = h.with_name(h.name[:-len(HELD_SUFFIX)])
            try:
                size = h.stat().st_size
                what = _settle(p, h, sha in keep)
            except FileNotFoundError:
                continue  # settled by its own removal meanwhile
            except OSError as exc:
                summary["errors"].append(f"{h.name}: {exc.strerror or exc}")
                continue
            summary["held_restored" if what == "restored" else "held_removed"] += 1
            if what == "removed":
                summary["bytes_freed"] += size
    return young


def _held_files(blob_dir: Path, sha: str) -> list[Path]:
    held = (blob_dir / sha[:2] / f"{sha}{ext}{HELD_SUFFIX}" for ext in (".zst", ".gz"))
    return [h for h in held if h.exists()]


def remove_dead_blobs(store, shas: Iterable[str], *, grace_s: float = RACE_GRACE_S, wait: bool = True,
                      dry_run: bool = False) -> dict:
    """The blob files of dead-lettered snapshots (memq.pipeline.dead_blobs gives their sha256s once
    MEMQ_DEAD_BLOB_GRACE_S has passed): removed where no snapshot row names the sha256 with a blob_ref,
    through retention's guarded removal (held aside, the rows asked again after `grace_s`, put back if
    one appeared); a blob any row still needs stays.
    `wait=True` holds and settles within the call (sleeping `grace_s`: `memq gc`); `wait=False` holds and
    returns: the sha256s held, or held too recently to settle, are listed in `deferred`, and a later call
    settles their held files once `grace_s` has passed (the beat's tick, which never sleeps)."""
    summary: dict = {"dead_blobs_checked": 0, "dead_blobs_removed": 0, "restored": 0, "bytes_freed": 0,
                     "held_restored": 0, "held_removed": 0, "kept": {"referenced": 0}, "deferred": [],
                     "errors": []}
    blob_dir = Path(store.blobs.directory)
    todo = sorted({sha for sha in shas if _BLOB_SHA.match(sha)})
    summary["dead_blobs_checked"] = len(todo)
    for chunk in _chunks(todo):
        held = {sha: _held_files(blob_dir, sha) for sha in chunk}
        young = _settle_held(store, held, summary, grace_s, dry_run)
        summary["dead_blobs_removed"] += summary.pop("held_removed", 0)
        summary["held_removed"] = 0
        with store.session() as s:
            named = _named(s, set(chunk))
        summary["kept"]["referenced"] += len(named)
        files = {sha: _blob_files(blob_dir, sha) for sha in chunk if sha not in named}
        files = {sha: paths for sha, paths in files.items() if paths}
        if dry_run:
            for paths in files.values():
                _unlink(paths, summary, "dead_blobs_removed", dry_run)
            continue
        if wait:
            _remove_guarded(store, files, _named, summary, "dead_blobs_removed", grace_s)
            summary["deferred"] += sorted(young)
            continue
        for paths in files.values():  # held now, settled by a later call
            for p in paths:
                try:
                    _hold(p)
                except FileNotFoundError:
                    continue
                except OSError as exc:
                    summary["errors"].append(f"{p.name}: {exc.strerror or exc}")
        summary["deferred"] += sorted(young | set(files))
    return summary


def _expired_blobs(store, policy: Policy, now: dt.datetime, dry_run: bool, summary: dict, grace_s: float) -> None:
    cands = _candidates(store, policy, now, summary)
    blob_dir = Path(store.blobs.directory)
    for chunk in _chunks(sorted(cands)):
        free = _unref_chunk(store, chunk, cands, dry_run, summary)
        if dry_run:
            for sha in free:
                _unlink(_blob_files(blob_dir, sha), summary, "blobs_removed", dry_run)
            continue
        _remove_guarded(store, {sha: _blob_files(blob_dir, sha) for sha in free},
                        _changed({sha: len(cands[sha]) for sha in free}), summary, "blobs_removed", grace_s)


def _orphans(store, policy: Policy, now: dt.datetime, dry_run: bool, summary: dict, grace_s: float) -> None:
    cut = policy.cutoff(policy.default_days, now)
    blob_dir = Path(store.blobs.directory)
    if cut is None or not blob_dir.is_dir():
        return
    cut_ts = cut.timestamp()
    old: dict[str, list[Path]] = defaultdict(list)
    helds: dict[str, list[Path]] = defaultdict(list)
    for sub in sorted(blob_dir.iterdir()):
        if not sub.is_dir() or len(sub.name) != 2:
            continue
        for p in sub.iterdir():
            try:
                mtime = p.stat().st_mtime
            except OSError:
                continue
            m = _BLOB_NAME.match(p.name)
            if m and m.group(1)[:2] == sub.name and mtime < cut_ts:
                old[m.group(1)].append(p)
            elif (h := _HELD_NAME.match(p.name)) and h.group(1)[:2] == sub.name:
                helds[h.group(1)].append(p)
            elif p.name.startswith(".") and mtime < time.time() - _TMP_MAX_AGE_S:
                _unlink([p], summary, "temp_files_removed", dry_run)
    for chunk in _chunks(sorted(helds)):  # left by a removal killed during its hold
        _settle_held(store, {sha: helds[sha] for sha in chunk}, summary, grace_s, dry_run)
    for chunk in _chunks(sorted(old)):
        with store.session() as s:
            named = set(s.execute(select(Snapshot.sha256).where(Snapshot.sha256.in_(chunk)).distinct()).scalars())
        orphans = {sha: old[sha] for sha in chunk if sha not in named}
        if dry_run:
            for paths in orphans.values():
                _unlink(paths, summary, "orphans_removed", dry_run)
        else:
            _remove_guarded(store, orphans, _changed(dict.fromkeys(orphans, 0)), summary, "orphans_removed", grace_s)


def collect(store, policy: Policy, *, now: dt.datetime | None = None, dry_run: bool = False,
            grace_s: float = RACE_GRACE_S, partition_days_ahead: int | None = None) -> dict:
    """Apply `policy` (see the module docstring). Returns what was (or, dry run, would be) removed.
    `grace_s`: how long removed blobs are held before the final reference check (see _remove_guarded).
    `partition_days_ahead`: also make stat_samples' day partitions that far ahead (PostgreSQL)."""
    now = now or utcnow()
    summary: dict = {"dry_run": dry_run, "now": now.isoformat(), "policy": policy.describe(),
                     "stat_samples_removed": 0, "stat_partitions_dropped": [], "stat_partitions_created": [],
                     "snapshots_unlinked": 0, "blobs_removed": 0,
                     "orphans_removed": 0, "temp_files_removed": 0, "restored": 0, "bytes_freed": 0,
                     "held_restored": 0, "held_removed": 0,
                     "kept": {"oom": 0, "diagnosis": 0, "active_run": 0, "referenced": 0}, "errors": []}
    if partition_days_ahead is not None and not dry_run:
        with store.session() as s:
            summary["stat_partitions_created"] = partitions.ensure_ahead(s, now, partition_days_ahead)
    if policy.default_days <= 0 and not any(d > 0 for d in policy.clusters.values()):
        return summary
    summary["stat_samples_removed"] = _stat_samples(store, policy, now, dry_run, summary)
    _expired_blobs(store, policy, now, dry_run, summary, grace_s)
    _orphans(store, policy, now, dry_run, summary, grace_s)
    return summary


__all__ = ["Policy", "parse_overrides", "collect", "remove_dead_blobs"]
