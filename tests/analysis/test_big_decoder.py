"""The decoder for big snapshots (profiler/codec.py `decode_stream`, profiler/snapshot.py `_Frames`):
a compressed pickle is unpickled while it is inflated, trace entries are released as they are parsed,
equal stacks share one frames list, and the guarantees of the whole-file decoder still hold (frames
flat, shared containers bounded, no code run). Real snapshots throughout."""

from __future__ import annotations

import copy
import gzip
import hashlib
import pickle
from pathlib import Path

import pytest

from memq import codec
from memq.analysis import analyze
from memq.errors import RefusedPickle, SnapshotError, TooLarge
from memq.load import decode_snapshot_bytes, load_snapshot_file
from memq.snapshot import parse_snapshot

REAL = Path(__file__).resolve().parents[1] / "fixtures" / "real"
ROOT = Path(__file__).resolve().parents[2]
BIG_1M = ROOT / "benchmarks" / "data" / "h200_1m_trace.pickle.gz"
BIG_100K = ROOT / "benchmarks" / "data" / "big.pickle.gz"
OOM = REAL / "frag_dynamic_1.15" / "oom.pickle.gz"
EPOCH = REAL / "seed_adamw" / "epoch0.pickle.gz"


def _raw(path: Path) -> bytes:
    return codec.decompress(path.read_bytes())


def _shared_frames_snapshot() -> dict:
    """A real snapshot re-shaped the way torch 2.11's own `_dump_snapshot` writes one (the 1M capture):
    every distinct frame is one dict, and entries with the same stack share one frames list."""
    snap = codec.loads_restricted(_raw(OOM))
    frames: dict[tuple, dict] = {}
    lists: dict[tuple, list] = {}
    for e in snap["device_traces"][0]:
        fl = [frames.setdefault((f["filename"], f["line"], f["name"]), f) for f in e.get("frames") or []]
        key = tuple(map(id, fl))
        e["frames"] = lists.setdefault(key, fl) if fl else []
    return snap


@pytest.mark.parametrize("protocol", [0, 2, 4, 5])
@pytest.mark.parametrize("compress", ["gzip", "zstd"])
def test_streamed_decode_equals_the_whole_file_decode(protocol, compress):
    """Protocol 0 reads lines, 2 has no frames (the unpickler peeks ahead), 4 and 5 are framed."""
    obj = codec.loads_restricted(_raw(OOM))
    data = pickle.dumps(obj, protocol=protocol)
    blob = codec.compress(data, compress)
    got, sha, size = codec.decode_stream(blob, len(data) + 1)
    assert got == obj
    assert (sha, size) == (hashlib.sha256(data).hexdigest(), len(data))
    a = decode_snapshot_bytes(blob).snapshot
    b = parse_snapshot(codec.loads_restricted(data))
    assert a.trace == b.trace and a.segments == b.segments


def test_streamed_decode_hashes_what_follows_the_pickle_as_the_blob_store_does():
    data = _raw(OOM) + b"trailing bytes"
    got = decode_snapshot_bytes(gzip.compress(data))
    assert got.sha256 == hashlib.sha256(data).hexdigest() and got.raw_size == len(data)
    assert got.sha256 == decode_snapshot_bytes(gzip.compress(data), keep_raw=True).sha256


def test_streamed_decode_keeps_the_size_cap_and_the_refusal_of_code():
    data = _raw(OOM)
    with pytest.raises(TooLarge, match="exceeds the limit"):
        codec.decode_stream(gzip.compress(data), len(data) - 1)
    evil = gzip.compress(b"\x80\x04cos\nsystem\n(S'true'\ntR.")
    with pytest.raises(RefusedPickle):
        codec.decode_stream(evil, 10_000)
    with pytest.raises(SnapshotError, match="empty input after decompression"):
        codec.decode_stream(gzip.compress(b""), 10_000)


