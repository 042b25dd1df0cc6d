"""ARCHITECTURE.md cause 1 under a cap: a per-process cap that ran out while the card still had room
for the request is not external memory, however much of the card other jobs hold. Real H200 jobs
that shared one card with four others (tests/fixtures/growth), each under its own cap."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.growth_calibration import FIX, load_spool, replay  # noqa: E402
from memq import codec  # noqa: E402
from memq.agent.spool import decode  # noqa: E402
from memq.analysis.limits import observer_facts  # noqa: E402
from memq.pipeline.analyse import oom_context  # noqa: E402
from memq.snapshot import parse_snapshot  # noqa: E402


def _end(sc: str, variant: str, free_delta: int | None = None) -> dict:
    snaps, figs, ooms = load_spool(FIX / sc / variant)
    oom = dict(ooms[-1])
    if free_delta is not None:  # the card's free bytes just under / at the request, wherever they are said
        oom["device_free"] = oom["alloc"] + free_delta
        msgs = [decode(f.read_bytes()) for f in sorted((FIX / sc / variant).glob("*.mqs"))]
        last = [m for m in msgs if m.fields["kind"] == "snapshot"][-1]
        raw = codec.decode(last.blob)
        for trace in raw.get("device_traces") or []:
            for e in trace:
                if e.get("action") == "oom":
                    e["device_free"] = oom["device_free"]
        snaps[-1] = (parse_snapshot(raw), snaps[-1][1], snaps[-1][2])
    return replay(snaps, figs, None, oom_context(observer_facts(oom, None, None)))


@pytest.mark.parametrize("sc,variant", [("fr_epoch_p05", "defaults"), ("fr_epoch_p3", "run")])
def test_a_cap_that_ran_out_beside_other_jobs_is_not_external_memory(sc, variant):
    res = _end(sc, variant)
    d = res["diagnosis"]
    assert d["primary_cause"] == "leak", d["causes"]
    assert "external_memory" not in [c["cause"] for c in d["causes"]]


def test_the_card_itself_out_under_a_cap_is_external_memory_just_under_the_request():
    under = _end("fr_epoch_p05", "defaults", free_delta=-1)["diagnosis"]
    at = _end("fr_epoch_p05", "defaults", free_delta=0)["diagnosis"]
    assert under["primary_cause"] == "external_memory", under["causes"]
    assert at["primary_cause"] == "leak" and "external_memory" not in [c["cause"] for c in at["causes"]]
