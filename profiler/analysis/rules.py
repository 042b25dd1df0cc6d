"""Every constant the diagnosis decides by, in one table, each with where it comes from.

Sources are of three kinds: `definition` (ARCHITECTURE.md's cause definitions, which bind), `measured`
(a figure measured on named fixtures or a calibration set), and `judgement` (a choice, with why).
classify.py, leak.py, step_need.py, checkpoint.py, recommend.py and confidence.py read their thresholds
from here; docs/analysis.md ("The rules table") lists the same table, and
tests/analysis/test_rule_boundaries.py puts every rule just under and just over its value.
"""

from __future__ import annotations

from dataclasses import dataclass

from memq.units import GiB, MiB, fmt_bytes


@dataclass(frozen=True)
class Rule:
    name: str
    value: float
    unit: str  # "bytes", "share" (of the quantity named), "x" (a multiple), "count", "confidence"
    kind: str  # definition | measured | judgement
    source: str
    used_in: str


RULES: dict[str, Rule] = {}


def _rule(name: str, value, unit: str, kind: str, source: str, used_in: str):
    if kind not in ("definition", "measured", "judgement"):
        raise ValueError(f"rule {name}: kind {kind!r} is not definition, measured or judgement")
    RULES[name] = Rule(name, value, unit, kind, source, used_in)
    return value


# ------------------------------------------------------------------ cause 1: external_memory
EXTERNAL_MIN_BYTES = _rule(
    "EXTERNAL_MIN_BYTES", 2 * GiB, "bytes", "definition",
    "ARCHITECTURE.md cause 1: non-PyTorch memory exceeds max(2 GiB, 10% of device total)", "classify, recommend")
EXTERNAL_DEVICE_SHARE = _rule(
    "EXTERNAL_DEVICE_SHARE", 0.10, "share of device total", "definition",
    "ARCHITECTURE.md cause 1: max(2 GiB, 10% of device total)", "classify, recommend")
CUDA_CONTEXT_BYTES = _rule(
    "CUDA_CONTEXT_BYTES", 1 * GiB, "bytes", "definition",
    "ARCHITECTURE.md cause 1: A + S would fit device total minus a normal context (~1 GiB)", "classify")

# ------------------------------------------------------------------ cause 2: leak (growth.py)
GROWTH_MIN_POINTS = _rule(
    "GROWTH_MIN_POINTS", 4, "count", "definition",
    "ARCHITECTURE.md cause 2 asks for a trend whose 95% interval is above zero: four points rising in "
    "order are the fewest whose chance under no trend (1/24, Mann-Kendall) is under 5%; of a series that "
    "grows in steps between points that do not move (a cache filling in bursts), four rises", "growth")
GROWTH_FEW_POINTS = _rule(
    "GROWTH_FEW_POINTS", 3, "count", "definition",
    "ARCHITECTURE.md cause 2, few points: a fast leak or three epoch-end files still decide when every "
    "interval grew steadily; under three points there is no interval to compare", "growth")
GROWTH_STEADY_SHARE = _rule(
    "GROWTH_STEADY_SHARE", 0.5, "share of the largest interval's growth", "judgement",
    "with three points, a steady rise: no interval under half the largest (a one-off jump, or a cache "
    "that slows as it fills, grows mostly in one interval)", "growth")
GROWTH_MIN_SEGMENT = _rule(
    "GROWTH_MIN_SEGMENT", 4, "count", "judgement",
    "a regime before or after a change point needs a trend of its own: GROWTH_MIN_POINTS points", "growth")
GROWTH_CHANGE_GAIN = _rule(
    "GROWTH_CHANGE_GAIN", 0.5, "share of one line's squared residuals", "judgement",
    "two regimes are said only where two lines at least halve one line's squared residuals: a straight "
    "leak with noise never gains that much from a split, a cache that stops gains far more", "growth")
