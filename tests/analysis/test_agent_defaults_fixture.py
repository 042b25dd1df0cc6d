"""The H200 scenario jobs at agent defaults (tests/fixtures/agent_defaults: a Redis dump and its ground
truth), diagnosed by analyze() exactly as a worker calls it (the run's snapshots in stream order, the
envelope's trigger/step/epoch as labels, the OOM observer's payload as the outside facts), without
the services in between (tests/workers/test_agent_defaults_e2e.py runs the same dump through a real
dispatcher and Celery worker). A private redis-server reads the dump; nothing is mocked."""

from __future__ import annotations

import json

import pytest

from memq import codec, envelope
from memq.analysis import analyze
from memq.analysis.labels import snapshot_label
from memq.load import decode_snapshot_bytes
from memq.model import OomContext
from memq.oom_message import parse_oom_message
from tests.workers.test_agent_defaults_e2e import META, SCEN, DumpRedis

STREAM = "memq:ingest"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list]:
    """run -> [(envelope, decoded snapshot)] in stream order."""
    srv = DumpRedis(tmp_path_factory.mktemp("dump"))
    try:
        r = srv.client()
        out: dict[str, list] = {}
        for _id, fields in r.xrange(STREAM):
            env = envelope.parse(fields)
            if env.kind != "snapshot":
                continue
            blob = r.get(env.blob_key("memq:"))
            out.setdefault(env.run, []).append((env, _id.decode(), decode_snapshot_bytes(codec.decompress(blob))))
        return out
    finally:
        srv.stop()


def _diagnose(runs, key: str, limit: int | None = None) -> dict:
    items = runs[SCEN[key]["run"]]
    envs = [e for e, _, _ in items]
    oom = (envs[-1].payload or {}).get("oom") or {}
    ctx = OomContext(limit_bytes=limit, requested_bytes=oom.get("alloc"), device_total_bytes=oom.get("device_total"),
                     device_free_bytes=oom.get("device_free"),
                     message=parse_oom_message(oom["message"]) if oom.get("message") else None)
    return analyze([ld for _, _, ld in items], ctx, names=[f"{STREAM}/{i}" for _, i, _ in items],
                   triggers=[e.trigger for e in envs],
                   labels=[snapshot_label(e.trigger, e.step, e.epoch) for e in envs])


def _text(result: dict) -> str:
    d = result["diagnosis"]
    return json.dumps([d["causes"], d["recommendations"]])


@pytest.mark.parametrize("key", sorted(k for k, v in SCEN.items() if v.get("cause") and "(" not in v["cause"]
                                       or k.startswith("dyn_default")))
def test_primary_cause_is_the_ground_truth(runs, key):
    sc = SCEN[key]
    want = sc["cause"].split(" ")[0]
    r = _diagnose(runs, key, limit=sc.get("cap_bytes") if sc.get("outcome") != "oom" else None)
    d = r["diagnosis"]
    assert d["primary_cause"] == want, (key, d["causes"][0])
    assert STREAM not in _text(r), "evidence names snapshots by step and epoch, not by stream id"


@pytest.mark.parametrize("key", ["leak", "leak_run"])
def test_leak_names_the_training_scripts_line(runs, key):
    r = _diagnose(runs, key)
    line = f"train_leak.py:{SCEN[key]['leak_line']}"
    assert r["details"]["leak"]["allocating_site"].split(" in ")[0].endswith(line)
    assert line in r["diagnosis"]["recommendations"][0]["action"]
    assert "<no frames>" not in _text(r)


def test_the_dynamic_oom_is_projected_to_what_the_job_really_needs(runs):
    """The default allocator's OOM in step 5 has no trace of that step: its need is projected from the
    warm-up trace's last step. The same schedule's real peak (the probe) is 17.60 GB, under the cap."""
    key = next(k for k in SCEN if k.startswith("dyn_default"))
    r = _diagnose(runs, key)
    need = r["diagnosis"]["step_need"]
    peak = META["dyn_cap"]["probe_max_allocated"]
    assert abs(need["bytes"] - peak) < 0.03 * peak, (need["bytes"], peak)
    assert need["low"] <= peak <= need["high"]
    assert need["high"] <= r["oom"]["limit_bytes"] and need["fits_limit"] is True and need["k"] > 3
    advice = [x["action"] for x in r["diagnosis"]["recommendations"]]
    assert advice[0].startswith("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")  # its twin completed


def test_the_oversized_batch_gets_no_allocator_advice(runs):
    r = _diagnose(runs, "oversized")
    assert r["diagnosis"]["primary_cause"] == "activation_spike"
    for rec in r["diagnosis"]["recommendations"]:
        assert rec["action"].startswith("Do not") or not any(
            k in rec["action"] for k in ("expandable_segments", "max_split_size_mb", "garbage_collection"))


def test_optimizer_state_names_its_bytes_and_leaner_options(runs):
    r = _diagnose(runs, "optstep")
    ev = " ".join(r["diagnosis"]["causes"][0]["evidence"])
    assert "8-bit AdamW" in ev and "SGD with momentum" in ev
    assert r["details"]["per_snapshot"][-1]["label"] == "OOM in step 0"  # before any step was marked
