"""Composition and phase by provenance on snapshots other projects published, and one class per block
on every screen (ARCHITECTURE.md "Composition and phase")."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from memq.agent import spool
from memq.analysis import analyze
from memq.analysis import frames as fr
from memq.analysis import provenance as pv
from memq.analysis.provenance import block_classes
from memq.codec import decode, decompress
from memq.load import load_snapshot_file
from memq.model import ACTIVE_ALLOCATED, INACTIVE, AllocatorSettings, Block, Segment, Snapshot, TraceEvent
from memq.snapshot import parse_snapshot
from memq.web.snapshot_view import snapshot_view

HERE = Path(__file__).resolve().parent.parent / "fixtures"
PUB = HERE / "public_snapshots"
TRUTH = json.loads((PUB / "truth.json").read_text())["snapshots"]
GiB = 2**30
rule = pytest.mark.rule


def _snap(path):
    s = load_snapshot_file(path)
    return getattr(s, "snapshot", s)


def _right_share(comp: dict, truth: dict, live: int) -> float:
    want = {k: truth.get(k, 0) for k in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE)}
    rest_pred = live - sum(comp.get(k, 0) for k in want)
    right = sum(min(comp.get(k, 0), v) for k, v in want.items()) + min(rest_pred, live - sum(want.values()))
    return right / live


@pytest.mark.parametrize("name", ["cs336_2.7b_ctx128_fullstep", "cs336_2.7b_ctx512_forward"])
def test_public_snapshot_composition_by_provenance(name):
    """A 3.4B-parameter model's AdamW full step (stacks="all", recorded after the model was made) and a
    forward-only snapshot: parameters predate the trace, gradients come from the autograd engine."""
    t = TRUTH[name]
    snap = _snap(Path(__file__).resolve().parent.parent.parent / t["path"])
    out = analyze([snap])
    comp = out["composition"]
    live = out["metrics"]["active_bytes"]
    # what no evidence names (a few RoPE-sized buffers outside the optimizer: 1.3 MB of 51 GiB) stays unknown
    assert comp["other"] == 0 and comp["unknown"] <= 0.001 * live
    assert _right_share(comp, t, live) >= 0.95
    if "gradients" in t:
        assert comp["gradients"] == pytest.approx(t["gradients"], rel=0.02)
    else:
        assert comp["gradients"] == 0
        assert out["details"]["timeline"]["peak_phase"] == "forward"


def test_variable_type_dispatch_is_forward_not_backward():
    """`torch::autograd::VariableType::*` frames are forward dispatch; the engine's are backward."""
    fwd = [{"name": "torch::autograd::VariableType::(anonymous namespace)::bmm(c10::DispatchKeySet)",
            "filename": "VariableType_3.cpp", "line": 1}]
    bwd = fwd + [{"name": "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)",
                  "filename": "??", "line": 0},
                 {"name": "torch::autograd::Engine::evaluate_function(...)", "filename": "??", "line": 0}]
    assert not fr.is_backward(fwd)
    assert fr.phase_of(fwd) is None
    assert fr.is_backward(bwd)


def test_segment_map_and_composition_agree_block_by_block():
    """The 4.12 GiB frameless block of the frag_dynamic OOM was `other` on the segment map and `unknown`
    in the composition: one function now decides, and both screens read it."""
    snap = _snap(HERE / "real/frag_dynamic_1.15/oom.pickle.gz")
    out = analyze([snap])
    view = snapshot_view(snap, out, title="t")
    classes = block_classes(snap)
    by = Counter()
    big = []
    for seg in view["segments"]:
        for b in seg["blocks"]:
            if b["c"] is None:
                continue
            by[b["c"]] += b["s"]
            assert b["c"] == classes[seg["address"] + b["o"]].cls
            if b["s"] > 4 * GiB:
                big.append(b["c"])
    assert big and set(big) == {fr.ACTIVATIONS}
    assert {k: v for k, v in by.items() if v} == {k: v for k, v in out["composition"].items() if v}