def test_streamed_decode_bounds_the_tuple_nesting_by_the_thread_stack():
    """Hashing a tuple nested N deep needs N levels of C stack. Streaming, the size is not known
    ahead, so the decoding thread gets the largest stack (4 GiB of address space, ~16.6M levels) and
    the reader refuses more tuple opcodes than that before the unpickler reaches them."""
    depth = 17_000_000  # past the bound: the bytes of a tuple opcode, here in a string (cheap to build)
    data = b"\x80\x04\x8d" + depth.to_bytes(8, "little") + b"t" * depth + b"."  # BINUNICODE8
    with pytest.raises(TooLarge, match="nest tuples"):
        codec.decode_stream(gzip.compress(data), 2 * len(data))
    under = 16_000_000
    data = b"\x80\x04\x8d" + under.to_bytes(8, "little") + b"t" * under + b"."
    assert codec.decode_stream(gzip.compress(data), 2 * len(data))[2] == len(data)
    shallow = b"\x80\x02)" + b"\x85" * 10_000 + b"."
    assert codec.decode_stream(gzip.compress(shallow), 2 * len(shallow), check=False)[2] == len(shallow)


def test_equal_stacks_share_one_list_and_frames_are_checked_once_each():
    snap = _shared_frames_snapshot()
    entries = snap["device_traces"][0]
    distinct = {id(e["frames"]) for e in entries if e["frames"]}
    data = pickle.dumps(snap, protocol=4)
    parsed = decode_snapshot_bytes(gzip.compress(data)).snapshot
    with_frames = [ev for ev in parsed.trace if ev.frames]
    assert len({id(ev.frames) for ev in with_frames}) == len(distinct) < len(with_frames)
    assert len({id(ev.frames) for ev in parsed.trace if not ev.frames}) == 1  # one shared empty list
    assert parse_snapshot(codec.loads_restricted(data)).trace == parsed.trace


def test_the_verdict_of_a_streamed_and_interned_decode_is_the_whole_file_verdict():
    ctx_free = [analyze([decode_snapshot_bytes(p.read_bytes(), keep_raw=True)])["diagnosis"] for p in (OOM, EPOCH)]
    streamed = [analyze([load_snapshot_file(p)])["diagnosis"] for p in (OOM, EPOCH)]
    assert streamed == ctx_free


def test_parsing_releases_the_decoded_entries_it_consumed():
    obj = codec.loads_restricted(_raw(EPOCH))
    kept = copy.deepcopy(obj)
    parse_snapshot(kept)  # not consumed: the caller's data is left as it was
    assert kept == obj
    parse_snapshot(obj, consume=True)
    assert set(map(type, obj["device_traces"][0])) == {type(None)}


@pytest.mark.parametrize("bad", [["deep", ["er"]], {"k": 1}, (1, (2,))])
def test_a_trace_frame_that_is_not_flat_is_refused(bad):
    snap = codec.loads_restricted(_raw(OOM))
    e = next(e for e in snap["device_traces"][0] if e.get("frames"))
    e["frames"][0]["filename"] = bad
    with pytest.raises(SnapshotError, match="not flat data"):
        decode_snapshot_bytes(gzip.compress(pickle.dumps(snap, protocol=4)))


def test_a_trace_frame_with_numbers_for_names_is_read_as_text():
    snap = codec.loads_restricted(_raw(OOM))
    for e in snap["device_traces"][0]:
        for f in e.get("frames") or []:
            f["name"], f["filename"] = 7, 8.5
    got = analyze([decode_snapshot_bytes(pickle.dumps(snap, protocol=4))])
    assert got["diagnosis"]["primary_cause"]


def test_legacy_tuple_frames_are_accepted_when_flat_and_refused_when_not():
    snap = codec.loads_restricted(_raw(OOM))
    for e in snap["device_traces"][0]:
        e["frames"] = [(f["filename"], f["line"], f["name"]) for f in e.get("frames") or []]
    assert decode_snapshot_bytes(pickle.dumps(snap, protocol=4)).snapshot.trace
    next(e for e in snap["device_traces"][0] if e["frames"])["frames"][0] = ("f", 1, ["nested"])
    with pytest.raises(SnapshotError, match="not flat data"):
        decode_snapshot_bytes(pickle.dumps(snap, protocol=4))


