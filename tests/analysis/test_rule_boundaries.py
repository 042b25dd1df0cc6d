"""Every rule of profiler/analysis/rules.py just under and just over its value, on synthetic facts.

The numbers here are literal (the documented value of each rule, not the constant read back): a rule
changed in rules.py fails its test here, which is the point. Each test names the rules it covers with
`@pytest.mark.rule(...)`; `test_every_rule_has_a_boundary_test` fails for a rule that none covers.
"""

from __future__ import annotations

import ast
import math
from dataclasses import replace
from pathlib import Path

import pytest

from memq.analysis import _optimizer_creation, checkpoint, classify, fit, leak, rules
from memq.analysis import step_need as sn
from memq.analysis.classify import Facts, diagnose
from memq.analysis.confidence import confidence, forecast_confidence
from memq.analysis.recommend import recommend
from memq.snapshot import parse_snapshot

GiB, MiB = 1024**3, 1024**2
rule = pytest.mark.rule
ROOT = Path(__file__).resolve().parents[2]


def facts(**kw) -> Facts:
    """An OOM that every test below moves over one boundary: 3 GiB live, a 1 GiB request, a 16 GiB limit,
    nothing else known."""
    base = dict(has_oom=True, S=GiB, S_min=GiB, A=3 * GiB, A_req=3 * GiB, R=5 * GiB, limit=16 * GiB,
                limit_source="--limit", limit_lower_bound=0, device_total=None, non_pytorch=None,
                largest_usable=8 * GiB, largest_blocked_by_max_split=0, private_pool_free=0, oom_frames=[],
                composition={}, peak_live=None, peak_phase=None, peak_frames=[], earlier_step_peak=None,
                training_steps_seen=5, settings_non_default=[], roundup=False, max_split=-1,
                peak_reserved=5 * GiB, leak={"holds": False, "settled": True}, stacks_all=True)
    base.update(kw)
    return Facts(**base)


# ------------------------------------------------------------------ cause 1: external_memory

@rule("EXTERNAL_MIN_BYTES")
def test_external_memory_above_two_gib_on_a_small_device():
    # 16 GiB device: a tenth is 1.6 GiB, so the 2 GiB floor decides
    f = lambda held: facts(device_total=16 * GiB, non_pytorch=held)  # noqa: E731
    assert not classify.check_external(f(2 * GiB - MiB)).holds
    assert classify.check_external(f(2 * GiB + MiB)).holds


@rule("EXTERNAL_DEVICE_SHARE")
def test_external_memory_above_a_tenth_of_a_large_device():
    f = lambda held: facts(device_total=80 * GiB, non_pytorch=held)  # noqa: E731
    assert not classify.check_external(f(8 * GiB - MiB)).holds
    assert classify.check_external(f(8 * GiB + MiB)).holds


@rule("CUDA_CONTEXT_BYTES")
def test_external_memory_only_when_the_live_set_would_fit_beside_a_one_gib_context():
    # 16 GiB device, 3 GiB outside PyTorch; A + S against 16 - 1 GiB
    f = lambda a: facts(device_total=16 * GiB, non_pytorch=3 * GiB, A=a, S=GiB)  # noqa: E731
    assert classify.check_external(f(14 * GiB - MiB)).holds
    assert not classify.check_external(f(14 * GiB + MiB)).holds


# ------------------------------------------------------------------ cause 2: leak

def _points(actives: list[int], kept: list[int] | None = None, opt: list[int] | None = None,
            params: int = 0) -> list[dict]:
    """Comparable points: live bytes `actives`; at each, `kept[i]` bytes of blocks that appeared since
    the previous point and are still live (all of the growth by default); optimizer state `opt[i]`
    (1 MiB throughout by default: warm-up is over) beside `params` of parameters."""
    pts, blocks, addr = [], {}, 1 << 40
    for i, a in enumerate(actives):
        if i:
            add = kept[i] if kept is not None else max(0, a - actives[i - 1])
            blocks = dict(blocks)
            if add:
                blocks[(addr, add)] = "train.py:10 in step"
                addr += add
        comp = {"optimizer_state": opt[i] if opt else MiB, "parameters": params}
        pts.append({"name": f"p{i}", "active": a, "composition": comp, "blocks": blocks})
    return pts


def _grown(step: int, n: int = 3, base: int = 2 * GiB) -> list[int]:
    return [base + i * step for i in range(n)]


@rule("LEAK_PERSIST_SHARE")
def test_leak_growth_must_be_half_blocks_that_stay_live():
    g = 200 * MiB
    assert not leak.detect_leak(_points(_grown(g), kept=[0, 98 * MiB, 98 * MiB]), None)["holds"]
    assert leak.detect_leak(_points(_grown(g), kept=[0, 102 * MiB, 102 * MiB]), None)["holds"]


@rule("UNFREEZE_OPT_SHARE")
def test_optimizer_growth_within_twice_the_parameters_is_unfreezing_when_it_is_most_of_the_growth():
    params = 10 * GiB
    g = GiB

    def run(opt_share: float) -> dict:
        opt = [GiB + int(i * g * opt_share) for i in range(3)]
        return leak.detect_leak(_points(_grown(g), opt=opt, params=params), None)
    assert run(0.79)["holds"]
    assert not run(0.81)["holds"]


