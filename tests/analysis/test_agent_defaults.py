"""The diagnosis on what the fleet sends: snapshots taken by the agent at its defaults (issue 12).

Real data only. `spool_oom` is a real agent spool from the H200 (a doubling batch until a real OOM:
the OOM snapshot has no trace, the warm-up snapshot has the trace of the first steps). Where a
scenario exists only as a full-history capture, the test derives its agent-default form from the
real snapshots (tests/analysis/agent_data.py): the trace dropped (recording paused), block frames
kept only for blocks live at the first snapshot (allocated during warm-up recording), and the
agent's embedded facts (`memq_agent`) added as the agent sends them.
"""

from __future__ import annotations

import json

import pytest

from memq import codec
from memq.analysis import ANALYZER_VERSION, _earlier_step_peak, _per, analyze
from memq.analysis.labels import agent_label, snapshot_label
from memq.analysis.per_snapshot import SnapshotDigest, digest
from memq.analysis.step_need import RUN_NOISE
from memq.model import OomContext
from memq.store.repository import json_safe
from tests.analysis.agent_data import (
    agent_default,
    live_keys,
    oom_context,
    parse,
    spool_snapshots,
    with_agent,
)
from tests.helpers import FIXTURES, REAL

GiB = 1024**3
LEAK = FIXTURES / "captured" / "leak_epochs"
LEAK_CAP = 7516192768
ALLOCATOR_SETTINGS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold",
                      "PYTORCH_CUDA_ALLOC_CONF")


def _raw(path) -> dict:
    return codec.decode(path.read_bytes())


def _evidence(result: dict) -> str:
    return " ".join(e for c in result["diagnosis"]["causes"] for e in c["evidence"])


def _advice(result: dict) -> str:
    return " ".join(" ".join(r.values()) for r in result["diagnosis"]["recommendations"])


def _allocator_advice(result: dict) -> list[str]:
    """Recommendations that tell the user to set an allocator setting (not the ones that say not to)."""
    return [r["action"] for r in result["diagnosis"]["recommendations"]
            if any(k in r["action"] for k in ALLOCATOR_SETTINGS) and not r["action"].startswith("Do not")]


@pytest.fixture(scope="module")
def spool():
    return spool_snapshots("spool_oom")


def _spool_run(spool, items=None):
    items = items if items is not None else list(range(len(spool)))
    fields = [spool[i][0] for i in items]
    snaps = [parse(spool[i][1]) for i in items]
    labels = [snapshot_label(f["trigger"], int(f["step"]), int(f["epoch"])) for f in fields]
    return analyze(snaps, oom_context(spool[-1][0]), names=[f"memq:ingest/{f['sha256'][:13]}-0" for f in fields],
                   triggers=[f["trigger"] for f in fields], labels=labels)


def test_doubled_batch_cut_off_early_is_a_spike_not_fragmentation(spool):
    """The OOM came early in a step with twice the batch: live + request still fits the 16.78 GiB cap
    (so the old verdict was fragmentation, and expandable_segments would not have saved it). Its
    blocks are 4x the warm-up step's largest allocation: the projected step needs > the cap."""
    assert [f["trigger"] for f, _ in spool] == ["periodic", "epoch_end", "epoch_end", "oom"]
    assert not any(spool[-1][1]["device_traces"])  # agent defaults: no trace of the failing step
    r = _spool_run(spool)
    assert r["oom"]["fits_if_compacted"] is True
    d = r["diagnosis"]
    assert d["primary_cause"] == "activation_spike", d["causes"][0]
    need = d["step_need"]
    limit = r["oom"]["limit_bytes"]
    assert need["fits_limit"] is False and need["low"] > limit and need["k"] >= 3.5
    assert any("x the 6.60 GiB peak of the earlier steps" in e for e in d["causes"][0]["evidence"])
    assert "periodic snapshot at step 2" in need["reference"]
    assert not _allocator_advice(r), "no allocator setting for a step that needs more than the limit"
    assert any(x["action"].startswith("Do not change allocator settings") for x in d["recommendations"])
    assert "memq:ingest" not in _evidence(r) + _advice(r)
    assert [s["file"] for s in r["snapshots"]][0].startswith("memq:ingest/")  # names stay in snapshots[].file