def test_one_long_frames_list_shared_by_every_entry_is_refused():
    """The memo lets a pickle reference one 10,000-frame list from 100,000 entries in a few hundred
    KB: 10^9 frame references for every later walk. The parser counts them against the input's size,
    as the shape check does for the rest of the snapshot."""
    frame = {"filename": "x.py", "line": 1, "name": "f"}
    frames = [frame] * 10_000
    snap = {"segments": [], "device_traces": [[{"action": "alloc", "addr": i, "size": 512, "stream": 0,
                                                 "time_us": i, "frames": frames} for i in range(100_000)]]}
    data = pickle.dumps(snap, protocol=4)
    assert len(data) < 5_000_000
    with pytest.raises(SnapshotError, match="reuses containers"):
        decode_snapshot_bytes(gzip.compress(data))


def test_the_real_million_entry_capture_decodes_with_its_stacks_interned():
    ld = load_snapshot_file(BIG_1M, max_bytes=codec.raw_limit(4 * 1024**3))
    trace = ld.snapshot.trace
    assert len(trace) == 1_000_000
    lists = {id(ev.frames) for ev in trace if ev.frames}
    assert 0 < len(lists) < 100  # 435,748 entries with frames, 293,691 list objects in the pickle
    assert ld.raw_size == 85_113_544


def test_a_frames_list_that_reads_like_a_kept_one_but_holds_containers_stays_itself_and_is_refused():
    from memq.snapshot import _Frames

    a = [{"filename": "a.py", "line": 1, "name": "f"}]
    b = [{"filename": "a.py", "line": 1, "name": "f", "extra": ["not", "flat"]}]
    fs = _Frames(10**6)
    assert fs.intern(a) is a
    assert fs.intern(b) is b  # same text, but dropping it for a would hide what check() refuses
    assert fs.intern([dict(a[0])]) is a  # the same text in other objects: the kept list
    with pytest.raises(SnapshotError, match="not flat"):
        fs.check()


def test_lists_sharing_frame_objects_are_found_by_identity_and_told_apart_by_their_frames():
    from memq.snapshot import _Frames

    x, y, z = ({"filename": "m.py", "line": n, "name": "f"} for n in (1, 2, 3))
    fs = _Frames(10**6)
    a = fs.intern([x, y])
    assert fs.intern([x, y]) is a  # the same frame objects in another list
    b = [x, z]
    assert fs.intern(b) is b  # the same first frame, another stack: its own
    assert fs.intern([x, y]) is a and fs.intern([x, z]) is b
    assert fs.intern([dict(x), dict(z)]) is b  # the same text, other objects
    fs.check()
    alone = _Frames(10**6)
    for n in range(100):  # frames no other list holds: nothing is held by identity
        alone.intern([{"filename": "m.py", "line": n, "name": "f"}])
    assert not alone._by_ids and not alone._by_list and len(alone._lists) == 100


def test_the_real_100k_snapshot_keeps_one_list_per_stack_it_records():
    """Its 55,150 frames lists hold 486,682 frame dicts, no two the same object (the pickle's memo
    shares none), saying 34 different things: kept by what they say, the per-list passes of the
    analysis run 34 times instead of 38,000."""
    ld = load_snapshot_file(BIG_100K)
    with_frames = [ev.frames for ev in ld.snapshot.trace if ev.frames]
    texts = {tuple((f["filename"], f["line"], f["name"]) for f in fl) for fl in with_frames}
    assert len(with_frames) == 55_150
    assert len({id(fl) for fl in with_frames}) == len(texts) == 34
    # the dropped lists go with the snapshot (freed whole, or never by a command that exits), and a
    # snapshot kept for long lets them go without changing what the analysis reads
    assert len(ld.snapshot.held) == 55_150 - 34
    before = analyze([ld])["diagnosis"]
    ld.snapshot.release_held()
    assert ld.snapshot.held == [] and analyze([ld])["diagnosis"] == before


@pytest.mark.parametrize("protocol", [0, 4])
def test_a_large_value_spanning_many_chunks_streams_whole(protocol):
    """A 6 MB string (six of the inflater's chunks) read in one piece, and protocol 0's long lines."""
    obj = {"segments": [], "note": "x" * 6_000_000 + "\n" + "y" * 3, "n": list(range(2000))}
    data = pickle.dumps(obj, protocol=protocol)
    got, sha, size = codec.decode_stream(gzip.compress(data), len(data) + 1)
    assert got == obj and size == len(data) and sha == hashlib.sha256(data).hexdigest()