@rule("UNFREEZE_STATE_MULTIPLE")
def test_unfreezing_state_stays_within_two_point_oh_five_times_the_parameters():
    params = 10 * GiB
    g = GiB

    def run(final_multiple: float) -> dict:
        top = int(final_multiple * params)
        return leak.detect_leak(_points(_grown(g), opt=[top - 2 * g, top - g, top], params=params), None)
    assert not run(2.04)["holds"]
    assert run(2.06)["holds"]


# ------------------------------------------------------------------ cause 3 and the last free bytes

@rule("NEAR_MISS_SHARE", "STRENGTH[healthy]", "STRENGTH[healthy_near_miss]")
def test_healthy_headroom_under_five_percent_is_a_near_miss():
    def run(head_share: float) -> classify.Finding:
        limit = 100 * GiB
        return classify.check_healthy(facts(has_oom=False, limit=limit, peak_reserved=int(limit * (1 - head_share))))
    assert run(0.049).strength == 0.7 and "near miss" in " ".join(run(0.049).evidence)
    assert run(0.051).strength == 1.0


def test_the_alert_headroom_default_is_the_near_miss_share():
    from memq.config import Settings

    assert Settings.__dataclass_fields__["alert_headroom_pct"].default == 5
    assert Settings.__dataclass_fields__["alert_headroom_pct"].default == round(100 * rules.NEAR_MISS_SHARE)


@rule("NEAR_MISS_SHARE", "STRENGTH[optimizer_later]")
def test_optimizer_state_holds_within_the_last_five_percent():
    creation = {"by": "frames", "optimizer": "AdamW", "multiple": 2, "params_bytes": GiB,
                "state_live_bytes": GiB, "state_full_bytes": 2 * GiB, "lean": {}}

    def run(head_share: float) -> classify.Finding:
        limit = 100 * GiB
        total = int(limit * (1 - head_share))
        return classify.check_optimizer_state(facts(limit=limit, A=total - GiB, S=GiB, optimizer_creation=creation,
                                                    composition={"optimizer_state": 4 * GiB}))
    assert run(0.049).holds and run(0.049).strength == 0.6
    assert not run(0.051).holds and run(0.051).listed


@rule("OPTIMIZER_SGD_MULTIPLE")
def test_state_above_one_and_a_half_times_the_parameters_reads_as_adamw():
    def why(multiple: float) -> str:
        f = facts(A=20 * GiB, composition={"parameters": 4 * GiB, "optimizer_state": int(multiple * 4 * GiB)})
        return next(r["why"] for r in recommend("capacity", f, None, f.leak) if r["playbook"] == "optimizer-state")
    assert "SGD momentum keeps 1x" in why(1.49)
    assert "AdamW keeps 2x" in why(1.51)


def _creation(S: int, params: int, block: int) -> dict | None:
    """A frameless OOM in the first optimizer step (the agent says so) with one live block of `block` bytes."""
    last = {"composition": {"parameters": params},
            "agent": {"step_figures": [], "step_in_progress": 1, "step_completed": None},
            "live_blocks": {(1 << 30, block): "<no frames>"}}
    return _optimizer_creation(last, S, [], "AdamW")


@rule("STATE_REQUEST_MAX_MULTIPLE")
def test_a_request_over_twice_the_parameters_is_not_state_being_created():
    params = 512 * MiB
    top = 2 * params + 2 * MiB
    assert _creation(top, params, top) is not None
    assert _creation(top + 512, params, top + 512) is None


@rule("SEGMENT_ROUNDING_BYTES")
def test_a_parameter_sized_block_holds_the_request_plus_up_to_two_mib():
    S = 100 * MiB
    assert _creation(S, GiB, S + 2 * MiB - 1) is not None
    assert _creation(S, GiB, S + 2 * MiB) is None


@rule("STATE_REQUEST_MIN_BYTES")
def test_a_frameless_request_under_one_mib_says_nothing_of_the_optimizer():
    assert _creation(MiB, GiB, MiB) is not None
    assert _creation(MiB - 512, GiB, MiB - 512) is None


# ------------------------------------------------------------------ cause 4: activation_spike

@rule("SPIKE_FACTOR", "STRENGTH[spike_full_at_x]")
def test_a_spike_needs_more_than_one_and_a_half_times_the_earlier_peak():
    def run(ratio: float) -> classify.Finding:
        earlier = 10 * GiB
        total = int(ratio * earlier)
        return classify.check_activation_spike(facts(A=total - GiB, S=GiB, earlier_step_peak=earlier, limit=14 * GiB))
    assert not run(1.49).holds
    assert run(1.51).holds and run(1.51).strength == pytest.approx(1.51 / 3, abs=1e-3)
    assert run(3.1).strength == 1.0


# ------------------------------------------------------------------ cause 5: workspace

@rule("WORKSPACE_LIMIT_SHARE", "STRENGTH[workspace_share]")
def test_workspace_memory_is_the_cause_from_a_tenth_of_the_limit():
    def run(share: float) -> classify.Finding:
        return classify.check_workspace(facts(has_oom=False, composition={"workspace": int(share * 16 * GiB)}))
    assert not run(0.099).holds
    assert run(0.101).holds and run(0.101).strength == 0.5


@rule("STRENGTH[workspace_request]", "STRENGTH[workspace_peak]")
def test_workspace_frames_on_the_request_weigh_more_than_on_the_peak():
    ws = [{"filename": "??", "line": 0, "name": "at::native::cudnn_convolution_workspace"}]
    assert classify.check_workspace(facts(oom_frames=ws)).strength == 0.9
    assert classify.check_workspace(facts(peak_frames=ws, peak_live=GiB)).strength == 0.7