def test_without_an_earlier_recorded_step_fragmentation_says_what_it_cannot_tell(spool):
    """The same OOM with only the epoch-end snapshots (no trace of any step): the step's need cannot
    be projected. Fragmentation may still be named, with lower confidence and saying so."""
    full = _spool_run(spool)
    r = _spool_run(spool, [1, 2, 3])
    d = r["diagnosis"]
    need = d["step_need"]
    assert need["bytes"] is None and need["fits_limit"] is None and "no complete earlier training step" in need["basis"]
    # live + request, the request at the least its segment could stand for, less run-to-run noise
    live_and_request = r["oom"]["requested_bytes"] - 2 * 2**20 + r["metrics"]["active_bytes"]
    assert need["low"] == int(live_and_request * (1 - RUN_NOISE))
    assert d["primary_cause"] == "fragmentation"
    frag = d["causes"][0]
    assert d["confidence"] < 0.7 < full["diagnosis"]["confidence"]
    assert any("what the rest of it needed is not known" in e for e in frag["evidence"])
    exp = next(x for x in d["recommendations"] if "expandable_segments:True" in x["action"])
    assert "not settled" in exp["expected_effect"]


def test_agent_step_figures_give_the_earlier_steps_peak(spool):
    """`step_figures` (the agent's per-step peak counters) stand in for earlier snapshots."""
    fields, raw = spool[-1]
    base = parse(spool[0][1])
    peaks = _per(base)["timeline"]["step_peaks"]  # the real warm-up steps' peaks
    figs = [{"step": i, "epoch": 0, "peak_allocated": p, "peak_reserved": p, "allocated": 1525950976,
             "reserved": 7981760512, "retries": 0, "ms": 50.0} for i, p in enumerate(peaks[1:3])]
    snap = parse(with_agent(raw, trigger="oom", step=16, epoch=2, step_in_progress=16, step_completed=15,
                            step_figures=figs, steps_source="mark_step", optimizer="AdamW"))
    assert len(snap.agent.step_figures) == 2 and snap.agent.optimizer == "AdamW"
    per = [_per(snap)]
    assert _earlier_step_peak(per) == (max(peaks[1:3]), 2)
    r = analyze([snap], oom_context(fields))
    assert r["details"]["per_snapshot"][0]["label"] == "OOM in step 16 (epoch 2)"
    frag = r["diagnosis"]["causes"][0]
    # no recorded step to project from, but the figures show it already holds 2.5x the earlier peak
    assert frag["cause"] == "fragmentation" and r["diagnosis"]["confidence"] < 0.65
    assert any("x the 6.60 GiB peak of the earlier steps" in e for e in frag["evidence"])


def test_real_fragmentation_still_fits_when_projected():
    """frag_dynamic_1.15 (full history): the failing step's own trace is projected to ~16.4 GiB, within
    the cap (its expandable_segments twin completed): fragmentation, with that number."""
    from memq.load import load_snapshot_file

    r = analyze([load_snapshot_file(REAL / "frag_dynamic_1.15" / "oom.pickle.gz")], OomContext(limit_bytes=20244645632))
    assert r["diagnosis"]["primary_cause"] == "fragmentation"
    need = r["diagnosis"]["step_need"]
    assert need["high"] <= 20244645632 and need["fits_limit"] is True and need["k"] > 4  # larger input, yet it fits
    assert any("it fits in one piece" in e for e in r["diagnosis"]["causes"][0]["evidence"])


