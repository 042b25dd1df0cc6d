"""The cross-rank diagnosis (profiler/analysis/ranks.py) on figures taken from real H200 recordings.

Real two-rank DDP captures (tests/fixtures/ddp_ranks, benchmarks/gpu/ddp_ranks.py: torchrun, two ranks
on one H200 with gloo, each capped at 0.10 of the card) are read here straight from the agents' spools,
analysed as the worker does: `data` (rank 1 gets 32 x 1024 tokens and runs out of memory in its first
step; rank 0 is torn down before its first snapshot, so only its exit figures exist), `leak` and
`balanced`. tests/workers/test_ddp_ranks_real.py pushes the same spools through the dispatcher and worker.

The older two-rank runs here are put together from real single-rank recordings of the same model
(0.45 GiB of parameters in each), each analysed as the worker does, and say which file stands for which
rank; they cover what the captures do not (a state imbalance, both ranks out of memory, a rank that sent
nothing):
- data imbalance: rank 1 = tests/fixtures/real/capacity/oom (the first step of a large input runs out
  of memory under a 16 GiB cap, before any optimizer state exists), rank 0 = seed_adamw/epoch1 (the
  same parameters, AdamW state, small inputs; it never failed);
- state imbalance: rank 1 = frag_dynamic_1.15/oom (0.45 GiB of optimizer state), rank 0 = seed_adamw/epoch1
  (0.91 GiB: AdamW's two moments) - the ranks hold different optimizer state;
- balanced: the same OOM snapshot on both ranks, rank 0 one second earlier;
- no OOM: the real two-rank DDP run tests/fixtures/agent_gpu/spool_ddp (each rank's last snapshot).
"""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from memq import codec
from memq.agent import spool
from memq.analysis import analyze
from memq.analysis.limits import observer_facts
from memq.analysis.ranks import (
    DATA_FACTOR,
    PEAK_FACTOR,
    RankFacts,
    activation_bytes,
    diagnose_ranks,
    need_bytes,
    rank_facts_from,
)
from memq.load import load_snapshot_file
from memq.model import OomContext
from memq.pipeline.analyse import oom_context
from memq.snapshot import parse_snapshot

FIX = Path(__file__).resolve().parents[1] / "fixtures"
REAL = FIX / "real"
GIB = 1 << 30
CAP = 17179869184  # the capacity recording's per-process cap (meta.json cap_bytes)


def _facts(path: Path, rank: int, *, oom_at: float | None = None, limit: int | None = None,
           requested: int | None = None) -> RankFacts:
    snap = load_snapshot_file(path).snapshot
    res = analyze([snap], OomContext(requested_bytes=requested, limit_bytes=limit) if requested else None)
    oom = res.get("oom")
    return RankFacts(rank=rank, cause=res["diagnosis"]["primary_cause"],
                     peak_allocated_bytes=res["metrics"]["allocated_bytes"],
                     peak_reserved_bytes=res["metrics"]["reserved_bytes"], limit_bytes=limit,
                     composition=res["composition"], oom_at=oom_at if oom else None,
                     oom_step=0 if oom else None,
                     oom_allocated_bytes=res["metrics"]["allocated_bytes"] if oom else None,
                     oom_requested_bytes=oom["requested_bytes"] if oom else None,
                     status="oom" if oom else "crashed")


@pytest.fixture(scope="module")
def healthy0():
    return _facts(REAL / "seed_adamw" / "epoch1.pickle.gz", 0)


@pytest.fixture(scope="module")
def capacity1():
    return _facts(REAL / "capacity" / "oom.pickle.gz", 1, oom_at=1000.0, limit=CAP, requested=150994944)


def test_data_imbalance_names_the_rank_and_advises_rebalancing(healthy0, capacity1):
    out = diagnose_ranks([healthy0, capacity1])
    assert out["failed_rank"] == 1 and out["failed_ranks"] == [1]
    assert out["cause"] == "capacity"
    assert out["imbalance"] == "data"
    # the same parameters on both ranks; rank 1's step needs > 1.5x rank 0's beyond the state
    rows = {r["rank"]: r for r in out["ranks"]}
    assert rows[0]["parameters_bytes"] == rows[1]["parameters_bytes"]
    assert rows[1]["activations_bytes"] > 10 * rows[0]["activations_bytes"]
    assert rows[1]["need_bytes"] == capacity1.oom_allocated_bytes + 150994944 > CAP
    text = " ".join(out["evidence"])
    assert "rank 1 ran out of memory first" in text and "data imbalance" in text
    assert "rank 0 ended without an OOM of its own" in text
    advice = out["recommendations"][0]["action"]
    assert "Rebalance" in advice and "rank 1" in advice and "bucket" in advice
    assert "smaller batch for all ranks would only waste" in out["recommendations"][0]["expected_effect"]