# ------------------------------------------------------------------ causes 6 and 7

@rule("STRENGTH[allocator_config]")
def test_rounding_that_turns_a_fit_into_an_oom():
    f = facts(roundup=True, settings_non_default=["roundup_power2_divisions:4"], A=15 * GiB + 512 * MiB,
              A_req=14 * GiB, S=GiB, S_min=GiB)
    assert classify.check_allocator_config(f).strength == 0.8


def _frag(**kw) -> Facts:
    # 12 live + 1 requested fits 16, but 15.5 reserved + a 1 GiB segment does not; no free block holds it
    base = dict(A=12 * GiB, S=GiB, R=15 * GiB + 512 * MiB, largest_usable=512 * MiB)
    base.update(kw)
    return facts(**base)


@rule("STRENGTH[fragmentation]", "STRENGTH[fragmentation_lower_bound]", "FRAG_UNSETTLED_PENALTY",
      "FRAG_SPIKE_LIKE_PENALTY")
def test_fragmentation_strength_and_what_lowers_it():
    settled = sn.StepNeed(13 * GiB, 13 * GiB, 14 * GiB, True, "test")
    unsettled = sn.StepNeed(None, 13 * GiB, None, None, "test")
    assert classify.check_fragmentation(_frag(step_need=settled)).strength == 0.9
    assert classify.check_fragmentation(_frag(step_need=unsettled)).strength == pytest.approx(0.65)
    spike_like = _frag(step_need=unsettled, earlier_step_peak=8 * GiB)  # 13 GiB > 1.5 x 8
    assert classify.check_fragmentation(spike_like).strength == pytest.approx(0.5)
    bound = _frag(limit=None, limit_lower_bound=16 * GiB, step_need=settled)
    assert classify.check_fragmentation(bound).strength == 0.6


@rule("PRIVATE_POOL_SHARE")
def test_private_pools_are_named_when_they_hold_half_the_free_cache():
    free = 15 * GiB + 512 * MiB - 12 * GiB

    def named(share: float) -> bool:
        ev = classify.check_fragmentation(_frag(private_pool_free=int(share * free))).evidence
        return any("private pools" in e for e in ev)
    assert not named(0.49)
    assert named(0.51)


@rule("STRANDED_SHARE")
def test_expandable_segments_advised_beside_another_cause_from_a_fifth_of_reserved_free():
    def advised(share: float) -> bool:
        R = 10 * GiB
        f = facts(R=R, A=int(R * (1 - share)), S=GiB)
        return any("expandable_segments" in r["action"] for r in recommend("workspace", f, None, f.leak))
    assert not advised(0.19)
    assert advised(0.21)


# ------------------------------------------------------------------ cause 8, the strengths of 1-3

@rule("STRENGTH[capacity]", "STRENGTH[capacity_per_over]")
def test_capacity_strength_grows_with_the_share_it_is_over_by():
    def strength(over_share: float) -> float:
        return classify.check_capacity(facts(A=int(16 * GiB * (1 + over_share)) - GiB, S=GiB)).strength
    assert strength(0.05) == pytest.approx(0.8, abs=1e-6)
    assert strength(0.2) == 1.0


@rule("STRENGTH[external_full_at_floor_x]")
def test_external_strength_reaches_one_at_twice_the_floor():
    f = lambda held: facts(device_total=80 * GiB, non_pytorch=held)  # noqa: E731
    assert classify.check_external(f(12 * GiB)).strength == pytest.approx(0.75)
    assert classify.check_external(f(17 * GiB)).strength == 1.0


@rule("STRENGTH[leak]", "STRENGTH[leak_per_interval]")
def test_leak_strength_from_the_intervals_of_its_trend():
    lk = {"holds": True, "evidence": ["grew"], "points": 4}  # three intervals
    assert classify.check_leak(facts(leak=lk)).strength == pytest.approx(0.8)
    assert classify.check_leak(facts(leak=dict(lk, points=9))).strength == pytest.approx(1.0)


@rule("STRENGTH[optimizer_first_step]", "STRENGTH[checkpoint_load]")
def test_optimizer_strength_in_the_first_step_and_for_a_checkpoint():
    creation = {"by": "frames", "optimizer": "AdamW", "multiple": 2, "params_bytes": GiB,
                "state_live_bytes": GiB, "state_full_bytes": 2 * GiB, "lean": {}}
    f = facts(A=16 * GiB, S=GiB, optimizer_creation=creation, training_steps_seen=0,
              composition={"optimizer_state": 4 * GiB})
    assert classify.check_optimizer_state(f).strength == 0.9
    ck = {"by": "frames", "site": None, "loaded_bytes": GiB, "params_bytes": GiB, "state_bytes": GiB}
    assert classify.check_optimizer_state(facts(checkpoint_load=ck)).strength == 0.85


@rule("STRENGTH[healthy_over_limit]")
def test_a_run_that_reserved_over_the_limit_given_doubts_the_limit():
    assert classify.check_healthy(facts(has_oom=False, peak_reserved=17 * GiB)).strength == 0.6


# ------------------------------------------------------------------ checkpoint loads