def test_frag_dynamic_at_agent_defaults_is_named_with_lower_confidence():
    from memq.load import load_snapshot_file

    path = REAL / "frag_dynamic_1.15" / "oom.pickle.gz"
    full = analyze([load_snapshot_file(path)], OomContext(limit_bytes=20244645632))
    raw = _raw(path)
    snap = parse(agent_default(raw, keep=lambda b: False))
    # without a trace, the request comes from the agent's OOM observer
    r = analyze([snap], OomContext(limit_bytes=20244645632, requested_bytes=4423680000))
    assert r["diagnosis"]["primary_cause"] == "fragmentation"
    assert r["diagnosis"]["confidence"] < full["diagnosis"]["confidence"]
    assert any("is not known" in e for e in r["diagnosis"]["causes"][0]["evidence"])


# -- leak at agent defaults --------------------------------------------------------------------------

STEMS = ["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"]


def _leak_run(keep_growth_frames_from: int | None = None, trigger: str = "epoch_end", comparable: bool = False):
    """leak_epochs as the agent sends it: frames only on blocks live at epoch 0 (warm-up recording);
    with `keep_growth_frames_from=k`, blocks that appear from epoch k on keep theirs too (the agent
    switched Python stacks on when it saw live bytes grow)."""
    raws = [_raw(LEAK / f"{s}.pickle.gz") for s in STEMS]
    warm = live_keys(raws[0])
    seen: set = set(warm)
    snaps = []
    for i, (stem, raw) in enumerate(zip(STEMS, raws, strict=True)):
        fresh = live_keys(raw) - seen
        recorded = warm | (fresh if keep_growth_frames_from is not None and i >= keep_growth_frames_from else set())
        seen |= live_keys(raw)
        d = agent_default(raw, keep=lambda b, r=recorded: (b["address"], b["size"]) in r)
        if stem == "oom":
            d = with_agent(d, trigger="oom", step=44, epoch=5, step_in_progress=44, step_completed=43)
        else:
            step = 8 * i + 7
            d = with_agent(d, trigger=trigger, step=step, epoch=i, step_completed=step, comparable=comparable)
        snaps.append(parse(d))
    names = [f"memq:ingest/179613157592{i}-0" for i in range(len(snaps))]
    ctx = OomContext(message=None, limit_bytes=LEAK_CAP, requested_bytes=262144000)
    return analyze(snaps, ctx, names=names)


def test_leak_without_frames_says_how_to_get_them():
    r = _leak_run()
    d = r["diagnosis"]
    assert d["primary_cause"] == "leak"
    text = _evidence(r) + _advice(r)
    assert "<no frames>" not in text and "memq:ingest" not in text
    assert 'history="on"' in text and "records Python stacks" in text
    ev = d["causes"][0]["evidence"]
    assert "end of epoch 0 (step 7)" in ev[0] and "end of epoch 4 (step 39)" in ev[0]
    assert r["details"]["per_snapshot"][-1]["label"] == "OOM in step 44 (epoch 5)"


def test_leak_names_the_allocating_line_once_growth_is_recorded():
    r = _leak_run(keep_growth_frames_from=3)
    d = r["diagnosis"]
    assert d["primary_cause"] == "leak"
    site = r["details"]["leak"]["allocating_site"]
    assert site.startswith("workspace/train.py:") and "torch/" not in site.split(" (via")[0]
    assert site in " ".join(d["causes"][0]["evidence"]) and site in d["recommendations"][0]["action"]


def test_agents_comparable_snapshots_stand_in_for_epoch_ends():
    """No epoch ends (a script without mark_epoch): the agent's `comparable` periodic snapshots are the
    leak test's points; its warm-up snapshot (periodic, not comparable) is not one."""
    r = _leak_run(trigger="periodic", comparable=True)
    assert r["diagnosis"]["primary_cause"] == "leak"
    assert r["details"]["leak"]["points"] == 5
    assert "periodic snapshot at step 7 (epoch 0)" in r["diagnosis"]["causes"][0]["evidence"][0]
    plain = _leak_run(trigger="periodic", comparable=False)  # same points by the common trigger
    assert plain["details"]["leak"]["points"] == 5


