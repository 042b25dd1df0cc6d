"""Step boundaries without code change (torch's optimizer hook, CPU torch), per-step figures, comparable
points, growth windows, and the OOM's step in progress. Real shared Redis, real torch optimizer."""

from __future__ import annotations

from memq import codec
from memq.agent.source import ReplaySource
from memq.agent.steps import FULL_READ_BOUNDARIES, GROWTH_MIN_BYTES, StepTracker, Stride, stride_for

from .conftest import REAL, blob_of, entries, make_agent

GIB = 1 << 30


def sig(live, peak=None, retries=0):
    return (live, 2 * GIB, peak or live, 2 * GIB, retries)


def test_tracker_baseline_growth_window_and_every_n():
    t = StepTracker(warmup_steps=3, comparable_every=10, comparable_min_s=0, growth_min_steps=1, window_steps=50)
    decisions = []
    for i in range(17):
        live = GIB + (0 if i < 6 else 200 << 20)  # live bytes jump by 200 MiB after step 5
        fig = t.figure(i, 0, sig(live), 50.0)
        decisions.append(t.on_boundary(fig, 10 * GIB, recording=False, now=float(i)))
        if decisions[-1].record:
            t.opened(decisions[-1].record)
    assert [d.comparable for d in decisions[:3]] == [None, None, "baseline"]
    assert decisions[6].comparable == "growth" and decisions[6].record == "growth"
    assert decisions[-1].comparable == "every_n"  # 10 boundaries after the growth point
    # in the window, the next growth is its end (that snapshot carries the frames)
    d = t.on_boundary(t.figure(17, 0, sig(GIB + (400 << 20)), 50.0), 10 * GIB, recording=True)
    assert d.comparable == "growth" and d.end_window and not d.record
    assert len(t.figures) == 18 and t.figures[-1]["allocated"] == GIB + (400 << 20)


def test_tracker_no_growth_below_threshold_and_large_step():
    t = StepTracker(warmup_steps=1, comparable_every=0, growth_min_steps=1)
    got = [t.on_boundary(t.figure(i, 0, sig(GIB + i * (GROWTH_MIN_BYTES // 8), peak=3 * GIB), 10.0), None,
                         recording=False) for i in range(6)]
    assert [d.comparable for d in got] == ["baseline"] + [None] * 5  # 5 x 8 MiB: under 64 MiB
    d = t.on_boundary(t.figure(6, 0, sig(GIB, peak=8 * GIB), 10.0), None, recording=False)
    assert d.record == "large_step" and d.window_steps == 10


def test_epoch_ends_growth_records_the_next_epoch():
    t = StepTracker()
    assert not t.on_epoch_end(GIB, None, recording=False).record
    d = t.on_epoch_end(GIB + (300 << 20), None, recording=False)
    assert d.record == "growth"
    t.opened("growth")
    assert t.on_epoch_end(GIB + (600 << 20), None, recording=True).end_window


def test_stride_keeps_reading_under_budget():
    assert stride_for(20e-6, 0.050) == 1          # 20 us of a 50 ms step: 0.04%
    assert stride_for(20e-6, 0.002) in (5, 6)     # a 2 ms step: every 5th boundary (float rounding)
    assert stride_for(20e-6, None) == 1


def test_stride_reads_the_first_boundaries_then_thins():
    s = Stride(budget_frac=0.002)
    assert [s.due(10.0 if b else None, b) for b in range(FULL_READ_BOUNDARIES)] == [1] * FULL_READ_BOUNDARIES
    s.cost(100e-6)  # 0.1 ms a reading of a 10 ms step: 1%, five times the budget
    assert s.stride == 5
    got = [s.due(10.0, b) for b in range(FULL_READ_BOUNDARIES, FULL_READ_BOUNDARIES + 10)]
    assert got == [None, None, None, None, 5] * 2  # each reading covers the steps it thinned


class DictSource(ReplaySource):
    """The replay source handing out dicts, as torch's `_snapshot()` does (so the agent embeds its figures)."""

    def snapshot(self):
        data = super().snapshot()
        return codec.loads_restricted(data) if data is not None else None


def test_tokens_of_a_step_the_optimizer_hook_closed_stay_with_it(shared):
    """The hook ends step 0 before the job's first mark_step(tokens=) names it: the tokens belong to
    that step's figure, not to the next one's."""
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB)] * 8
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1.0)
    import torch

    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for i in range(3):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        a.mark_step(i, 0, tokens=100 * (i + 1))
    figs = list(a.tracker.figures)
    a.stop(10)
    assert [(f["step"], f.get("tokens")) for f in figs] == [(0, 100), (1, 200), (2, 300)]


def _tiny_training(steps, agent=None, mark=False):
    import torch  # the CPU build is part of the test set-up (tests/run.sh)

    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if mark:
            agent.mark_step(100 + i, 7)
    return opt