GROWTH_PLATEAU_SHARE = _rule(
    "GROWTH_PLATEAU_SHARE", 0.25, "share of the earlier regime's slope", "judgement",
    "ARCHITECTURE.md cause 2, still going: growth stopped when the recent regime's 95% upper bound is under "
    "a quarter of the earlier slope (a leak that merely slows stays above it)", "growth")
GROWTH_NOISE_MULTIPLE = _rule(
    "GROWTH_NOISE_MULTIPLE", 3.0, "x the run's scatter", "definition",
    "ARCHITECTURE.md cause 2: a rise over the window larger than the run's own scatter about the line; "
    "three standard deviations, so dynamic shapes that move the floor are not read as a rise", "growth")
GROWTH_MATTERS_SHARE = _rule(
    "GROWTH_MATTERS_SHARE", 0.01, "share of LIMIT (or of the live bytes)", "definition",
    "ARCHITECTURE.md cause 2, it matters: it has already added more than 1% of LIMIT (of A when LIMIT is "
    "unknown)", "growth")
GROWTH_HORIZON_MULTIPLE = _rule(
    "GROWTH_HORIZON_MULTIPLE", 10.0, "x the span the series covers", "judgement",
    "ARCHITECTURE.md cause 2, it matters: the growth would use the headroom within the run's horizon, "
    "which is rarely known; ten times what the run has lived covers a job at a tenth of its life (the "
    "earliest point a forecast is judged at is half), and leaves out a 512-byte-a-step drift that would "
    "need millions of steps", "growth")
FORECAST_NEAR_MISS_SHARE = _rule(
    "FORECAST_NEAR_MISS_SHARE", 0.10, "share of LIMIT", "judgement",
    "the forecast says a near miss beside 'no OOM expected' when the steps' peak comes within a tenth of "
    "LIMIT: twice the last free bytes (NEAR_MISS_SHARE), so a run is told before it is in them", "forecast")
LEAK_PERSIST_SHARE = _rule(
    "LEAK_PERSIST_SHARE", 0.5, "share of the growth", "judgement",
    "ARCHITECTURE.md cause 2 asks that the growth be blocks that stay live; half of it, because a step's "
    "own churn (a new activation at an old block's size) replaces some of the kept blocks between points",
    "leak")
UNFREEZE_OPT_SHARE = _rule(
    "UNFREEZE_OPT_SHARE", 0.8, "share of the growth", "judgement",
    "ARCHITECTURE.md cause 2's progressive-unfreezing exception applies when the growth is optimizer "
    "state: at least 80% of it (the rest is the new parameters' gradients' rounding)", "leak")
UNFREEZE_STATE_MULTIPLE = _rule(
    "UNFREEZE_STATE_MULTIPLE", 2.05, "x the parameters' bytes", "definition",
    "ARCHITECTURE.md cause 2: state for parameters that start training is not a leak, and Adam(W) keeps 2x "
    "the parameters' bytes; 5% above 2x for the allocator's rounding of each state tensor", "leak")

# ------------------------------------------------------------------ cause 3 and the last free bytes
NEAR_MISS_SHARE = _rule(
    "NEAR_MISS_SHARE", 0.05, "share of LIMIT", "definition",
    "ARCHITECTURE.md: 'the last free bytes' means headroom under 5% of a known LIMIT (causes 3 and 9; "
    "MEMQ_ALERT_HEADROOM_PCT defaults to the same 5)", "classify, recommend")
OPTIMIZER_SGD_MULTIPLE = _rule(
    "OPTIMIZER_SGD_MULTIPLE", 1.5, "x the parameters' bytes", "judgement",
    "state above 1.5x the parameters is Adam(W)'s 2x, below it SGD momentum's 1x: the midpoint between "
    "the two multiples", "recommend")
STATE_REQUEST_MAX_MULTIPLE = _rule(
    "STATE_REQUEST_MAX_MULTIPLE", 2, "x the parameters' bytes", "measured",
    "a request larger than twice all the parameters is not state being created (one state tensor is at "
    "most its parameter, twice it for fp32 state of half-precision parameters): the 4x-longer-sequence "
    "logits of tests/fixtures/ddp_ranks/data are such a request", "analysis")