def _resume(copies: float) -> tuple:
    """Ten 64 MiB parameter blocks beside twenty of AdamW state; `copies` x the parameters' bytes in new
    frameless blocks of the same size."""
    p = 64 * MiB
    frames_p = [{"filename": "torch/nn/modules/module.py", "line": 1, "name": "_apply"}]
    frames_s = [{"filename": "torch/optim/adamw.py", "line": 1, "name": "_init_group"}]
    blocks, addr = [], 0

    def add(size, frames):
        nonlocal addr
        blocks.append({"address": addr, "size": size, "requested_size": size, "state": "active_allocated",
                       "frames": frames})
        addr += size
    for _ in range(10):
        add(p, frames_p)
    for _ in range(20):
        add(p, frames_s)
    before = {(b["address"], b["size"]): "x" for b in blocks}
    for _ in range(round(copies * 10)):
        add(p, [])
    return blocks, before, addr


def _snap(blocks: list, size: int):
    return parse_snapshot({"segments": [{"device": 0, "address": 0, "total_size": size, "stream": 0,
                                         "segment_type": "large", "allocated_size": size, "active_size": size,
                                         "blocks": blocks}], "device_traces": [[]]})


@rule("DUPLICATE_OVER_PARAMS")
def test_a_resume_duplicates_more_than_one_and_a_quarter_times_the_parameters():
    for copies, found in ((1.2, False), (1.3, True)):
        blocks, before, size = _resume(copies)
        assert (checkpoint.checkpoint_load([], _snap(blocks, size), before) is not None) is found, copies


@rule("DUPLICATE_SHARE")
def test_duplicates_must_be_half_of_what_appeared():
    p = 64 * MiB
    for other, found in ((31, False), (29, True)):  # 30 duplicates beside 31 or 29 blocks of another size
        blocks, before, size = _resume(3.0)
        for _ in range(other):
            blocks.append({"address": size, "size": p + 512, "requested_size": p + 512, "state": "active_allocated",
                           "frames": []})
            size += p + 512
        assert (checkpoint.checkpoint_load([], _snap(blocks, size), before) is not None) is found, other


# ------------------------------------------------------------------ the failing step's need

W = 2_097_152_000  # a real request: a GPT's logits gradient, 16 x 1024 x 32,000 fp32


@rule("MATCH_TOL")
def test_two_sizes_are_one_tensor_within_five_percent():
    assert sn._match([int(W * 1.049)], [W]) > 0
    assert sn._match([int(W * 1.051)], [W]) == 0