def test_state_imbalance_when_optimizer_state_differs(healthy0):
    r1 = _facts(REAL / "frag_dynamic_1.15" / "oom.pickle.gz", 1, oom_at=5.0, requested=4423680000)
    out = diagnose_ranks([healthy0, r1])
    assert out["failed_rank"] == 1 and out["imbalance"] == "state"
    assert "optimizer state" in " ".join(out["evidence"])
    assert "sharding" in out["recommendations"][0]["action"]


def test_balanced_failure_is_the_jobs_not_one_ranks(capacity1):
    r0 = RankFacts(**{**capacity1.__dict__, "rank": 0, "oom_at": 999.0})
    out = diagnose_ranks([capacity1, r0])
    assert out["failed_rank"] == 0 and out["failed_ranks"] == [0, 1]  # the earlier OOM comes first
    assert out["imbalance"] == "none"
    assert "balanced" in " ".join(out["evidence"])


def test_one_ranks_leak():
    """rank 1 = tests/fixtures/captured/leak_epochs (epoch ends 0-4 and the OOM, analysed together: the
    kept logits grow by 1 GB an epoch); rank 0 = the same job's epoch0 snapshot alone (same model and
    AdamW state, before anything piled up)."""
    d = FIX / "captured" / "leak_epochs"
    cap = 7516192768
    snaps = [load_snapshot_file(d / f"{n}.pickle.gz").snapshot for n in
             ("epoch0", "epoch1", "epoch2", "epoch3", "epoch4", "oom")]
    res1 = analyze(snaps, OomContext(limit_bytes=cap))
    assert res1["diagnosis"]["primary_cause"] == "leak"
    r1 = RankFacts(rank=1, cause="leak", leak=True, oom_at=50.0, oom_step=44, limit_bytes=cap,
                   composition=res1["composition"], oom_allocated_bytes=res1["metrics"]["allocated_bytes"],
                   oom_requested_bytes=res1["oom"]["requested_bytes"])
    r0 = _facts(d / "epoch0.pickle.gz", 0)
    assert r0.cause == "healthy"
    out = diagnose_ranks([r0, r1])
    assert out["failed_rank"] == 1 and out["cause"] == "leak" and out["imbalance"] == "leak"
    assert "rank 1 only" in out["recommendations"][0]["action"]
    rows = {r["rank"]: r for r in out["ranks"]}
    assert rows[0]["parameters_bytes"] == rows[1]["parameters_bytes"]
    assert rows[0]["optimizer_state_bytes"] == rows[1]["optimizer_state_bytes"]


def test_unknown_when_other_ranks_sent_nothing(capacity1):
    out = diagnose_ranks([capacity1, RankFacts(rank=0)])
    assert out["failed_rank"] == 1 and out["imbalance"] == "unknown"
    assert out["recommendations"] == []


def _last_snapshot_blob(rank_dir: Path) -> bytes:
    """The rank's last snapshot in its spool, read in place (the fixture is never modified)."""
    msgs = [spool.decode(p.read_bytes()) for p in sorted(rank_dir.glob("*.mqs"))]
    return [m.blob for m in msgs if m.fields.get("kind") == "snapshot"][-1]


def test_real_ddp_run_without_oom_is_balanced():
    """tests/fixtures/agent_gpu/spool_ddp: the real two-rank run (world_size 2, H200, no OOM)."""
    facts = []
    for d in sorted(glob.glob(str(FIX / "agent_gpu" / "spool_ddp" / "gpu-ddp" / "rank*"))):
        rank = int(Path(d).name[4])
        blob = _last_snapshot_blob(Path(d))
        snap = parse_snapshot(codec.decode(codec.decompress(blob)))
        res = analyze([snap])
        facts.append(RankFacts(rank=rank, cause=res["diagnosis"]["primary_cause"], composition=res["composition"],
                               peak_allocated_bytes=res["metrics"]["allocated_bytes"]))
    assert [f.rank for f in facts] == [0, 1]
    out = diagnose_ranks(facts)
    assert out["failed_rank"] is None and out["imbalance"] == "none"
    a, b = (need_bytes(f) for f in facts)
    assert max(a, b) < 1.3 * min(a, b)
    assert activation_bytes(facts[0]) is not None


def test_one_rank_is_nothing_to_compare(capacity1):
    out = diagnose_ranks([capacity1])
    assert out["failed_rank"] is None and out["world"] == 1