STATE_REQUEST_MIN_BYTES = _rule(
    "STATE_REQUEST_MIN_BYTES", 1 * MiB, "bytes", "judgement",
    "a frameless request under 1 MiB is a small pool block (bias, norm), which says nothing about which "
    "phase allocated it", "analysis")
SEGMENT_ROUNDING_BYTES = _rule(
    "SEGMENT_ROUNDING_BYTES", 2 * MiB, "bytes", "definition",
    "ARCHITECTURE.md cause 7: large requests are rounded up to 2 MiB, so a block holds its request plus "
    "up to 2 MiB", "analysis")

# ------------------------------------------------------------------ cause 4: activation_spike
SPIKE_FACTOR = _rule(
    "SPIKE_FACTOR", 1.5, "x the earlier steps' peak", "definition",
    "ARCHITECTURE.md cause 4: the step needs more than 1.5x the peak live bytes of the earlier steps",
    "classify")

# ------------------------------------------------------------------ cause 5: workspace
WORKSPACE_LIMIT_SHARE = _rule(
    "WORKSPACE_LIMIT_SHARE", 0.10, "share of LIMIT", "judgement",
    "workspace memory is the cause only when it is a tenth of the limit or more: cuBLAS keeps a few MiB "
    "per handle and stream in every job, far under a tenth (the calibration set's GPTs: 8-32 MiB)",
    "classify")

# ------------------------------------------------------------------ cause 7: fragmentation
FRAG_UNSETTLED_PENALTY = _rule(
    "FRAG_UNSETTLED_PENALTY", 0.25, "strength", "judgement",
    "ARCHITECTURE.md cause 7: where the failing step's need cannot be projected, say so and lower the "
    "confidence; a quarter of the strength takes a 0.9 fragmentation to ~0.79, under a settled one",
    "classify")
FRAG_SPIKE_LIKE_PENALTY = _rule(
    "FRAG_SPIKE_LIKE_PENALTY", 0.15, "strength", "judgement",
    "an unsettled step that already holds more than SPIKE_FACTOR x the earlier peak may be a larger input: "
    "lowered again, so a settled spike elsewhere would outrank it", "classify")
PRIVATE_POOL_SHARE = _rule(
    "PRIVATE_POOL_SHARE", 0.5, "share of the cached free bytes", "judgement",
    "CUDA graphs' private pools are named (evidence, advice) when they hold most of the free cache: then "
    "no allocator setting reaches the memory the request needed", "classify, recommend")
STRANDED_SHARE = _rule(
    "STRANDED_SHARE", 0.2, "share of reserved", "judgement",
    "an OOM whose cause is another, with a fifth of reserved free in pieces, still gets the "
    "expandable-segments advice: below that the pieces are ordinary cache slack", "recommend")

# ------------------------------------------------------------------ checkpoint loads (cause 3)
DUPLICATE_OVER_PARAMS = _rule(
    "DUPLICATE_OVER_PARAMS", 1.25, "x the parameters' bytes", "measured",
    "duplicates beyond the parameters' own bytes: an EMA copy is exactly 1x, the smallest optimizer state "
    "(SGD momentum) makes a checkpoint 2x (tests/fixtures/step_need resume)", "checkpoint")
DUPLICATE_SHARE = _rule(
    "DUPLICATE_SHARE", 0.5, "share of the new bytes", "judgement",
    "half of what appeared must be duplicates, so a step's activations of parameter-like sizes do not pass",
    "checkpoint")

# ------------------------------------------------------------------ the failing step's need
MATCH_TOL = _rule(
    "MATCH_TOL", 0.05, "share of the smaller size", "measured",
    "two sizes are one tensor at ratio k within 5%: the allocator rounds requests to 512 B and large blocks "
    "to 2 MiB pages, under 1% of the tensors that matter (the calibration set)", "step_need")