def _one_step_ref(size: int) -> dict:
    return {"allocs": [[size, sn.SCALED], [size // 8, sn.FIXED]], "events": [0, -1, 1]}


@rule("K_MIN", "K_MAX")
@pytest.mark.parametrize(("k", "aligned"), [(63.4, True), (64.6, False), (0.2525, True), (0.2475, False)])
def test_the_step_scale_is_a_quarter_to_sixty_four_times(k, aligned):
    r = 64 * MiB
    assert (sn.align(_one_step_ref(r), [], int(k * r)) is not None) is aligned


@rule("ALIGN_MIN_BYTES", "ALIGN_SMALL_SHARE", "MIN_MATCHED")
def test_the_gate_counts_blocks_from_one_mib_or_a_256th_and_needs_four_fifths():
    """A reference of one input-sized tensor r at k = 4, the failing step holding it (4r) and blocks no
    tensor of it explains: projected while they are under a fifth of the counted bytes. Blocks below
    max(1 MiB, S/256) are not counted at all."""
    odd = 7_654_321  # matches nothing at any scale in the 5% tolerance

    def projected(junk: list[int], S: int = 64 * MiB) -> bool:
        r = S // 4  # the reference's tensor at k = 4 is the request
        ref = {"allocs": [[r, sn.SCALED], [r, sn.SCALED]], "events": [0, 1, -2, -1]}
        return sn.project(ref, "ref", junk, S, sum(junk), None).bytes is not None
    # S = 64 MiB: S/256 = 256 KiB, so the 1 MiB floor decides. Explained: the request; unexplained:
    # the junk. Four fifths needs the junk at most S / 4 = 16 MiB
    assert projected([odd, odd])  # 14.6 MiB unexplained: 81%
    assert not projected([odd, odd, 2_000_000])  # 16.5 MiB: 79%
    assert projected([odd, odd] + [1_048_575] * 40)  # under 1 MiB: not counted
    assert not projected([odd, odd] + [1_048_577] * 2)
    big = 2 * GiB  # S/256 = 8 MiB is now the floor
    assert projected([8 * MiB - 1] * 200, S=big)
    assert not projected([8 * MiB + 1] * 200, S=big)


@rule("K_MARGIN_HIGH", "K_MARGIN_LOW", "RUN_NOISE")
def test_the_interval_replays_the_rest_at_one_and_a_quarter_and_nine_tenths_less_half_a_percent():
    r = 64 * MiB
    ref = {"allocs": [[r, sn.SCALED], [r, sn.SCALED]], "events": [0, 1, -2, -1]}
    k = 4.0
    n = sn.project(ref, "ref", [], int(k * r), 0, None)
    assert n.bytes == int(8 * r)
    assert n.high == int(4 * r + 5 * r)  # the rest at 1.25 k
    slack = 2 * MiB  # a 256 MiB request: up to 2 MiB of segment rounding
    assert abs(n.low - (4 * r + 3.6 * r - slack) * 0.995) <= 2


@rule("LARGE_ROUND", "MID_SEGMENT")
def test_a_request_stands_for_a_block_up_to_its_segment_rounding():
    assert sn.request_slack(20 * MiB + 1) == 2 * MiB  # above 10 MiB blocks: rounded up to 2 MiB
    assert sn.request_slack(20 * MiB) == 19 * MiB  # a 20 MiB segment holds any request of 1-10 MiB
    assert sn.request_slack(2 * MiB + 1) == MiB + 1
    assert sn.request_slack(2 * MiB) == 2 * MiB


# ------------------------------------------------------------------ confidence

@rule("CONF_BASE", "CONF_PER_STRENGTH", "CONF_EARLIER_UNSETTLED", "CONF_MESSAGE_FRAGMENTATION")
def test_a_primary_cause_confidence():
    assert confidence("primary", 0.0) == 0.5
    assert confidence("primary", 1.0) == 0.95
    assert confidence("primary", 1.0, earlier_unsettled=True) == 0.85
    assert confidence("primary", 0.2, fragmentation_from_message=True) == 0.59  # under the cap
    assert confidence("primary", 0.3, fragmentation_from_message=True) == 0.6  # 0.635 capped


@rule("CONF_UNSETTLED_PRIMARY", "CONF_NOT_SETTLED")
def test_an_unsettled_diagnosis_names_a_weak_primary_and_lists_the_unsettled_low():
    primary, conf, causes, _ = diagnose(facts(limit=None))
    assert (primary, conf) == ("capacity", 0.3)
    assert {c["confidence"] for c in causes[1:]} == {0.1}
    assert confidence("weak_primary") == 0.3 and confidence("not_settled") == 0.1


@rule("CONF_SECONDARY_BASE", "CONF_SECONDARY_PER_STRENGTH", "CONF_BELOW_PRIMARY", "CONF_FLOOR")
def test_causes_under_the_primary():
    assert confidence("also_holds", 0.0, primary=0.95) == 0.3
    assert confidence("also_holds", 1.0, primary=0.95) == 0.7
    assert confidence("also_holds", 1.0, primary=0.74) == 0.69  # just under a weak primary
    assert confidence("also_holds", 1.0, primary=0.76) == 0.7
    assert confidence("also_holds", 0.0, primary=0.07) == 0.05  # the floor
    assert confidence("listed", primary=0.95) == 0.3
    assert confidence("listed", primary=0.34) == 0.29
    with pytest.raises(ValueError, match="listed under a primary"):
        confidence("listed")
    with pytest.raises(ValueError, match="unknown confidence role"):
        confidence("maybe", primary=0.9)


def test_a_message_alone_caps_fragmentation_through_the_same_function():
    from memq.analysis import explain_message
    from memq.cli.analyze import build_context

    msg = ("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 GiB of which "
           "3.00 GiB is free. Of the allocated memory 60.00 GiB is allocated by PyTorch, and 14.00 GiB is "
           "reserved by PyTorch but unallocated.")
    d = explain_message(build_context(70 * GiB, None, msg))["diagnosis"]
    assert d["primary_cause"] == "fragmentation" and d["confidence"] == 0.6 == d["causes"][0]["confidence"]


# ------------------------------------------------------------------ the OOM forecast's confidence

@rule("FORECAST_CONF_NO_GROWTH_BASE", "FORECAST_CONF_NO_GROWTH_PER_POINT", "FORECAST_CONF_NO_GROWTH_POINTS")
def test_a_no_growth_forecast_gains_a_twentieth_a_point_up_to_eight_points():
    assert forecast_confidence("no_growth", 0) == 0.5
    assert forecast_confidence("no_growth", 1) == 0.55
    assert forecast_confidence("no_growth", 7) == 0.85  # just under the cap
    assert forecast_confidence("no_growth", 8) == 0.9
    assert forecast_confidence("no_growth", 9) == 0.9  # just over: no more


@rule("FORECAST_CONF_BOUNDED", "FORECAST_CONF_UNDATED")
def test_a_bounded_or_undated_forecast_has_its_level_whatever_the_points():
    assert {forecast_confidence("bounded", n) for n in (0, 3, 40)} == {0.7}
    assert {forecast_confidence("undated", n) for n in (0, 3, 40)} == {0.5}
    assert forecast_confidence("none", 40) == 0.0
    with pytest.raises(ValueError, match="unknown forecast outcome"):
        forecast_confidence("likely")


@rule("FORECAST_CONF_DATED_BASE", "FORECAST_CONF_DATED_PER_POINT", "FORECAST_CONF_DATED_POINTS")
def test_a_dated_forecast_gains_four_hundredths_a_point_up_to_ten_points():
    assert forecast_confidence("dated", 0, interval_width=0.0) == 0.55
    assert forecast_confidence("dated", 1, interval_width=0.0) == 0.59
    assert forecast_confidence("dated", 9, interval_width=0.0) == 0.91  # just under the cap
    assert forecast_confidence("dated", 10, interval_width=0.0) == 0.95
    assert forecast_confidence("dated", 11, interval_width=0.0) == 0.95  # just over: no more


@rule("FORECAST_CONF_FEW_POINTS")
def test_a_dated_forecast_on_few_points_starts_at_even_odds():
    assert forecast_confidence("dated", 10, interval_width=0.0, few=True) == 0.5
    assert forecast_confidence("dated", 3, interval_width=0.0, few=True) == 0.5


@rule("FORECAST_CONF_WIDTH_LOSS")
def test_a_wide_interval_takes_at_most_half_the_confidence():
    # 5 points: 0.75 before the interval; half its width comes off, at most half
    assert forecast_confidence("dated", 5, interval_width=0.9) == 0.41  # just under the cap: 0.75 x 0.55
    assert forecast_confidence("dated", 5, interval_width=1.1) == 0.38  # just over: 0.75 x 0.5
    assert forecast_confidence("dated", 5, interval_width=3.0) == 0.38


@rule("FORECAST_CONF_FLOOR")
def test_a_dated_forecast_is_never_said_under_three_tenths():
    assert forecast_confidence("dated", 3, interval_width=0.75, few=True) == 0.31  # 0.5 x 0.625, over the floor
    assert forecast_confidence("dated", 3, interval_width=0.85, few=True) == 0.3  # 0.5 x 0.575, under it


# ------------------------------------------------------------------ the what-if replay

def _fidelity_of(recorded: list[int], modelled: list[int]) -> dict:
    from types import SimpleNamespace

    from memq.analysis.whatif import fidelity

    ops = list(range(len(recorded)))
    rep = SimpleNamespace(recorded_events=[], recorded_reserved_after=lambda: recorded, recorded_alloc_addr=[],
                          program=SimpleNamespace(ops=ops), op_event=ops)
    sim = SimpleNamespace(segment_events=[], reserved_after=modelled, alloc_addr=[])
    return fidelity(rep, sim)


@rule("REPLAY_RESERVED_TOLERANCE")
def test_a_replay_reproduces_the_reserved_bytes_within_five_percent():
    assert _fidelity_of([1000, 2000], [1000, 2098])["reserved_within_5pct"]  # 4.9%
    assert not _fidelity_of([1000, 2000], [1000, 2102])["reserved_within_5pct"]  # 5.1%


@rule("REPLAY_EVENT_SHARE")
def test_a_replay_reproduces_the_run_from_ninety_five_percent_of_its_segment_events():
    from memq.analysis.whatif import reproduces

    assert reproduces({"segment_event_share": 0.951, "reserved_within_5pct": True})
    assert not reproduces({"segment_event_share": 0.949, "reserved_within_5pct": True})
    assert not reproduces({"segment_event_share": 1.0, "reserved_within_5pct": False})


@rule("TRACE_TIME_SLACK_US")
def test_two_copies_of_a_trace_entry_are_one_within_five_microseconds():
    from types import SimpleNamespace

    from memq.analysis.whatif import _same_entry

    def entry(t):
        return SimpleNamespace(action="alloc", addr=4096, size=512, stream=0, time_us=t)

    assert _same_entry(entry(1_000_000), entry(1_000_005))
    assert not _same_entry(entry(1_000_000), entry(1_000_006))


# ------------------------------------------------------------------ the table itself

def _covered() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Name))
                    and getattr(node.func, "attr", getattr(node.func, "id", None)) == "rule"):
                names |= {a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)}
    return names