# -- optimizer state created by the failing request --------------------------------------------------

def _first_step_oom(limit: int) -> dict:
    """opt_state_first_step's snapshot before the first optimizer step (parameters and gradients live,
    frames on the parameters from warm-up recording), as the agent's OOM snapshot in step 0: the
    failed request is the embedding's 138,240,000-byte exp_avg (its real size in that run's trace)."""
    raw = _raw(REAL / "opt_state_first_step" / "before_step.pickle.gz")
    params = {k for k in live_keys(raw)}
    d = with_agent(agent_default(raw, keep=lambda b: (b["address"], b["size"]) in params),
                   trigger="oom", step=0, epoch=0, step_in_progress=0, optimizer="AdamW")
    return analyze([parse(d)], OomContext(limit_bytes=limit, requested_bytes=138240000))


def test_first_step_state_creation_into_the_last_bytes_is_optimizer_state():
    r = _first_step_oom(limit=630_000_000)  # live + request = 620 MB: within the last 5%
    d = r["diagnosis"]
    assert d["primary_cause"] == "optimizer_state", d["causes"][0]
    assert any("first optimizer step" in e for e in d["causes"][0]["evidence"])
    assert any("8-bit AdamW" in e and "0.90 GiB" in e for e in d["causes"][0]["evidence"])


def test_state_creation_is_listed_when_fragmentation_is_primary():
    r = _first_step_oom(limit=670_000_000)  # fits with room, but a new segment does not
    d = r["diagnosis"]
    assert d["primary_cause"] == "fragmentation"
    listed = next(c for c in d["causes"] if c["cause"] == "optimizer_state")
    assert 0.1 < listed["confidence"] < d["confidence"]
    assert any("creates optimizer state" in e for e in listed["evidence"])
    assert any("SGD with momentum" in e for e in listed["evidence"])


def test_setup_without_steps_is_never_a_spike(spool):
    """The OOM snapshot alone: no earlier training step, so however large, not a spike."""
    fields, raw = spool[-1]
    r = analyze([parse(raw)], oom_context(fields))
    assert r["diagnosis"]["primary_cause"] != "activation_spike"


# -- labels --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("args,kw,want", [
    (("epoch_end", 14, 0), {}, "end of epoch 0 (step 14)"),
    (("oom", 60, 3), {"step_in_progress": 60}, "OOM in step 60 (epoch 3)"),
    (("oom", 59, 3), {"step_completed": 59}, "OOM in step 60 (epoch 3)"),
    (("periodic", 200, None), {}, "periodic snapshot at step 200"),
    ((None, None, None), {"fallback": "a.pickle"}, "a.pickle"),
])
def test_snapshot_labels(args, kw, want):
    assert snapshot_label(*args, **kw) == want


def test_an_old_agents_oom_step_is_the_last_completed_one():
    assert agent_label({"trigger": "oom", "step": 59, "epoch": 3}) == "OOM in step 60 (epoch 3)"


def test_agent_facts_of_the_wrong_type_are_dropped_not_fatal():
    raw = _raw(REAL / "seed_sgd" / "epoch1.pickle.gz")
    snap = parse(with_agent(raw, trigger=7, step="x", step_figures=[{"step": 1}, "bad", {"step": 2,
                            "peak_allocated": 5, "allocated": 1}], recording="on", comparable="yes"))
    a = snap.agent
    assert a.trigger is None and a.step is None and a.comparable is False and a.recording_on is None
    assert [f.step for f in a.step_figures] == [2]
    assert "memq_agent" not in snap.unknown_keys