K_MIN = _rule(
    "K_MIN", 0.25, "x", "judgement",
    "a step a quarter of the earlier one (a short last batch) is still modelled by it", "step_need")
K_MAX = _rule(
    "K_MAX", 64.0, "x", "judgement",
    "8x the batch times 8x the length; beyond, the earlier step is no model of this one", "step_need")
ALIGN_MIN_BYTES = _rule(
    "ALIGN_MIN_BYTES", 1 << 20, "bytes", "judgement",
    "blocks under 1 MiB are too small to move the need and too many to align", "step_need")
ALIGN_SMALL_SHARE = _rule(
    "ALIGN_SMALL_SHARE", 1 / 256, "share of the request", "judgement",
    "blocks under 1/256 of the request are left out of the alignment for the same reason", "step_need")
MIN_MATCHED = _rule(
    "MIN_MATCHED", 0.8, "share of the failing step's bytes", "measured",
    "the gate: below 80% explained the alignment picks a wrong point (the calibration set)", "step_need")
K_MARGIN_HIGH = _rule(
    "K_MARGIN_HIGH", 0.25, "share of k", "measured",
    "the interval's top replays the rest at 1.25k: the calibration set's largest point error (1.9%) is "
    "well inside it (benchmarks/RESULTS.md, the failing step's need)", "step_need")
K_MARGIN_LOW = _rule(
    "K_MARGIN_LOW", 0.10, "share of k", "measured",
    "the interval's bottom replays the rest at 0.9k (same calibration)", "step_need")
LARGE_ROUND = _rule(
    "LARGE_ROUND", 2 << 20, "bytes", "definition",
    "ARCHITECTURE.md cause 7: the segment S needs is S rounded up to 2 MiB above 10 MiB", "step_need")
MID_SEGMENT = _rule(
    "MID_SEGMENT", 20 << 20, "bytes", "definition",
    "ARCHITECTURE.md cause 7: requests of 1-10 MiB take a 20 MiB segment", "step_need")
RUN_NOISE = _rule(
    "RUN_NOISE", 0.005, "share of the need", "measured",
    "run-to-run difference of one job: 0.02% (tests/fixtures/agent_defaults dyn, a GPT) and 0.32% "
    "(tests/fixtures/step_need cnn_dyn, a CNN); the lower bound allows 0.5%", "step_need")

# ------------------------------------------------------------------ confidence (confidence.py)
CONF_BASE = _rule(
    "CONF_BASE", 0.5, "confidence", "judgement",
    "a primary cause whose test held is at least even odds: its deciding test passed", "confidence")
CONF_PER_STRENGTH = _rule(
    "CONF_PER_STRENGTH", 0.45, "confidence", "judgement",
    "the strength of the test adds up to 0.45, so no verdict reads as certain (0.95 at most)",
    "confidence")
CONF_EARLIER_UNSETTLED = _rule(
    "CONF_EARLIER_UNSETTLED", 0.1, "confidence", "definition",
    "ARCHITECTURE.md: a cause whose evidence is missing gets lower confidence; an earlier cause in the "
    "precedence that could not be ruled out costs the primary 0.1", "confidence")
CONF_UNSETTLED_PRIMARY = _rule(
    "CONF_UNSETTLED_PRIMARY", 0.3, "confidence", "judgement",
    "an OOM with no deciding test settled names its best-supported candidate, flagged weak: under even odds",
    "confidence")
CONF_SECONDARY_BASE = _rule(
    "CONF_SECONDARY_BASE", 0.3, "confidence", "judgement",
    "another cause whose test holds starts at 0.3 and never reaches the primary's", "confidence")
CONF_SECONDARY_PER_STRENGTH = _rule(
    "CONF_SECONDARY_PER_STRENGTH", 0.4, "confidence", "judgement",
    "its strength adds up to 0.4 (0.7 at most, still below a strong primary)", "confidence")
