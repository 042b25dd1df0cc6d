"""Snapshot layouts of torch 2.0 .. 2.14 and newer, derived from a real H200 snapshot by applying
each version's documented differences (research/anchors-pytorch-memory.md, section 1.2)."""

from __future__ import annotations

import copy
import gzip
import pickle

import pytest

from memq import codec
from memq.analysis import analyze
from memq.load import decode_snapshot_bytes
from memq.model import OomContext
from tests.helpers import REAL

LIMIT = OomContext(limit_bytes=8 * 1024**3)


@pytest.fixture(scope="module")
def base() -> dict:
    return codec.decode((REAL / "frag_synthetic" / "oom.pickle.gz").read_bytes())


def as_torch_2_0(d):
    for s in d["segments"]:
        for k in ("segment_pool_id", "is_expandable", "frames"):
            s.pop(k, None)
        for b in s["blocks"]:
            frames = b.pop("frames", [])
            addr = b.pop("address")
            b["history"] = [{"addr": addr, "real_size": b["requested_size"], "frames": frames}]
    d.pop("allocator_settings")
    d.pop("external_annotations", None)
    for t in d["device_traces"]:
        for e in t:
            for k in ("time_us", "compile_context", "user_metadata"):
                e.pop(k, None)
    return d


def as_torch_2_1(d):
    d.pop("allocator_settings")
    d.pop("external_annotations", None)
    for t in d["device_traces"]:
        for e in t:
            e.pop("time_us", None)
    return d


def as_torch_2_2(d):
    d.pop("allocator_settings")
    return d


def with_2_5_to_2_14_extras(d):
    d["external_annotations"] = [{"name": "train_step", "stage": "START", "device": 0, "time_us": 1},
                                 {"name": "train_step", "stage": "END", "device": 0, "time_us": 2}]
    t = d["device_traces"][0]
    for e in t:
        e["compile_context"] = "Torch-Compiled Region: 0/0"
        e["user_metadata"] = "step=3"
        e["pool_id"] = (0, 0)
    t.insert(1, {"action": "annotate", "size": 0, "stream": 0, "time_us": 5, "user_metadata": "epoch 1"})
    d["host_segments"] = [{"address": 1, "total_size": 4096, "blocks": []}]
    d["host_traces"] = [[]]
    d["allocator_settings"]["graph_capture_record_stream_reuse"] = False
    d["allocator_settings"]["trace_alloc_overflowed"] = True
    d["allocator_settings"]["trace_alloc_max_entries"] = 8000
    return d