# ------------------------------------------------------------------ memq fit (fit.py)

def _measured(covers_start: bool) -> fit.Measured:
    return fit.Measured(replay=None, kinds=[], optimizer=None, parameter_bytes=0, cast_share=0.0, steps=2,
                        covers_start=covers_start, recorded_peak=0)


@rule("FIT_MARGIN")
def test_fit_interval_of_a_program_its_own_ops_decide_is_three_percent_either_side():
    low, high = fit.interval(_measured(True), GiB)
    assert low <= int(GiB * (1 - 0.029)) and high >= int(GiB * (1 + 0.029))
    assert low > int(GiB * (1 - 0.031)) and high < int(GiB * (1 + 0.031))


@rule("FIT_MARGIN_LIBRARY")
def test_fit_interval_where_a_library_chooses_sizes_by_shape_is_thirteen_percent_either_side():
    m = _measured(True)
    m.library = fit.LIBRARY_CONV
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.129)) and high >= int(GiB * (1 + 0.129))
    assert low > int(GiB * (1 - 0.131)) and high < int(GiB * (1 + 0.131))
    assert "cuDNN convolutions" in m.margin_reason
    assert rules.FIT_MARGIN_LIBRARY > rules.FIT_MARGIN


@rule("FIT_MARGIN_COMPILE")
def test_fit_interval_of_a_compiled_model_is_eight_percent_either_side():
    m = _measured(True)
    m.library = fit.LIBRARY_COMPILE
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.079)) and high >= int(GiB * (1 + 0.079))
    assert low > int(GiB * (1 - 0.081)) and high < int(GiB * (1 + 0.081))
    assert "restart" in m.margin_reason and "first run" in m.margin_reason
    assert rules.FIT_MARGIN < rules.FIT_MARGIN_COMPILE < rules.FIT_MARGIN_LIBRARY
    m.library = fit.LIBRARY_CONV  # a compiled model with convolutions keeps the convolutions' interval
    assert fit.interval(m, GiB)[0] < low


@rule("FIT_MARGIN_COMPILE_FROZEN")
def test_fit_interval_of_a_compiled_model_with_a_frozen_base_is_thirty_percent_either_side():
    m = replace(_measured(True), library=fit.LIBRARY_COMPILE, parameter_bytes=100 * GiB, gradient_bytes=GiB)
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.299)) and high >= int(GiB * (1 + 0.299))
    assert low > int(GiB * (1 - 0.301)) and high < int(GiB * (1 + 0.301))
    assert "frozen base" in m.margin_reason
    assert fit.interval(replace(m, library=None), GiB) == fit.interval(_measured(True), GiB)  # eager: its own