# -- blocks older than the trace are parameters only with evidence ----------------------------------------

MiB = 2**20


def _spool_snapshots(rank_dir: Path) -> list:
    msgs = [spool.decode(p.read_bytes()) for p in sorted(rank_dir.glob("*.mqs"))]
    return [parse_snapshot(decode(decompress(m.blob))) for m in msgs if m.fields.get("kind") == "snapshot"]


def _classes_bytes(snap) -> Counter:
    out = Counter()
    for bc_addr, bc in block_classes(snap).items():
        out[(bc.cls, bc.source)] += next(b.size for seg in snap.segments for b in seg.blocks if b.address == bc_addr)
    return out


def test_a_leak_older_than_a_short_trace_is_not_parameters():
    """The agent's OOM snapshot of the leaking DDP rank (tests/fixtures/ddp_ranks/leak, rank 1): recording
    came back on a few steps before the OOM, so the kept logits of earlier steps predate its trace, with no
    frames. They are not parameters: the parameters (0.45 GiB, known from their frames) and AdamW's state
    (twice them) leave no parameter unaccounted for."""
    d = next((HERE / "ddp_ranks" / "leak" / "spool" / "ddp-leak").glob("rank1-*"))
    snap = _spool_snapshots(d)[-1]
    assert snap.agent.trigger == "oom" and 0 < len(snap.trace) < 10_000
    comp = analyze([snap])["composition"]
    params = 481_781_760  # the rank's parameters, named by their frames (the fp32 GPT of the DDP captures)
    assert comp["parameters"] == pytest.approx(params, rel=0.01)
    assert comp["optimizer_state"] == pytest.approx(2 * params, rel=0.02)
    # the kept logits: older than the trace, frameless, unknown rather than a wrong class
    assert comp["unknown"] > 3 * 2**30


def test_no_trace_means_no_parameters_without_evidence():
    """The same published forward-only snapshot with its trace taken away: its 12.8 GiB of frameless
    weights are unknown (nothing says they are parameters), never guessed."""
    snap = _snap(PUB / "cs336_2.7b_memory_ctx512_forward.pickle.gz")
    snap.traces[snap.trace_device] = []
    comp = analyze([snap])["composition"]
    assert comp["parameters"] == 0 and comp["unknown"] > 12 * 2**30


def test_the_real_runs_keep_their_parameters_and_name_the_cublas_workspace():
    """A real AdamW run recorded from the start with an 8000-entry ring (tests/fixtures/real/seed_adamw):
    the parameters are exactly the blocks their frames name (as before), and the one 32 MiB frameless block
    older than the trace, the autograd thread's cuBLAS workspace, is a workspace by its size."""
    snap = _snap(HERE / "real/seed_adamw/epoch1.pickle.gz")
    comp = analyze([snap])["composition"]
    assert comp["parameters"] == 481_781_760
    assert comp["workspace"] == 32 * MiB and comp["unknown"] == 0


def _synthetic(live: list[tuple[int, int, list]], trace: list) -> Snapshot:
    """One segment holding `live` blocks [(address, size, frames)] and a free block after them."""
    blocks = [Block(a, n, n, ACTIVE_ALLOCATED, f) for a, n, f in live]
    end = max(a + n for a, n, _ in live)
    blocks.append(Block(end, 2 * MiB, 0, INACTIVE, []))
    base = min(a for a, _, _ in live)
    seg = Segment(0, base, end + 2 * MiB - base, 0, "large", (0, 0), False, blocks, [])
    return Snapshot([seg], [trace], AllocatorSettings(), "2.3+")


FWD = [{"filename": "/x/torch/nn/modules/linear.py", "name": "forward", "line": 1}]


def _ev(action, addr, size, frames=FWD):
    return TraceEvent(action, addr, size, 0, 0, frames)