def test_each_ddp_rank_is_read_on_its_own_device():
    """spool_ddp's warm-up snapshots: each rank recorded on its own device, and the other device's trace
    holds 2 events of the process-group setup. Rank 1's peak comes from device 1's trace, so the two
    ranks of this balanced run peak alike (before, rank 1 was read on device 0: 1.99 GB against 7.57 GB)."""
    peaks = []
    for rank in (0, 1):
        d = next((FIX / "agent_gpu" / "spool_ddp" / "gpu-ddp").glob(f"rank{rank}-*"))
        msgs = [spool.decode(p.read_bytes()) for p in sorted(d.glob("*.mqs"))]
        warm = [m.blob for m in msgs if m.fields.get("kind") == "snapshot"][0]
        snap = parse_snapshot(codec.decode(codec.decompress(warm)))
        assert snap.trace_device == rank and len(snap.trace) > 10_000
        peaks.append(analyze([snap])["details"]["timeline"]["peak_live_bytes"])
    assert peaks[0] == peaks[1] > 7_000_000_000


# -- the real DDP captures (tests/fixtures/ddp_ranks) -------------------------------------------------

DDP = FIX / "ddp_ranks"


def _messages(sc: str, rank: int) -> list:
    d = next((DDP / sc / "spool" / f"ddp-{sc}").glob(f"rank{rank}-*"))
    return [spool.decode(p.read_bytes()) for p in sorted(d.glob("*.mqs"))]


def _end(msgs) -> dict:
    return json.loads(next(m for m in msgs if m.fields["kind"] == "run_end").fields["payload"])


def _real_rank(sc: str, rank: int) -> tuple[RankFacts, dict | None]:
    """A rank of a real capture as the store builds it: its run_end figures, and its snapshots analysed
    together (the OOM one with the context the service builds from the agent's observer), and that
    analysis (None for a rank that sent no snapshot)."""
    msgs = _messages(sc, rank)
    end = _end(msgs)
    snaps = [m for m in msgs if m.fields["kind"] == "snapshot"]
    if not snaps:
        return rank_facts_from(rank, end), None
    parsed = [parse_snapshot(codec.decode(codec.decompress(m.blob))) for m in snaps]
    oom = next((json.loads(m.fields["payload"])["oom"] for m in snaps if m.fields.get("trigger") == "oom"), None)
    ctx = oom_context(observer_facts(oom)) if oom else None  # as the dispatcher and the service build it
    res = analyze(parsed, ctx)
    oom_step = next((int(m.fields["step"]) for m in snaps if m.fields.get("trigger") == "oom"), None)
    return rank_facts_from(rank, end, res, oom_step=oom_step, oom_at=float(snaps[-1].fields["ts"]) / 1000), res


def test_real_data_oom_is_capacity_not_the_optimizers_first_step():
    """The data capture's rank 1: an OOM in step 0 (no step completed) whose 5,898,240,000-byte request is
    the size of a live block - the bf16 logits' fp32 copy, 32 x 1024 x 45,000 x 4 - in cross_entropy (the
    OOM event's frames). Before, the no-frames rule (first step + a live block of the request's size) read
    it as the optimizer state's creation (0.81); a state tensor is at most its parameter's size, and the
    request is 12x all the parameters."""
    _, res = _real_rank("data", 1)
    d = res["diagnosis"]
    assert res["oom"]["requested_bytes"] == 32 * 1024 * 45_000 * 4 > 12 * res["composition"]["parameters"]
    assert d["primary_cause"] == "capacity", [(c["cause"], c["confidence"]) for c in d["causes"]]
    assert "optimizer_state" not in {c["cause"] for c in d["causes"] if c["confidence"] >= 0.5}
    assert not any("Consider a leaner optimizer" in r["action"] for r in d["recommendations"])
    assert any("whatever the allocator does" in e for e in d["causes"][0]["evidence"])


def test_real_data_imbalance_against_a_rank_with_exit_figures_only():
    """Rank 0 was torn down (process group aborted) in its first step, before any snapshot: its exit
    figures (peak 6.12 GiB) are all there is. Rank 1's activations alone (need - its own state) exceed
    that whole peak 2.6x, so the imbalance is the data, settled without rank 0's composition."""
    r1, _ = _real_rank("data", 1)
    r0, _ = _real_rank("data", 0)
    assert r0.composition == {} and r0.end_reason == "process_group_aborted" and r0.status == "crashed"
    out = diagnose_ranks([r0, r1])
    assert out["failed_rank"] == 1 and out["cause"] == "capacity" and out["imbalance"] == "data"
    ratio = activation_bytes(r1) / need_bytes(r0)
    assert 2.5 < ratio < 2.7  # 15.72 GiB / 6.12 GiB, against DATA_FACTOR 1.5
    ev = " ".join(out["evidence"])
    assert "their peak stands in for their activations" in ev and "not settled" not in ev
    assert out["recommendations"][0]["action"].startswith("Rebalance the data across ranks: rank 1")


