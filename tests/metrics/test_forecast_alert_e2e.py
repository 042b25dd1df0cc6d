"""The OOM forecast alert end to end: a real H200 leak run (tests/fixtures/forecast, val_logits at agent
defaults) replayed envelope by envelope into Redis at a steady pace, as a job that is still running
sends them -> `memq dispatcher` -> a Celery worker with its beat -> PostgreSQL; the alert must reach a
local webhook receiver before the run's OOM envelope is even sent.

The job set its cap after its first steps; the replay reports the cap in `run_start` (`limit_bytes`),
as the agent does for a job that caps itself before `agent.start`."""

from __future__ import annotations

import json
import shutil
import time

import pytest

from memq import envelope
from memq.agent.spool import Spool, iter_spool_dirs
from memq.agent.transport import append_fields
from tests.metrics.receiver import Receiver
from tests.workers.stack import Stack, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(300)]

from pathlib import Path  # noqa: E402

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "forecast"
RUN = "fc-val_logits-defaults"
PACE_S = 1.0  # between two snapshot envelopes (the real job's epochs took 0.2 s; a real one's, minutes)


@pytest.fixture(scope="module")
def rx():
    with Receiver() as r:
        yield r


@pytest.fixture(scope="module")
def stack(tmp_path_factory, shared_redis, pg_server, rx):
    from tests.conftest import temp_pg_database

    with temp_pg_database("forecast") as url:
        s = Stack(tmp_path_factory.mktemp("forecast"), shared_redis, url, MEMQ_ALERT_WEBHOOK_URL=rx.url,
                  MEMQ_ALERT_SWEEP_S="1", MEMQ_ALERT_RUN_INTERVAL_S="0", MEMQ_ALERT_FORMAT="alertmanager",
                  MEMQ_PUBLIC_URL="http://memq.test", MEMQ_FORECAST_ALERT_S="21600",
                  MEMQ_RUN_DIAGNOSIS_DELAY_MS="300", MEMQ_FORECAST_REFRESH_S="2")
        try:
            s.upgrade()
            s.start_worker(concurrency=1)  # with its beat: the alert sweep runs every second
            s.start_dispatcher(wait=True)
            yield s
        finally:
            s.close()


def _forecast_alerts(rx: Receiver) -> list[dict]:
    out = []
    for r in list(rx.requests):
        for a in r["body"].get("alerts") or []:
            if a["labels"].get("alertname") == "MemqOOMForecast":
                out.append({"key": r["key"], "alert": a, "at": r.get("t", time.time())})
    return out


def test_forecast_alert_arrives_before_the_oom(stack, rx, tmp_path):
    truth = json.loads((FIX / "truth.json").read_text())["val_logits"]["defaults"]
    src = next((FIX / "val_logits" / "defaults").iterdir())
    shutil.copytree(src, tmp_path / "spool")
    st = stack.settings
    sent_oom_at = None
    first_alert_at = None
    (folder,) = list(iter_spool_dirs(tmp_path / "spool"))
    for _name, msg in list(Spool(folder, max_bytes=1 << 62)):
        fields = dict(msg.fields)
        if fields["kind"] == "run_start":
            payload = json.loads(fields.get("payload") or "{}")
            payload["limit_bytes"] = truth["cap_bytes"]
            fields["payload"] = json.dumps(payload)
        if fields["kind"] == "snapshot" and fields.get("trigger") == "oom":
            sent_oom_at = time.time()
            if first_alert_at is None and _forecast_alerts(rx):
                first_alert_at = time.time()
        if msg.blob_key is not None:
            stack.redis.set(envelope.parse(fields).blob_key(st.key_prefix), msg.blob, ex=3600)
        append_fields(stack.redis, fields, stream=st.stream_key, maxlen=st.stream_maxlen)
        if fields["kind"] == "snapshot":
            time.sleep(PACE_S)
            if first_alert_at is None and _forecast_alerts(rx):
                first_alert_at = time.time()
    assert sent_oom_at is not None
    assert first_alert_at is not None and first_alert_at < sent_oom_at, (
        "no forecast alert before the OOM envelope was sent", stack.memq_json("history", "--run", RUN)["forecast"],
        stack.states(), [d.get("reason") for d in stack.dead()[:3]])

    alerts = _forecast_alerts(rx)
    a = alerts[0]["alert"]
    assert a["labels"]["run"] == RUN and a["labels"]["severity"] == "critical"
    desc = a["annotations"]["description"]
    assert desc.startswith(f"run {RUN} will run out of memory in epoch ") and "per epoch" in desc
    epoch = int(desc.split("in epoch ", 1)[1].split(" ", 1)[0])
    assert abs(epoch - truth["oom_epoch"]) <= 1
    assert a["annotations"]["oom_at"] and "eta" in a["annotations"]
    # once per run: the sweep runs every second, the forecast barely moves, no second page
    assert len({x["key"] for x in alerts}) == 1

    def oom_settled():
        doc = stack.memq_json("history", "--run", RUN)
        return doc["run"]["status"] == "oom" and doc["run"]["oom_count"] >= 1 and doc

    doc = wait_for(oom_settled, 90, 0.5, "the OOM analysed")
    fc = doc["forecast"]
    # a finished run keeps the forecast it had: made before the OOM, and it said so
    assert fc["oom_expected"] is True and fc["as_of_step"] < truth["oom_step"]
    assert abs(fc["epoch"] - truth["oom_epoch"]) <= 1
    assert doc["run"]["oom_forecast_step"] == fc["step"]