def test_digests_carry_the_agent_facts(spool):
    """A worker diagnoses from digests of earlier snapshots: the projection and labels must not change."""
    snaps = [parse(with_agent(raw, trigger=f["trigger"], step=int(f["step"]), epoch=int(f["epoch"])))
             for f, raw in spool]
    ctx = oom_context(spool[-1][0])
    full = analyze(snaps, ctx)
    digests = [SnapshotDigest.from_json(json.loads(json.dumps(json_safe(digest(s, ANALYZER_VERSION)))))
               for s in snaps[:-1]]
    fresh = parse(with_agent(spool[-1][1], trigger="oom", step=16, epoch=2))
    got = analyze([*digests, fresh], ctx)
    assert json.dumps(json_safe(got), sort_keys=True) == json.dumps(json_safe(full), sort_keys=True)
    assert full["diagnosis"]["primary_cause"] == "activation_spike"
    assert "periodic snapshot at step 2 (epoch 0)" in full["diagnosis"]["step_need"]["reference"]


# -- leak from the agent's per-step figures (one snapshot: `memq run` with no epoch marks) -----------

def _figures(snaps, steps, epochs) -> list[dict]:
    """Per-step figures as the agent sends them, from the real snapshots' own numbers: allocated at
    the boundary = the snapshot's active bytes, peak = its trace's peak (or active)."""
    out = []
    for s, step, epoch in zip(snaps, steps, epochs, strict=True):
        p = _per(s)
        a = p["metrics"]["active_bytes"]
        out.append({"step": step, "epoch": epoch, "allocated": a, "reserved": p["metrics"]["reserved_bytes"],
                    "peak_allocated": max(a, p["timeline"].get("peak_live_bytes") or 0),
                    "peak_reserved": p["metrics"]["reserved_bytes"], "retries": 0, "ms": 40.0})
    return out


def test_a_leak_shows_in_the_step_figures_of_the_oom_snapshot_alone():
    """leak_epochs' OOM snapshot with no other snapshot; the agent's figures at the epoch ends carry
    the real live bytes of those boundaries (the epoch-end snapshots')."""
    epochs = [parse(_raw(LEAK / f"epoch{i}.pickle.gz")) for i in range(5)]
    figs = _figures(epochs, [8 * i + 7 for i in range(5)], list(range(5)))
    oom = agent_default(_raw(LEAK / "oom.pickle.gz"), keep=lambda b: False)
    snap = parse(with_agent(oom, trigger="oom", step=44, epoch=5, step_in_progress=44, step_figures=figs))
    r = analyze([snap], OomContext(limit_bytes=LEAK_CAP, requested_bytes=262144000))
    d = r["diagnosis"]
    assert d["primary_cause"] == "leak", d["causes"][0]
    assert r["details"]["leak"]["source"] == "the agent's figures at every step boundary"
    text = _evidence(r) + _advice(r)
    assert "from the end of epoch 0 (step 7) to the end of epoch 4 (step 39)" in text
    assert "+0.98 GiB an epoch" in text and 'history="on"' in text and "<no frames>" not in text
    only = analyze([parse(oom)], OomContext(limit_bytes=LEAK_CAP, requested_bytes=262144000))
    assert only["diagnosis"]["primary_cause"] != "leak"  # without the figures: not settled


def test_flat_step_figures_are_no_leak():
    from tests.helpers import REAL_RUNS, run_files

    stems, opts = REAL_RUNS["kept_loss_no_leak"]
    snaps = [parse(_raw(p)) for p in run_files("kept_loss_no_leak")]
    figs = _figures(snaps, [int(s[4:]) for s in stems], [None] * len(stems))
    last = parse(with_agent(_raw(run_files("kept_loss_no_leak")[-1]), trigger="periodic", step=400,
                            step_figures=figs))
    r = analyze([last], OomContext(limit_bytes=opts["limit"]))
    assert r["details"]["leak"]["holds"] is False and r["details"]["leak"]["settled"] is True
    assert r["diagnosis"]["primary_cause"] == "healthy"
