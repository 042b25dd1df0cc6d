"""A stats batch moves a stored OOM forecast on (analyse.refresh_forecast), on SQLite and PostgreSQL: the
run diagnosis' forecast and the run's forecast columns change, nothing else; the same batch twice is
one change; a run with no diagnosis is left alone."""

from __future__ import annotations

import json

from sqlalchemy import select

from memq.pipeline import analyse, ingest
from memq.store import repository as repo
from memq.store.orm import Run, RunDiagnosis
from tests.analysis.agent_data import FORECAST, spool_files, spool_run

SPOOL = next((FORECAST / "val_logits" / "defaults").iterdir())
CAP = json.loads((FORECAST / "truth.json").read_text())["val_logits"]["defaults"]["cap_bytes"]


def _ingest_first(store, tmp_path, n: int) -> int:
    files = spool_files(SPOOL, tmp_path / "files")[:n]
    ingest.ingest_files(store, repo.RunMeta(name="fc-refresh", status="running"),
                         [ingest.SnapshotInput(path=str(f)) for f in files], limit_bytes=CAP)
    with store.session() as s:
        return s.execute(select(Run.id).where(Run.name == "fc-refresh")).scalar_one()


def _later_figures() -> list[dict]:
    snaps, _ctx, trig = spool_run(SPOOL)
    last = [s for s, t in zip(snaps, trig, strict=True) if t != "oom"][-1]
    return [{"step": f.step, "epoch": f.epoch, "allocated": f.allocated, "peak_allocated": f.peak_allocated,
             "peak_reserved": f.peak_reserved, "reserved": f.reserved, "ms": f.ms} for f in last.agent.step_figures]


def _stored(store, rid):
    with store.session() as s:
        d = s.execute(select(RunDiagnosis).where(RunDiagnosis.run_id == rid)).scalar_one()
        run = s.execute(select(Run).where(Run.id == rid)).scalar_one()
        return dict(d.result), d.primary_cause, run.oom_forecast_step


def test_refresh_moves_the_forecast_and_nothing_else(store, tmp_path):
    rid = _ingest_first(store, tmp_path, 8)
    before, cause, _col = _stored(store, rid)
    assert before["forecast"]["oom_expected"] is True
    figs = _later_figures()
    assert analyse.refresh_forecast(store, rid, 0, figs, 1.8e9) == "refreshed"
    after, cause2, col = _stored(store, rid)
    assert after["forecast"]["as_of_step"] == max(f["step"] for f in figs) > before["forecast"]["as_of_step"]
    assert after["forecast"]["as_of_time"] == 1.8e9 and col == after["forecast"]["step"]
    assert after["diagnosis"] == before["diagnosis"] and cause2 == cause
    assert after["forecast"]["site"] == before["forecast"]["site"]
    # the same batch again adds nothing
    assert analyse.refresh_forecast(store, rid, 0, figs, 1.8e9) == "unchanged"


def test_no_diagnosis_is_left_alone(store):
    with store.session() as s:
        rid = repo.upsert_run(s, repo.RunMeta(name="bare"))
    assert analyse.refresh_forecast(store, rid, 0, _later_figures(), None) == "none"


CACHE = next((FORECAST / "cache_fill" / "defaults").iterdir())
CACHE_CAP = json.loads((FORECAST / "truth.json").read_text())["cache_fill"]["defaults"]["cap_bytes"]


def test_figures_that_show_the_growth_stopped_make_the_run_diagnosed_again(store, tmp_path):
    """cache_fill (a cache that fills for two epochs, then stays): diagnosed on its first snapshots, the
    growth looks like a leak; the stats batches' figures of the later epochs show the plateau, which
    moves the growth model's verdict (refresh says so), and the run's diagnosis made again over the
    whole series (the kept figures included) is no leak, its forecast a plateau."""
    files = spool_files(CACHE, tmp_path / "files")
    snaps, _ctx, trig = spool_run(CACHE)
    n = 5
    ingest.ingest_files(store, repo.RunMeta(name="cache-run", status="running"),
                        [ingest.SnapshotInput(path=str(f)) for f in files[:n]], limit_bytes=CACHE_CAP)
    with store.session() as s:
        rid = s.execute(select(Run.id).where(Run.name == "cache-run")).scalar_one()
    before, cause, _col = _stored(store, rid)
    assert before["details"]["leak"]["holds"] and cause == "leak", before["details"]["leak"]["evidence"]
    last = [s for s, t in zip(snaps, trig, strict=True) if t != "oom"][-1]
    figs = [{"step": f.step, "epoch": f.epoch, "allocated": f.allocated, "peak_allocated": f.peak_allocated,
             "peak_reserved": f.peak_reserved, "reserved": f.reserved, "ms": f.ms} for f in last.agent.step_figures]
    assert analyse.refresh_forecast(store, rid, 0, figs, 1.8e9) == "verdict_changed"
    analyse.recompute_run(store, rid, 0)
    after, cause2, _col = _stored(store, rid)
    assert cause2 != "leak" and not after["details"]["leak"]["holds"]
    assert after["forecast"]["growth"]["state"] == "plateau" and after["forecast"]["oom_expected"] is False
    assert "then flat for" in after["forecast"]["basis"]