@rule("FIT_FROZEN_GRADIENT_SHARE")
def test_a_frozen_base_is_gradients_under_half_the_parameters():
    m = replace(_measured(True), library=fit.LIBRARY_COMPILE, parameter_bytes=1000)
    assert replace(m, gradient_bytes=499).frozen_base and replace(m, gradient_bytes=499).margin == 0.30
    assert not replace(m, gradient_bytes=501).frozen_base
    assert replace(m, gradient_bytes=501).margin == rules.FIT_MARGIN_COMPILE
    assert not replace(m, gradient_bytes=0).frozen_base  # gradients unknown: nothing says frozen


@rule("FIT_MARGIN_COMPILE_LENGTH")
def test_fit_interval_of_a_compiled_model_at_another_length_is_sixteen_percent_either_side():
    m = replace(_measured(True), library=fit.LIBRARY_COMPILE, length_asked=True)
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.159)) and high >= int(GiB * (1 + 0.159))
    assert low > int(GiB * (1 - 0.161)) and high < int(GiB * (1 + 0.161))
    assert "(t x t) scores" in m.margin_reason
    assert rules.FIT_MARGIN_COMPILE < rules.FIT_MARGIN_COMPILE_LENGTH < rules.FIT_MARGIN_COMPILE_FROZEN


@rule("FIT_MARGIN_OPTIMIZER")
def test_fit_interval_for_another_optimizer_is_at_least_twelve_percent_either_side():
    m = _measured(True)
    m.switched = "adamw"
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.119)) and high >= int(GiB * (1 + 0.119))
    assert low > int(GiB * (1 - 0.121)) and high < int(GiB * (1 + 0.121))
    assert "another optimizer (adamw)" in m.margin_reason
    m.library = fit.LIBRARY_CONV  # never narrower than the trace's own
    assert fit.interval(m, GiB) == fit.interval(replace(m, switched=None), GiB)


@rule("MIDRUN_MARGIN")
def test_fit_interval_of_a_mid_run_trace_is_seventeen_percent_either_side():
    low, high = fit.interval(_measured(False), GiB)
    assert low <= int(GiB * (1 - 0.169)) and high >= int(GiB * (1 + 0.169))
    assert low > int(GiB * (1 - 0.171)) and high < int(GiB * (1 + 0.171))
    # a trace cut mid-run is never better than a whole one, of either kind
    assert rules.MIDRUN_MARGIN >= max(rules.FIT_MARGIN, rules.FIT_MARGIN_LIBRARY)
    m = _measured(False)
    m.library = fit.LIBRARY_RNN
    assert fit.interval(m, GiB) == (low, high) and "mid-run" in m.margin_reason


@rule("FORWARD_ONLY_MARGIN")
def test_fit_interval_of_a_forward_alone_is_forty_percent_either_side():
    m = _measured(True)
    m.partial = fit.PARTIAL_FORWARD
    low, high = fit.interval(m, GiB)
    assert low <= int(GiB * (1 - 0.399)) and high >= int(GiB * (1 + 0.399))
    assert low > int(GiB * (1 - 0.401)) and high < int(GiB * (1 + 0.401))
    m.partial = fit.PARTIAL_BACKWARD  # a whole backward: the whole trace's interval
    assert fit.interval(m, GiB) == fit.interval(_measured(True), GiB)


@rule("FIT_MIN_BYTES")
def test_fit_reads_odd_frameless_buffers_from_one_mib_as_workspaces():
    assert not fit.is_workspace(MiB - 1)
    assert fit.is_workspace(MiB + 1)


@rule("CAST_COVERAGE")
def test_fit_holds_half_size_copies_that_cover_eighty_percent_of_the_weights():
    assert not fit.holds_cast_copies(0.799, told=False)
    assert fit.holds_cast_copies(0.801, told=False)
    assert fit.holds_cast_copies(0.0, told=True)  # the agent (or autocast's frame) said so


@rule("WORKSPACE_NEAR")
def test_fit_scales_a_workspace_within_4096_bytes_of_an_activation():
    act = 8 * MiB
    assert fit.near_input(act + 4095, [act]) and fit.near_input(act - 4095, [4 * MiB, act])
    assert not fit.near_input(act + 4097, [act]) and not fit.near_input(act - 4097, [4 * MiB, act])


@rule("GRAD_TEMP_PER_GRADIENT")
def test_fit_holds_up_to_two_gradient_sized_temporaries_per_gradient():
    assert not fit.too_many_for_weights(6, 3)  # the tied-embedding GPT: 2 a step for its 1 gradient, 3 steps
    assert fit.too_many_for_weights(7, 3)
    assert fit.too_many_for_weights(1, 0)  # no gradient of that size (nor twice it) at all


@rule("STATE_INFER_TOLERANCE")
def test_fit_reads_an_unnamed_optimizer_from_its_state_within_fifteen_percent():
    g = 100 * MiB
    assert fit.infer_optimizer(int(g * 1.149), g) == ("sgd_momentum", True)
    assert fit.infer_optimizer(int(g * 1.151), g) == (None, False)
    assert fit.infer_optimizer(int(g * 0.149), g) == ("sgd", True)
    assert fit.infer_optimizer(int(g * 0.151), g) == (None, False)