def test_optimizer_hook_finds_steps_without_mark_step(shared):
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    live = [GIB] * 14 + [GIB + (300 << 20)] * 12 + [GIB + (700 << 20)] * 4
    src.signals = [sig(x) for x in live]
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, optimizer="AdamW",
                   model="Net", comparable_every_steps=0, step_budget=1.0)
    _tiny_training(30)
    assert a.steps_source == "optimizer_hook" and a.step == 29
    assert a.policy.steps_seen == 30
    # the OOM comes in the step after the last completed one
    src.fire_oom()
    a.note_exception(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    a.stop(10)
    got = entries(r, stream)
    assert got[0].payload["optimizer"] == "AdamW" and got[0].payload["model"] == "Net"  # strings, not "str"
    snaps = [e for e in got if e.kind == "snapshot"]
    reasons = [(s.trigger, s.payload.get("reason"), s.step) for s in snaps]
    assert reasons == [("periodic", "warmup", 2), ("periodic", "growth", 14), ("periodic", "growth", 26),
                       ("oom", None, 30)], reasons
    assert all(s.payload.get("comparable") for s in snaps[:3])
    meta = [codec.loads_restricted(blob_of(r, s, prefix))["memq_agent"] for s in snaps]
    assert meta[0]["recording"]["on"] is True and meta[0]["recording"]["reason"] == "warmup"
    # the first growth opens a recording window; the second growth closes it with frames recorded since step 15
    assert meta[1]["recording"]["on"] is False
    assert meta[2]["recording"] == {"on": True, "since_step": 15, "reason": "growth"}
    oom = meta[3]
    assert (oom["step_in_progress"], oom["step_completed"], oom["steps_source"]) == (30, 29, "optimizer_hook")
    assert oom["optimizer"] == "AdamW" and oom["model"] == "Net" and oom["comparable"] is False
    figs = oom["step_figures"]
    assert [f["step"] for f in figs] == list(range(30))
    assert [f["allocated"] for f in figs] == live
    assert set(figs[0]) >= {"step", "epoch", "peak_allocated", "peak_reserved", "allocated", "reserved",
                            "retries", "ms"}
    sent = [f for e in got if e.kind == "stats" for f in e.payload.get("step_figures", [])]
    assert [f["step"] for f in sent] == list(range(30))  # the figures also travel with the stats


def test_mark_step_wins_over_the_hook(shared):
    r, prefix, stream = shared
    src = DictSource(REAL / "seed_adamw")
    src.signals = [sig(GIB)]
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1.0)
    opt = _tiny_training(6, agent=a, mark=True)
    assert a.steps_source == "mark_step" and a.step == 105 and a.policy.steps_seen == 6
    assert a._optimizer_name == type(opt).__name__
    a.stop(10)
    # the ticker (stats_interval_s=0) also samples between boundaries, with no step yet on a busy machine
    samples = [x for e in entries(r, stream) if e.kind == "stats" for x in e.payload["samples"]
               if x.get("step") is not None]
    assert sorted({x["step"] for x in samples}) == list(range(100, 106))  # the hook's step 0 took the job's number


def _oom_from(src: DictSource, agent, python_caller: bool) -> None:
    """The allocator calls the OOM observer in the allocating thread. From autograd's backward thread
    there is no Python frame above the observer at all; `_thread.start_new_thread` calls it the same
    way, straight from C as the thread's bottom frame. Returns once the observer has taken its snapshot."""
    import _thread
    import time

    if python_caller:
        src.fire_oom()
        return
    entry = src.oom_entry()
    before = _thread._count()  # threads started through _thread and still running (threading's too)
    _thread.start_new_thread(src.observer, (0, int(entry["alloc"]), int(entry.get("device_alloc") or 0),
                                            int(entry.get("device_free") or 0)))
    deadline = time.monotonic() + 10
    while agent.oom_snapshots < 1 or _thread._count() > before:  # the observer has returned
        assert time.monotonic() < deadline, "the observer did not return"
        time.sleep(0.01)


