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


def test_a_graph_torn_down_unrun_is_no_backward():
    """Dropping a forward's output frees its graph: the nodes' teardown is named like them
    (`BmmBackward0::release_variables`, the node's deleter), with no engine frame: not backward. The same
    release inside the engine, after a node ran, is."""
    teardown = [{"name": "torch::autograd::generated::BmmBackward0::release_variables()", "filename": "", "line": 0},
                {"name": "std::_Sp_counted_deleter<torch::autograd::generated::ViewBackward0*, void (*)"
                         "(torch::autograd::Node*)>::_M_dispose()", "filename": "", "line": 0},
                {"name": "torch::autograd::deleteNode(torch::autograd::Node*)", "filename": "", "line": 0}]
    engine = teardown + [{"name": "torch::autograd::Engine::evaluate_function(...)", "filename": "", "line": 0}]
    assert not fr.is_backward(teardown)
    assert fr.event_phase(teardown, True) == fr.PHASE_FORWARD
    assert fr.is_backward(engine)


def test_a_published_forward_whose_graph_was_torn_down_holds_no_gradients():
    """A published 2.7B forward under bf16 autocast with autograd on, its output dropped: the trace ends
    with 1,029 frees of the graph's teardown. No backward ran, so every weight is a parameter (read as
    half parameters, half gradients before)."""
    snap = _snap(PUB / "cs336_2.7b_forward_ctx512_bf16_after_warmup.pickle.gz")
    comp, _ = pv.composition(snap)
    truth = json.loads((PUB / "truth.json").read_text())["snapshots"]["cs336_2.7b_forward_ctx512_bf16_after_warmup"]
    assert comp[fr.GRADIENTS] == 0
    assert comp[fr.PARAMETERS] == pytest.approx(truth["parameters"], rel=0.01)


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