def test_a_load_told_not_to_hash_returns_no_digest_and_the_same_snapshot():
    hashed, unhashed = load_snapshot_file(EPOCH), load_snapshot_file(EPOCH, digest=False)
    assert unhashed.sha256 is None and hashed.sha256 == hashlib.sha256(_raw(EPOCH)).hexdigest()
    assert unhashed.snapshot.trace == hashed.snapshot.trace and unhashed.raw_size == hashed.raw_size


def test_memq_analyze_of_a_healthy_snapshot_imports_only_what_it_uses():
    """`memq analyze` never names a snapshot by its hash, so it does not hash it nor import hashlib,
    whose libcrypto is 3.7 MB of the process's peak (the 100k snapshot's peak RSS goal is the plain
    pickle.loads'); a snapshot with no OOM needs neither the allocator model (what-if, fit), nor a
    TOML parser when no config file exists (together ~2% of that goal's time)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "MEMQ_CONFIG": "/nonexistent/memq.toml"}
    got = subprocess.run([sys.executable, "-X", "importtime", "-m", "memq", "analyze", str(EPOCH), "--json"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert got.returncode == 0, got.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in got.stderr.splitlines() if line.startswith("import time")}
    assert "memq.analysis" in imported and "json" in imported  # the probe sees the command's imports
    assert "_hashlib" not in imported and "hashlib" not in imported
    assert not {"memq.analysis.allocator_model", "memq.analysis.whatif", "tomllib"} & imported


def _cpp_trace(copies: int, one_list_per_entry: bool) -> dict:
    """The real stacks="all" capture (35 C++ and Python frames a stack) repeated `copies` times, frames
    shared as torch pickles them (one dict per distinct frame); each entry its own frames list, or one
    list per allocation read again by its frees (torch's own sharing)."""
    snap = codec.loads_restricted(_raw(ROOT / "tests" / "fixtures" / "captured" / "cudnn_workspace"
                                       / "after_benchmark_step.pickle.gz"))
    frames: dict[tuple, dict] = {}
    out = []
    for k in range(copies):
        by_addr: dict = {}
        for e in snap["device_traces"][0]:
            if "addr" not in e:  # the capture's own `snapshot` marker
                continue
            e2 = {**e, "addr": e["addr"] + (k << 40)}
            fl = [frames.setdefault((f["filename"], f["line"], f["name"]), f) for f in e.get("frames") or []]
            if not one_list_per_entry and e["action"] != "alloc" and e2["addr"] in by_addr:
                fl = by_addr[e2["addr"]]
            by_addr.setdefault(e2["addr"], fl)
            e2["frames"] = fl
            out.append(e2)
    snap["device_traces"] = [out]
    return snap


@pytest.mark.parametrize("one_list_per_entry", [True, False])
def test_lists_of_shared_frames_are_read_by_their_text_once_per_stack_not_once_per_list(one_list_per_entry):
    """Reading a list's text is the costly path (35 frames of C++ symbols): it runs once per distinct
    stack, however many list objects say it (it ran for 434,497 of the 1M entries of such a trace)."""
    from memq import snapshot as snapshot_mod

    calls = []
    real = snapshot_mod._Frames._by_text

    def counting(self, f):
        calls.append(1)
        return real(self, f)

    raw = _cpp_trace(40, one_list_per_entry)
    n_entries = len(raw["device_traces"][0])
    stacks = {tuple((f["filename"], f["line"], f["name"]) for f in e["frames"]) for e in raw["device_traces"][0]
              if e["frames"]}
    data = pickle.dumps(raw, protocol=4)
    snapshot_mod._Frames._by_text = counting
    try:
        snap = decode_snapshot_bytes(data).snapshot
    finally:
        snapshot_mod._Frames._by_text = real
    assert len(snap.trace) == n_entries > 10_000
    assert len(calls) <= 2 * len(stacks) < 400, (len(calls), len(stacks))
    assert len({id(ev.frames) for ev in snap.trace if ev.frames}) == len(stacks)


def test_a_list_remembered_by_identity_is_let_go_after_its_last_entry():
    """One list per allocation, read again by its frees, of frames of its own (no other list holds
    them): remembered while entries still to come hold it, so that memory follows what is left to
    read, and found again by its identity instead of its text."""
    raw = _cpp_trace(3, one_list_per_entry=False)
    from memq.snapshot import _Frames, _parse_trace

    trace = raw["device_traces"][0]
    own: dict[int, list] = {}  # each list with frame dicts of its own, still shared by its entries
    for e in trace:
        if e["frames"]:
            e["frames"] = own.setdefault(id(e["frames"]), [dict(f) for f in e["frames"]])
    assert len(own) < len(trace) * 0.7  # frees read their allocation's list
    fs = _Frames(10**9)
    events = _parse_trace(trace, 0, fs, consume=True)
    kept = {id(ev.frames) for ev in events}
    # what is still remembered is a list kept for its stack anyway, never one that would be freed
    assert fs._by_list and all(id(f) in kept or f in fs.held for f, _c in fs._by_list.values())


def test_lists_of_shared_frames_are_not_remembered_by_identity():
    """torch's one list per allocation, of frames other lists share: found again by the frames'
    identities, so no entry's list is held past its last entry and nothing is swept."""
    raw = _cpp_trace(3, one_list_per_entry=False)
    from memq.snapshot import _Frames, _parse_trace

    trace = raw["device_traces"][0]
    stacks = {tuple(map(id, e["frames"])) for e in trace if e["frames"]}
    fs = _Frames(10**9)
    events = _parse_trace(trace, 0, fs, consume=True)
    assert not fs._by_list
    assert len({id(ev.frames) for ev in events if ev.frames}) == len(stacks)


def test_lists_agreeing_on_the_frames_looked_at_are_told_apart_up_to_the_limits_and_past_them():
    """Lists that agree on their length and middle frame are told apart by identity up to _SAME_ENDS
    of them, then by five frames' identities (first, quarter, middle, three-quarter, last) up to
    _SAME_ENDS more; past both, a list is found by its text: the same answer, at the text's cost."""
    from memq import snapshot as snapshot_mod
    from memq.snapshot import _SAME_ENDS, _Frames

    many = 2 * _SAME_ENDS + 2
    ends = [{"filename": "e.py", "line": n, "name": "f"} for n in range(5)]
    between = [{"filename": "m.py", "line": n, "name": "g"} for n in range(many)]
    holder = []  # frames other lists hold too, as torch pickles them

    def stack(k: int) -> list:  # 9 frames: positions 0, 2, 4, 6, 8 are the five looked at
        fl = [ends[0], between[k], ends[1], between[k], ends[2], between[k], ends[3], between[k], ends[4]]
        holder.append(fl)
        return list(fl)

    fs = _Frames(10**6)
    kept = [fs.intern(stack(k)) for k in range(many)]
    assert len({id(c) for c in kept}) == many  # all different stacks
    calls = []
    real = snapshot_mod._Frames._by_text
    snapshot_mod._Frames._by_text = lambda self, f: calls.append(1) or real(self, f)
    try:
        again = [fs.intern(stack(k)) for k in range(many)]
    finally:
        snapshot_mod._Frames._by_text = real
    assert [id(c) for c in again] == [id(c) for c in kept]
    assert len(calls) == 2  # the two past both limits, by their text; the others by identity


def test_entry_sizes_past_the_cap_are_refused_at_the_entry_that_passes_it():
    """The sizes' sum is checked as it grows: past MAX_FIGURE_BYTES it could only grow, and each
    addition to a sum of a hundred thousand digits costs as much as its digits. The entry after
    the one that passes the cap (here not even a dict) is never read."""
    from memq.snapshot import MAX_FIGURE_BYTES

    huge = {"action": "alloc", "addr": 1, "size": MAX_FIGURE_BYTES ** 50, "stream": 0, "time_us": 1, "frames": []}
    raw = {"segments": [], "device_traces": [[huge, "not an entry"] + [dict(huge, addr=2)] * 10]}
    with pytest.raises(SnapshotError, match="a snapshot may claim"):
        parse_snapshot(raw)