def test_an_oom_on_autograd_thread_still_sends_its_snapshot(shared):
    """The observer's stack is taken from its caller's frame; an allocation on a thread with no Python
    frames (autograd's backward) has none, and must still leave the OOM snapshot (the H200 capture of a
    fragmentation OOM in backward lost it to a ValueError before this was fixed)."""
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB)] * 6
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1.0)
    for i in range(4):
        a.mark_step(i, 0, tokens=1024 * (i + 1))
    _oom_from(src, a, python_caller=False)
    a.note_exception(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    a.stop(10)
    assert a.counters()["errors"] == 0
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot" and e.trigger == "oom"]
    assert len(snaps) == 1
    meta = codec.loads_restricted(blob_of(r, snaps[0], prefix))["memq_agent"]
    assert meta["oom_frames"] == []
    assert [f.get("tokens") for f in meta["step_figures"]] == [1024, 2048, 3072, 4096]


def test_the_observer_keeps_the_failing_allocations_python_stack(shared):
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB)] * 4
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1.0)
    a.mark_step(0, 0)
    _oom_from(src, a, python_caller=True)
    a.note_exception(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    a.stop(10)
    snap = next(e for e in entries(r, stream) if e.kind == "snapshot" and e.trigger == "oom")
    frames = codec.loads_restricted(blob_of(r, snap, prefix))["memq_agent"]["oom_frames"]
    names = [f["name"] for f in frames]
    assert "fire_oom" in names and "_oom_from" in names  # innermost first: the allocation's caller chain
    assert names.index("fire_oom") < names.index("_oom_from")
    assert all(set(f) == {"filename", "line", "name"} for f in frames)


def test_every_figure_reaches_the_stream_in_batches_with_its_time(shared):
    """1,500 boundaries between two timed flushes: the figures go out in batches of FLUSH_FIGURES and
    the rest with the stop, none dropped (a ring of 512 used to lose all but the last 512)."""
    import time

    from memq.agent.steps import FLUSH_FIGURES

    r, prefix, stream = shared
    src = DictSource(REAL / "seed_adamw")
    src.signals = [sig(GIB + i * (1 << 20)) for i in range(1500)]
    a = make_agent(source=src, stream=stream, key_prefix=prefix, step_budget=1e9, stats_flush_s=3600,
                   comparable_every_steps=0)
    t0 = time.time()
    for i in range(1500):
        a.mark_step(i, i // 100)
    a.stop(10)
    batches = [e.payload.get("step_figures", []) for e in entries(r, stream) if e.kind == "stats"]
    sent = [f for b in batches for f in b]
    assert [f["step"] for f in sent] == list(range(1500))
    assert max(len(b) for b in batches) == FLUSH_FIGURES and len(batches) >= 1500 // FLUSH_FIGURES
    assert all(t0 - 1 <= f["t"] <= time.time() + 1 for f in sent)


def test_thinned_boundaries_reach_the_last_step(shared):
    """Very fast steps are read every MAX_STRIDE boundaries at most (a stride once pinned at 1,000 by a
    slow boundary left a 1,000-step run with no figure after its start); the spans add up to the steps
    and the last figures reach the service with the run's end."""
    from memq.agent.steps import MAX_STRIDE

    r, prefix, stream = shared
    src = DictSource(REAL / "seed_adamw")
    n = 1000
    src.signals = [sig(GIB + i * (1 << 20)) for i in range(n)]
    a = make_agent(source=src, stream=stream, key_prefix=prefix, step_budget=1e-12, comparable_every_steps=0)
    for i in range(n):
        a.mark_step(i, 0)
    a.stop(10)
    sent = [f for e in entries(r, stream) if e.kind == "stats" for f in e.payload.get("step_figures", [])]
    thinned = [f for f in sent if f.get("span", 1) > 1]
    assert thinned and all(f["span"] <= MAX_STRIDE for f in thinned)
    assert sum(f.get("span", 1) for f in sent) == sent[-1]["step"] + 1 >= n - MAX_STRIDE
    assert all(isinstance(f["t"], float) for f in sent)


def test_the_first_boundaries_are_all_read_whatever_the_stride(shared):
    """A fast leak that kills in a dozen steps has a figure at every step boundary: the first
    FULL_READ_BOUNDARIES are read even when the reading's cost against a tiny step makes the stride
    large (a step budget of 1e-9 here: past them, every boundary but one in a thousand is skipped)."""
    from memq.agent.steps import FULL_READ_BOUNDARIES

    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB + i * (126 << 20)) for i in range(101)]
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1e-9)
    for i in range(100):
        a.mark_step(i, 0)
    steps = [f["step"] for f in a.tracker.figures]
    a.stop(10)
    assert FULL_READ_BOUNDARIES == 64
    assert steps[:FULL_READ_BOUNDARIES] == list(range(FULL_READ_BOUNDARIES))  # just under: every one read
    assert steps[FULL_READ_BOUNDARIES:] == []  # just over: the stride again


def test_the_agents_growth_trigger_reads_the_growth_models_share():
    # one value in two places (the agent must not import the analysis package): pinned equal, and the
    # trigger moves just over it
    from memq.agent import steps
    from memq.analysis import rules

    assert steps.GROWTH_MATTERS_SHARE == rules.GROWTH_MATTERS_SHARE
    limit = 100 * steps.GROWTH_MIN_BYTES  # 1% of it is over the 64 MiB floor
    assert steps.growth_threshold(limit, 0) == int(rules.GROWTH_MATTERS_SHARE * limit)
    assert steps.growth_threshold(limit // 10, 0) == steps.GROWTH_MIN_BYTES


def test_importing_the_agent_loads_no_analysis():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", "import sys, memq.agent; "
                          "print(sorted(m for m in sys.modules if m.startswith('memq.analysis')))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", out
