"""`memq fit` on stored runs and on decoded snapshots: the CLI's and the web's /fit use case (the
run's measured snapshot is found by store/fit_source.py, its blob decoded, the question answered by
analysis/fit.py)."""

from __future__ import annotations

from dataclasses import replace

from memq.analysis import fit as F
from memq.errors import BadInput
from memq.store.blob_snapshots import load_blob
from memq.store.fit_source import fit_source


def answer_for(snap, where: str, question, fallback_limit: tuple[int | None, str | None]) -> dict:
    """`memq fit`'s document for a decoded snapshot (CLI and web): the question's limit, else
    `fallback_limit` (the run's, else the agent's). Refusals are BadInput naming what to change."""
    if question.limit is None:
        limit = fallback_limit[0]
        if limit is None and snap.agent is not None and snap.agent.limit_bytes:
            limit, source = snap.agent.limit_bytes, "the agent's limit at its last step boundary"
        else:
            source = fallback_limit[1]
        question = replace(question, limit=limit, limit_source=source if limit is not None else None)
    question, read = F.measured_shape(question, snap)
    try:
        F.check(question)
        doc = F.answer(F.classify(snap, optimizer=question.optimizer), question)
        if read:
            doc["notes"].append(read)
    except ValueError as exc:
        raise BadInput(str(exc)) from exc
    except F.NotAssessable as exc:
        raise BadInput(f"{where}: {exc}") from exc
    doc["source"] = where
    return doc


def fit_for_run(store, run_name: str, rank: int | None, question) -> dict:
    """`memq fit --run` and the web's /fit: the run's measured snapshot, answered."""
    with store.session() as s:
        src = fit_source(s, run_name, rank)
    snap = load_blob(store, src.sha256, src.source).snapshot
    step = f" step {src.step}" if src.step is not None else ""
    why = f": {src.chosen}" if src.chosen else ""
    where = (f"run {run_name} rank {src.rank}, snapshot {src.snapshot_id}{step} ({src.trace_entries} trace "
             f"entries{why})")
    doc = answer_for(snap, where, question, (src.limit_bytes, src.limit_source))
    doc["run"], doc["rank"], doc["snapshot_id"] = run_name, src.rank, src.snapshot_id
    return doc