def test_stats_batches_move_the_forecast_on(stack, tmp_path):
    """Between snapshots the agent's stats batches carry the per-step figures: the dispatcher hands them
    to a worker, which moves the stored forecast on. The run's envelopes up to its 6th snapshot, then
    the stats batch that followed its 7th snapshot without that snapshot: the forecast must reach the
    batch's last step."""
    truth = json.loads((FIX / "truth.json").read_text())["best_weights"]["defaults"]
    src = next((FIX / "best_weights" / "defaults").iterdir())
    shutil.copytree(src, tmp_path / "spool")
    (folder,) = list(iter_spool_dirs(tmp_path / "spool"))
    msgs = [dict(m.fields, _blob=m.blob, _key=m.blob_key) for _n, m in Spool(folder, max_bytes=1 << 62)]
    snaps = [i for i, m in enumerate(msgs) if m["kind"] == "snapshot"]
    cut, skipped = snaps[5], snaps[6]
    stats_after = next(i for i in range(skipped + 1, len(msgs)) if msgs[i]["kind"] == "stats")
    run = "fc-stats-refresh"
    st = stack.settings

    def send(m: dict) -> None:
        fields = {k: v for k, v in m.items() if not k.startswith("_")}
        fields["run"] = run
        if fields["kind"] == "run_start":
            payload = json.loads(fields.get("payload") or "{}")
            payload["limit_bytes"] = truth["cap_bytes"]
            fields["payload"] = json.dumps(payload)
        if m["_key"] is not None:
            stack.redis.set(envelope.parse(fields).blob_key(st.key_prefix), m["_blob"], ex=3600)
        append_fields(stack.redis, fields, stream=st.stream_key, maxlen=st.stream_maxlen)

    for m in msgs[:cut + 1]:
        send(m)

    def settled():
        doc = stack.memq_json("history", "--run", run)
        fc = doc.get("forecast")
        return doc["run"]["snapshot_count"] == 6 and fc and fc.get("as_of_step") is not None and fc

    base = wait_for(settled, 60, 0.5, "the forecast of the first six snapshots")["as_of_step"]

    def forecast_at(step: int):
        fc = stack.memq_json("history", "--run", run).get("forecast")
        return fc if fc and fc.get("as_of_step") is not None and fc["as_of_step"] >= step else None

    batch = json.loads(msgs[stats_after]["payload"])["step_figures"]
    last = max(f["step"] for f in batch)
    assert last > base
    time.sleep(2.5)  # past MEMQ_FORECAST_REFRESH_S since the replayed batches' refresh
    send(msgs[stats_after])
    fc = wait_for(lambda: forecast_at(last), 60, 0.5, "the forecast moved on by the stats batch")
    assert fc["as_of_step"] == last and fc["oom_expected"] is True
    assert abs(fc["epoch"] - truth["oom_epoch"]) <= 1