@rule("STEP_START_ORPHAN_FREES")
def test_a_trace_that_frees_what_it_did_not_allocate_does_not_cover_the_step_start():
    """STEP_START_ORPHAN_FREES: a trace may free up to 8 blocks older than itself (the previous step's
    outputs as their names are rebound) and still be read as covering the step from its start (then the
    frameless blocks older than it are the weights); one more, and they stay unknown."""
    base = 1 << 32
    weights = [(base + i * 64 * MiB, 64 * MiB, []) for i in range(4)]  # 256 MiB older than the trace
    act = base + 4 * 64 * MiB
    for orphans, want in ((8, fr.PARAMETERS), (9, fr.UNKNOWN)):
        trace = [_ev("free_requested", base - (k + 1) * 8 * MiB, 4 * MiB) for k in range(orphans)]
        trace.append(_ev("alloc", act, 2 * MiB))
        snap = _synthetic(weights + [(act, 2 * MiB, FWD)], trace)
        classes = block_classes(snap)
        assert {classes[a].cls for a, _, _ in weights} == {want}, orphans
        assert classes[act].cls == fr.ACTIVATIONS
    # a trace that begins in backward (a ring that wrapped there) does not cover the step's start either
    bwd = [{"filename": "/x/torch/autograd/graph.py", "name": "_engine_run_backward", "line": 1}]
    snap = _synthetic(weights + [(act, 2 * MiB, bwd)], [_ev("alloc", act, 2 * MiB, bwd)])
    assert {block_classes(snap)[a].cls for a, _, _ in weights} == {fr.UNKNOWN}


@rule("CUBLAS_WORKSPACE_BYTES", "CUBLAS_WORKSPACE_OLD_BYTES", "CUBLAS_WORKSPACE_MAX_BLOCKS")
def test_a_frameless_block_the_size_of_a_cublas_workspace_is_a_workspace():
    """Older than a trace that did not start at the step's start (it frees blocks it never made), with no
    frames: 32 MiB or 8.125 MiB blocks are cuBLAS workspaces, up to four of them; 512 bytes more, or a
    fifth of that size (tensors of that shape), and they stay unknown."""
    base = 1 << 32
    act = base + 1024 * MiB
    orphans = [_ev("free_requested", base - (k + 1) * 64 * MiB, 64 * MiB) for k in range(9)]
    trace = orphans + [_ev("alloc", act, 2 * MiB)]
    cases = ((32 * MiB, 1, fr.WORKSPACE_CAT), (8519680, 1, fr.WORKSPACE_CAT), (32 * MiB + 512, 1, fr.UNKNOWN),
             (32 * MiB, 4, fr.WORKSPACE_CAT), (32 * MiB, 5, fr.UNKNOWN))
    for size, count, want in cases:
        blocks = [(base + k * 40 * MiB, size, []) for k in range(count)]
        snap = _synthetic(blocks + [(act, 2 * MiB, FWD)], trace)
        classes = block_classes(snap)
        assert {classes[a].cls for a, _, _ in blocks} == {want}, (size, count)


def test_older_blocks_sized_as_the_optimizer_state_implies_are_parameters():
    """Adam's state (frames in torch/optim/adam.py) made in the trace: two blocks per parameter of its size.
    Of the frameless blocks older than the trace, those the state implies are parameters (known from the
    state, not from being old); one more of a parameter's size than the state implies is its gradient,
    kept from an earlier backward (one per parameter), and one of a size no state has stays unknown."""
    base = 1 << 32
    adam = [{"filename": "/x/torch/optim/adam.py", "name": "_init_group", "line": 1}]
    p1, p2, extra, odd = base, base + 64 * MiB, base + 128 * MiB, base + 192 * MiB
    s0 = base + 256 * MiB
    state = [(s0 + i * 64 * MiB, 64 * MiB, adam) for i in range(2)] + \
            [(s0 + 128 * MiB + i * 32 * MiB, 32 * MiB, adam) for i in range(2)]
    live = [(p1, 64 * MiB, []), (p2, 32 * MiB, []), (extra, 64 * MiB, []), (odd, 48 * MiB, [])] + state
    trace = [_ev("free_requested", base - 64 * MiB, 64 * MiB)] + [_ev("alloc", a, n, f) for a, n, f in state]
    classes = block_classes(_synthetic(live, trace))
    got = {a: (classes[a].cls, classes[a].source) for a in (p1, p2, extra, odd)}
    assert got[p1] == (fr.PARAMETERS, pv.FROM_STATE) and got[p2] == (fr.PARAMETERS, pv.FROM_STATE)
    assert got[extra] == (fr.GRADIENTS, pv.FROM_SIZE) and got[odd][0] == fr.UNKNOWN


