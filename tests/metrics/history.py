"""Runs written into a real history database the way the workers leave them (a run row with its
verdict, plus the run-level diagnosis of one rank), for the outbox and exporter tests."""

from __future__ import annotations

from sqlalchemy import update

from memq.store import repository as repo
from memq.store.orm import Run

GIB = 1024**3


def diagnosis(cause: str, evidence: str, action: str, why: str = "") -> dict:
    return {"schema": 1, "metrics": {"fragmentation_ratio": 0.1}, "oom": None,
            "diagnosis": {"primary_cause": cause, "confidence": 0.9,
                          "causes": [{"cause": "healthy", "confidence": 0.1, "evidence": ["not this one"]},
                                     {"cause": cause, "confidence": 0.9, "evidence": [evidence, "second line"]}],
                          "recommendations": [{"action": action, "why": why, "expected_effect": "fits"}]}}


def add_run(session, name: str, *, cluster: str = "c1", job: str = "j1", status: str = "running",
            cause: str | None = "healthy", oom_count: int = 0, peak: int | None = 10 * GIB,
            limit: int | None = 80 * GIB, evidence: str = "evidence line", action: str = "do this",
            frag: float | None = 0.2) -> int:
    rid = repo.upsert_run(session, repo.RunMeta(name=name, cluster=cluster, job=job, gpu_memory_bytes=limit))
    session.execute(update(Run).where(Run.id == rid).values(
        status=status, primary_cause=cause, oom_count=oom_count, peak_reserved_bytes=peak,
        fragmentation_ratio=frag, updated_at=repo.db_time(session, repo.utcnow())))
    if cause is not None:
        repo.store_run_diagnosis(session, rid, 0, "test", diagnosis(cause, evidence, action, "because"), 1,
                                 peak, peak, {})
    return rid


def set_run(session, rid: int, **values) -> None:
    values.setdefault("updated_at", repo.db_time(session, repo.utcnow()))
    session.execute(update(Run).where(Run.id == rid).values(**values))