CONF_BELOW_PRIMARY = _rule(
    "CONF_BELOW_PRIMARY", 0.05, "confidence", "definition",
    "ARCHITECTURE.md: every other cause that holds is listed with lower confidence than the primary", "confidence")
CONF_FLOOR = _rule(
    "CONF_FLOOR", 0.05, "confidence", "judgement",
    "a listed cause is never shown at 0: it is part of the story", "confidence")
CONF_NOT_SETTLED = _rule(
    "CONF_NOT_SETTLED", 0.1, "confidence", "judgement",
    "a test that could not be settled is listed low, with the input that would settle it", "confidence")
CONF_MESSAGE_FRAGMENTATION = _rule(
    "CONF_MESSAGE_FRAGMENTATION", 0.6, "confidence", "judgement",
    "an OOM message gives no free blocks: fragmentation from a message alone is suspected, never sure",
    "confidence")

# ------------------------------------------------------------------ strengths (classify.py)
#: How clearly each deciding test's numbers pass (0..1), which confidence.py turns into confidence.
#: All are judgement: what matters is the order they put causes in (a request whose own frames name
#: the cause above a share of memory; a first-step optimizer OOM above a later one).
_STRENGTHS = {
    "external_full_at_floor_x": (2, "x the floor", "memory outside PyTorch at twice the external floor is as "
                                 "clear as it gets (strength 1); at the floor, 0.5"),
    "leak": (0.5, "strength", "a leak on the fewest points (three, two intervals) starts at 0.7 (0.5 + 2 x 0.1)"),
    "leak_per_interval": (0.1, "strength", "each interval of the trend adds 0.1: five make it certain"),
    "optimizer_first_step": (0.9, "strength", "state created in the first step: nothing else could have grown"),
    "optimizer_later": (0.6, "strength", "state created later (a re-created optimizer): less certain"),
    "checkpoint_load": (0.85, "strength", "the frames or the duplicated blocks say a checkpoint is being loaded"),
    "spike_full_at_x": (3, "x the earlier peak", "a step needing 3x the earlier steps' peak is as clear as it gets"),
    "workspace_request": (0.9, "strength", "the failed request's own frames are a cuDNN/cuBLAS/NCCL workspace"),
    "workspace_peak": (0.7, "strength", "the peak's frames are a workspace's: one step removed from the OOM"),
    "workspace_share": (0.5, "strength", "only a share of live memory is workspace: no frame ties it to the OOM"),
    "allocator_config": (0.8, "strength", "the arithmetic with and without the setting decides it"),
    "fragmentation": (0.9, "strength", "A + S fits a known LIMIT and no usable free block holds S"),
    "fragmentation_lower_bound": (0.6, "strength", "the limit is only a lower bound (peak reserved earlier)"),
    "capacity": (0.6, "strength", "A + S over LIMIT, by a hair"),
    "capacity_per_over": (4, "strength per share over", "each tenth of LIMIT it is over by adds 0.4: certain "
                          "at a tenth over"),
    "healthy": (1.0, "strength", "no OOM, no leak, headroom left"),
    "healthy_over_limit": (0.6, "strength", "the run reserved more than the limit given without failing: the "
                           "limit is doubtful"),
    "healthy_near_miss": (0.7, "strength", "within the last free bytes: a larger input would fail"),
}
STRENGTH: dict[str, float] = {
    k: _rule(f"STRENGTH[{k}]", v, unit, "judgement", why, "classify") for k, (v, unit, why) in _STRENGTHS.items()
}


def shown(value: float, unit: str) -> str:
    return fmt_bytes(value, "brief") if unit == "bytes" else f"{value:g}"


def markdown_table() -> str:
    """The table docs/analysis.md carries ("The rules table"), one row per rule."""
    rows = ["| rule | value | unit | kind | source | used in |", "|---|---|---|---|---|---|"]
    for r in RULES.values():
        rows.append(f"| `{r.name}` | {shown(r.value, r.unit)} | {r.unit} | {r.kind} | {r.source} | {r.used_in} |")
    return "\n".join(rows) + "\n"