def _staging(sem: int, size: int = 64 * MiB):
    from types import SimpleNamespace

    from memq.analysis.allocator_model import OP_ALLOC, OP_FREE, Program

    prog = Program(ops=[OP_ALLOC, OP_ALLOC, OP_FREE, OP_FREE], hid=[0, 1, 1, 0], size=[size, sem, 0, 0],
                   stream=[0] * 4, n_handles=2)
    trace = [SimpleNamespace(action=a, addr=addr, size=sz, frames=[]) for a, addr, sz in
             (("alloc", 1 << 20, size), ("alloc", 1 << 40, sem), ("free_requested", 1 << 40, sem),
              ("free_requested", 1 << 20, size))]
    kinds = [fit.INPUT, fit.INPUT]
    fit._mark_reduce_buffers(trace, kinds, [0, 1])
    return SimpleNamespace(replay=SimpleNamespace(program=prog), kinds=kinds)


@rule("REDUCE_SEMAPHORES_MAX")
def test_fit_reads_a_block_and_its_1024_byte_semaphores_as_a_reduction_staging_buffer():
    assert _staging(1024).kinds == [fit.REDUCE_BUFFER, fit.INPUT]
    assert _staging(1025).kinds == [fit.INPUT, fit.INPUT]


@rule("REDUCE_STAGING_MAX")
def test_fit_scales_a_staging_buffer_to_138412032_bytes_at_most():
    s = 64 * MiB
    m = _staging(48, s)
    under, over = (138_412_032 - 1) / s, (138_412_032 + 4096) / s
    assert fit.scaled_sizes(m, under)[0] == int(s * under) == 138_412_031
    assert fit.scaled_sizes(m, over)[0] == 138_412_032
    held = _staging(48, 139_264_000)  # past it at the measured shape: held at its size
    assert fit.scaled_sizes(held, 8.0)[0] == 139_264_000
    assert fit.reduce_buffer_size(138_412_032 - 1, 8) == 138_412_032
    assert fit.reduce_buffer_size(138_412_032 + 1, 8) == 138_412_032 + 1


def _cast(partner: int, gap: int = 1, kind: int = fit.GRADIENTS, size: int = MiB):
    """A half-precision block, then its float32 cast (kept as .grad: `kind`) `gap` ops before its free."""
    from memq.analysis.allocator_model import OP_ALLOC, OP_FREE, Program

    ops, hid, sizes = [OP_ALLOC, OP_ALLOC], [0, 1], [size, partner]
    for i in range(gap - 1):  # what else the engine allocated in between
        ops.append(OP_ALLOC), hid.append(2 + i), sizes.append(4096)
    ops.append(OP_FREE), hid.append(0), sizes.append(0)
    prog = Program(ops=ops, hid=hid, size=sizes, stream=[0] * len(ops), n_handles=max(hid) + 1)
    kinds = [fit.INPUT, kind] + [fit.INPUT] * (gap - 1)
    fit._hold_cast_gradients(prog, kinds, lambda h: True)
    return kinds[0]


def _cast_copied(copy: int, size: int = MiB) -> int:
    """The cast (a temporary), the block freed, .grad allocated as a copy of the cast (`copy` bytes, its
    strides the weight's), the cast freed: an einsum's or bmm's weight gradient."""
    from memq.analysis.allocator_model import OP_ALLOC, OP_FREE, Program

    prog = Program(ops=[OP_ALLOC, OP_ALLOC, OP_FREE, OP_ALLOC, OP_FREE], hid=[0, 1, 0, 2, 1],
                   size=[size, 2 * size, 0, copy, 0], stream=[0] * 5, n_handles=3)
    kinds = [fit.INPUT, fit.INPUT, fit.GRADIENTS]
    fit._hold_cast_gradients(prog, kinds, lambda h: True)
    return kinds[0]


@rule("CAST_GRAD_RATIO")
def test_fit_holds_a_block_whose_float32_cast_is_twice_its_size_and_kept_as_a_gradient():
    assert _cast(2 * MiB) == fit.GRAD_TEMP
    assert _cast(2 * MiB - 1) == fit.INPUT and _cast(2 * MiB + 1) == fit.INPUT
    assert _cast(2 * MiB, kind=fit.INPUT) == fit.INPUT  # an activation's gradient cast: consumed, not kept
    assert _cast(2 * MiB, kind=fit.KEPT) == fit.GRAD_TEMP  # the last step's .grad, never freed in the trace
    assert _cast_copied(2 * MiB) == fit.GRAD_TEMP
    assert _cast_copied(2 * MiB - 1) == fit.INPUT and _cast_copied(2 * MiB + 1) == fit.INPUT


@rule("CAST_GRAD_GAP")
def test_fit_holds_a_block_freed_one_op_after_its_cast():
    assert _cast(2 * MiB, gap=1) == fit.GRAD_TEMP
    assert _cast(2 * MiB, gap=2) == fit.INPUT


def test_every_rule_has_a_boundary_test():
    missing = sorted(set(rules.RULES) - _covered())
    assert missing == [], f"rules with no boundary test: {missing}"
    unknown = sorted(_covered() - set(rules.RULES))
    assert unknown == [], f"tests name rules that do not exist: {unknown}"


def test_every_rule_has_a_source_and_a_kind():
    for r in rules.RULES.values():
        assert r.kind in ("definition", "measured", "judgement") and len(r.source) > 20, r.name
        assert r.kind != "definition" or "ARCHITECTURE.md" in r.source, r.name
        assert isinstance(r.value, (int, float)) and not math.isnan(r.value), r.name


def test_the_docs_carry_the_table_as_it_is():
    doc = (ROOT / "docs" / "analysis.md").read_text()
    assert rules.markdown_table() in doc, "docs/analysis.md's rules table differs from rules.markdown_table()"