def test_the_agents_roles_come_first_and_every_site_says_so():
    """The published forward-only snapshot without its trace has nothing to say its weights are
    parameters; with the roles an agent would send (the storages of the optimizer's parameters), they
    are, known from the job, and a role beats the frames a block carries."""
    from dataclasses import replace

    from memq.model import AGENT_ROLES, AgentInfo

    snap = _snap(PUB / "cs336_2.7b_memory_ctx512_forward.pickle.gz")
    snap.traces[snap.trace_device] = []
    weights = [b for seg in snap.segments for b in seg.blocks if b.is_live and not b.frames]
    framed = next(b for seg in snap.segments for b in seg.blocks if b.is_live and b.frames)
    code = AGENT_ROLES.index
    roles = sorted([(b.address, b.requested_size, code("parameter")) for b in weights]
                   + [(framed.address, framed.requested_size, code("optimizer_state"))])
    snap.agent = replace(snap.agent or AgentInfo(), roles=tuple(roles))
    out = analyze([snap])
    comp = out["composition"]
    assert comp["parameters"] == sum(b.size for b in weights) > 12 * GiB
    assert comp["optimizer_state"] == framed.size and comp["unknown"] == 0
    classes = block_classes(snap)
    assert {classes[b.address].source for b in weights} == {pv.FROM_JOB}
    by_origin = pv.origins(snap)
    assert by_origin["parameters"] == {pv.KNOWN: comp["parameters"]}
    assert set(by_origin["activations"]) == {pv.INFERRED}
    assert out["details"]["composition_origin"]["parameters"] == {pv.KNOWN: comp["parameters"]}
    assert out["details"]["composition_sites"]["parameters"][0]["origin"] == pv.KNOWN


@rule("STATE_SPLIT_SHARE")
def test_older_blocks_split_into_parameters_and_state_where_nine_tenths_come_in_threes():
    """A trace from a step's start (zero_grad's frees are the optimizer's) after warm-up steps: the
    parameters and AdamW's two moments are all older than it, frameless. Where 90% of those bytes come in
    multiples of three blocks of one size, each three are a parameter (the highest address: made first)
    and its state; at 89% nothing is split (all read as parameters, as in a forward-only trace)."""
    base = 1 << 40
    zero_grad = [{"filename": "/x/torch/optim/optimizer.py", "name": "zero_grad", "line": 1}]
    for odd_mib, want_state in ((10, True), (11, False)):
        # 90 MiB in three 30 MiB triples (param + 2 moments), and odd_mib MiB alone in two blocks of one size
        triples = [(base - (k + 1) * 64 * MiB, 10 * MiB, []) for k in range(9)]
        lone = [(base - 2048 * MiB - k * 64 * MiB, odd_mib * MiB // 2, []) for k in range(2)]
        act = base + 512 * MiB
        trace = [_ev("free_requested", base + 1024 * MiB, 10 * MiB, zero_grad), _ev("alloc", act, 2 * MiB)]
        snap = _synthetic(triples + lone + [(act, 2 * MiB, FWD)], trace)
        classes = block_classes(snap)
        got = [classes[a].cls for a, _, _ in sorted(triples, key=lambda t: -t[0])]
        if want_state:  # 90 / (90 + 10): the nine 10 MiB blocks are three parameters and six moments
            assert got == [fr.PARAMETERS] * 3 + [fr.OPTIMIZER_STATE] * 6, got
        else:  # 90 / (90 + 11) < 90%: no split
            assert set(got) == {fr.PARAMETERS}, got
