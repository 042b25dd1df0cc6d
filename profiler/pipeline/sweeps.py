"""What-if sweeps of OOM snapshots: computed by a worker (and `memq ingest`), stored, read back.

- `sweep_snapshot(store, snapshot_id, load=None)`: the standard sweep (`memq whatif --sweep`'s
  settings) of one OOM snapshot under its run's own limit, with the same rank's earlier snapshots
  that carry a trace as seeds (profiler/analysis/whatif.py); stored by store/sweeps.py. Snapshots that
  are not OOMs are skipped; a sweep already stored for the same inputs is reused.
- `replay_for_run(store, run, rank, confs, limit)`: `memq whatif --run`: the run's last OOM snapshot
  (else its last snapshot) and its limit, from the history.
- `whatif_simulator(store, session)`: the nightly report's replay of a run under a proposed setting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from memq.analysis.whatif import run_whatif, sweep_confs
from memq.errors import MemqError, NotFound
from memq.store import sweeps
from memq.store.blob_snapshots import load_blob
from memq.store.connection import Store
from memq.store.sweeps import (
    Loader,
    SweepPlan,
    oom_snapshot_ids,
    plan_for,
    store_sweep,
    stored_sweep_id,
    sweep_version,
    target_for_run,
)


def run_plan(plan: SweepPlan, load: Loader, confs: list[str] | None = None,
             limit_bytes: int | None = None, sweep: bool = False) -> dict[str, Any]:
    """Replay a plan (decoding its blobs with `load(sha256, source)`) under the recorded settings,
    `confs`, and the standard sweep when `sweep` or no confs are given; the stored document."""
    target = load(plan.target.sha256, plan.target.source)
    earlier, used = [], []
    for ref in plan.earlier:
        try:
            earlier.append(load(ref.sha256, ref.source).snapshot)
            used.append(ref)
        except MemqError:
            continue  # a blob gone or refused: seed with the others
    snap = target.snapshot
    wanted = [""]
    for c in list(confs or []) + (sweep_confs(snap) if sweep or confs is None else []):
        if c not in wanted:
            wanted.append(c)
    limit = limit_bytes if limit_bytes is not None else plan.limit_bytes
    results = run_whatif(snap, limit, wanted, earlier=earlier, recorded_oom=plan.recorded_oom or None)
    out = []
    for r in results:
        d = r.to_dict()
        inputs = d.get("inputs") or {}
        for k in ("joined", "seeds"):  # indices into `earlier` -> the user's terms
            inputs[k] = [used[i].describe() for i in inputs.get(k) or [] if i < len(used)]
        d["inputs"] = inputs
        out.append(d)
    return {"snapshot": plan.target.describe(), "run": plan.run_name, "limit_bytes": limit,
            "limit_source": "--limit" if limit_bytes is not None else plan.limit_source,
            "recorded_oom": plan.recorded_oom, "confs": wanted, "results": out}


def _default_load(store: Store) -> Loader:
    return lambda sha, src: load_blob(store, sha, src)


def sweep_snapshot(store: Store, snapshot_id: int, load: Loader | None = None) -> tuple[int | None, bool]:
    """The stored sweep of one OOM snapshot: (its id, whether it was computed now); (None, False) for
    a snapshot that is not an OOM or whose blob is gone."""
    version = sweep_version()
    with store.session() as s:
        plan = plan_for(s, snapshot_id)
        if not plan.recorded_oom:
            return None, False
        key = plan.context_key()
        sid = stored_sweep_id(s, plan.target.sha256, version, key)
    if sid is not None:
        return sid, False
    try:
        doc = run_plan(plan, load or _default_load(store))
    except NotFound:
        return None, False
    with store.session() as s:
        return store_sweep(s, plan.target.sha256, version, key, plan.limit_bytes, doc), True


def sweep_rank(store: Store, run_id: int, rank: int, load: Loader | None = None) -> int:
    """Sweep every analysed OOM snapshot of one run's rank (stored ones are reused); returns how many
    were computed now."""
    with store.session() as s:
        ids = oom_snapshot_ids(s, run_id, rank)
    return sum(sweep_snapshot(store, sid, load)[1] for sid in ids)


def replay_for_run(store: Store, run_name: str, rank: int | None, confs: list[str], sweep: bool = False,
                   limit_bytes: int | None = None, load: Loader | None = None) -> dict[str, Any]:
    """`memq whatif --run`: the document of `run_plan` for the run's target snapshot."""
    with store.session() as s:
        plan = plan_for(s, target_for_run(s, run_name, rank))
    return run_plan(plan, load or _default_load(store), confs=list(confs), limit_bytes=limit_bytes, sweep=sweep)


def whatif_simulator(store, session,
                     max_trace_entries: int = 200_000) -> Callable[[dict, str], dict | None]:
    """A `simulate` for build_report: the run's last snapshot (its OOM snapshot when it has one)
    under the recorded settings and under `setting`, at the run's limit: the sweep the worker stored
    for it (store/sweeps.py) when it holds the setting, else replayed here from the blob
    store with the rank's earlier snapshots as seeds. The result carries the verdict and its reason
    (not assessable, or a success over the recorded window only), never an outcome alone. Returns
    None when the blob is not stored or the trace is too long to replay here."""
    def simulate(run: dict, setting: str) -> dict | None:
        row = sweeps.report_target(session, run["id"])
        if row is None:
            return None
        stored = sweeps.sweeps_by_sha(session, [row.sha256]).get(row.sha256)
        results = {r["conf"]: r for r in (stored or {}).get("results") or []}
        source = "stored sweep"
        if "" not in results or setting not in results:
            if not store.blobs.exists(row.sha256):
                return None
            try:
                def load(sha, src):
                    ld = load_blob(store, sha, src)
                    if sum(len(t) for t in ld.snapshot.traces) > max_trace_entries:
                        raise ValueError("trace too long to replay in the report")
                    return ld

                plan = sweeps.plan_for(session, int(row.id))
                doc = run_plan(plan, load, confs=[setting],
                                      limit_bytes=run["memory_limit_bytes"] or plan.limit_bytes)
            except ValueError as exc:
                if "too long" in str(exc):
                    return None
                return {"conf": setting, "error": f"{type(exc).__name__}: {exc}"[:300]}
            except MemqError as exc:
                return {"conf": setting, "error": f"{type(exc).__name__}: {exc}"[:300]}
            results = {r["conf"]: r for r in doc["results"]}
            source = "replayed for this report"
        recorded, proposed = results[""], results[setting]
        return {"conf": setting, "snapshot": row.sha256[:12], "trigger": row.trigger, "source": source,
                "limit_bytes": proposed.get("limit_bytes", (stored or {}).get("limit_bytes")),
                "recorded_predicted_oom": recorded.get("predicted_oom"),
                "predicted_oom": proposed.get("predicted_oom"),
                "verdict": proposed.get("verdict"),
                "reason": proposed.get("reason"),
                "recorded_reason": recorded.get("reason"),
                "recorded_peak_reserved_bytes": recorded.get("peak_reserved_bytes"),
                "peak_reserved_bytes": proposed.get("peak_reserved_bytes"),
                "confidence": proposed.get("confidence"),
                "note": (proposed.get("notes") or [None])[-1]}

    return simulate
