"""Envelopes and blobs arrive intact in the shared Redis (unique stream and key prefix per test)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from memq import codec
from memq.agent.source import ReplaySource

from .conftest import REAL, blob_of, entries, fixture_sha, make_agent, wait_for


def test_seed_run_arrives_intact(shared):
    r, prefix, stream = shared
    src = ReplaySource(REAL / "seed_adamw")
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, rank=2, job="job-7", host="hostA")
    for epoch in range(3):
        for step in range(epoch * 15, epoch * 15 + 15):
            a.mark_step(step, epoch)
        a.mark_epoch(epoch)
    counters = a.stop(10)
    got = entries(r, stream)
    kinds = [e.kind for e in got]
    assert kinds[0] == "run_start" and kinds[-1] == "run_end"
    snaps = [e for e in got if e.kind == "snapshot"]
    # the warm-up (3 recorded steps) ends with a snapshot taken before recording pauses
    assert [s.trigger for s in snaps] == ["periodic"] + ["epoch_end"] * 3
    assert snaps[0].payload["reason"] == "warmup" and snaps[0].payload["recording"] is True
    assert [(s.step, s.epoch) for s in snaps] == [(2, 0), (14, 0), (29, 1), (44, 2)]
    for e in got:
        assert (e.run, e.cluster, e.rank, e.job, e.host) == ("test-run", "test-cluster", 2, "job-7", "hostA")
    # the replay source hands out the fixture files in meta order: the blob is byte-identical
    files = [e["file"] for e in src.entries]
    for s, f in zip(snaps, files[:len(snaps)], strict=True):
        data = blob_of(r, s, prefix)
        assert s.sha256 == fixture_sha("seed_adamw", f)
        snap = codec.decode(data)
        assert isinstance(snap, dict) and snap["segments"]
        assert r.ttl(s.blob_key(prefix)) > 6 * 24 * 3600
    samples = [x for e in got if e.kind == "stats" for x in e.payload["samples"]]
    steps = [x["step"] for x in samples if "step" in x]
    assert steps == list(range(45))
    assert "reserved_bytes.all.current" in samples[-1]
    start = got[0].payload
    assert start["torch"] == "2.11.0+cu130" and start["world_size"] >= 1 and start["agent"]["history"] == "auto"
    end = got[-1].payload
    assert end["status"] == "completed" and end["steps"] == 45
    assert counters["sent"] == len(got) and counters["dropped"] == 0 and counters["errors"] == 0


def test_gzip_codec_when_asked(shared):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, codec="gzip")
    assert a.snapshot("manual")
    a.stop(10)
    (snap,) = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert snap.codec == "gzip" and snap.trigger == "manual"
    assert codec.decode(blob_of(r, snap, prefix))["segments"]


def test_oom_snapshot_carries_observer_figures_and_message(shared):
    r, prefix, stream = shared
    src = ReplaySource(REAL / "frag_dynamic_1.15")
    a = make_agent(source=src, stream=stream, key_prefix=prefix, oom_message_wait_s=5)
    a.mark_step(11, 0)
    oom_text = (REAL / "frag_dynamic_1.15" / "meta.json").read_text()
    import json

    message = json.loads(oom_text)["oom_message"]

    class OutOfMemoryError(RuntimeError):
        pass

    err = OutOfMemoryError(message)
    with pytest.raises(OutOfMemoryError) as ei:
        # what the allocator does: observer first, then the error is raised to the caller, unchanged
        assert src.fire_oom()
        raise err
    assert ei.value is err
    a.note_exception(ei.value)
    a.stop(10)
    got = entries(r, stream)
    (snap,) = [e for e in got if e.kind == "snapshot"]
    meta = src.oom_entry()
    assert snap.trigger == "oom" and snap.step == 12  # the step in progress: last marked (11) + 1
    assert snap.payload["step_completed"] == 11
    assert snap.oom == {"alloc": meta["alloc"], "device_alloc": meta["device_alloc"],
                        "device_free": meta["device_free_at_oom"], "device_total": meta["device_total"],
                        "message": message}
    assert snap.sha256 == fixture_sha("frag_dynamic_1.15", "oom.pickle.gz")
    assert got[-1].payload["status"] == "oom"
    # after an OOM the policy records continuously
    assert src.history_calls[-2][0] is True and a.policy.reason == "oom"


def test_oom_message_missing_when_caught_is_null_not_invented(shared):
    r, prefix, stream = shared
    src = ReplaySource(REAL / "capacity")
    a = make_agent(source=src, stream=stream, key_prefix=prefix, oom_message_wait_s=0.2)
    src.fire_oom()
    a.stop(10)
    (snap,) = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert snap.oom["message"] is None and snap.oom["alloc"] > 0


def test_two_ranks_one_run(shared):
    r, prefix, stream = shared
    agents = [make_agent(stream=stream, key_prefix=prefix, rank=k, run="ddp-run") for k in (0, 1)]
    for a in agents:
        a.mark_step(0, 0)
        a.mark_epoch(0)
    for a in agents:
        a.stop(10)
    got = entries(r, stream)
    assert {e.run for e in got} == {"ddp-run"}
    assert sorted(e.rank for e in got if e.kind == "snapshot") == [0, 1]
    assert sorted(e.rank for e in got if e.kind == "run_start") == [0, 1]


def test_signal_snapshot_chains_previous_handler(shared):
    r, prefix, stream = shared
    seen = []
    prev = signal.signal(signal.SIGUSR2, lambda s, f: seen.append(s))
    try:
        a = make_agent(stream=stream, key_prefix=prefix, signal="SIGUSR2")
        os.kill(os.getpid(), signal.SIGUSR2)
        assert wait_for(lambda: a.counters()["sent"] >= 2, 5)
        a.stop(10)
        assert seen == [signal.SIGUSR2]
        # our handler is gone again, the previous one is back
        assert signal.getsignal(signal.SIGUSR2) is not None
        os.kill(os.getpid(), signal.SIGUSR2)
        time.sleep(0.05)
        assert seen == [signal.SIGUSR2, signal.SIGUSR2]
    finally:
        signal.signal(signal.SIGUSR2, prev)
    assert [e.trigger for e in entries(r, stream) if e.kind == "snapshot"] == ["signal"]


def test_periodic_snapshots_without_steps(shared):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, snapshot_every_s=0.3, tick_s=0.05)
    time.sleep(1.0)
    a.stop(10)
    assert [e.trigger for e in entries(r, stream) if e.kind == "snapshot"][:2] == ["periodic", "periodic"]


def test_periodic_snapshot_taken_at_a_step_boundary(shared):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, snapshot_every_s=0.2)
    for step in range(30):
        a.mark_step(step, 0)
        time.sleep(0.02)
    a.stop(10)
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert snaps and all(s.trigger == "periodic" and s.step is not None for s in snaps)


def test_context_manager_and_module_api(shared):
    from memq import agent

    r, prefix, stream = shared
    src = ReplaySource(REAL / "seed_sgd")
    with agent.start(run="ctx", cluster="c", source=src, stream=stream, key_prefix=prefix, signal=None,
                     fsync=False) as handle:
        assert agent.start(run="other", cluster="c") is handle  # one agent per process
        agent.mark_step(0, 0)
        agent.mark_epoch(0)
        assert agent.snapshot("manual")
        assert agent.flush(10)
        assert agent.counters()["sent"] >= 3
    assert handle.stopped
    got = entries(r, stream)
    assert [e.trigger for e in got if e.kind == "snapshot"] == ["epoch_end", "manual"]
    assert got[-1].kind == "run_end"


class _DictSource(ReplaySource):
    """Hands out the snapshot as a dict, as torch's `_snapshot()` does (decoded with the restricted
    decoder from the fixture's bytes)."""

    def snapshot(self):
        data = super().snapshot()
        return codec.decode_plain(data) if data is not None else None