def with_awaiting_free(d):
    blk = next(b for s in d["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    blk["state"] = "active_awaiting_free"
    return d


def with_oom_addr_slot(d):
    oom = next(e for e in d["device_traces"][0] if e["action"] == "oom")
    oom["addr"] = oom.pop("device_free")
    return d


def truncated_ring(d):
    d["device_traces"][0] = d["device_traces"][0][-20:]
    return d


def with_unknown_keys(d):
    d["future_top_level"] = {"x": 1}
    d["segments"][0]["registration_counter"] = 3
    d["segments"][0]["blocks"][0]["new_block_field"] = "y"
    d["device_traces"][0].insert(0, {"action": "segment_prefetch", "addr": 1, "size": 2, "stream": 0})
    d["device_traces"][0][-1]["forward_frames"] = []
    return d


def segments_only_dict(d):
    return {"segments": d["segments"]}


def bare_segment_list(d):
    return d["segments"]


LAYOUTS = [
    (as_torch_2_0, "2.0"),
    (as_torch_2_1, "2.1"),
    (as_torch_2_2, "2.2"),
    (with_2_5_to_2_14_extras, "2.3+"),
    (with_awaiting_free, "2.3+"),
    (with_oom_addr_slot, "2.3+"),
    (truncated_ring, "2.3+"),
    (with_unknown_keys, "2.3+"),
    (segments_only_dict, "segments-only"),
    (bare_segment_list, "segments-only"),
]


def _roundtrip(data) -> bytes:
    return gzip.compress(pickle.dumps(data, protocol=4))


@pytest.mark.parametrize("transform,fmt", LAYOUTS, ids=[t.__name__ for t, _ in LAYOUTS])
def test_layout_parses_and_keeps_the_memory_picture(base, transform, fmt):
    want = analyze([decode_snapshot_bytes(_roundtrip(base)).snapshot], LIMIT)
    snap = decode_snapshot_bytes(_roundtrip(transform(copy.deepcopy(base)))).snapshot
    assert snap.torch_format == fmt
    got = analyze([snap], LIMIT)
    # Segment-derived figures do not depend on the layout.
    for k in ("reserved_bytes", "allocated_bytes", "largest_free_block_bytes", "stranded_bytes"):
        if transform is with_awaiting_free and k == "allocated_bytes":
            continue
        assert got["metrics"][k] == want["metrics"][k], k
    assert got["metrics"]["active_bytes"] == want["metrics"]["active_bytes"]
    if transform in (segments_only_dict, bare_segment_list):
        assert got["oom"] is None  # no trace: the failed request is unknown without --oom-message
        assert got["snapshots"][0]["trace_entries"] == 0
    else:
        assert got["diagnosis"]["primary_cause"] == "fragmentation"


def test_unknown_keys_are_kept_not_fatal(base):
    snap = decode_snapshot_bytes(_roundtrip(with_unknown_keys(copy.deepcopy(base)))).snapshot
    assert snap.unknown_keys == ["future_top_level"]


def test_2_14_extras_are_read(base):
    snap = decode_snapshot_bytes(_roundtrip(with_2_5_to_2_14_extras(copy.deepcopy(base)))).snapshot
    assert snap.host_segment_count == 1
    assert snap.trace_overflowed is True
    assert len(snap.annotations) == 2
    assert any(e.action == "annotate" and e.user_metadata == "epoch 1" for e in snap.trace)


def test_awaiting_free_counts_as_live_not_allocated(base):
    snap = decode_snapshot_bytes(_roundtrip(with_awaiting_free(copy.deepcopy(base)))).snapshot
    m = analyze([snap], LIMIT)
    assert m["details"]["metrics"]["pending_free_bytes"] > 0
    pending = m["details"]["metrics"]["pending_free_bytes"]
    assert m["metrics"]["allocated_bytes"] + pending == m["metrics"]["active_bytes"]


def test_oom_device_free_from_either_slot(base):
    a = decode_snapshot_bytes(_roundtrip(base)).snapshot.oom_event()
    b = decode_snapshot_bytes(_roundtrip(with_oom_addr_slot(copy.deepcopy(base)))).snapshot.oom_event()
    assert a.device_free == b.device_free and a.device_free is not None


def test_segments_only_with_message_still_diagnoses(base):
    from memq.oom_message import parse_oom_message
    from tests.helpers import meta

    snap = decode_snapshot_bytes(_roundtrip(bare_segment_list(copy.deepcopy(base)))).snapshot
    ctx = OomContext(message=parse_oom_message(meta("frag_synthetic")["oom_message"]))
    r = analyze([snap], ctx)
    assert r["diagnosis"]["primary_cause"] == "fragmentation"


def test_json_snapshot_is_accepted(base):
    import json

    data = json.dumps(base, default=list).encode()
    snap = decode_snapshot_bytes(data).snapshot
    assert analyze([snap], LIMIT)["diagnosis"]["primary_cause"] == "fragmentation"


def test_zstd_compressed_snapshot(base):
    raw = pickle.dumps(base)
    a = decode_snapshot_bytes(codec.compress(raw, "zstd"))
    b = decode_snapshot_bytes(raw)
    assert a.sha256 == b.sha256  # the hash is of the uncompressed bytes
