"""Scenarios captured for memq on the H200 (tests/fixtures/captured/README.md): a leak across epochs,
a cuDNN workspace spike with stacks="all", CUDA-graph private pools, and one dynamic-shape job under
several allocator settings at one limit. Each gets its ground-truth label."""

from __future__ import annotations

import json

import pytest

from memq.analysis import analyze
from memq.load import load_snapshot_file
from memq.model import OomContext
from memq.oom_message import parse_oom_message
from tests.helpers import FIXTURES

CAPTURED = FIXTURES / "captured"
DYN_CAP = 18484297728
EPOCHS = ["epoch0", "epoch1", "epoch2"]

CASES = {
    "leak_epochs": (["epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"], 7516192768),
    "cuda_graphs": (["after_replays"], None),
    "cuda_graphs_oom": (["graphs_captured", "oom"], 4445962240),
    "paused_recording": (["paused", "resumed"], None),
    "cudnn_workspace": (["oom"], 6523191296),
    "dynamic_settings/default": (["end"], DYN_CAP),
    "dynamic_settings/gc_0.6": (["epoch0", "epoch1", "oom"], DYN_CAP),
    "dynamic_settings/roundup_4": (["oom"], DYN_CAP),
    "dynamic_settings/expandable_segments": (EPOCHS, DYN_CAP),
    "dynamic_settings/max_split_128": (EPOCHS, DYN_CAP),
    "dynamic_settings/max_split_512": (EPOCHS, DYN_CAP),
    "dynamic_settings/max_split_128_gc_0.6": (EPOCHS, DYN_CAP),
    "dynamic_settings/expandable_gc_0.6": (EPOCHS, DYN_CAP),
    "dynamic_settings/probe": (EPOCHS, None),
}


def _meta(folder: str) -> dict:
    return json.loads((CAPTURED / folder / "meta.json").read_text())


def _run(folder: str, ctx: OomContext) -> dict:
    stems, _ = CASES[folder]
    return analyze([load_snapshot_file(CAPTURED / folder / f"{s}.pickle.gz") for s in stems], ctx)


@pytest.mark.parametrize("folder", sorted(CASES))
def test_captured_label(folder):
    stems, cap = CASES[folder]
    result = _run(folder, OomContext(limit_bytes=cap))
    assert result["diagnosis"]["primary_cause"] == _meta(folder)["label"], result["diagnosis"]["causes"][0]


@pytest.mark.parametrize("folder", sorted(f for f in CASES if _meta(f).get("oom_message")))
def test_captured_label_from_message(folder):
    ctx = OomContext(message=parse_oom_message(_meta(folder)["oom_message"]))
    assert _run(folder, ctx)["diagnosis"]["primary_cause"] == _meta(folder)["label"]


def test_leak_growth_is_attributed_to_the_kept_logits():
    r = _run("leak_epochs", OomContext(limit_bytes=7516192768))
    leak = r["details"]["leak"]
    # five epoch ends, 8 x 131072000 bytes kept in each: the trend says so, to the byte
    # the files carry no epoch marks: five points in order
    assert leak["holds"] and leak["points"] == 5 and leak["growth"]["unit"] == "point"
    assert leak["growth"]["rate_bytes"] == 8 * 131072000
    top = leak["growth_by_site"][0]
    assert top["bytes"] > 3.5 * 1024**3 and "forward" in top["site"]
    # The OOM alone also looks like fragmentation; the leak still wins by precedence.
    assert "fragmentation" in [c["cause"] for c in r["diagnosis"]["causes"] if c["confidence"] > 0.1]


def test_leak_needs_the_epochs_not_only_the_oom():
    only_oom = analyze([load_snapshot_file(CAPTURED / "leak_epochs" / "oom.pickle.gz")],
                       OomContext(limit_bytes=7516192768))
    assert only_oom["diagnosis"]["primary_cause"] != "leak"


def test_workspace_evidence_names_the_cudnn_frame():
    r = _run("cudnn_workspace", OomContext(limit_bytes=6523191296))
    ev = r["diagnosis"]["causes"][0]["evidence"][0]
    assert "generate_and_filter_plans" in ev and "36.28 GiB" in ev
    assert r["diagnosis"]["recommendations"][0]["action"].startswith("Set torch.backends.cudnn.benchmark=False")


def test_private_pools_are_named_and_expandable_segments_not_advised():
    r = _run("cuda_graphs_oom", OomContext(limit_bytes=4445962240))
    ev = " ".join(r["diagnosis"]["causes"][0]["evidence"])
    assert "private pools" in ev
    actions = [x["action"] for x in r["diagnosis"]["recommendations"]]
    assert "pool=g.pool()" in actions[0]
    assert not any(a.startswith("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments") for a in actions)
    healthy = _run("cuda_graphs", OomContext())
    assert healthy["details"]["metrics"]["private_pool_bytes"] > 500 * 1024**2


def test_roundup_is_blamed_with_the_unrounded_request():
    r = _run("dynamic_settings/roundup_4", OomContext(limit_bytes=DYN_CAP))
    ev = r["diagnosis"]["causes"][0]["evidence"][0]
    assert "roundup_power2_divisions" in ev and "4.00 GiB" in ev
    assert r["diagnosis"]["recommendations"][0]["action"].startswith(
        "Remove or relax the non-default allocator settings (roundup_power2_divisions:4)")


def test_default_run_is_a_near_miss():
    r = _run("dynamic_settings/default", OomContext(limit_bytes=DYN_CAP))
    assert "under 5%" in " ".join(r["diagnosis"]["causes"][0]["evidence"])


def test_frames_survive_a_recording_pause():
    paused = load_snapshot_file(CAPTURED / "paused_recording" / "paused.pickle.gz").snapshot
    assert paused.trace == []  # switching recording off clears the trace
    live = [b for s in paused.segments for b in s.blocks if b.is_live]
    assert sum(1 for b in live if b.frames) >= 3