def test_dict_snapshots_are_self_describing_and_distinct(shared):
    r, prefix, stream = shared
    src = _DictSource(REAL / "kept_loss_no_leak")
    src.entries = src.entries[:1]  # the same state every time
    a = make_agent(source=src, stream=stream, key_prefix=prefix, history="off")
    a.mark_step(5, 0)
    a.mark_epoch(0)
    a.mark_step(9, 1)
    a.mark_epoch(1)
    a.stop(10)
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert len(snaps) == 2 and snaps[0].sha256 != snaps[1].sha256
    marks = [codec.decode(blob_of(r, s, prefix))["memq_agent"] for s in snaps]
    assert [(m["trigger"], m["step"], m["epoch"], m["rank"]) for m in marks] == [("epoch_end", 5, 0, 0),
                                                                              ("epoch_end", 9, 1, 0)]


def test_periodic_snapshot_records_one_step_first(shared):
    r, prefix, stream = shared
    src = ReplaySource(REAL / "seed_adamw")
    a = make_agent(source=src, stream=stream, key_prefix=prefix, snapshot_every_s=0.15, warmup_steps=1)
    for step in range(12):
        a.mark_step(step, 0)
        time.sleep(0.03)
    a.stop(10)
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert snaps and all(s.trigger == "periodic" for s in snaps)
    assert snaps[0].payload["reason"] == "warmup"
    # each later one is taken at the end of a recorded step, before recording pauses again
    assert len(snaps) >= 2
    assert all(s.payload["recording"] is True and s.payload["reason"] == "periodic" for s in snaps[1:])
    ons = [on for on, _, _ in src.history_calls]
    assert ons.count(True) >= len(snaps) and ons[-1] is False


def test_calls_after_stop_do_nothing(shared):
    r, prefix, stream = shared
    src = ReplaySource(REAL / "capacity")
    a = make_agent(source=src, stream=stream, key_prefix=prefix)
    a.stop(10)
    calls, n = len(src.history_calls), r.xlen(stream)
    for step in range(10):
        a.mark_step(step, 0)
    a.mark_epoch(0)
    assert a.snapshot() is False
    assert src.fire_oom()  # the observer stays attached (torch cannot detach it): it does nothing now
    time.sleep(0.2)
    assert len(src.history_calls) == calls and r.xlen(stream) == n and src.snapshot_calls == 0


def test_bad_options_give_a_no_op_handle():
    from memq import agent

    h = agent.start(run="r", cluster="c", history="sometimes")  # invalid: the job must still run
    with h:
        assert h.mark_step(1, 0) is None and h.counters() == {}
    assert agent.current() is None or agent.current().run != "r"