def test_real_captures_thresholds_have_wide_margins():
    """The figures the thresholds meet on the real captures (printed with -s): the balanced ranks' step
    peaks are equal to the byte (1.00x against PEAK_FACTOR 1.3); the data rank's activations are 2.6x the
    other rank's whole peak (DATA_FACTOR 1.5); the leaking rank would read 2.08x - a data imbalance -
    were its leak not recognised first, which is why the leak check precedes the activation comparison."""
    bal = [_real_rank("balanced", r)[0] for r in (0, 1)]
    leak1, _ = _real_rank("leak", 1)
    leak0, _ = _real_rank("leak", 0)
    for f in (*bal, leak0, leak1):
        print(f"rank {f.rank}: cause {f.cause} need {need_bytes(f)} activations {activation_bytes(f)} "
              f"parameters {f.composition.get('parameters')} optimizer {f.composition.get('optimizer_state')}")
    assert need_bytes(bal[0]) == need_bytes(bal[1]) < PEAK_FACTOR * need_bytes(bal[0])
    out = diagnose_ranks(bal)
    assert out["failed_rank"] is None and out["imbalance"] == "none"
    # the leak: identical state on both ranks, rank 1's own diagnosis a leak
    assert leak0.composition["parameters"] == leak1.composition["parameters"]
    assert leak0.composition["optimizer_state"] == leak1.composition["optimizer_state"] > 0
    assert leak1.cause == "leak" and leak1.leak and leak0.cause == "healthy" and not leak0.leak
    assert diagnose_ranks([leak0, leak1])["imbalance"] == "leak"
    assert DATA_FACTOR < activation_bytes(leak1) / activation_bytes(leak0) < 2.2
    unrecognised = RankFacts(**{**leak1.__dict__, "leak": False, "cause": "fragmentation"})
    assert diagnose_ranks([leak0, unrecognised])["imbalance"] == "data"  # what the leak check guards against


def test_one_rank_far_above_the_others_without_a_composition_is_uneven_not_data():
    """Neither rank sent a snapshot (only exit figures): rank 1 ran out of memory needing 2x rank 0's peak.
    That is an imbalance, but nothing recorded says whether inputs or state differ, so it is `uneven`
    (not `data`, whose advice - rebalance the shards - would be a guess), and the advice says what to compare."""
    r0 = RankFacts(rank=0, status="crashed", end_reason="sigterm", peak_allocated_bytes=6 << 30, limit_bytes=14 << 30)
    r1 = RankFacts(rank=1, status="oom", peak_allocated_bytes=12 << 30, limit_bytes=14 << 30,
                   oom_step=3, oom_allocated_bytes=12 << 30, oom_requested_bytes=3 << 30)
    out = diagnose_ranks([r0, r1])
    assert out["failed_rank"] == 1 and out["imbalance"] == "uneven"
    assert any("not settled" in e for e in out["evidence"])
    (rec,) = out["recommendations"]
    assert rec["action"].startswith("Compare rank 1 with the others") and rec["playbook"] == "rank-imbalance"
    assert "Rebalance the data" not in rec["action"]


def test_observer_facts_take_the_cap_only_when_it_is_one():
    """The rule the dispatcher stores an agent's OOM context by (and the playbook and these tests reuse):
    the observer's device_alloc is the per-process cap only when below the device total."""
    msgs = _messages("data", 1)
    oom = next(json.loads(m.fields["payload"])["oom"] for m in msgs if m.fields.get("trigger") == "oom")
    facts = observer_facts(oom)
    assert facts["limit_bytes"] == oom["device_alloc"] == 15_010_988_032 < facts["device_total_bytes"]
    assert facts["requested_bytes"] == oom["alloc"] and "13.98 GiB allowed" in facts["message"]
    uncapped = observer_facts({**oom, "device_alloc": oom["device_total"]})
    assert "limit_bytes" not in uncapped  # the analysis derives it from the device
    assert observer_facts(oom, run_limit=12 << 30)["limit_bytes"] == 12 << 30  # the run's announced cap wins
    assert len(observer_facts(oom, max_message=10)["message"]) == 10
