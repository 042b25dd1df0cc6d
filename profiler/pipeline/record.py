"""What an agent's envelope records: the rows each kind means (the dispatcher reads the stream, moves the
blobs, batches, acknowledges and dead-letters; this is what it writes). Each function takes the
dispatcher's open session, so the rows commit together before the entries are acknowledged.

- `new_run(s, env)`: the run an envelope names, created by it when new (first values win);
- `run_start(s, env)`: the run's settings as its rank 0 announces them (device, cap, allocator
  settings, optimizer, ...);
- `run_end(s, run_id, env)`: its end time and status (analysis/run_status.py, through pipeline/runs.py),
  and the rank's own exit figures;
- `stats(s, items)`: stat samples (one INSERT for a batch) and rank figures; returns the per-step
  figures each (run, rank) sent, for the forecast's refresh;
- `snapshot(s, run_id, env, ref, source)`: the snapshot row (idempotent), with the OOM observer's facts
  read against the run's limit and device; an OOM snapshot moves its run to `oom`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from memq import envelope
from memq.analysis.forecast import MAX_FIGURES as MAX_FORECAST_FIGURES
from memq.analysis.limits import observer_facts, real_cap
from memq.analysis.series import compact as compact_figures
from memq.launcher_ids import real_id
from memq.pipeline import runs
from memq.store import rank_figures
from memq.store import repository as repo


def _ts(ms: int | None) -> dt.datetime | None:
    return None if ms is None else repo.to_utc(ms / 1000.0)


def _int_or_none(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _str(v: Any, n: int) -> str | None:
    if v is None or v == "":
        return None
    return str(v)[:n]


def _outside(value, total: int | None) -> int | None:
    """Bytes held outside PyTorch as run_start says, kept only when they fit the device."""
    v = _int_or_none(value)
    if v is None or v < 0 or (total is not None and v >= total):
        return None
    return v


def new_run(s, env: envelope.Envelope) -> tuple[int, str | None]:
    """(the run's id, its owner): created by this envelope when new, else as stored (first values win)."""
    rid = repo.upsert_run(s, repo.RunMeta(name=env.run, cluster=env.cluster, job=real_id(env.job),
                                          host=env.host or None, started_at=_ts(env.ts), owner=env.owner or None),
                          first_wins=True)
    return rid, repo.run_owner(s, rid)


def run_meta(env: envelope.Envelope) -> repo.RunMeta:
    """The run's settings as a run_start announces them (sizes that do not fit the device are dropped)."""
    p = env.payload
    total = _int_or_none(p.get("device_total"))
    conf = p.get("alloc_conf_env") or {}
    conf_text = conf.get("PYTORCH_CUDA_ALLOC_CONF") or conf.get("PYTORCH_ALLOC_CONF") \
        if isinstance(conf, dict) else None
    labels = p.get("labels") if isinstance(p.get("labels"), dict) else {}
    return repo.RunMeta(
        name=env.run, cluster=env.cluster, job=real_id(env.job), host=env.host or None, rank=env.rank,
        labels=labels, torch_version=_str(p.get("torch"), 64), cuda_version=_str(p.get("cuda"), 64),
        driver_version=_str(p.get("driver"), 64), gpu_model=_str(p.get("gpu"), 128), gpu_memory_bytes=total,
        memory_limit_bytes=real_cap(p.get("limit_bytes"), total), allocator_conf=_str(conf_text, 500),
        non_pytorch_bytes=_outside(p.get("non_pytorch_bytes"), total),
        optimizer=_str(p.get("optimizer"), 100), param_count=_int_or_none(p.get("params")),
        world_size=_int_or_none(p.get("world_size")), started_at=_ts(env.ts))


def run_start(s, env: envelope.Envelope) -> int:
    return repo.upsert_run(s, run_meta(env), first_wins=True)


def run_end(s, run_id: int, env: envelope.Envelope) -> None:
    repo.upsert_run(s, repo.RunMeta(name=env.run, ended_at=_ts(env.ts)))
    sent = env.payload.get("status")
    runs.ended(s, run_id, envelope.LEGACY_RUN_STATUSES.get(sent, sent))
    figures = env.payload.get("figures")
    if isinstance(figures, dict):  # the rank's own peaks, also of a rank torn down by the launcher
        rank_figures.upsert(s, run_id, env.rank, figures, sent, _ts(env.ts))


@dataclass
class StatsRecorded:
    samples: int = 0
    #: (run id, rank) -> (its per-step figures, compacted, oldest first; the batch's latest time in s)
    figures: dict[tuple[int, int], tuple[list, float]] = field(default_factory=dict)


def stats(s, items: Iterable[tuple[int, envelope.Envelope]]) -> StatsRecorded:
    """`items`: (run id, envelope) of consecutive stats entries."""
    out = StatsRecorded()
    rows: list[dict] = []
    for rid, env in items:
        figs = env.payload.get("step_figures")
        if isinstance(figs, list) and figs:
            got = out.figures.setdefault((rid, env.rank), ([], 0.0))
            got[0].extend(f for f in figs if isinstance(f, dict))
            # a long batch keeps its whole shape at bounded size (older figures merged pairwise)
            out.figures[(rid, env.rank)] = (compact_figures(got[0], MAX_FORECAST_FIGURES),
                                            max(got[1], env.ts / 1000.0))
        if isinstance(env.payload.get("rank_figures"), dict):
            rank_figures.upsert(s, rid, env.rank, env.payload["rank_figures"], None, _ts(env.ts))
        samples = env.payload.get("samples")
        for smp in samples if isinstance(samples, list) else []:
            if not isinstance(smp, dict) or "device_metadata" in smp:
                continue
            t = smp.get("t")
            if not isinstance(t, (int, float)) or isinstance(t, bool):
                continue
            try:
                rows.append(repo.stat_row(rid, env.rank, smp, float(t), step=_int_or_none(smp.get("step")),
                                          epoch=_int_or_none(smp.get("epoch"))))
            except (TypeError, ValueError, OverflowError):
                continue  # one malformed sample is skipped, not the batch
    if rows:
        repo.insert_stat_samples(s, rows)
    out.samples = len(rows)
    return out


def snapshot(s, run_id: int, env: envelope.Envelope, ref: str, source: str) -> tuple[int, str, bool]:
    """The snapshot row (ON CONFLICT DO NOTHING); returns (id, state, created)."""
    run = repo.run_settings(s, run_id)
    facts = observer_facts(env.oom or {}, run.memory_limit_bytes, run.gpu_memory_bytes)
    sid, created = repo.insert_snapshot(s, repo.NewSnapshot(
        run_id=run_id, sha256=env.sha256, size_bytes=int(env.size or 0), rank=env.rank, step=env.step,
        epoch=env.epoch, trigger=env.trigger or "manual", taken_at=_ts(env.ts), blob_ref=ref,
        source=source, context=facts))
    state = "pending" if created else repo.snapshot_row(s, sid).state
    runs.snapshot_seen(s, run_id, env.trigger)
    return sid, state, created