def _own_segments(live: list[tuple[int, int, list]], trace: list, streams: dict | None = None,
                  room: dict | None = None) -> Snapshot:
    """Each of `live` [(address, size, frames)] the first block of its own segment, a free block after it
    (`room[address]` bytes, 2 MiB if not given; none at 0: a segment exactly its size); the segment on stream
    `streams[address]` (0 if not given)."""
    streams, room = streams or {}, room or {}
    segs = []
    for a, n, f in live:
        free = room.get(a, 2 * MiB)
        blocks = [Block(a, n, n, ACTIVE_ALLOCATED, f)] + ([Block(a + n, free, 0, INACTIVE, [])] if free else [])
        segs.append(Segment(0, a, n + free, streams.get(a, 0), "large", (0, 0), False, blocks, []))
    return Snapshot(segs, [trace], AllocatorSettings(), "2.3+")


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
    frames, each starting its segment: 32 MiB or 8.125 MiB blocks are cuBLAS workspaces, up to four of
    them (two streams' two); 512 bytes more, or a fifth of that size (tensors of that shape), and they stay
    unknown. One placed after another block in its segment (a weight loaded beside others) is no workspace."""
    base = 1 << 32
    act = base + 1024 * MiB
    orphans = [_ev("free_requested", base - (k + 1) * 64 * MiB, 64 * MiB) for k in range(9)]
    trace = orphans + [_ev("alloc", act, 2 * MiB)]
    cases = ((32 * MiB, 1, fr.WORKSPACE_CAT), (8519680, 1, fr.WORKSPACE_CAT), (32 * MiB + 512, 1, fr.UNKNOWN),
             (32 * MiB, 4, fr.WORKSPACE_CAT), (32 * MiB, 5, fr.UNKNOWN))
    for size, count, want in cases:
        blocks = [(base + k * 40 * MiB, size, []) for k in range(count)]
        snap = _own_segments(blocks + [(act, 2 * MiB, FWD)], trace, {a: k % 2 for k, (a, _, _) in enumerate(blocks)})
        classes = block_classes(snap)
        assert {classes[a].cls for a, _, _ in blocks} == {want}, (size, count)
    # the same block after an 8 MiB one in a single segment
    weight = base + 8 * MiB
    snap = _synthetic([(base, 8 * MiB, []), (weight, 32 * MiB, []), (act, 2 * MiB, FWD)], trace)
    assert block_classes(snap)[weight].cls == fr.UNKNOWN


@rule("CUBLAS_WORKSPACES_PER_STREAM")
def test_a_stream_holds_two_cublas_workspaces_the_highest():
    """Frameless 32 MiB blocks each starting its segment, all on one stream: two are both workspaces (the
    job's thread and the autograd engine's); of three, the two highest are, and the lowest (a weight cast
    after them, as in the bf16 generation captures) is not. Two more on a second stream are its own two."""
    base = 1 << 32
    act = base + 1024 * MiB
    trace = [_ev("free_requested", base - (k + 1) * 64 * MiB, 64 * MiB) for k in range(9)] + \
            [_ev("alloc", act, 2 * MiB)]
    for count in (2, 3):
        blocks = [(base + k * 40 * MiB, 32 * MiB, []) for k in range(count)]
        classes = block_classes(_own_segments(blocks + [(act, 2 * MiB, FWD)], trace))
        got = [classes[a].cls for a, _, _ in sorted(blocks, reverse=True)]
        assert got[:2] == [fr.WORKSPACE_CAT] * 2
        assert fr.WORKSPACE_CAT not in got[2:], count
    blocks = [(base + k * 40 * MiB, 32 * MiB, []) for k in range(4)]
    snap = _own_segments(blocks + [(act, 2 * MiB, FWD)], trace, {base: 7, base + 40 * MiB: 7})
    assert {block_classes(snap)[a].cls for a, _, _ in blocks} == {fr.WORKSPACE_CAT}


@pytest.mark.parametrize("where, job", [("composition_eve", "eve_cnn_adamw_bf16_fwd_none_dumpstep"),
                                        ("composition_fresh", "fresh_cnn_sgd_fwd_all_dumpstep")])
def test_of_workspace_sized_blocks_those_older_than_the_trace_are_the_workspaces(where, job):
    """A ConvNet recorded for its dump's step only, dumped after its forward (H100 and H200 captures, the second
    with its stacks removed): four frameless 32 MiB blocks, each starting its own segment on one stream, the
    two cuBLAS workspaces (made at the first step's first multiply, older than the trace) and two of the
    forward's saved activations (made in the trace, at higher addresses). The older two are the workspaces;
    the highest two were taken before (the agent's roles, which name no workspace, then gave 59.8% and
    72.2% of live bytes in class; now 100%)."""
    path = HERE / where / job
    truth = json.loads((path / "truth.json").read_text())
    snap = _snap(path / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    classes = block_classes(snap)
    ws = [a for a, _n, label, _c, _p in truth["blocks"] if label == "workspace"]
    saved = [a for a, n, label, _c, _p in truth["blocks"] if label == "saved" and n == 32 * MiB]
    assert len(ws) == 2 and saved
    assert {classes[a].cls for a in ws} == {fr.WORKSPACE_CAT}
    assert fr.WORKSPACE_CAT not in {classes[a].cls for a in saved}
    with_roles = _truth_bench().score_gpu(path, with_roles=True, strip=True)
    assert with_roles["class_share"] >= 0.99, with_roles


@rule("CUBLAS_WORKSPACE_MAX_BLOCKS")
def test_among_more_workspace_sized_blocks_than_handles_a_workspace_has_a_segment_its_own_size():
    """Five frameless 32 MiB blocks older than the trace, each starting its segment: more than a job has
    handles, so some are tensors of that size. A workspace's segment was made for it (exactly 32 MiB); a
    weight cast into the segment a larger tensor left (48 MiB) is none: the two in segments their own size
    are the workspaces (as in a bf16 generation job whose weights were cast after loading). With three
    such segments among them, the stream's two highest; with five, none (tensors made alone)."""
    base = 1 << 32
    act = base + 1024 * MiB
    trace = [_ev("free_requested", base - (k + 1) * 64 * MiB, 64 * MiB) for k in range(9)] + \
            [_ev("alloc", act, 2 * MiB)]
    blocks = [(base + k * 64 * MiB, 32 * MiB, []) for k in range(5)]
    for exact, want in ((2, {0, 1}), (3, {1, 2}), (5, set())):
        room = {a: 0 if k < exact else 16 * MiB for k, (a, _, _) in enumerate(blocks)}
        classes = block_classes(_own_segments(blocks + [(act, 2 * MiB, FWD)], trace, room=room))
        got = {k for k, (a, _, _) in enumerate(blocks) if classes[a].cls == fr.WORKSPACE_CAT}
        assert got == want, exact


def test_a_bf16_generation_jobs_workspaces_among_its_32_mib_weights():
    """bf16 generation recorded after its weights were loaded (tests/fixtures/composition_fresh, H200): two
    cuBLAS workspaces older than the trace among six 32 MiB weights, the weights in segments cut for their
    fp32 originals. The workspaces are named and the weights stay weights: at least 99% of live bytes in
    their class (89.3% before)."""
    job = HERE / "composition_fresh" / "fresh_wide_infer_static_bf16_all_loaded"
    truth = json.loads((job / "truth.json").read_text())
    classes = block_classes(_snap(job / "snapshot.pickle.gz"))
    ws = {b[0] for b in truth["blocks"] if b[3] == "workspace"}
    assert len(ws) == 2 and {classes[a].cls for a in ws} == {fr.WORKSPACE_CAT}
    big = {b[0] for b in truth["blocks"] if b[1] == 32 * MiB and b[3] == "parameters"}
    assert len(big) == 6 and {classes[a].cls for a in big} == {fr.PARAMETERS}
    assert _scored(job.name, where=FRESH)["class_share"] >= 0.99


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
    multiples of three blocks of one size, each three are a parameter (made first: in one segment, the
    lowest address, a segment being cut from its start) and its state; at 89% nothing is split (all read as
    parameters, as in a forward-only trace)."""
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
        got = [classes[a].cls for a, _, _ in sorted(triples, key=lambda t: t[0])]
        if want_state:  # 90 / (90 + 10): the nine 10 MiB blocks are three parameters and six moments
            assert got == [fr.PARAMETERS] * 3 + [fr.OPTIMIZER_STATE] * 6, got
        else:  # 90 / (90 + 11) < 90%: no split
            assert set(got) == {fr.PARAMETERS}, got


# -- inference: weights and caches -------------------------------------------------------------------------

GEN = [{"filename": "/app/generate.py", "name": "generate", "line": 10}]  # the loop between forward calls
LOOP = [{"filename": "/app/generate.py", "name": "generate", "line": 20}]  # kept outputs, tokens


def _site(line: int, in_module: bool = True) -> list:
    """A stack of its own (traces share one frames list per stack): a cat in attention, or code outside
    the model."""
    f = [{"filename": "/app/model.py", "name": "update", "line": line}]
    return f + ([{"filename": "/x/torch/nn/modules/module.py", "name": "_call_impl", "line": 1}] if in_module else GEN)


def _generation(calls: int, layers: int = 2, kept_per_call: int = 0, backward: bool = False):
    """A trace of `calls` forward calls of a model whose cache grows by concatenation: each call makes a
    key and a value block per layer (sites K and V) and frees the previous call's, inside the call; its
    logits are freed between calls. `kept_per_call`: blocks an evaluation loop keeps from every call
    (a growing list). Returns (snapshot, cache addresses, logits address, kept addresses)."""
    k_site, v_site, tmp, logits_site, kept_site = _site(1), _site(2), _site(3), _site(4), _site(5, False)
    base = 1 << 36
    nxt = [base]

    def new(n):
        nxt[0] += n
        return nxt[0] - n

    trace, cache, kept = [], {}, []
    logits = None
    for c in range(calls):
        for layer in range(layers):
            t = new(MiB)  # an intermediate of this call, freed in it
            trace += [_ev("alloc", t, MiB, tmp)]
            for kv, site in ((0, k_site), (1, v_site)):
                a = new(4 * MiB)
                trace.append(_ev("alloc", a, 4 * MiB, site))
                old = cache.pop((layer, kv), None)
                if old is not None:
                    trace += [_ev("free_requested", old, 4 * MiB, site), _ev("free_completed", old, 4 * MiB, site)]
                cache[(layer, kv)] = a
            trace += [_ev("free_requested", t, MiB, tmp), _ev("free_completed", t, MiB, tmp)]
        logits = new(2 * MiB)
        trace.append(_ev("alloc", logits, 2 * MiB, logits_site))
        for _ in range(kept_per_call):
            a = new(MiB)
            trace.append(_ev("alloc", a, MiB, kept_site))
            kept.append(a)
        if c < calls - 1:
            trace += [_ev("free_requested", logits, 2 * MiB, GEN), _ev("free_completed", logits, 2 * MiB, GEN)]
    if backward:
        trace.append(_ev("alloc", new(MiB), MiB, [{"filename": "/x/torch/_tensor.py", "name": "backward",
                                                   "line": 1}]))
        trace.append(_ev("free_requested", nxt[0] - MiB, MiB, GEN))
    weights = [(base - (k + 1) * 64 * MiB, 32 * MiB + 4096, []) for k in range(3)]
    live = weights + [(a, 4 * MiB, None) for a in cache.values()] + [(logits, 2 * MiB, None)] + \
        [(a, MiB, None) for a in kept]
    frames_of = {ev.addr: ev.frames for ev in trace if ev.action == "alloc"}
    live = [(a, n, f if f is not None else frames_of[a]) for a, n, f in live]
    return _synthetic(live, trace), list(cache.values()), logits, kept, [a for a, _, _ in weights]


@rule("INFERENCE_MIN_CALLS")
def test_a_cache_grown_by_concatenation_is_read_with_the_weights_from_two_forward_calls():
    """INFERENCE_MIN_CALLS: a key and a value per layer made in each forward call and freed inside the next
    (a cache grown by concatenation) are a cache, with the weights, once the trace holds two forward calls;
    in one (a training step dumped after forward) they are activations. The last logits stay the step's."""
    for calls, want in ((1, fr.ACTIVATIONS), (2, fr.PARAMETERS), (3, fr.PARAMETERS)):
        snap, cache, logits, _, weights = _generation(calls)
        classes = block_classes(snap)
        assert {classes[a].cls for a in cache} == {want}, calls
        if want == fr.PARAMETERS:
            assert {classes[a].source for a in cache} == {pv.FROM_CACHE}
            # the weights older than the trace: the trace covers the generation from its start
            assert {classes[a].cls for a in weights} == {fr.PARAMETERS}
            assert {classes[a].source for a in weights} == {pv.BEFORE_TRACE}
        assert classes[logits].cls == fr.ACTIVATIONS


def test_a_trace_with_a_backward_holds_no_inference_cache():
    """The same blocks in a trace whose forward calls a backward follows (a training job's forward calls
    with gradient accumulation) are no cache: what is kept across its forward calls is for the backward.
    A backward before the calls (a job that trained, then generates) leaves them a cache."""
    snap, cache, _, _, _ = _generation(3, backward=True)
    classes = block_classes(snap)
    assert fr.PARAMETERS not in {classes[a].cls for a in cache}
    snap, cache, _, _, _ = _generation(3)
    bwd = [{"filename": "/x/torch/_tensor.py", "name": "backward", "line": 1}]
    trace = [_ev("alloc", 1 << 30, MiB, bwd), _ev("free_requested", 1 << 30, MiB, bwd),
             _ev("alloc", (1 << 30) + MiB, MiB, []), _ev("free_requested", (1 << 30) + MiB, MiB, [])] + snap.trace
    live = [(b.address, b.size, b.frames) for seg in snap.segments for b in seg.blocks if b.is_live]
    classes = block_classes(_synthetic(live, trace))
    assert {(classes[a].cls, classes[a].source) for a in cache} == {(fr.PARAMETERS, pv.FROM_CACHE)}


def test_a_static_cache_older_than_a_ring_buffer_is_a_cache_by_its_own_stack():
    """A ring buffer that lost the making of a static cache: its blocks are older than the trace but carry
    their own stack (made outside the model, never freed); in an inference trace, a stack with several
    of them is a cache; the prompt, alone at its stack, is the step's."""
    snap, _, _, _, _ = _generation(3)
    static_site = [{"filename": "/app/cache.py", "name": "__init__", "line": 5}] + GEN
    prompt_site = [{"filename": "/app/generate.py", "name": "generate", "line": 3}]
    base = 1 << 38
    pre = [(base + k * 8 * MiB, 8 * MiB, static_site) for k in range(4)]
    prompt = (base + 64 * MiB, 64 * 1024, prompt_site)
    live = [(b.address, b.size, b.frames) for seg in snap.segments for b in seg.blocks if b.is_live]
    classes = block_classes(_synthetic(live + pre + [prompt], snap.trace))
    assert {(classes[a].cls, classes[a].source) for a, _, _ in pre} == {(fr.PARAMETERS, pv.FROM_CACHE)}
    assert classes[prompt[0]].cls != fr.PARAMETERS


@rule("CACHE_MIN_BLOCKS")
def test_a_site_with_one_block_kept_across_calls_is_no_cache():
    """CACHE_MIN_BLOCKS: a one-layer model keeps one key and one value, each its own site's only block:
    not a cache (a prompt, the generated tokens and the beam scores are such blocks); two layers (two
    blocks of each site) are."""
    for layers, want in ((1, fr.ACTIVATIONS), (2, fr.PARAMETERS)):
        snap, cache, _, _, _ = _generation(3, layers=layers)
        classes = block_classes(snap)
        assert {classes[a].cls for a in cache} == {want}, layers


def test_outputs_kept_from_every_call_are_no_cache():
    """An evaluation loop that keeps every call's output in a list: kept across calls, but more of them at
    the end than at any call's start (a list grows, a cache is replaced): activations, not a cache."""
    snap, cache, _, kept, _ = _generation(4, kept_per_call=2)
    classes = block_classes(snap)
    assert {classes[a].cls for a in cache} == {fr.PARAMETERS}
    assert {classes[a].cls for a in kept} == {fr.ACTIVATIONS}


def test_a_static_cache_made_before_the_first_call_is_a_cache():
    """A cache allocated whole before generation by the job's code (outside the model) and written in
    place: never freed, kept across every call, as many blocks at the end as at each call's start."""
    snap, _, _, _, _ = _generation(3)
    static_site, prompt_site = _site(7, False), _site(8, False)
    base = 1 << 38
    pre = [_ev("alloc", base + k * 8 * MiB, 8 * MiB, static_site) for k in range(4)]
    prompt = _ev("alloc", base + 64 * MiB, 64 * 1024, prompt_site)
    trace = pre + [prompt] + snap.trace
    live = [(b.address, b.size, b.frames) for seg in snap.segments for b in seg.blocks if b.is_live]
    live += [(ev.addr, ev.size, ev.frames) for ev in pre + [prompt]]
    classes = block_classes(_synthetic(live, trace))
    assert {classes[ev.addr].cls for ev in pre} == {fr.PARAMETERS}
    assert {classes[ev.addr].source for ev in pre} == {pv.FROM_CACHE}
    assert classes[prompt.addr].cls == fr.ACTIVATIONS  # the prompt: one block of its site


def test_with_the_agents_roles_an_undeclared_cache_older_than_the_trace_is_a_cache():
    """The job named its weights (agent roles) but declared no cache, made before the trace: in an
    inference trace, the unnamed blocks every call kept, in sizes of several blocks, are its cache; a lone
    one (the prompt) is the step's. A declared cache is known from the job."""
    from dataclasses import replace

    from memq.model import AGENT_ROLES, AgentInfo

    snap, _, _, _, weights = _generation(3)
    base = 1 << 34
    old_cache = [(base + k * 16 * MiB, 8 * MiB, []) for k in range(4)]
    prompt = (base + 128 * MiB, 64 * 1024, [])
    live = [(b.address, b.size, b.frames) for seg in snap.segments for b in seg.blocks if b.is_live]
    s2 = _synthetic(live + old_cache + [prompt], snap.trace)
    code = AGENT_ROLES.index
    roles = [(a, 32 * MiB + 4096, code("parameter")) for a in weights]
    s2.agent = replace(AgentInfo(), roles=tuple(sorted(roles)))
    classes = block_classes(s2)
    assert {classes[a].cls for a in weights} == {fr.PARAMETERS}
    assert {(classes[a].cls, classes[a].source) for a, _, _ in old_cache} == {(fr.PARAMETERS, pv.FROM_CACHE)}
    assert classes[prompt[0]].cls == fr.ACTIVATIONS
    # declared by the job (agent.roles.declare): known from the job
    s3 = _synthetic(live + old_cache + [prompt], snap.trace)
    s3.agent = replace(AgentInfo(), roles=tuple(sorted(roles + [(a, n, code("cache")) for a, n, _ in old_cache])))
    classes = block_classes(s3)
    assert {(classes[a].cls, classes[a].source) for a, _, _ in old_cache} == {(fr.PARAMETERS, pv.FROM_JOB)}


def test_a_trace_without_stacks_says_why_its_blocks_are_unknown():
    """A trace recorded without stacks (no frames anywhere): nothing in it tells a class, so its blocks are
    unknown, and every screen says why (the segment map's block, the composition's site); with no trace
    at all, the same, for that reason."""
    base = 1 << 36
    live = [(base + k * 8 * MiB, 4 * MiB, []) for k in range(3)]
    trace = [_ev("alloc", a, n, []) for a, n, _ in live] + \
        [_ev("alloc", base + 64 * MiB, MiB, []), _ev("free_requested", base + 64 * MiB, MiB, [])]
    snap = _synthetic(live, trace)
    classes = block_classes(snap)
    assert {(classes[a].cls, classes[a].source) for a, _, _ in live} == {(fr.UNKNOWN, pv.NO_FRAMES)}
    _, sites = pv.composition(snap)
    assert sites[fr.UNKNOWN][0]["site"] == "<no frames: the trace was recorded without stacks>"
    assert "without stacks" in pv.SOURCE_WORDS[pv.NO_FRAMES]
    snap = _synthetic(live, [])
    classes = block_classes(snap)
    assert {(classes[a].cls, classes[a].source) for a, _, _ in live} == {(fr.UNKNOWN, pv.NO_TRACE)}
    assert pv.composition(snap)[1][fr.UNKNOWN][0]["site"] == "<no allocation history recorded>"


H200 = HERE / "composition_h200"
FRESH = HERE / "composition_fresh"


def _with_roles(snap, ranges) -> Snapshot:
    """`snap` as the agent sends it with the roles `ranges` [(address, size, role code)]."""
    from dataclasses import replace

    from memq.model import AgentInfo

    snap.agent = replace(snap.agent or AgentInfo(), roles=tuple(sorted(tuple(r) for r in ranges)))
    return snap


def _class_share(snap, truth: dict) -> float:
    """The share of the truth's live bytes read in their class (a step's `other` counts as activations)."""
    classes = block_classes(snap)
    total = right = 0
    for addr, size, _label, cls, _phase in truth["blocks"]:
        got = classes[addr].cls if addr in classes else fr.UNKNOWN
        total += size
        right += size if got == cls or (cls == "other" and got == fr.ACTIVATIONS) else 0
    return right / total


@pytest.mark.parametrize("job", sorted(p.name for p in H200.iterdir()
                                        if (p / "truth.json").exists() and p.name.startswith("infer_")
                                        and ("_none_" not in p.name or p.name == "infer_dyn_bf16_none_start")))
def test_h200_inference_captures_read_their_weights_and_caches(job):
    """Generation on an H200 (benchmarks/gpu/composition_capture.py), the truth of every live block from
    the tensors at the dump: a static cache made before generation (in the trace, or older than a ring
    buffer), a cache grown by concatenation, a beam search reordering it, and an evaluation loop with no
    cache. Without the agent's roles, at least 95% of live bytes in the right class (a KV cache with the
    weights); the evaluation loop's kept outputs are no cache."""
    truth = json.loads((H200 / job / "truth.json").read_text())
    snap = _snap(H200 / job / "snapshot.pickle.gz")
    share = _class_share(snap, truth)
    assert share >= 0.95, (job, share)
    classes = block_classes(snap)
    cache = {a for a, bc in classes.items() if bc.source == pv.FROM_CACHE}
    kv = {b[0] for b in truth["blocks"] if b[2] == "kv_cache"}
    assert cache <= kv, job  # nothing else is called a cache
    if cache:  # the composition says which of the parameters' bytes are a cache
        sites = pv.composition(snap)[1][fr.PARAMETERS]
        assert any(s["site"].startswith("<inference cache>") for s in sites), sites
    if not job.endswith("_loaded"):  # a cache made in the trace, or older than a ring, is read as one
        assert cache == kv, job
    # (older than a trace that covers generation from its start, it is with the weights: parameters)


def test_with_no_history_a_block_of_a_parameters_size_is_not_called_its_gradient():
    """No trace at all (recording was off; the blocks made while it was on keep their frames): Adam's
    state still implies the parameters among the frameless blocks, but one more of a parameter's size is
    as likely forward's output of that shape as a gradient kept from a backward: unknown, saying why."""
    base = 1 << 32
    adam = [{"filename": "/x/torch/optim/adam.py", "name": "_init_group", "line": 1}]
    p1, extra = base, base + 128 * MiB
    s0 = base + 256 * MiB
    state = [(s0 + i * 64 * MiB, 64 * MiB, adam) for i in range(2)]
    classes = block_classes(_synthetic([(p1, 64 * MiB, []), (extra, 64 * MiB, [])] + state, []))
    assert (classes[p1].cls, classes[p1].source) == (fr.PARAMETERS, pv.FROM_STATE)
    assert (classes[extra].cls, classes[extra].source) == (fr.UNKNOWN, pv.NO_TRACE)


def test_the_timeline_draws_a_growing_cache_as_the_cache_from_its_first_block():
    """A cache grown by concatenation is replaced every token: the blocks freed on the way were the cache
    too, so the snapshot page's timeline draws every block of its allocation sites in the class the live
    cache has (parameters), not as activations."""
    from memq.web.snapshot_view import _Stacks, category_timeline

    job = H200 / "infer_dyn_bf16_py_start"
    snap = _snap(job / "snapshot.pickle.gz")
    sites = pv.cache_sites(snap)
    made = [ev for ev in snap.trace if ev.action == "alloc" and id(ev.frames) in sites]
    assert len(sites) == 2 and len(made) > 300  # keys and values, a new block per layer and token
    tl = category_timeline(snap, _Stacks(), 0)
    cats = tl["categories"]
    # half way through generation the cache (some 97% of its final size) is counted with the weights
    truth = json.loads((job / "truth.json").read_text())
    cache_bytes = sum(b[1] for b in truth["blocks"] if b[2] == "kv_cache")
    mid = tl["levels"][len(tl["levels"]) // 2]
    assert mid[cats.index(fr.PARAMETERS)] >= truth["param_bytes"] + 0.9 * cache_bytes


UNTRACED = H200 / "untraced"
# the share of live bytes each untraced capture must keep in the right class (measured 2026-12-05: 98.8%,
# 100%, 99.7% and 99.7%; the inference captures' 32 MiB bf16 weight alone in its segment, below the two
# cuBLAS workspaces, is a weight: a stream holds two workspaces, CUBLAS_WORKSPACES_PER_STREAM)
UNTRACED_FLOOR = {"oom_fwd_eager_bf16_off": 0.98, "fwd_eager_fp32_py_agent": 0.99, "infer_dyn_bf16_off": 0.99,
                  "infer_bf16_all_loaded": 0.99}


@pytest.mark.parametrize("job", sorted(UNTRACED_FLOOR))
def test_h200_captures_with_no_trace_read_the_models_state_by_sizes_and_addresses(job):
    """Snapshots with no allocation trace and no roles (tests/fixtures/composition_h200/untraced): an
    AdamW step that ran out of memory in forward with recording never on (the parameters the highest
    blocks of their sizes, two state blocks each below them, the rest the step's activations); a forward
    after warm-up steps recorded then paused (the frameless blocks made after it stopped: activations);
    bf16 generation with recording never on (the weights: the model's run of segments); and generation
    recorded from its start with the weights older than the trace (a 32 MiB weight loaded beside
    others is no cuBLAS workspace). Every class so read says where it came from."""
    truth = json.loads((UNTRACED / job / "truth.json").read_text())
    snap = _snap(UNTRACED / job / "snapshot.pickle.gz")
    assert _class_share(snap, truth) >= UNTRACED_FLOOR[job]
    classes = block_classes(snap)
    by_source = Counter()
    for bc in classes.values():
        by_source[bc.source] += 1
    if not snap.trace:
        assert by_source[pv.AFTER_HISTORY if job.endswith("_agent") else pv.FROM_LAYOUT] > 50, by_source
        by_origin = pv.origins(snap)
        assert pv.LAYOUT in by_origin[fr.ACTIVATIONS if job.endswith("_agent") else fr.PARAMETERS]
        _, sites = pv.composition(snap)
        assert any(s["site"].startswith("<no allocation history") and s["origin"] == pv.LAYOUT
                   for c in sites.values() for s in c)
        assert pv.LAYOUT in pv.SOURCE_WORDS[pv.FROM_LAYOUT] and pv.LAYOUT in pv.SOURCE_WORDS[pv.AFTER_HISTORY]


def test_untraced_oom_capture_parameters_state_and_activations_in_their_bytes():
    """The AdamW OOM with no history: 0.42 GiB of parameters, 0.84 GiB of state (two per parameter) and
    1.31 GiB of activations, each within 5% of the truth (an 8 MiB and a 2 MiB activation among the
    parameters, a 32 MiB one alone in its segment read as a cuBLAS workspace), nothing unknown; with the
    agent's roles every block they name is known from the job instead (the roles come first)."""
    job = UNTRACED / "oom_fwd_eager_bf16_off"
    truth = json.loads((job / "truth.json").read_text())
    snap = _snap(job / "snapshot.pickle.gz")
    comp, _ = pv.composition(snap)
    for cls in (fr.PARAMETERS, fr.OPTIMIZER_STATE, fr.ACTIVATIONS):
        assert comp[cls] == pytest.approx(truth["class_bytes"][cls], rel=0.05), cls
    assert comp[fr.UNKNOWN] == 0
    snap = _with_roles(_snap(job / "snapshot.pickle.gz"), truth["agent_roles"]["ranges"])
    sources = {bc.source for bc in block_classes(snap).values()}
    assert pv.FROM_LAYOUT not in sources and pv.FROM_JOB in sources


def _run_of_segments(n: int, base: int, size: int) -> list:
    """n large segments back to back, from `base` down, each one frameless live block."""
    return [Segment(0, base - (i + 1) * size, size, 0, "large", (0, 0), False,
                    [Block(base - (i + 1) * size, size, size, ACTIVE_ALLOCATED, [])], []) for i in range(n)]


@rule("UNTRACED_MODEL_MIN_SEGMENTS")
def test_with_no_trace_and_no_state_the_weights_are_the_top_run_of_eight_segments():
    """No trace, no frames, no optimizer state (inference): the weights are the blocks of the first run of
    eight segments back to back from the top; a run of seven is no model (unknown), and the blocks below
    the run stay unknown."""
    top = 1 << 40
    for n, want in ((8, fr.PARAMETERS), (7, fr.UNKNOWN)):
        model = _run_of_segments(n, top, 6 * MiB)
        below = _run_of_segments(1, top - 1024 * MiB, 10 * MiB)
        snap = Snapshot(model + below, [[]], AllocatorSettings(), "2.3+")
        classes = block_classes(snap)
        assert {classes[s.address].cls for s in model} == {want}, n
        assert classes[below[0].address].cls == fr.UNKNOWN
        if want == fr.PARAMETERS:
            assert {classes[s.address].source for s in model} == {pv.FROM_LAYOUT}


@rule("UNTRACED_RUNS_ABOVE_MODEL")
def test_with_no_trace_the_models_run_is_read_only_near_the_top():
    """Two single segments apart from each other above the model's run of eight: it is still read; a
    third, and nothing says where the model is (unknown)."""
    top = 1 << 40
    for above, want in ((2, fr.PARAMETERS), (3, fr.UNKNOWN)):
        singles = [_run_of_segments(1, top - i * 64 * MiB, 16 * MiB)[0] for i in range(above)]
        model = _run_of_segments(8, top - 1024 * MiB, 6 * MiB)
        snap = Snapshot(singles + model, [[]], AllocatorSettings(), "2.3+")
        classes = block_classes(snap)
        assert {classes[s.address].cls for s in model} == {want}, above


def _spaced(n: int, base: int, size: int, stride: int) -> list:
    """n large segments from `base` down, one every `stride` bytes, each one frameless live block."""
    return [Segment(0, base - (i + 1) * stride, size, 0, "large", (0, 0), False,
                    [Block(base - (i + 1) * stride, size, size, ACTIVE_ALLOCATED, [])], []) for i in range(n)]


def test_with_no_trace_a_driver_that_spaces_segments_still_shows_the_weights():
    """A driver that aligns each mapping to a coarser boundary (20 MiB segments 32 MiB apart, as in
    tests/fixtures/real and a published GPT-2 snapshot): eight such segments are the model's run, their
    blocks the weights; a gap as large as the segment breaks the run (unknown); and where those weights
    have an optimizer's state beside them nothing is read (the state's place is unsaid there)."""
    top = 1 << 40
    for stride, want in ((32 * MiB, fr.PARAMETERS), (40 * MiB - 512, fr.PARAMETERS), (40 * MiB, fr.UNKNOWN)):
        model = _spaced(8, top, 20 * MiB, stride)
        snap = Snapshot(model, [[]], AllocatorSettings(), "2.3+")
        classes = block_classes(snap)
        assert {classes[s.address].cls for s in model} == {want}, stride
        if want == fr.PARAMETERS:
            assert {classes[s.address].source for s in model} == {pv.FROM_LAYOUT}
    model = _spaced(8, top, 20 * MiB, 32 * MiB)
    state = _run_of_segments(1, top - 2048 * MiB, 320 * MiB)
    state[0].blocks = [Block(state[0].address + i * 20 * MiB, 20 * MiB, 20 * MiB, ACTIVE_ALLOCATED, [])
                       for i in range(16)]  # two moments per weight, side by side
    snap = Snapshot(model + state, [[]], AllocatorSettings(), "2.3+")
    classes = block_classes(snap)
    assert {classes[b.address].cls for s in model + state for b in s.blocks} == {fr.UNKNOWN}


def test_with_no_trace_the_real_spaced_layout_reads_the_weights_before_training():
    """tests/fixtures/real's model before its first step, stripped of trace, frames and roles: the weights
    of its top run (spaced 32 MiB apart) are read from the layout and nothing is read as anything else."""
    snap = _snap(HERE / "real/seed_adamw/before_training.pickle.gz")
    snap.traces[snap.trace_device] = []
    snap.agent = None
    for seg in snap.segments:
        for b in seg.blocks:
            b.frames = []
    classes = block_classes(snap)
    live = [b for s in snap.segments for b in s.blocks if b.is_live]
    read = sum(b.size for b in live if classes.get(b.address) and classes[b.address].cls == fr.PARAMETERS)
    assert read >= 0.45 * sum(b.size for b in live)
    assert {classes[b.address].cls for b in live if b.address in classes} <= {fr.PARAMETERS, fr.UNKNOWN}


@rule("STATE_SPLIT_SHARE")
def test_with_no_trace_a_model_whose_blocks_have_no_room_for_state_is_read_by_its_run():
    """No trace, no frames: walking from the top, a parameter needs two more blocks of its size below (Adam's
    moments), and the state begins at two side by side of a parameter's size. Where 90% of the bytes walked
    had room for state, the parameters and their state are read so (the block with none is the step's);
    a byte more without room, and no optimizer state is read: the top run of segments gives the weights,
    the pairs below stay unknown."""
    top = 1 << 40
    sizes = [10 * MiB] * 6 + [8 * MiB] * 3  # 84 MiB of parameters
    limit = 84 * MiB / 9  # the lone block's bytes at which it is a tenth of the bytes walked
    for lone, want in ((int(limit) // 512 * 512, fr.OPTIMIZER_STATE), (int(limit) // 512 * 512 + 512, fr.UNKNOWN)):
        params, at = [], top
        for n in sizes + [lone]:
            at -= n
            params.append(Segment(0, at, n, 0, "large", (0, 0), False, [Block(at, n, n, ACTIVE_ALLOCATED, [])], []))
        *params, single = params
        state, at = [], at - 512 * MiB
        for n in sizes:  # the moments of each parameter, two side by side in one segment
            at -= 2 * n
            state.append(Segment(0, at, 2 * n, 0, "large", (0, 0), False,
                                 [Block(at, n, n, ACTIVE_ALLOCATED, []), Block(at + n, n, n, ACTIVE_ALLOCATED, [])],
                                 []))
        snap = Snapshot(params + [single] + state, [[]], AllocatorSettings(), "2.3+")
        classes = block_classes(snap)
        assert {classes[s.address].cls for s in params} == {fr.PARAMETERS}
        assert {classes[b.address].cls for s in state for b in s.blocks} == {want}, lone
        assert classes[single.address].cls == (fr.ACTIVATIONS if want == fr.OPTIMIZER_STATE else fr.PARAMETERS)


@pytest.mark.parametrize("path", ["real/seed_adamw/epoch1.pickle.gz", "public_snapshots/"
                                  "cs336_2.7b_memory_ctx512_forward_mixed.pickle.gz",
                                  "captured/cuda_graphs/after_replays.pickle.gz"])
def test_with_no_trace_a_layout_that_does_not_show_the_model_reads_nothing(path):
    """Stripped of trace and frames: a run whose driver spaced every segment apart (tests/fixtures/real), a
    published snapshot whose top run is the forward's activations, and a CUDA graph's private pool at the
    top. Nothing says where the model is: no class is read from the layout (they stay unknown)."""
    snap = _snap(HERE / path)
    snap.traces[snap.trace_device] = []
    for seg in snap.segments:
        for b in seg.blocks:
            b.frames = []
    assert not {bc.source for bc in block_classes(snap).values()} & {pv.FROM_LAYOUT, pv.AFTER_HISTORY}
# ------------------------------------------------------------------ traces recorded without stacks

def _job(live: list, trace: list) -> Snapshot:
    """A snapshot whose frameless trace holds the whole job: it made the one segment, then `trace`."""
    snap = _synthetic(live, trace)
    seg = snap.segments[0]
    snap.traces[snap.trace_device] = [_ev("segment_alloc", seg.address, seg.total_size, [])] + trace
    return snap


def _made(blocks: list, gap: int = 0) -> list:
    """Frameless allocations of `blocks` [(address, size, frames)] one after another, with `gap`
    short-lived allocations (made and freed) between any two: a run of kept blocks when gap is 0."""
    out = []
    for k, (a, n, _f) in enumerate(blocks):
        if k and gap:
            out += _tmp(gap, tag=a)
        out.append(_ev("alloc", a, n, []))
    return out


def _tmp(n: int, tag: int = 0, size: int = MiB) -> list:
    """n short-lived frameless allocations (a forward's temporaries), made and freed, outside the segment."""
    out = []
    for k in range(n):
        a = (1 << 30) + ((tag >> 20) % 4096) * 64 * MiB + k * size
        out += [_ev("alloc", a, size, []), _ev("free_requested", a, size, []), _ev("free_completed", a, size, [])]
    return out


FORWARD = _tmp(1, tag=1 << 40, size=256 * MiB)  # a step's activations, made in forward, freed in backward


@rule("ORDER_GRADIENT_SHARE")
def test_without_stacks_gradients_are_kept_copies_of_half_the_weights():
    """A trace without stacks that holds the whole job and shows no optimizer state: the weights are made
    first (the largest run of kept blocks); a block made later at a weight's size is its gradient where such
    copies hold at least half of the weights' bytes (51 of 100 MiB), and the step's (activations) at 49."""
    base = 1 << 34
    w49, w51 = (base, 49 * MiB, []), (base + 64 * MiB, 51 * MiB, [])
    for copied, want in ((w51, fr.GRADIENTS), (w49, fr.ACTIVATIONS)):
        g = (base + 128 * MiB, copied[1], [])
        trace = _made([w49, w51]) + _tmp(3) + FORWARD + _made([g]) + _tmp(2)
        classes = block_classes(_job([w49, w51, g], trace))
        assert (classes[g[0]].cls, classes[g[0]].source) == (want, pv.FROM_ORDER)
        assert {classes[a].cls for a, _, _ in (w49, w51)} == {fr.PARAMETERS}


@rule("STATE_SPLIT_SHARE")
def test_without_stacks_a_run_of_pairs_of_the_weights_sizes_is_the_optimizer_state():
    """AdamW's first step makes two blocks per parameter of its size, one after the other: a run of kept
    blocks is the state where nine tenths of its bytes come in such pairs (40+40+50+50 MiB and 20 MiB
    more: 90%); with 21 MiB more (89.5%) it is not. The state implies the weights (the earliest blocks of
    its sizes), and a later copy of each is its gradient."""
    base = 1 << 34
    weights = [(base, 40 * MiB, []), (base + 64 * MiB, 50 * MiB, [])]
    grads = [(base + 128 * MiB, 40 * MiB, []), (base + 192 * MiB, 50 * MiB, [])]
    for odd_mib, want in ((20, fr.OPTIMIZER_STATE), (21, None)):
        s0 = base + 256 * MiB
        state = [(s0, 40 * MiB, []), (s0 + 64 * MiB, 40 * MiB, []), (s0 + 128 * MiB, 50 * MiB, []),
                 (s0 + 192 * MiB, 50 * MiB, []), (s0 + 256 * MiB, odd_mib * MiB, [])]
        trace = _made(weights) + _tmp(4) + FORWARD + _made(grads, gap=2) + _tmp(1) + _made(state) + _tmp(2)
        classes = block_classes(_job(weights + grads + state, trace))
        got = {classes[a].cls for a, _, _ in state[:4]}
        if want:
            assert got == {want}
            assert {classes[a].cls for a, _, _ in weights} == {fr.PARAMETERS}
            assert {classes[a].cls for a, _, _ in grads} == {fr.GRADIENTS}
        else:
            assert fr.OPTIMIZER_STATE not in got


def test_without_stacks_a_workspace_is_made_amid_a_multiplys_operands():
    """Two 32 MiB blocks kept to the end: the one made between short-lived allocations (a multiply's
    operands) is a cuBLAS workspace, the one made among the weights is a weight; a later run of pairs of
    one size no weight has is an inference cache (a key and a value), a lone kept block the step's."""
    base = 1 << 34
    ws = (base, 32 * MiB, [])
    weights = [(base + 64 * MiB, 32 * MiB, []), (base + 128 * MiB, 8 * MiB, [])]
    kv = [(base + 192 * MiB, 3 * MiB, []), (base + 196 * MiB, 3 * MiB, [])]
    out = (base + 200 * MiB, 64 * 1024, [])
    trace = _tmp(1) + _made([ws]) + _tmp(1) + _made(weights) + _tmp(3) + _made(kv) + _tmp(2) + _made([out]) + _tmp(1)
    snap = _job([ws] + weights + kv + [out], trace)
    classes = block_classes(snap)
    got = {a: (classes[a].cls, classes[a].source) for a, _, _ in [ws] + weights + kv + [out]}
    assert got[ws[0]] == (fr.WORKSPACE_CAT, pv.FROM_ORDER)
    assert {got[a] for a, _, _ in weights} == {(fr.PARAMETERS, pv.FROM_ORDER)}
    assert {got[a] for a, _, _ in kv} == {(fr.PARAMETERS, pv.FROM_CACHE)}
    assert got[out[0]] == (fr.ACTIVATIONS, pv.FROM_ORDER)
    assert {pv.entry_phase(snap, classes[a].event) for a in got} == {"forward"}  # no backward: forward (or setup)
    _, sites = pv.composition(snap)
    assert any("by the trace's order" in s["site"] for s in sites[fr.PARAMETERS])
    assert pv.SOURCE_WORDS[pv.FROM_ORDER].startswith("inferred from the trace's order")


@pytest.mark.parametrize("job", ["full_eager_fp32_none_start", "infer_dyn_bf16_none_start"])
def test_h200_traces_without_stacks_read_by_their_order(job):
    """Recorded with stacks=None from the job's start on an H200 (benchmarks/gpu/composition_capture.py):
    GPT 109M with AdamW dumped after its third step, and bf16 generation with a cache grown by
    concatenation. With no frame anywhere, the trace's order alone puts at least 97% of live bytes in the
    right class and the right allocation phase (the truth from the tensors at the dump), every class
    says it came from the order, and the training peak is in backward."""
    truth = json.loads((H200 / job / "truth.json").read_text())
    snap = _snap(H200 / job / "snapshot.pickle.gz")
    assert not any(ev.frames for ev in snap.trace)
    classes = block_classes(snap)
    for addr, _size, _label, _cls, _phase in truth["blocks"]:
        assert classes[addr].source in (pv.FROM_ORDER, pv.FROM_CACHE)
    score = _scored(job)
    assert score["class_share"] >= 0.97, score
    assert score["phase_share"] >= 0.97, score
    comp = analyze([snap])
    assert comp["composition"]["unknown"] == 0
    words = {c: pv.origin_words(o) for c, o in comp["details"]["composition_origin"].items()}
    if job.startswith("full"):
        assert set(words.values()) == {pv.ORDER}, words  # every class: "inferred from the trace's order"
        want = {k: truth["class_bytes"][k] for k in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE)}
        assert {k: comp["composition"][k] for k in want} == pytest.approx(want, rel=0.01)
        assert comp["details"]["timeline"]["peak_phase"] == "backward"
    sites = [s["site"] for c in comp["details"]["composition_sites"].values() for s in c]
    assert all("by the trace's order" in s or s.startswith("<inference cache>") for s in sites), sites


@rule("ORDER_GRADIENT_SHARE")
def test_without_stacks_a_run_one_per_weight_is_sgd_momentum_where_it_copies_half_of_them():
    """SGD's momentum is made in its first step, one buffer per parameter of its size, one after the
    other: a run of kept blocks, one per earlier kept block's size, is the optimizer's state where it
    copies at least half of their bytes (two buffers, 51 of 100 MiB); at 49 MiB it is not (a run of two
    gradients made one after the other copies a few MiB)."""
    base = 1 << 34
    weights = [(base, 49 * MiB, []), (base + 64 * MiB, 51 * MiB, []), (base + 128 * MiB, MiB, []),
               (base + 132 * MiB, MiB, [])]
    for first, want in ((1, fr.OPTIMIZER_STATE), (0, None)):
        # momentum of the 51 (or the 49) MiB weight and of a 1 MiB one, made together
        s0 = base + 256 * MiB
        mom = [(s0, weights[first][1], []), (s0 + 64 * MiB, MiB, [])]
        trace = _made(weights) + _tmp(4) + FORWARD + _tmp(2) + _made(mom) + _tmp(2)
        classes = block_classes(_job(weights + mom, trace))
        got = {classes[a].cls for a, _, _ in mom}
        assert (got == {want}) if want else (fr.OPTIMIZER_STATE not in got), (first, got)


@rule("STATE_LEAD_MAX")
def test_without_stacks_the_state_run_may_begin_with_the_backwards_last_gradients():
    """Where zero_grad keeps the gradients (set_to_none=False), the backward's last ones are kept and made with
    no short-lived allocation before AdamW's first step makes its state, so they lead the state's run of
    kept blocks: up to eight of them (each a weight's size) are left out of it and the state reads from its
    pairs; with nine, the run's pairs hold under nine tenths of its bytes and it is not read as state."""
    base = 1 << 34
    big = [(base + k * 64 * MiB, (40 + k) * MiB, []) for k in range(9)]  # nine weights, each its own size
    # and a 1 GiB embedding, so that the run does not copy half of the weights (no SGD momentum either)
    small = [(base + 1024 * MiB, MiB, []), (base + 1028 * MiB, 2 * MiB, []), (base + 1032 * MiB, 1024 * MiB, [])]
    for lead, want in ((8, fr.OPTIMIZER_STATE), (9, None)):
        g0 = base + 4096 * MiB
        grads = [(g0 + k * 64 * MiB, n, []) for k, (_a, n, _f) in enumerate(big[:lead])]
        s0 = g0 + 1024 * MiB
        state = [(s0 + k * 4 * MiB, n * MiB, []) for k, n in enumerate((1, 1, 2, 2))]
        trace = _made(big + small) + _tmp(4) + FORWARD + _tmp(2) + _made(grads + state) + _tmp(2)
        classes = block_classes(_job(big + small + grads + state, trace))
        got = {classes[a].cls for a, _, _ in state}
        assert (got == {want}) if want else (fr.OPTIMIZER_STATE not in got), (lead, got)
        if want:
            assert fr.OPTIMIZER_STATE not in {classes[a].cls for a, _, _ in grads}


def test_a_small_gpt_recorded_without_stacks_with_gradients_kept_reads_its_adam_state():
    """The small GPT trained by Adam with zero_grad(set_to_none=False) (tests/fixtures/composition_fresh, H200),
    read with every stack removed: its backward's last two gradients lead the run that makes Adam's state,
    and the state, the weights and the gradients still read (63.6% of live bytes in their class before)."""
    score = _scored("fresh_small_adam_keepgrad_fwd_py_start", strip=True, where=FRESH)
    assert score["class_share"] >= 0.99, score


@rule("ORDER_GRADIENT_SHARE")
def test_without_stacks_sgd_momentum_beside_gradients_kept_since_the_first_backward():
    """zero_grad(set_to_none=False) keeps each parameter's gradient from the first backward on, so before
    SGD's first step the kept blocks hold two per parameter (the weight and its gradient). A run of one
    buffer per parameter's size is the momentum where it copies at least half of one of those copies (two
    buffers, 52 of 102 MiB); at 50 it is not, as where gradients are released. With a buffer for every
    parameter, the kept gradients read as gradients too."""
    base = 1 << 34
    weights = [(base, 49 * MiB, []), (base + 64 * MiB, 51 * MiB, []), (base + 128 * MiB, MiB, []),
               (base + 132 * MiB, MiB, [])]
    grads = [(base + 192 * MiB + k * 64 * MiB, n, []) for k, (_a, n, _f) in enumerate(weights)]
    for sizes, want in (((51, 1), fr.OPTIMIZER_STATE), ((49, 1), None), ((49, 51, 1, 1), fr.OPTIMIZER_STATE)):
        s0 = base + 512 * MiB
        mom = [(s0 + k * 64 * MiB, n * MiB, []) for k, n in enumerate(sizes)]
        trace = _made(weights) + _tmp(4) + FORWARD + _made(grads, gap=2) + _tmp(2) + _made(mom) + _tmp(2)
        classes = block_classes(_job(weights + grads + mom, trace))
        got = {classes[a].cls for a, _, _ in mom}
        assert (got == {want}) if want else (fr.OPTIMIZER_STATE not in got), (sizes, got)
        if len(sizes) == len(weights):
            assert {classes[a].cls for a, _, _ in grads} == {fr.GRADIENTS}
            assert {classes[a].cls for a, _, _ in weights} == {fr.PARAMETERS}


def test_a_convnet_recorded_without_stacks_with_gradients_kept_reads_its_momentum():
    """A ConvNet trained by SGD with momentum, zero_grad(set_to_none=False), recorded without stacks from the
    job's start and dumped in a later backward (tests/fixtures/composition_fresh, H200): its momentum
    buffers, made in one run at the first step beside the weights and the kept gradients, are the
    optimizer state, the gradients are gradients (68.9% of live bytes in their class before, 100% now)."""
    score = _scored("fresh_cnn_sgd_keepgrad_bwd_none_start", where=FRESH)
    assert score["class_share"] >= 0.99, score
    assert score["peak_phase"] == score["peak_truth"] == "backward", score


def test_zero_grads_release_at_a_traces_start_says_how_many_state_tensors_each_parameter_keeps():
    """An encoder-decoder with AdamW recorded without stacks for its dump's step only, dumped in its forward
    (tests/fixtures/composition_fresh, H200): the trace opens with zero_grad releasing one gradient per
    parameter, and the blocks older than the trace hold three of each released size (the parameter and
    Adam's two moments). So they are parameters and state, split by age, and not the layout's reading (which
    called every weight-sized block of the model's segments a parameter: 67.1% of live bytes in class, now
    75.3%; age puts the parameters first for only a third of these bytes). The weight-sized blocks the
    forward made are not gradients (they come before the trace's most live bytes): the step's activations."""
    job = FRESH / "fresh_encdec_bf16_fwd_none_dumpstep"
    truth = json.loads((job / "truth.json").read_text())
    snap = _snap(job / "snapshot.pickle.gz")
    assert not any(ev.frames for ev in snap.trace)
    classes = block_classes(snap)
    by_size: dict = {}  # the blocks older than the trace
    for b in (b for seg in snap.segments for b in seg.blocks if b.is_live and classes[b.address].event < 0):
        by_size.setdefault(pv.tensor_size(b), []).append(b)
    last, k, freed = pv._released_beside(snap.trace, by_size)
    assert k == 2 and last > 0 and sum(freed.values()) >= 90
    older = [(a, n, c) for a, n, _l, c, _p in truth["blocks"] if classes[a].event < 0 and n >= MiB]
    held = [(a, n) for a, n, c in older if c in ("parameters", "optimizer_state")]
    assert sum(n for a, n in held if classes[a].cls in (fr.PARAMETERS, fr.OPTIMIZER_STATE)) >= 0.9 * sum(
        n for _a, n in held)
    state = [(a, n) for a, n, c in older if c == "optimizer_state"]
    assert sum(n for a, n in state if classes[a].cls == fr.OPTIMIZER_STATE) >= 0.6 * sum(n for _a, n in state)
    made = [a for a, _n, _l, _c, _p in truth["blocks"] if classes[a].event >= 0]
    assert made and fr.GRADIENTS not in {classes[a].cls for a in made}
    acts = [(a, n) for a, n, _l, c, _p in truth["blocks"] if c == "activations" and classes[a].event >= 0]
    assert sum(n for a, n in acts if classes[a].cls == fr.ACTIVATIONS) >= 0.95 * sum(n for _a, n in acts) > 0
    assert _scored(job.name, where=FRESH)["class_share"] >= 0.75  # 67.1% by the layout, 7.4% when none was read


def test_a_radam_step_recorded_without_stacks_reads_its_state_from_zero_grads_release():
    """A deep MLP trained by RAdam under bf16 autocast, recorded without stacks for its dump's step only and
    dumped in its backward (tests/fixtures/composition_late, H200): zero_grad's release at the trace's start
    (one free per parameter, three older blocks of each size) is the step's start, so the older blocks are
    each parameter and its two moments. 99.9% of live bytes in their class; 46.3% before, when the frees the
    trace opens with made it read as a ring that began mid-step."""
    late = HERE / "composition_late"
    score = _scored("late_deep_radam_bf16_step_none_dumpstep", where=late)
    assert score["class_share"] >= 0.99, score


@pytest.mark.parametrize("where, job, peak", [
    ("composition_late", "late_deep_radam_bf16_step_none_dumpstep", "backward"),
    ("composition_fresh", "fresh_encdec_bf16_fwd_none_dumpstep", "forward"),
    ("composition_eve", "eve_wide_adafactor_bf16_step_none_dumpstep", "backward"),
    ("composition_eve", "eve_cnn_adamw_bf16_fwd_none_dumpstep", "forward"),
    ("composition_eve", "eve_lora_adamw_step_none_dumpstep", "backward")])
def test_a_stackless_trace_begun_by_zero_grads_release_reads_its_phases(where, job, peak):
    """Traces without stacks recorded for the dump's step only (H200 and H100 captures): each opens with
    zero_grad releasing the last step's gradients, so its forward runs from there to the step's first
    gradient (or its most live entry, if that comes first), its backward to its last gradient, and its
    optimizer step after it. The peak's phase was named nowhere before (None) and the blocks' allocation
    phases were 51.8-75.5% right; now the peak is right and at least 99% of the bytes. Dumped after a forward
    (the encoder-decoder, the ConvNet), no gradient of 1 MiB or more was made: a few small outputs of a
    bias's size do not begin a backward. A LoRA's adapters' gradients are all under 1 MiB, and theirs do."""
    score = _scored(job, where=HERE / where)
    assert score["peak_phase"] == score["peak_truth"] == peak, score
    assert score["phase_share"] >= 0.99, score


def test_with_the_agents_roles_a_stackless_trace_still_reads_its_phases_from_the_release():
    """The RAdam MLP above with the roles the agent sent (its stacks setting "none"): the roles name every
    block older than the trace, so none is left for the split, but the release is read against all of them
    and the phases stand (the peak in backward, every byte's phase right)."""
    score = _truth_bench().score_gpu(HERE / "composition_late" / "late_deep_radam_bf16_step_none_dumpstep",
                                     with_roles=True)
    assert score["class_share"] >= 0.99, score
    assert score["peak_phase"] == score["peak_truth"] == "backward", score
    assert score["phase_share"] >= 0.99, score


def test_a_stackless_trace_that_does_not_begin_with_a_release_names_no_phase():
    """A ring buffer that wrapped mid-step, its stacks removed (tests/fixtures/composition_fresh, H200): its
    first frees are a backward's, not zero_grad's, so nothing places its entries in a phase."""
    path = FRESH / "fresh_wide_bf16_oom_bwd_py_ring"
    snap = _snap(path / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    assert pv._released_step(snap) is None
    assert pv.entry_phase(snap, len(snap.trace) - 1) is None


@pytest.mark.parametrize("where, job, strip", [("composition_eve", "eve_lstm_nadam_bwd_none_dumpstep", False),
                                               ("composition_late", "late_lstm_adamax_fwd_py_dumpstep", True)])
def test_an_lstms_flat_gradient_released_beside_its_embeddings_is_read_with_its_state(where, job, strip):
    """LSTM language models recorded for their dump's step only, without stacks (H100 and H200 captures, the
    second with its stacks removed): zero_grad releases the embedding's and the head's gradients, three older
    blocks of each size (k = 2), and one flat gradient for the LSTM's weights, whose older block is alone of
    its size (its state is in the weights' own sizes). The release is still zero_grad's, the flat block is
    the weights (53.8% and 61.9% of live bytes in class when the flat size kept the release from being read
    as one, the state taken for parameters); now all of them, and the phases too."""
    score = _scored(job, strip=strip, where=HERE / where)
    assert score["class_share"] >= 0.99, score
    assert score["phase_share"] >= 0.99, score


def test_a_release_of_one_gradient_per_older_block_says_there_is_no_state():
    """Plain SGD (no momentum) on a deep MLP of equal layers, recorded without stacks for its dump's step
    (tests/fixtures/composition_late, H200): zero_grad released one gradient per weight, and the older blocks
    hold one of each size, so no older block is optimizer state, though each size comes in an even count (a
    weight and one state tensor would fit it too: 40.9% of live bytes in class when that was read)."""
    late = HERE / "composition_late"
    job = late / "late_mlp_sgdplain_fwd_none_dumpstep"
    classes = block_classes(_snap(job / "snapshot.pickle.gz"))
    assert fr.OPTIMIZER_STATE not in {bc.cls for bc in classes.values()}
    assert _scored(job.name, where=late)["class_share"] >= 0.73


def test_weights_whose_gradient_was_not_released_are_frozen_and_keep_no_state():
    """A LoRA fine-tune with AdamW recorded for its dump's step, its stacks removed (tests/fixtures/
    composition_fresh, H200): zero_grad released the adapters' gradients only; the frozen base's weights,
    older than the trace in counts that three divide, are parameters with no state (97.5% of live bytes
    in class when they were split as if each kept two moments)."""
    job = FRESH / "fresh_lora_adamw_fwd_all_dumpstep"
    truth = json.loads((job / "truth.json").read_text())
    snap = _snap(job / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    classes = block_classes(snap)
    base = [(a, n) for a, n, _l, c, _p in truth["blocks"] if c == "parameters" and n >= MiB]
    assert base and {classes[a].cls for a, _n in base} == {fr.PARAMETERS}
    assert _scored(job.name, strip=True, where=FRESH)["class_share"] >= 0.99


def test_blocks_older_than_a_trace_without_stacks_are_read_by_their_layout():
    """A deep GPT's bf16 OOM in forward recorded in a ring that wrapped, its stacks removed (tests/fixtures/
    composition_late, H200): the trace says nothing of the blocks older than it (it opens mid-step, no
    release of gradients), so they are read by their layout as with no trace at all, and say so."""
    job = HERE / "composition_late" / "late_deep_bf16_oom_fwd_py_ring"
    snap = _snap(job / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    classes = block_classes(snap)
    laid = [bc for bc in classes.values() if bc.source == pv.LAYOUT_BEFORE_TRACE]
    assert {bc.cls for bc in laid} >= {fr.PARAMETERS, fr.OPTIMIZER_STATE}
    _, sites = pv.composition(snap)
    assert any(s["site"].startswith("<made before a trace without stacks") for s in sites[fr.PARAMETERS])
    assert pv.origin(pv.LAYOUT_BEFORE_TRACE) == pv.LAYOUT
    assert _scored(job.name, strip=True, where=HERE / "composition_late")["class_share"] >= 0.8


@pytest.mark.parametrize("job, grads", [("fresh_wide_adafactor_bwd_all_dumpstep", True),
                                        ("fresh_lora_adamw_fwd_all_dumpstep", False)])
def test_without_stacks_a_parameter_sized_block_is_a_gradient_only_after_the_most_live_bytes(job, grads):
    """Two captures recorded for their dump's step only, their stacks removed: dumped in backward (a wide
    GPT with Adafactor), the weight-sized blocks made after the step's most live bytes are its gradients
    (96% of live bytes in class); dumped in forward (a LoRA fine-tune), the forward's blocks of a weight's
    shape are made before that and none is called a gradient: they are the training step's activations
    (the trace opens with zero_grad releasing gradients of the parameters' sizes), 99% of live bytes."""
    path = HERE / "composition_fresh" / job
    truth = json.loads((path / "truth.json").read_text())
    snap = _snap(path / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    classes = block_classes(snap)
    named = {classes[a].cls for a, _n, _l, _c, _p in truth["blocks"]}
    assert (fr.GRADIENTS in named) == grads
    score = _scored(job, strip=True, where=FRESH)
    assert score["class_share"] >= (0.95 if grads else 0.99), score


@pytest.mark.parametrize("where, job, strip", [("composition_fresh", "fresh_cnn_sgd_step_py_start", True),
                                               ("composition_h200", "inbwd_eager_bf16_none_start", False)])
def test_without_stacks_the_last_steps_gradients_made_before_its_most_live_bytes(where, job, strip):
    """The last step's gradients, read from a trace without stacks: a ConvNet's backward peaks after its
    first gradients (a cuDNN workspace of the backward's own), so five of them were made before the step's
    most live bytes; its backward is over (of what the step made before, only its inputs are live), so they
    are gradients too (91.4% before, 100% now). A GPT dumped inside its backward still holds the activations
    its forward saved: nothing made before the most live bytes is taken for a gradient there."""
    score = _scored(job, strip=strip, where=HERE / where)
    assert score["class_share"] >= (0.99 if strip else 0.98), score


def test_without_stacks_a_lora_jobs_gradients_are_of_the_sizes_its_optimizer_keeps_state_for():
    """A LoRA fine-tune of the fresh H200 set, out of memory in a later step, its stacks removed: only the
    adapters have AdamW state, so only their sizes are a gradient's (the frozen base's 64 MiB weight shape
    is also its forward's activations' shape: 0.13 GiB of them read as gradients before), and the steps are
    told by zero_grad releasing the adapters' gradients (the forward's activations read as made in backward
    before: phase 36.5%)."""
    score = _scored("fresh_lora_bf16_oom_bwd_py_start", strip=True, where=FRESH)
    assert score["class_share"] >= 0.99, score
    assert score["phase_share"] >= 0.9, score


def test_without_stacks_gradients_kept_since_the_first_backward_end_their_step_at_its_state():
    """Gradients kept since the first backward (zero_grad(set_to_none=False)) are the first step's: that step's
    optimizer stretch ends where its state was made, not at the trace's end (the later steps' forwards and
    backwards are no optimizer step), so more of the ConvNet's live bytes have their phase right."""
    snap = _snap(HERE / "composition_fresh" / "fresh_cnn_sgd_keepgrad_bwd_none_start" / "snapshot.pickle.gz")
    order = pv._order(snap)
    state_end = max(i for i, (cls, _src) in order.made.items() if cls == fr.OPTIMIZER_STATE)
    assert order.optimizer and max(b for _a, b in order.optimizer) <= state_end
    assert _scored("fresh_cnn_sgd_keepgrad_bwd_none_start", where=FRESH)["phase_share"] >= 0.99


def test_without_stacks_a_later_steps_most_live_bytes_begin_its_backward_unless_the_optimizers():
    """A trace without stacks whose gradients are kept since the first backward: later steps make no gradient,
    so their backward is not told by one. The trace's most live bytes, after the first step, are where a
    backward begins (its forward has saved everything), unless they are the optimizer's temporaries: blocks
    of a parameter's size made in a row."""
    base = 1 << 34
    weights = [(base, 40 * MiB, []), (base + 64 * MiB, 50 * MiB, [])]
    grads = [(base + 128 * MiB, 40 * MiB, []), (base + 192 * MiB, 50 * MiB, [])]
    s0 = base + 256 * MiB
    state = [(s0 + k * 64 * MiB, n * MiB, []) for k, n in enumerate((40, 40, 50, 50))]
    first = _made(weights) + _tmp(4) + FORWARD + _made(grads, gap=2) + _tmp(1) + _made(state) + _tmp(2)
    later_fwd = _tmp(1, tag=1 << 41, size=512 * MiB)  # a later step's saved activations, the most live bytes
    foreach = []  # the optimizer's temporaries, one per parameter, in a row, above those
    for k, n in enumerate((40, 50)):
        foreach.append(_ev("alloc", (1 << 36) + k * 64 * MiB, n * MiB, []))
    foreach += [_ev(a, (1 << 36) + k * 64 * MiB, n * MiB, []) for k, n in enumerate((40, 50))
                for a in ("free_requested", "free_completed")]
    live = weights + grads + state
    for tail, want in ((later_fwd + _tmp(1), "backward"),
                       (_tmp(1, tag=1 << 42, size=64 * MiB) + foreach + _tmp(1), "optimizer_step")):
        snap = _job(live, first + tail)
        top = max(range(len(snap.trace)), key=lambda i: sum(
            ev[2] if ev[0] == "alloc" else -ev[2] if ev[0] == "free_completed" else 0 for ev in snap.trace[:i + 1]))
        assert top >= len(first), want
        assert pv.entry_phase(snap, top) == want


@pytest.mark.parametrize("path, share", [("captured/dynamic_settings/expandable_segments/epoch0.pickle.gz", 1.0),
                                         ("real/seed_sgd/epoch0.pickle.gz", 0.93)])
def test_the_age_of_blocks_from_their_addresses_puts_a_parameter_before_its_state(path, share):
    """Blocks older than a trace are told apart by age alone: the oldest of a parameter and its state is the
    parameter. Oldest first is the highest run of segments mapped back to back, each run upward (a model loads
    upward into one stretch; a segment is cut from its start; an expandable segment grows upward). Where the
    frames say which block is the parameter, that order puts the parameter first for all of the bytes of a job
    on expandable segments (the highest address first: none) and 94% of a job on fixed ones (as before)."""
    snap = _snap(HERE / path)
    age = pv._age_order(snap)
    groups: dict = {}
    for seg in snap.segments:
        for b in seg.blocks:
            if b.is_live and b.frames and fr.categorize(b.frames) in (fr.PARAMETERS, fr.OPTIMIZER_STATE):
                groups.setdefault(pv.tensor_size(b), []).append(b)
    first = total = 0
    for size, group in groups.items():
        n = sum(fr.categorize(b.frames) == fr.PARAMETERS for b in group)
        if 0 < n < len(group):
            first += size * sum(fr.categorize(b.frames) == fr.PARAMETERS for b in sorted(group, key=age)[:n])
            total += size * n
    assert total >= 400 * MiB and first >= share * total, (first, total)


@pytest.mark.parametrize("job", ["fresh_cnn_sgd_fwd_all_dumpstep", "fresh_small_adagrad_step_py_dumpstep"])
def test_history_begun_at_the_dumps_step_splits_a_parameter_from_its_one_state_tensor_by_age(job):
    """SGD's momentum and Adagrad's sum, one state tensor per parameter, older than a trace begun at the dump's
    step (tests/fixtures/composition_fresh, H200): the Adagrad job made its sums right after its weights, in
    the segments above them, and the ConvNet its momentum in a segment just above its weights'. Oldest first
    by `_age_order`, the parameters are told from their state (92.8% and 45.1% of live bytes in class when the
    highest address was taken for the oldest)."""
    assert _scored(job, where=FRESH)["class_share"] >= 0.95


def test_a_dump_steps_parameters_kept_gradients_and_momentum_older_than_its_trace():
    """A tied-embedding GPT trained by SGD with momentum and zero_grad(set_to_none=False), its history begun at
    the dump's step (tests/fixtures/composition_fresh, H200): every parameter, its kept gradient and its
    momentum are older than the trace, and no optimizer code allocates in it. Three blocks per parameter's
    size: the parameters (oldest, the top run) read right; which of the other two is the gradient and which
    the momentum, both made into the segments the first step's activations left, is read by age, about half
    right (5.8% of live bytes in class before, all three swapped)."""
    job = HERE / "composition_fresh" / "fresh_tied_sgd_keepgrad_step_all_dumpstep"
    truth = json.loads((job / "truth.json").read_text())
    classes = block_classes(_snap(job / "snapshot.pickle.gz"))
    params = [(a, n) for a, n, _l, c, _p in truth["blocks"] if c == "parameters"]
    assert sum(n for a, n in params if classes[a].cls == fr.PARAMETERS) >= 0.95 * sum(n for _a, n in params)
    assert _scored(job.name, where=FRESH)["class_share"] >= 0.6


def test_without_stacks_an_inference_traces_blocks_are_not_a_training_steps_activations():
    """Generation with a cache grown by concatenation, recorded in a ring that wrapped, its stacks removed
    (tests/fixtures/composition_fresh, H200): nothing says a training step ran (no gradient, no optimizer
    state, no zero_grad releasing gradients at the trace's start), so what the trace made stays unknown
    rather than a forward's activations: the cache's blocks among it are the weights' class."""
    path = HERE / "composition_fresh" / "fresh_tied_infer_dyn_bf16_py_ring"
    truth = json.loads((path / "truth.json").read_text())
    snap = _snap(path / "snapshot.pickle.gz")
    _truth_bench().strip_frames(snap)
    classes = block_classes(snap)
    made = [a for a, _n, _l, c, _p in truth["blocks"] if c == "parameters" and classes[a].event >= 0]
    assert made and fr.ACTIVATIONS not in {classes[a].cls for a in made}


def test_zero_grad_releasing_gradients_is_the_traces_first_run_of_frees_it_did_not_make():
    """A trace without stacks shows a training step where its first run of frees of blocks it did not make (no
    allocation between them) holds two or more of the parameters' sizes: zero_grad releasing the last step's
    gradients as a step begins. One such free is not enough, and two in a later run (a ring that began in a
    backward freeing what its forward saved) are not that."""
    sizes = {4 * MiB, 8 * MiB}
    old = [_ev("free_requested", (1 << 30) + k * 16 * MiB, n, []) for k, n in enumerate((4 * MiB, 8 * MiB))]
    made = [_ev("alloc", 1 << 36, 2 * MiB, []), _ev("free_requested", 1 << 36, 2 * MiB, [])]
    other = _ev("free_requested", (1 << 31), 3 * MiB, [])
    assert pv._releases_gradients(made + old + made, sizes)
    assert pv._releases_gradients([old[0], other, old[1]], sizes)  # other frees between them: one run still
    assert not pv._releases_gradients(made + old[:1] + made, sizes)
    assert not pv._releases_gradients([other] + made + old, sizes)  # the first run held none of those sizes


def _truth_bench():
    """benchmarks/composition_truth.py: the one scorer against a capture's truth, and the one way to strip a
    snapshot's stacks."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import composition_truth

    return composition_truth


def _scored(job: str, strip: bool = False, where: Path = H200) -> dict:
    """The share of a capture's live bytes in the right class and allocation phase, as the benchmark scores it
    (no roles; `strip`: every stack removed first); `where`: its capture set."""
    return _truth_bench().score_gpu(where / job, with_roles=False, strip=strip)


@pytest.mark.parametrize("job", ["fwd_eager_fp32_py_start", "oom_fwd_eager_fp32_py_start", "full_eager_fp32_py_sgd",
                                 "fwd_eager_fp32_py_accum", "infer_bf16_py_start", "infer_beam_bf16_py_start",
                                 "infer_eval_bf16_py_start", "infer_dyn_bf16_py_start"])
def test_h200_captures_from_the_start_read_by_their_order_once_their_stacks_are_gone(job):
    """Captures recorded from the job's start with stacks, read with every stack removed (what a recording
    without stacks holds), none of them used to set the order's rules: dumped after forward, at an OOM
    in forward, SGD with momentum, gradient accumulation with gradients kept across steps; generation
    with a static cache, beam search, and an evaluation loop keeping every call's output. At least 97%
    of live bytes in the right class and allocation phase."""
    score = _scored(job, strip=True)
    assert score["class_share"] >= 0.97, score
    assert score["phase_share"] >= 0.97, score


def test_without_stacks_the_agents_roles_still_come_first():
    """The generation recorded without stacks, with the roles the agent sent: the weights are known from
    the job; without the cache the job declared, the trace's order still reads the cache (pairs of one
    size kept with the weights), and no block the job did not name is called a weight, gradient or state."""
    from memq.model import AGENT_ROLES

    job = H200 / "infer_dyn_bf16_none_start"
    truth = json.loads((job / "truth.json").read_text())
    kv = {b[0] for b in truth["blocks"] if b[2] == "kv_cache"}
    ranges = [tuple(r) for r in truth["agent_roles"]["ranges"] if r[2] != AGENT_ROLES.index("cache")]
    snap = _with_roles(_snap(job / "snapshot.pickle.gz"), ranges)
    classes = block_classes(snap)
    weights = {b[0] for b in truth["blocks"] if b[2] == "parameter"}
    assert {classes[a].source for a in weights} == {pv.FROM_JOB}
    assert {(classes[a].cls, classes[a].source) for a in kv} == {(fr.PARAMETERS, pv.FROM_CACHE)}
    named = {(fr.PARAMETERS, pv.FROM_ORDER), (fr.GRADIENTS, pv.FROM_ORDER), (fr.OPTIMIZER_STATE, pv.FROM_ORDER)}
    assert not {(bc.cls, bc.source) for bc in classes.values()} & named


def test_without_stacks_a_workspace_sized_block_made_after_the_first_backward_is_a_tensor():
    """A thread's cuBLAS workspace is made at its first multiply: a 32 MiB block made amid short-lived ones
    before the first backward is over (its gradients, freed together by zero_grad, tell where it ended) is
    a workspace; one made so in a later step is that step's tensor."""
    base = 1 << 34
    ws = (base, 32 * MiB, [])
    weights = [(base + 64 * MiB, 40 * MiB, []), (base + 128 * MiB, 50 * MiB, [])]
    late = (base + 192 * MiB, 32 * MiB, [])
    g = [((1 << 33) + k * 64 * MiB, n, []) for k, (_, n, _) in enumerate(weights)]  # freed by zero_grad
    zero_grad = [_ev(a, addr, n, []) for addr, n, _ in g for a in ("free_requested", "free_completed")]
    trace = _tmp(1) + _made([ws]) + _tmp(1) + _made(weights) + FORWARD + _made(g, gap=2) + _tmp(1) + zero_grad \
        + _tmp(1, tag=1 << 41, size=256 * MiB) + _tmp(1) + _made([late]) + _tmp(1)
    snap = _job([ws] + weights + [late], trace)
    classes = block_classes(snap)
    assert (classes[ws[0]].cls, classes[late[0]].cls) == (fr.WORKSPACE_CAT, fr.ACTIVATIONS)
    assert pv._order(snap).backward  # the step was read from zero_grad's frees


def test_without_stacks_the_timeline_draws_every_step_by_the_trace_order():
    """The snapshot page's category timeline of the training step recorded without stacks: nothing is
    drawn unknown; each earlier step's gradients (released together by zero_grad) are drawn as gradients
    while they lived, the optimizer's temporaries with its state, the rest as the step's activations."""
    from memq.web.snapshot_view import _Stacks, category_timeline

    snap = _snap(H200 / "full_eager_fp32_none_start" / "snapshot.pickle.gz")
    tl = category_timeline(snap, _Stacks(), 0)
    cats = tl["categories"]
    col = {c: [row[cats.index(c)] for row in tl["levels"]] for c in cats}
    assert max(col[fr.UNKNOWN]) == 0
    grads = col[fr.GRADIENTS]
    # the gradients rise in each backward and fall at zero_grad: at least two falls before the dump
    high = [g > 300 * MiB for g in grads if g > 300 * MiB or g < 100 * MiB]  # full, or released
    falls = sum(1 for a, b in zip(high, high[1:], strict=False) if a and not b)
    assert falls >= 2, falls
    assert max(col[fr.ACTIVATIONS]) > GiB


def test_without_stacks_fused_adams_step_tensors_sit_between_the_pairs():
    """Fused (or capturable) Adam makes a small step tensor on the GPU before each parameter's two moments:
    the pairs are still adjacent blocks of one size, so the run is the state, step tensors with it."""
    base = 1 << 34
    weights = [(base, 40 * MiB, []), (base + 64 * MiB, 50 * MiB, [])]
    grads = [(base + 128 * MiB, 40 * MiB, []), (base + 192 * MiB, 50 * MiB, [])]
    s0 = base + 256 * MiB
    state = [(s0, 512, []), (s0 + MiB, 40 * MiB, []), (s0 + 64 * MiB, 40 * MiB, []),
             (s0 + 128 * MiB, 512, []), (s0 + 129 * MiB, 50 * MiB, []), (s0 + 192 * MiB, 50 * MiB, [])]
    trace = _made(weights) + _tmp(4) + FORWARD + _made(grads, gap=2) + _tmp(1) + _made(state) + _tmp(2)
    classes = block_classes(_job(weights + grads + state, trace))
    assert {classes[a].cls for a, _, _ in state} == {fr.OPTIMIZER_STATE}
    assert {classes[a].cls for a, _, _ in weights} == {fr.PARAMETERS}
    assert {classes[a].cls for a, _, _ in grads} == {fr.GRADIENTS}


# -- a model built in the trace, a hand-written optimizer, the torch 2.0 layout ---------------------------

INIT = [{"filename": "/app/layers.py", "name": "__init__", "line": 3},
        {"filename": "/app/model.py", "name": "__init__", "line": 9},
        {"filename": "/app/train.py", "name": "main", "line": 40}]
CALL = [{"filename": "/x/torch/nn/modules/module.py", "name": "_call_impl", "line": 1}]


def test_what_the_models_constructors_made_is_parameters():
    """A trace begun before the model was made: its own modules' `__init__` (not torch's) made the
    weights, outside any forward call, before the first one. Still live, they are parameters (from their
    frames), not the forward's outputs, also where a function named for the optimizer called the
    constructor (Megatron's `setup_model_and_optimizer`). A block made by an `__init__` inside a forward
    call, by an optimizer's constructor, or by a constructor after the first forward (a batch object
    moving its tensors to the GPU in the training loop) is not."""
    base = 1 << 36
    w, setup, in_fwd, opt, act, batch = (base + k * 64 * MiB for k in range(6))
    fwd_init = INIT[:1] + CALL
    opt_init = [{"filename": "/app/my_optimizer.py", "name": "__init__", "line": 5}] + INIT[2:]
    by_setup = INIT[:2] + [{"filename": "/app/train.py", "name": "setup_model_and_optimizer", "line": 7}]
    batch_init = [{"filename": "/app/data.py", "name": "__init__", "line": 5}] + INIT[2:]
    live = [(w, 32 * MiB, INIT), (setup, 8 * MiB, by_setup), (in_fwd, 4 * MiB, fwd_init),
            (opt, 32 * MiB, opt_init), (act, 2 * MiB, FWD), (batch, MiB, batch_init)]
    trace = [_ev("alloc", a, n, f) for a, n, f in live]
    classes = block_classes(_synthetic(live, trace))
    assert (classes[w].cls, classes[w].source) == (fr.PARAMETERS, pv.FROM_FRAMES)
    assert classes[setup].cls == fr.PARAMETERS
    assert classes[in_fwd].cls == fr.ACTIVATIONS and classes[opt].cls != fr.PARAMETERS
    assert classes[act].cls == fr.ACTIVATIONS and classes[batch].cls == fr.ACTIVATIONS


def test_a_torch_2_0_block_made_by_the_engines_constructor_is_a_parameter():
    """torch 2.0 layout: no trace, each block carries its own history's frames. An inference engine's
    weights, allocated under its `__init__` by weight initialisers, are parameters; a block made by its
    generation loop stays what its frames say (`other`)."""
    base = 1 << 36
    engine = [{"filename": "/app/backend.py", "name": "allocate", "line": 1},
              {"filename": "/app/engine.py", "name": "init_weight_list", "line": 2},
              {"filename": "/app/engine.py", "name": "init_all_weights", "line": 3},
              {"filename": "/app/engine.py", "name": "__init__", "line": 4}]
    mask = [{"filename": "/app/engine.py", "name": "update_attention_mask", "line": 7},
            {"filename": "/app/engine.py", "name": "generate", "line": 8}]
    live = [(base, 32 * MiB, engine), (base + 64 * MiB, 4096, mask)]
    classes = block_classes(_synthetic(live, []))
    assert (classes[base].cls, classes[base].source) == (fr.PARAMETERS, pv.FROM_FRAMES)
    assert classes[base + 64 * MiB].cls == fr.OTHER


STEP = [{"filename": "/app/optimizer.py", "name": "step", "line": 0},
        {"filename": "/x/torch/optim/optimizer.py", "name": "wrapper", "line": 493}]


_SITES = {line: [dict(STEP[0], line=line)] + STEP[1:] for line in (51, 56, 64)}  # one list per stack


def _step_site(line: int) -> list:
    return _SITES[line]


def _rebinding_step(sizes: list[int], rebind: bool = True):
    """A hand-written Adam's step after a backward whose gradients stayed live: per parameter it makes
    new m and v (sites 51, 56) in place of the old, and, with `rebind`, a new parameter (site 64) in
    place of the old one (`p.data = p.data - ...`). Returns (snapshot, {role: [addresses]})."""
    base = 1 << 36
    nxt = [base]

    def new(n):  # each block 64 MiB apart
        nxt[0] += 64 * MiB
        return nxt[0]

    bwd = [{"filename": "/x/torch/autograd/graph.py", "name": "_engine_run_backward", "line": 1}]
    roles: dict = {"param": [], "m": [], "v": [], "grad": []}
    old = {(role, i): new(n) for i, n in enumerate(sizes) for role in ("param", "m", "v")}
    trace = [_ev("alloc", a, sizes[i], _step_site(51 if r == "m" else 56 if r == "v" else 64) if r != "param"
                 else INIT) for (r, i), a in old.items()]
    for n in sizes:
        a = new(n)
        trace.append(_ev("alloc", a, n, bwd))
        roles["grad"].append(a)
    for i, n in enumerate(sizes):
        for role, line in (("m", 51), ("v", 56)) + ((("param", 64),) if rebind else ()):
            a = new(n)
            site = _step_site(line)
            trace += [_ev("alloc", a, n, site), _ev("free_requested", old[(role, i)], n, site),
                      _ev("free_completed", old[(role, i)], n, site)]
            roles[role].append(a)
        if not rebind:
            roles["param"].append(old[("param", i)])
    live = [(a, sizes[i], []) for role, addrs in roles.items() for i, a in enumerate(addrs)]
    frames_of = {ev.addr: ev.frames for ev in trace if ev.action == "alloc"}
    return _synthetic([(a, n, frames_of[a]) for a, n, _ in live], trace), roles


def test_parameters_a_handwritten_optimizer_rebinds_are_parameters():
    """`p.data = p.data - lr * update` in a hand-written Adam: the step makes three blocks per parameter
    (m, v, then the new parameter, freeing the old). The last site, one block per gradient, each
    replacing an older block of its size, where no other block is a parameter of that size: parameters
    (source `rebound`), made in the optimizer step. Without the rebinding the parameters are the blocks
    the constructor made, and the step's blocks stay state."""
    snap, roles = _rebinding_step([4 * MiB, 4 * MiB, 2 * MiB])
    classes = block_classes(snap)
    assert {(classes[a].cls, classes[a].source) for a in roles["param"]} == {(fr.PARAMETERS, pv.FROM_REBOUND)}
    assert {classes[a].cls for a in roles["m"] + roles["v"]} == {fr.OPTIMIZER_STATE}
    assert {classes[a].cls for a in roles["grad"]} == {fr.GRADIENTS}
    assert "rebinds" in pv.SOURCE_WORDS[pv.FROM_REBOUND]
    snap, roles = _rebinding_step([4 * MiB, 4 * MiB, 2 * MiB], rebind=False)
    classes = block_classes(snap)
    assert {(classes[a].cls, classes[a].source) for a in roles["param"]} == {(fr.PARAMETERS, pv.FROM_FRAMES)}
    assert {classes[a].cls for a in roles["m"] + roles["v"]} == {fr.OPTIMIZER_STATE}


def test_a_first_step_that_replaces_nothing_rebinds_no_parameter():
    """The same three sites, but nothing older of those sizes is freed in the step (a first step making
    three state tensors per parameter, the parameters not in the snapshot): no parameter is read from it."""
    snap, roles = _rebinding_step([4 * MiB, 2 * MiB])
    snap.traces[snap.trace_device] = [ev for ev in snap.trace if not (
        ev.action.startswith("free") and ev.frames and ev.frames[0]["name"] == "step")]
    snap.memo.clear()
    classes = block_classes(snap)
    assert fr.PARAMETERS not in {classes[a].cls for a in roles["param"]}


@rule("STATE_SPLIT_SHARE")
def test_kept_gradients_and_one_state_tensor_each_older_than_the_trace_with_no_optimizer_seen():
    """A trace from a step's start whose backward made no gradient (it accumulated into ones kept since an
    earlier step) and in which no optimizer code allocated (SGD's foreach step works in place): the blocks older
    than it may be each parameter, its kept gradient and one state tensor. Where nine tenths of their bytes
    come in even numbers of blocks of one size, a parameter and its gradient explain them, and no state is read
    (a forward and backward that keep their gradients, no optimizer): six 10 MiB blocks and three of 2 MiB,
    60 / 66 MiB. With three of 2.5 MiB (60 / 67.5: 88.9%), threes explain them: each three, oldest first, a
    parameter, its gradient and its state."""
    base = 1 << 40
    bwd = [{"filename": "/x/torch/autograd/graph.py", "name": "_engine_run_backward", "line": 1}]
    act = base + 4096 * MiB
    trace = [_ev("alloc", act, 2 * MiB), _ev("alloc", act + 8 * MiB, 3 * MiB, bwd),
             _ev("free_requested", act + 8 * MiB, 3 * MiB, bwd)]
    for small, want_state in ((2 * MiB, False), (5 * MiB // 2, True)):
        six = [(base - (k + 1) * 64 * MiB, 10 * MiB, []) for k in range(6)]  # the highest first: the oldest
        three = [(base - 1024 * MiB - (k + 1) * 64 * MiB, small, []) for k in range(3)]
        snap = _own_segments(six + three + [(act, 2 * MiB, FWD)], trace)
        classes = block_classes(snap)
        got = [classes[a].cls for a, _, _ in six]
        if want_state:
            assert got == [fr.PARAMETERS] * 2 + [fr.GRADIENTS] * 2 + [fr.OPTIMIZER_STATE] * 2, got
            assert [classes[a].cls for a, _, _ in three] == [fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE]
        else:
            assert fr.OPTIMIZER_STATE not in got and set(got) == {fr.PARAMETERS, fr.GRADIENTS}, got


@rule("STATE_COUNT_SHARE")
def test_a_handwritten_optimizers_state_per_parameter_from_the_counts():
    """A hand-written AdamW (frames name no torch optimizer) makes new moments in the recorded step; the
    parameters and their gradients, kept from warm-up and accumulated into by the recorded backward
    (which made fresh gradients and freed them), are older than the trace, two blocks per size per
    parameter. Where 90% of the state's bytes are in sizes with two state blocks per pair of older
    blocks, one of each pair is the parameter and the other its gradient; at 89% no count is trusted and
    each state block implies a parameter of its own (the gradients read as parameters), as where the
    backward made no block of those sizes (nothing says the gradients are among the older blocks)."""
    base = 1 << 40
    bwd = [{"filename": "/x/torch/autograd/graph.py", "name": "_engine_run_backward", "line": 1}]
    for odd_mib, want_grads, fresh_size in ((10, True, 9 * MiB), (11, False, 9 * MiB), (10, False, 3 * MiB)):
        fit = [9 * MiB, 9 * MiB, 9 * MiB, 9 * MiB, 9 * MiB]  # 5 parameters: 90 MiB of state
        older = [(base - (k + 1) * 64 * MiB, n, []) for k, n in enumerate(fit + fit)]
        # a size whose state blocks do not pair with the older ones: 2 state blocks, 3 older blocks
        lone = odd_mib * MiB // 2
        older += [(base - 2048 * MiB - k * 64 * MiB, lone, []) for k in range(3)]
        state = [(base + (k + 1) * 64 * MiB, n, STEP) for k, n in enumerate(fit + fit + [lone, lone])]
        fresh = base + 4096 * MiB
        trace = [_ev("alloc", fresh, fresh_size, bwd), _ev("free_requested", fresh, fresh_size, bwd)] + \
            [_ev("alloc", a, n, f) for a, n, f in state]
        snap = _synthetic(older + state, trace)
        classes = block_classes(snap)
        got = Counter(classes[a].cls for a, n, _ in older if n == 9 * MiB)
        if want_grads:  # 90 / (90 + 10): k = 2
            assert got == {fr.PARAMETERS: 5, fr.GRADIENTS: 5}, got
        else:  # 90 / (90 + 11) < 90%, or no fresh gradient of those sizes: one parameter per state block
            assert got == {fr.PARAMETERS: 10}, got


def _class_bytes(snap) -> Counter:
    classes = block_classes(snap)
    out = Counter()
    for seg in snap.segments:
        for b in seg.blocks:
            if b.is_live:
                out[classes[b.address].cls] += b.size
    return out


@pytest.mark.parametrize("name", ["cs336_d512_forward_ctx200", "cs336_d512_forward_ctx200_bf16",
                                  "cs336_d512_3steps_ctx100", "cs336_d512_3steps_ctx200_bf16",
                                  "cs336_gpt2small_compiled_fullstep", "flexgen_opt6.7b_oom",
                                  "flexgen_opt1.3b_int4_after_generate"])
def test_public_snapshots_of_models_built_in_the_trace_hand_written_optimizers_and_torch_2_0(name):
    """Published snapshots, each read right by one rule: a model whose constructors ran in the trace
    (d512 forward), parameters a hand-written Adam rebinds (d512 3 steps), a hand-written AdamW's state
    per parameter from the counts, with the warm-up's gradients older than the trace (GPT-2 small
    compiled), and an inference engine's weights in the torch 2.0 layout (FlexGen). At least 95% of the
    live bytes in the class their source states, each class within 4% of it (the truth counts tensor
    bytes; the allocator rounds a 19.5 MiB tensor into a 20 MiB block)."""
    t = TRUTH[name]
    snap = _snap(Path(__file__).resolve().parent.parent.parent / t["path"])
    comp = _class_bytes(snap)
    live = sum(comp.values())
    assert _right_share(comp, t, live) >= 0.95
    for cls in (fr.PARAMETERS, fr.GRADIENTS, fr.OPTIMIZER_STATE):
        assert comp[cls] == pytest.approx(t.get(cls, 0), rel=0.04, abs=MiB), cls  # blocks round tensors up


def test_the_segment_map_says_a_rebound_parameter_came_from_the_step():
    """The snapshot page's segment map gives each block its source, and the page the words for it: the
    rebound parameters of the hand-written Adam say so."""
    snap = _snap(PUB / "cs336_d512_3steps_ctx100.pickle.gz")
    out = analyze([snap])
    view = snapshot_view(snap, out, title="t")
    got = Counter((b["c"], b["v"]) for seg in view["segments"] for b in seg["blocks"] if b["c"])
    assert got[(fr.PARAMETERS, pv.FROM_REBOUND)] == 39
    assert view["source_words"][pv.FROM_REBOUND].startswith("inferred from the trace: made by the optimizer step")
    assert out["details"]["composition_origin"]["parameters"] == {pv.INFERRED: out["composition"]["parameters"]}


def test_a_windows_path_reads_as_torchs_own():
    """A job run on Windows records `C:\\...\\torch\\nn\\modules\\module.py`: the rules read torch's paths
    with "/" (the DeComFL file's `model.to(device)` was an inference cache before, not the parameters)."""
    convert = [{"filename": "C:\\Python311\\Lib\\site-packages\\torch\\nn\\modules\\module.py", "name": "convert",
                "line": 1}]
    adam = [{"filename": "C:\\Python311\\Lib\\site-packages\\torch\\optim\\adam.py", "name": "_init_group",
             "line": 1}]
    assert fr.categorize(convert) == fr.PARAMETERS
    assert fr.categorize(adam) == fr.OPTIMIZER_STATE
    assert fr.is_optimizer(adam)
    assert convert[0]["filename"].startswith("C:\\")  # read, not rewritten


def test_a_zeroth_order_estimators_per_parameter_state_is_optimizer_state():
    """The published DeComFL file: zeroth-order fine-tuning of OPT-125M, forwards only under no_grad, and a
    gradient estimator that keeps one fp32 tensor per parameter (Adam's second moment) made by its own
    code, not torch.optim's. Read as an inference cache (49.4% of bytes right) before; now the model and
    that state each in their class, and the estimator's entries are the optimizer step's."""
    name = "decomfl_opt125m_zo_adam_forward"
    t = TRUTH[name]
    snap = _snap(Path(__file__).resolve().parent.parent.parent / t["path"])
    comp, _ = pv.composition(snap)
    live = sum(b.size for seg in snap.segments for b in seg.blocks if b.is_live)
    assert _right_share(comp, t, live) >= 0.98
    assert comp[fr.OPTIMIZER_STATE] == pytest.approx(t["optimizer_state"], rel=0.01)
    classes = block_classes(snap)
    model = sum(b.requested_size for seg in snap.segments for b in seg.blocks
                if b.is_live and classes[b.address] == (fr.PARAMETERS, pv.FROM_FRAMES, classes[b.address].event))
    assert model == t["parameters"]  # the model's own 196 tensors, from `Module.to`'s frames
    state = [bc for bc in classes.values() if bc.cls == fr.OPTIMIZER_STATE]
    assert len(state) == 196 and {bc.source for bc in state} == {pv.FROM_PER_PARAM}
    assert {pv.entry_phase(snap, bc.event) for bc in state} == {fr.PHASE_OPTIMIZER}
    # one truth per screen: the timeline's peak, made by that code, is in the optimizer step too
    assert analyze([snap])["details"]["timeline"]["peak_phase"].startswith(fr.PHASE_OPTIMIZER)


def _model_and_state(n_params: int, per_param: int = 1, sizes: list | None = None):
    """A model of `n_params` tensors made by `Module.to` (distinct sizes), then one line of the job's own
    code that makes `per_param` blocks of each parameter's size (or of `sizes`), then a forward."""
    convert = [{"filename": "/x/torch/nn/modules/module.py", "name": "convert", "line": 1}]
    state_site = [{"filename": "/app/zo.py", "name": "update_state", "line": 7}]
    base = 1 << 36
    params = [(base + k * 64 * MiB, (k + 1) * MiB, convert) for k in range(n_params)]
    want = sizes if sizes is not None else [n for _, n, _ in params] * per_param
    state = [(base + (1 << 32) + k * 64 * MiB, n, state_site) for k, n in enumerate(want)]
    act = (base + (1 << 33), 3 * MiB + 512, FWD)
    trace = [_ev("alloc", a, n, f) for a, n, f in params + state + [act]]
    return _synthetic(params + state + [act], trace), [a for a, _, _ in state]


@rule("PER_PARAM_STATE_MIN_TENSORS")
def test_one_line_that_makes_every_parameters_size_is_per_parameter_state():
    """PER_PARAM_STATE_MIN_TENSORS (4): a line outside the model that makes a block of each parameter's
    size, one for one, is per-parameter state where the model has 4 parameter tensors, not where it has 3
    (a few blocks sharing a tiny model's sizes are as likely its inputs and outputs)."""
    for n, want in ((3, fr.ACTIVATIONS), (4, fr.OPTIMIZER_STATE)):
        snap, state = _model_and_state(n)
        classes = block_classes(snap)
        assert {classes[a].cls for a in state} == {want}, n


def test_per_parameter_state_needs_every_parameters_size_one_for_one():
    """Two tensors per parameter from one line are state; a line that makes all but one of the sizes, or
    one size twice too many, is not."""
    snap, state = _model_and_state(6, per_param=2)
    assert {block_classes(snap)[a].cls for a in state} == {fr.OPTIMIZER_STATE}
    for sizes in ([k * MiB for k in range(1, 6)], [k * MiB for k in range(1, 7)] + [MiB]):
        snap, state = _model_and_state(6, sizes=sizes)
        assert {block_classes(snap)[a].cls for a in state} == {fr.ACTIVATIONS}, sizes


@pytest.mark.parametrize("job", sorted(p.name for p in H200.iterdir() if "_none_" in p.name))
def test_h200_captures_without_stacks_are_read_by_the_trace_order(job):
    """Every capture recorded from the start without stacks (`context=None`): training in fp32 and bf16,
    fused AdamW, SGD, torch.compile, dumped after forward, at the end of backward, inside backward, at an OOM
    in forward or in backward, and generation with a static cache, a beam search and no cache. The twelve
    captured after the order reading was written (2026-12-05) read 98.6-100% of their bytes right; every
    block is said to come from the trace's order, the job's roles, or a workspace's size."""
    truth = json.loads((H200 / job / "truth.json").read_text())
    snap = _snap(H200 / job / "snapshot.pickle.gz")
    assert not any(ev.frames for ev in snap.trace)
    assert _class_share(snap, truth) >= 0.98, job
    assert {bc.source for bc in block_classes(snap).values()} <= {pv.FROM_ORDER, pv.FROM_CACHE, pv.FROM_SIZE}


FRESH = HERE / "composition_fresh"


@pytest.mark.parametrize("job", sorted(p.name for p in FRESH.iterdir() if (p / "truth.json").exists()))
def test_fresh_captures_with_the_agents_roles_read_every_byte(job):
    """The fresh judging set (tests/fixtures/composition_fresh: a CNN with SGD, RMSprop and BN, small and wide
    GPTs with Adam, Adagrad and Adafactor, an encoder-decoder, tied embeddings, a LoRA fine-tune; stacks none,
    python and all; dumped after forward, backward and the step, at OOMs, and in generation), with the roles
    the agent sent: at least 97.5% of live bytes in their class (97.996-100% when judged, after the fix of
    cuDNN's outputs below; the least, a ring buffer's RMSprop step, leaves a few MiB of outputs `other`)."""
    truth = json.loads((FRESH / job / "truth.json").read_text())
    if not isinstance((truth.get("agent_roles") or {}).get("ranges"), list):
        pytest.fail(f"{job}: the capture holds no roles")
    snap = _with_roles(_snap(FRESH / job / "snapshot.pickle.gz"), truth["agent_roles"]["ranges"])
    assert _class_share(snap, truth) >= 0.975, job


LATE = HERE / "composition_late"
LATE_JOBS = sorted(p.name for p in LATE.iterdir() if (p / "truth.json").exists())


@pytest.mark.parametrize("job", LATE_JOBS)
def test_late_captures_with_the_agents_roles_read_every_byte(job):
    """The late judging set (tests/fixtures/composition_late: a ViT, an LSTM language model whose cuDNN
    weights share one flat buffer, a deep MLP, a deeper GPT; NAdam, RAdam, Adamax, SGD without momentum, AdamW
    without foreach; judged once, as captured), with the roles the agent sent: at least 99% of live bytes in
    their class (99.6-100% when judged)."""
    truth = json.loads((LATE / job / "truth.json").read_text())
    if not isinstance((truth.get("agent_roles") or {}).get("ranges"), list):
        pytest.fail(f"{job}: the capture holds no roles")
    snap = _with_roles(_snap(LATE / job / "snapshot.pickle.gz"), truth["agent_roles"]["ranges"])
    assert _class_share(snap, truth) >= 0.99, job


@pytest.mark.parametrize("job", [j for j in LATE_JOBS if "_start" in j and "_none_" not in j])
def test_late_captures_recorded_from_the_start_with_stacks_need_no_roles(job):
    """The late set's jobs recorded from their start with Python or all stacks (as `_record_memory_history()`
    at a job's start, or the agent's warm-up): at least 99% of live bytes in their class from the trace alone,
    no roles (99.6-100% when judged)."""
    truth = json.loads((LATE / job / "truth.json").read_text())
    assert truth["spec"]["record"] == "start" and truth["spec"]["stacks"] in ("python", "all")
    assert _class_share(_snap(LATE / job / "snapshot.pickle.gz"), truth) >= 0.99, job


def test_an_lstms_flat_weights_older_than_the_trace_are_its_parameters():
    """The late set's LSTM language model trained by Adamax, recorded from the dump's step (Python stacks):
    cuDNN keeps the LSTM's eight weights as views of one 64 MiB buffer, one block, while Adamax keeps two
    tensors of each weight's own size. Judged: 80.9% of bytes right; the flat block was `unknown` and four
    16 MiB state tensors read as parameters (sizes that come in pairs, no parameter of their own). The state
    of the sizes without a parameter block adds up to the lone block exactly: that block is the parameters."""
    job = "late_lstm_adamax_fwd_py_dumpstep"
    truth = json.loads((LATE / job / "truth.json").read_text())
    snap = _snap(LATE / job / "snapshot.pickle.gz")
    classes = block_classes(snap)
    flat = [(a, n) for a, n, label, _cls, _ph in truth["blocks"] if label == "parameter" and n == 65600 * 1024]
    assert len(flat) == 1 and classes[flat[0][0]].cls == fr.PARAMETERS
    state16 = [a for a, n, label, _cls, _ph in truth["blocks"] if label == "optimizer_state" and n == 16 << 20]
    assert len(state16) == 8 and {classes[a].cls for a in state16} == {fr.OPTIMIZER_STATE}
    assert _class_share(snap, truth) >= 0.99


def test_an_lstms_flat_weights_and_sgd_momentum_made_in_a_trace_without_stacks():
    """The late set's LSTM trained by SGD with momentum and zero_grad(set_to_none=False), recorded from its
    start without stacks. cuDNN keeps the eight LSTM weights as views of one 64 MiB buffer, and their kept
    gradient as one more; SGD makes one momentum tensor of each weight's own size (four of 16 MiB, four of
    16 KiB), which no earlier block has. Judged: 10.0% of bytes right (no momentum run found: the model read
    as activations, the momentum as parameters). The momentum's blocks without a partner add up exactly to
    the flat buffer, and the run begins after the embedding's gradient, made last in the backward: 100%,
    every phase right."""
    job = "late_lstm_sgd_keepgrad_step_none_start"
    truth = json.loads((LATE / job / "truth.json").read_text())
    assert truth["spec"]["stacks"] == "none" and truth["spec"]["record"] == "start"
    snap = _snap(LATE / job / "snapshot.pickle.gz")
    classes = block_classes(snap)
    flat = 65600 * 1024
    by_label = Counter((label, n, classes[a].cls) for a, n, label, _cls, _ph in truth["blocks"])
    assert by_label[("parameter", flat, fr.PARAMETERS)] == 1 and by_label[("gradient", flat, fr.GRADIENTS)] == 1
    assert by_label[("optimizer_state", 16 << 20, fr.OPTIMIZER_STATE)] == 4
    assert by_label[("gradient", 64 << 20, fr.GRADIENTS)] == 2  # the embedding's, made last, leads the run
    assert _class_share(snap, truth) == 1.0


def test_a_flat_partner_is_one_earlier_block_of_exactly_the_rest():
    """The momentum's blocks with no earlier block of their size stand for a flat buffer only where they add
    up to an earlier kept block's size exactly, one not already matched."""
    from memq.analysis.provenance import _flat_partner, _one_per_param

    mib = 1 << 20
    assert _flat_partner(64 * mib, Counter({64 * mib: 1})) == 64 * mib
    assert _flat_partner(64 * mib + 512, Counter({64 * mib: 1})) is None  # not exactly
    assert _flat_partner(64 * mib, Counter({64 * mib: 0})) is None  # already matched
    assert _flat_partner(0, Counter({0: 1})) is None
    earlier = Counter({64 * mib: 2, 32 * mib: 2})  # a weight and its kept gradient, each of two sizes
    lead, ones, before = _one_per_param([32 * mib, 16 * mib, 16 * mib, 32 * mib], 1, earlier)
    assert (lead, sorted(ones), before[32 * mib]) == (1, [32 * mib, 32 * mib], 3)


def test_no_flat_weights_where_no_lone_block_adds_up_exactly():
    """The flat reading needs one lone block exactly as large as the parameters the unpaired state implies:
    a byte more or less, or two such blocks, and it says nothing."""
    from memq.analysis.provenance import _flat_weights

    class B:
        def __init__(self, a):
            self.address = a

    mib = 1 << 20
    groups = {16 * mib: [B(i) for i in range(8)], 64 * mib: [B(10 + i) for i in range(6)]}
    assert _flat_weights({**groups, 64 * mib + mib: [B(99)]}, 2) is None  # 4 x 16 MiB implied, not 65 MiB
    assert _flat_weights({**groups, 64 * mib + 1: [B(99)]}, 2) is None  # a byte over
    flat, state_only = _flat_weights({16 * mib: groups[16 * mib], 64 * mib: [B(99)]}, 2)
    assert flat.address == 99 and state_only == {16 * mib}
    assert _flat_weights({16 * mib: groups[16 * mib], 64 * mib: [B(98), B(99)]}, 2) is None  # two blocks
    # a lone block is never its own state: with k = 1 every odd group would otherwise imply itself
    assert _flat_weights({64 * mib: [B(99)]}, 1) is None


def test_a_convolutions_output_made_inside_cudnn_is_no_workspace():
    """With stacks="all" a convolution's output (and batch norm's) is made by at::empty inside
    `at::native::cudnn_convolution`: the step's activations, not cuDNN's scratch (0.34 GiB of a CNN's forward
    read as workspace when the fresh set was judged: 16.3% of bytes right). Scratch asked of the allocator
    directly (run_conv_plan, setWorkspaceForHandle) still is a workspace, and so is anything NCCL makes."""
    job = "fresh_cnn_sgd_fwd_all_dumpstep"
    truth = json.loads((FRESH / job / "truth.json").read_text())
    snap = _snap(FRESH / job / "snapshot.pickle.gz")
    classes = block_classes(snap)
    acts = [(a, n) for a, n, _label, cls, _ph in truth["blocks"] if cls == fr.ACTIVATIONS]
    assert sum(n for a, n in acts if classes[a].cls == fr.ACTIVATIONS) >= 0.99 * sum(n for _, n in acts)
    conv = next(bc for bc in classes.values() if bc.event >= 0 and any(
        "cudnn_convolution" in f.get("name", "") for f in snap.trace[bc.event].frames))
    assert conv.cls == fr.ACTIVATIONS
    alloc = {"name": "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"}
    empty = {"name": "at::detail::empty_generic(c10::ArrayRef<long>, c10::Allocator*)"}
    plan = {"name": "at::native::run_conv_plan(cudnnContext*, at::Tensor const&)"}
    out = {"name": "at::native::cudnn_convolution(at::Tensor const&, at::Tensor const&)"}
    nccl = {"name": "c10d::ProcessGroupNCCL::allgather(std::vector<at::Tensor>&)"}
    assert fr.is_workspace([alloc, plan]) and not fr.is_workspace([alloc, empty, out])
    assert fr.is_workspace([alloc, empty, nccl])


def test_a_ring_that_began_mid_generation_still_reads_a_concatenated_cache():
    """The fresh set's tied-embedding model generating with a cache grown by concatenation, in a 1,500-entry
    ring that began in the middle of a forward call: the frees of the cache blocks made before the ring
    were not counted against their site, so it looked as if it held one block at a call's start and six at
    the end (a growing list, no cache): 70.9% of bytes right when judged. A free carries its allocation's
    frames, so it counts against its site: every key and value block is the cache."""
    job = "fresh_tied_infer_dyn_bf16_py_ring"
    truth = json.loads((FRESH / job / "truth.json").read_text())
    snap = _snap(FRESH / job / "snapshot.pickle.gz")
    made: set = set()
    orphans = 0  # frees of blocks the ring never saw made
    for ev in snap.trace:
        if ev.action == "alloc":
            made.add(ev.addr)
        elif ev.action == "free_requested" and ev.addr not in made:
            orphans += 1
    assert orphans >= 12
    classes = block_classes(snap)
    kv = {a for a, _n, label, _cls, _ph in truth["blocks"] if label == "kv_cache"}
    assert len(kv) == 12 and {a for a, bc in classes.items() if bc.source == pv.FROM_CACHE} == kv
    assert _class_share(snap, truth) >= 0.99


def test_beside_the_agents_roles_no_per_parameter_state_is_inferred():
    """Where the agent sent roles, the job named its optimizer state: a line that makes every parameter's
    size but that the job did not name (an EMA of the weights, a copy) is the step's, not state the frames
    or sizes would infer."""
    from memq.model import AGENT_ROLES

    snap, state = _model_and_state(4)
    params = [(b.address, b.requested_size, AGENT_ROLES.index("parameter")) for seg in snap.segments
              for b in seg.blocks if b.is_live and b.frames and b.frames[0]["name"] == "convert"]
    assert len(params) == 4
    classes = block_classes(_with_roles(snap, params))
    assert {classes[a].cls for a in state} == {fr.ACTIVATIONS}
