"""Frame text is bounded where it is read: names and file names longer than MAX_FRAME_TEXT are cut at
decode, with a marker, so no snapshot makes analysis time grow with the length of a name (a 1.7 MB
snapshot of 127 KB frame names took 18 s in the stack rules' regexes)."""

from __future__ import annotations

import pickle
import time
from pathlib import Path

from memq import codec
from memq.analysis import analyze
from memq.load import decode_snapshot_bytes
from memq.snapshot import FRAME_TEXT_CUT, MAX_FRAME_TEXT, cut_frame_text, parse_snapshot

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIXTURES / "real"
CPP = FIXTURES / "captured" / "cudnn_workspace" / "after_benchmark_step.pickle.gz"
MARK_MAX = len(FRAME_TEXT_CUT.format(10**9))


def _hostile(path: Path, name_len: int, file_len: int = 0) -> bytes:
    """A real snapshot whose every distinct frame's name (and file name) is padded to `name_len`
    (`file_len`) characters: one dict per distinct frame, as torch pickles them."""
    snap = codec.loads_restricted(codec.decompress(path.read_bytes()))
    lists = [b["frames"] for seg in snap["segments"] for b in seg["blocks"] if b.get("frames")]
    lists += [seg["frames"] for seg in snap["segments"] if seg.get("frames")]
    lists += [e["frames"] for tr in snap["device_traces"] for e in tr if e.get("frames")]
    one: dict[tuple, dict] = {}
    for fl in lists:
        fl[:] = [one.setdefault((f["filename"], f["line"], f["name"]), f) for f in fl]
    for f in one.values():
        f["name"] = (f["name"] + "<" * name_len)[:max(name_len, len(f["name"]))]
        if file_len:
            f["filename"] = ("/x" * file_len)[:file_len] + f["filename"]
    return pickle.dumps(snap, protocol=4)  # our own data, pickled here


def _all_frames(snap) -> list:
    out = [f for s in snap.segments for b in s.blocks for f in b.frames] + [f for s in snap.segments for f in s.frames]
    return out + [f for t in snap.traces for ev in t for f in ev.frames]


def _text_read(snap) -> int:
    """Characters of frame text the analysis can read: each distinct frame once."""
    seen = {id(f): f for f in _all_frames(snap)}
    return sum(len(str(f.get("name", ""))) + len(str(f.get("filename", ""))) for f in seen.values())


def _analysis_s(snap) -> float:
    """One analysis of `snap`, in seconds, with the memos a fresh process starts without."""
    from memq.analysis import frames as fr

    for fn in (fr.categorize, fr.is_optimizer, fr._site_of):
        fn.memo.clear()
    fr._frame_label.cache_clear()
    fr._user_label.cache_clear()
    t = time.perf_counter()
    analyze([snap])
    return time.perf_counter() - t


def test_the_cut_keeps_short_text_and_marks_what_it_cuts():
    assert cut_frame_text("a" * MAX_FRAME_TEXT) == "a" * MAX_FRAME_TEXT
    cut = cut_frame_text("a" * (MAX_FRAME_TEXT + 1))
    assert cut == "a" * MAX_FRAME_TEXT + FRAME_TEXT_CUT.format(1)
    assert cut.endswith("…[cut: 1 more chars]")


def test_long_names_and_files_are_cut_at_decode_everywhere_a_frame_is_kept():
    for path in (REAL / "seed_adamw" / "epoch0.pickle.gz", CPP):
        snap = decode_snapshot_bytes(_hostile(path, 40_000, 20_000)).snapshot
        frames = _all_frames(snap)
        assert frames and all(len(f["name"]) <= MAX_FRAME_TEXT + MARK_MAX for f in frames)
        assert all(len(f["filename"]) <= MAX_FRAME_TEXT + MARK_MAX for f in frames)
        assert all("…[cut: " in f["name"] and "…[cut: " in f["filename"] for f in frames)


def test_legacy_tuple_frames_are_cut_too():
    raw = {"segments": [], "device_traces": [[
        {"action": "alloc", "addr": 1, "size": 512, "stream": 0, "time_us": 1,
         "frames": [("f" * 9000, 3, "n" * 9000)]}]]}
    f = parse_snapshot(raw).traces[0][0].frames[0]
    assert len(f[0]) <= MAX_FRAME_TEXT + MARK_MAX and len(f[2]) <= MAX_FRAME_TEXT + MARK_MAX and f[1] == 3


def test_real_frames_are_kept_whole_when_they_fit():
    snap = decode_snapshot_bytes(codec.decompress((REAL / "seed_adamw" / "epoch0.pickle.gz").read_bytes())).snapshot
    assert not any("…[cut: " in str(f.get("name")) for f in _all_frames(snap))


def test_analysis_time_does_not_grow_with_the_length_of_names():
    """The same stacks with names padded to 600 characters and to 40,000: the text the analysis can
    read is the same (every name cut to the same length), and so is its time (a ratio, best of 3)."""
    for path in (REAL / "seed_adamw" / "epoch0.pickle.gz", CPP):
        short = decode_snapshot_bytes(_hostile(path, 600)).snapshot
        long_ = decode_snapshot_bytes(_hostile(path, 40_000)).snapshot
        read_short, read_long = _text_read(short), _text_read(long_)
        assert read_long <= read_short * 1.05, (read_short, read_long)
        # interleaved, best of 5 each: a burst of the other test worker's load lands on both sides alike
        long_s, short_s = float("inf"), float("inf")
        for _ in range(5):
            long_s, short_s = min(long_s, _analysis_s(long_)), min(short_s, _analysis_s(short))
        ratio = long_s / short_s
        assert ratio < 2.0, ratio
