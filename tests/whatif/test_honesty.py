"""What-if honesty: a snapshot that cannot answer says so (`predicted_oom` null, with the reason), a
success that covers the recorded window only is never a high-confidence "fits", and settings whose
real outcome is known (tests/fixtures/captured/dynamic_settings: one job, one cap, one process per
setting on an H200) are predicted right or not at all.

Agent-default OOM snapshots: tests/fixtures/agent_gpu/spool_oom (the agent's spool, byte for byte:
gzip pickles inside MQS1 files), and variants derived HERE from full-history fixtures by dropping the
trace (what the agent sends when recording was off at the OOM) or cutting it before the OOM entry."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from memq import codec
from memq.agent.spool import decode as decode_spool
from memq.analysis.whatif import run_whatif, sweep_confs
from memq.load import load_snapshot_file
from memq.snapshot import parse_snapshot
from tests.helpers import FIXTURES, REAL

SPOOL = FIXTURES / "agent_gpu" / "spool_oom" / "gpu-oom" / "rank0-vm-560"
D = FIXTURES / "captured" / "dynamic_settings"
CAP = 18484297728


def spool_snapshots() -> list[tuple[dict, object]]:
    """(envelope fields, parsed snapshot) of every snapshot message in the spool, in send order."""
    out = []
    for f in sorted(SPOOL.glob("*.mqs")):
        msg = decode_spool(f.read_bytes())
        if msg.fields.get("kind") == "snapshot":
            out.append((msg.fields, parse_snapshot(codec.decode(msg.blob))))
    return out


def metas() -> dict:
    return {d.name: json.loads((d / "meta.json").read_text()) for d in sorted(D.iterdir())
            if d.is_dir() and not d.name.startswith("_") and d.name != "probe"}


def twin_confs() -> list[str]:
    return [""] + [m["alloc_conf"] or "expandable_segments:False" for n, m in metas().items()]


def real_outcome(conf: str, recorded: str) -> str:
    m = metas()
    conf = conf or m[recorded]["alloc_conf"]
    return next(v["outcome"] for v in m.values() if (v["alloc_conf"] or "expandable_segments:False") == conf
                or v["alloc_conf"] == conf)


def without_trace(snap):
    """The snapshot as the agent sends it when history recording was off at the OOM."""
    return replace(snap, traces=[[] for _ in snap.traces], memo={})


def assert_not_assessable(results, words: str):
    for r in results:
        assert r.predicted_oom is None and r.verdict == "not_assessable" and r.confidence == "none", r.conf
        assert words in r.reason, r.reason
        assert any(n.startswith("not assessable: ") for n in r.notes)


# ------------------------------------------------------------------------------- no trace at the OOM

def test_agent_default_oom_snapshot_is_not_assessable_never_fits():
    snaps = spool_snapshots()
    fields, oom = snaps[-1]
    assert fields["trigger"] == "oom" and not oom.trace  # recording was off when the job ran out of memory
    limit = 18013185638  # the observer's device_alloc at the OOM: the 0.12 cap
    res = run_whatif(oom, limit, sweep_confs(oom), recorded_oom=True)
    assert_not_assessable(res, "no trace")
    # the earlier snapshots (the warm-up window has a 12,802-entry trace from the first allocation) do
    # not change that: the requests that cut the cache the OOM met are in no trace
    res = run_whatif(oom, limit, sweep_confs(oom), earlier=[s for _f, s in snaps[:-1]], recorded_oom=True)
    assert_not_assessable(res, "no trace")
    assert res[0].inputs["snapshots"] == len(snaps)


@pytest.mark.parametrize("path", [REAL / "frag_dynamic_1.15" / "oom.pickle.gz", D / "gc_0.6" / "oom.pickle.gz"])
def test_full_history_oom_with_the_trace_dropped(path):
    snap = without_trace(load_snapshot_file(path).snapshot)
    res = run_whatif(snap, CAP, twin_confs(), recorded_oom=True)
    assert_not_assessable(res, "no trace")
    # even without being told about the OOM: no trace, nothing is predicted (the old answer was
    # "(recorded) fits, confidence high")
    assert_not_assessable(run_whatif(snap, CAP, [""]), "no trace")


def test_trace_that_stops_before_the_recorded_oom():
    snap = load_snapshot_file(D / "gc_0.6" / "oom.pickle.gz").snapshot
    dev = next(i for i, t in enumerate(snap.traces) if t)
    traces = [list(t) for t in snap.traces]
    traces[dev] = [e for e in traces[dev] if e.action != "oom"][:6000]  # the ring buffer read earlier
    cut = replace(snap, traces=traces, memo={})
    assert_not_assessable(run_whatif(cut, CAP, twin_confs(), recorded_oom=True), "ends before the recorded OOM")


def test_recorded_settings_that_do_not_reproduce_the_oom():
    snap = load_snapshot_file(D / "gc_0.6" / "oom.pickle.gz").snapshot
    res = run_whatif(snap, 2 * CAP, twin_confs())  # not the cap the run had
    assert_not_assessable(res, "do not reproduce the recorded OOM")
    assert res[0].fidelity is not None  # the model check is still reported


def test_no_limit_is_not_assessable_but_peaks_are_replayed():
    snap = load_snapshot_file(D / "max_split_128" / "epoch1.pickle.gz").snapshot
    res = run_whatif(snap, None, ["", "expandable_segments:True"])
    assert_not_assessable(res, "no limit")
    assert all(r.peak_reserved_bytes > 0 for r in res) and res[0].fidelity is not None


# ------------------------------------------------------------------------ twins with real outcomes

def _check_twins(res, recorded: str):
    answered = 0
    for r in res:
        real = real_outcome(r.conf, recorded)
        if r.predicted_oom is None:
            assert r.reason and r.verdict == "not_assessable"
            continue
        answered += 1
        assert r.predicted_oom == (real == "oom"), (recorded, r.conf, r.verdict, r.confidence, real)
        if r.verdict == "survives_window":
            assert r.confidence in ("low", "medium") and "window" in r.reason
    return answered


@pytest.mark.parametrize("name", ["gc_0.6", "roundup_4"])
def test_each_twin_is_predicted_right_or_not_at_all_from_an_oom_window(name):
    """The OOM snapshot alone (an 8000-entry window ending at the OOM), then with the same run's
    earlier epoch-end windows: every answer matches the real outcome of that setting at the same cap."""
    files = sorted((D / name).glob("epoch*.pickle.gz")) + [D / name / "oom.pickle.gz"]
    snaps = [load_snapshot_file(f).snapshot for f in files]
    alone = run_whatif(snaps[-1], CAP, twin_confs())
    _check_twins(alone, name)
    seeded = run_whatif(snaps[-1], CAP, twin_confs(), earlier=snaps[:-1])
    answered = _check_twins(seeded, name)
    assert seeded[0].predicted_oom is True and seeded[0].confidence == "high"  # the recorded OOM, reproduced
    if name == "gc_0.6":
        # epoch0 and epoch1 seed the other settings' cache: the recorded settings replayed the same way
        # give the recorded OOM, so the settings that completed on the GPU are answered (window only)
        assert seeded[1].inputs["seeds"] == [0, 1] and seeded[1].start_state == "seeded"
        assert answered >= 6
        ok = [r for r in seeded if r.verdict == "survives_window"]
        assert {r.conf for r in ok} >= {"expandable_segments:True", "max_split_size_mb:128", "max_split_size_mb:512"}
        assert all(r.confidence == "low" for r in ok)  # mid-run start, run after the OOM unknown


def test_roundup_request_is_known_only_after_rounding():
    """Under roundup_power2_divisions:4 the OOM entry holds 5 GiB, the request rounded; the request was
    4.4 GB. Settings that serve the smaller and fail the larger are not assessable, not OOM."""
    snap = load_snapshot_file(D / "roundup_4" / "oom.pickle.gz").snapshot
    res = {r.conf: r for r in run_whatif(snap, CAP, twin_confs())}
    r = res["expandable_segments:True"]
    assert r.predicted_oom is None and "after rounding" in r.reason


def test_whole_run_trace_fits_are_high_confidence_and_oom_window_successes_are_not():
    """From a trace that starts at an empty allocator and ends with the job (default/end), a setting
    that completes is a plain fit; from an OOM window, a setting that gets through is window-only."""
    end = load_snapshot_file(D / "default" / "end.pickle.gz").snapshot
    r = run_whatif(end, CAP, ["expandable_segments:True"])[0]
    assert (r.predicted_oom, r.verdict, r.confidence, r.coverage) == (False, "fits", "high", "from_start")
    oom = load_snapshot_file(D / "gc_0.6" / "oom.pickle.gz").snapshot
    for r in run_whatif(oom, CAP, sweep_confs(oom)):
        assert not (r.predicted_oom is False and r.confidence == "high")
        assert r.verdict != "fits" or r.conf == ""


# ------------------------------------------------------------------------------ several snapshots

def test_overlapping_traces_are_joined():
    """leak_epochs: the epoch-4 window and the OOM window overlap (the ring buffer kept recording):
    joined, the replay covers both, and the recorded OOM is reproduced exactly over the longer trace."""
    L = FIXTURES / "captured" / "leak_epochs"
    names = ["before_training", "epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom"]
    snaps = [load_snapshot_file(L / f"{n}.pickle.gz").snapshot for n in names]
    limit = json.loads((L / "meta.json").read_text())["cap_bytes"]
    rec = run_whatif(snaps[-1], limit, [""], earlier=snaps[:-1])[0]
    assert rec.inputs["joined"] == [5] and rec.inputs["trace_entries"] > 8000
    assert rec.predicted_oom is True and rec.fails_recorded_request
    assert rec.fidelity["alloc_address_share"] == 1.0 and rec.fidelity["reserved_within_5pct"]
    assert any("joined" in n for n in rec.notes)


def test_cli_takes_several_files(tmp_path):
    from click.testing import CliRunner

    from memq.cli import cli

    files = [str(D / "gc_0.6" / f) for f in ("epoch0.pickle.gz", "epoch1.pickle.gz", "oom.pickle.gz")]
    r = CliRunner().invoke(cli, ["whatif", *files, "--limit", str(CAP), "--conf", "expandable_segments:True",
                                 "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out[1]["start_state"] == "seeded" and out[1]["inputs"]["seeds"] == files[:2]
    assert out[1]["verdict"] == "survives_window" and "window" in out[1]["reason"]
    text = CliRunner().invoke(cli, ["whatif", files[-1], "--limit", str(CAP), "--sweep"]).output
    assert "not assessable" in text or "n/a" in text
    assert Path(files[-1]).name in text
