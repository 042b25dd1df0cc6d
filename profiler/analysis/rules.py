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
FORECAST_EARLY_WARNING_SHARE = _rule(
    "FORECAST_EARLY_WARNING_SHARE", 0.10, "share of LIMIT", "judgement",
    "the forecast warns beside 'no OOM expected' when the steps' peak allocated bytes come within a tenth "
    "of LIMIT: twice the last free bytes (NEAR_MISS_SHARE), so a run is told before it is in them; an "
    "early warning on the trend, not the near miss (analysis/headroom.py)", "forecast")
FORECAST_TRAINED_MULTIPLE = _rule(
    "FORECAST_TRAINED_MULTIPLE", 3.05, "x the parameters' bytes", "definition",
    "ARCHITECTURE.md cause 2: state for parameters that start training later is not a leak; every parameter "
    "training with AdamW holds a gradient and two moments, 3x its bytes; 5% above for the allocator's "
    "rounding, as UNFREEZE_STATE_MULTIPLE", "forecast")
FORECAST_STATE_SHARE = _rule(
    "FORECAST_STATE_SHARE", 0.8, "share of the growth", "judgement",
    "the forecast reads growth as parameters starting to train (a ceiling, not a line) when at least 80% of "
    "it is gradients and optimizer state, as UNFREEZE_OPT_SHARE does for the leak verdict", "forecast")
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

# ------------------------------------------------------------------ composition by provenance
STEP_START_ORPHAN_FREES = _rule(
    "STEP_START_ORPHAN_FREES", 8, "count", "measured",
    "blocks older than the trace read as parameters only where the trace covers the step from its start: "
    "such a trace frees few blocks it did not allocate, the previous step's outputs as their names are "
    "rebound (0 in the ten published CS336 snapshots, 2 in the published 12-layer one recorded after five "
    "warm-up steps), while a ring buffer that wrapped mid-step frees the earlier part's activations, one "
    "or more per layer (35-151 in tests/fixtures/real, max_entries=8000)", "provenance")
STATE_SPLIT_SHARE = _rule(
    "STATE_SPLIT_SHARE", 0.9, "share of the bytes older than the trace in sizes of 1 MiB or more", "judgement",
    "blocks older than the trace are split into parameters and k state tensors each only where nine tenths "
    "of those bytes come in multiples of k + 1 blocks of one size (a parameter and its state are one size); "
    "the rest is what the step kept (inputs, outputs) or a leak; in a trace without stacks, a run of blocks "
    "made one after another and kept is the optimizer's state where nine tenths of its bytes come in "
    "adjacent pairs of a size earlier kept blocks have (AdamW's two moments per parameter, made together "
    "in its first step; fused Adam's small step tensors between them). With no trace at all, the same share "
    "of the bytes walked from the top must have room for two state blocks each below them before the "
    "optimizer state is read from its pairs", "provenance, untraced")
STATE_LEAD_MAX = _rule(
    "STATE_LEAD_MAX", 8, "count", "judgement",
    "in a trace without stacks, the run of kept blocks that holds the optimizer's state may begin with at most "
    "eight of the backward's last gradients (kept by zero_grad(set_to_none=False), made with no short-lived "
    "allocation between them and the state): two in the small GPT with Adam of the fresh H200 set (its "
    "embedding's and the first block's), whose state then read as activations; one in the late set's LSTM "
    "with SGD's momentum (its embedding's, made last), whose model then read as activations; a model's last "
    "gradients come in a layer's few weights", "provenance")
ORDER_GRADIENT_SHARE = _rule(
    "ORDER_GRADIENT_SHARE", 0.5, "share of the weights' bytes", "judgement",
    "in a trace without stacks and no optimizer state, kept blocks made after the weights at a weight's size "
    "(one per weight) are gradients only where they copy at least half of the weights' bytes (a backward "
    "makes one per parameter: all of them after a full backward, 100% in the H200 captures of "
    "benchmarks/gpu/composition_capture.py); fewer are as likely outputs that happen to share a size. "
    "Likewise a run of kept blocks, one per earlier kept block's size, is SGD's momentum (made together in "
    "its first step) only where it copies at least half of those blocks' bytes (a run of two gradients "
    "made one after the other copies a few MiB), of one copy per parameter where gradients kept since the "
    "first backward double them (a ConvNet of the fresh H200 set: its momentum copies 48.8% of weights and "
    "gradients, 97.5% of one copy)", "provenance")
STATE_COUNT_SHARE = _rule(
    "STATE_COUNT_SHARE", 0.9, "share of the optimizer state's bytes", "judgement",
    "where nothing names the optimizer (a hand-written one) and the gradients are older than the trace "
    "(its backward accumulated into them), the state blocks per parameter are the k that nine tenths of the "
    "state's bytes agree on, size by size (k state blocks per two older blocks: a parameter and its "
    "gradient); the rest may be a size shared with other tensors", "provenance")
INFERENCE_MIN_CALLS = _rule(
    "INFERENCE_MIN_CALLS", 2, "count", "definition",
    "ARCHITECTURE.md \"Composition and phase\" (for inference, KV caches are with the weights): a cache is "
    "what one forward call leaves for the next, so a trace is read for caches only where it holds at least "
    "two forward calls (runs of entries inside a module's call) and no backward or optimizer step; one "
    "forward call (a training step dumped after forward) has nothing kept across calls", "provenance")
CACHE_MIN_BLOCKS = _rule(
    "CACHE_MIN_BLOCKS", 2, "count", "judgement",
    "an allocation site is an inference cache only where it holds at least two live blocks (a key and a value "
    "per layer: 12-24 in every inference capture of benchmarks/gpu/composition_capture.py), kept across a "
    "forward call and no more of them at the end than at every call's start; a prompt, the generated "
    "tokens and the beam scores are one block of their site", "provenance")
PER_PARAM_STATE_MIN_TENSORS = _rule(
    "PER_PARAM_STATE_MIN_TENSORS", 4, "count", "judgement",
    "one allocation site outside the model's code whose live blocks are the parameters' sizes one for one is "
    "per-parameter state (an optimizer's or a gradient estimator's: tests/fixtures/public_snapshots' DeComFL "
    "file, 196 of them) only where the model has at least four parameter tensors (one linear layer with a "
    "norm: weight, bias and the norm's two); with fewer, a block or two that share a tiny model's sizes are "
    "as likely its inputs and outputs", "provenance")
UNTRACED_MODEL_MIN_SEGMENTS = _rule(
    "UNTRACED_MODEL_MIN_SEGMENTS", 8, "count", "judgement",
    "with no allocation history, the model is read from the first run, from the top of the address space, "
    "of at least eight large segments back to back (a model loads one segment per weight, one after "
    "another: that run is the model's 17 segments in all 33 captures of "
    "benchmarks/gpu/composition_capture.py, a 6-block GPT; a published snapshot's forward activations "
    "(cs336 ctx512 forward_mixed) make a run of 5 at the top, which must not read as a model)", "untraced")
UNTRACED_RUNS_ABOVE_MODEL = _rule(
    "UNTRACED_RUNS_ABOVE_MODEL", 2, "count", "measured",
    "with no allocation history, the model's run of segments is read only where at most two runs of segments "
    "lie above it (one, a single weight's segment, in all 33 captures of benchmarks/gpu/composition_capture.py); "
    "where the driver spaced segments apart (tests/fixtures/real: every 20 MiB segment its own run) the first "
    "long run is far down, among the optimizer state, and nothing is read", "untraced")
CUBLAS_WORKSPACE_BYTES = _rule(
    "CUBLAS_WORKSPACE_BYTES", 32 * MiB, "bytes", "measured",
    "torch's default CUBLAS_WORKSPACE_CONFIG on compute capability 9.0 and later (':4096:8', 8 x 4096 KiB): "
    "one block per handle and stream, made on the thread that first multiplies (the autograd engine's "
    "thread records no Python frames); the one frameless 32 MiB block of every H200 capture in "
    "tests/fixtures/real", "provenance")
CUBLAS_WORKSPACE_OLD_BYTES = _rule(
    "CUBLAS_WORKSPACE_OLD_BYTES", 2 * 4096 * 1024 + 8 * 16 * 1024, "bytes", "judgement",
    "torch's default CUBLAS_WORKSPACE_CONFIG before compute capability 9.0 (':4096:2:16:8', 8.125 MiB): "
    "the same block on older cards, where no capture here was made", "provenance")
CUBLAS_WORKSPACE_MAX_BLOCKS = _rule(
    "CUBLAS_WORKSPACE_MAX_BLOCKS", 4, "count", "measured",
    "frameless blocks of a cuBLAS workspace's size are workspaces only up to four of them (a handle for the "
    "training thread and one for the autograd engine's, each on a stream or two: 1-2 in every H200 capture "
    "here); the agent's OOM snapshots of tests/fixtures/step_need hold 15-20 frameless 32 MiB activations. "
    "Among more than four, those in a segment exactly their size are the candidates (a workspace's segment "
    "is made for it; a bf16 generation job of the fresh H200 set holds six 32 MiB weights cast into the 48 "
    "and 64 MiB segments of their fp32 originals beside its two workspaces)", "provenance")
CUBLAS_WORKSPACES_PER_STREAM = _rule(
    "CUBLAS_WORKSPACES_PER_STREAM", 2, "count", "measured",
    "of the frameless blocks of a cuBLAS workspace's size, a stream holds at most two workspaces, those older "
    "than the trace first, then the highest: torch keeps a handle per thread and a workspace per handle and "
    "stream, and two threads multiply (the job's and the autograd engine's); every one of the 17 H200 captures "
    "of tests/fixtures/composition_h200 holds exactly two on its stream, the two highest such blocks, and the "
    "bf16 generation captures a third, lower: a weight cast after them; a ConvNet recorded for its dump's step "
    "(the fresh H200 and evening H100 sets) made two 32 MiB activations above its two older workspaces",
    "provenance")

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

# ------------------------------------------------------------------ changes between runs (compare.py)
CHANGE_MIN_BYTES = _rule(
    "CHANGE_MIN_BYTES", 64 * MiB, "bytes", "judgement",
    "a change between two snapshots or two runs is named from 64 MiB: under a typical activation tensor of "
    "the fixtures' models, allocator rounding and a batch's shape wobble stay below it", "compare")
CHANGE_MIN_SHARE = _rule(
    "CHANGE_MIN_SHARE", 0.01, "share of the bytes it changed from", "judgement",
    "... and from 1% of what it changed from, so a run of 80 GiB is not told about 64 MiB moves", "compare")
CHANGE_FRAG_RATIO = _rule(
    "CHANGE_FRAG_RATIO", 0.1, "fragmentation ratio", "judgement",
    "a fragmentation ratio that moves by a tenth between snapshots is a change worth naming", "compare")
SAME_LIMIT_WITHIN_BYTES = _rule(
    "SAME_LIMIT_WITHIN_BYTES", 10 * GiB // 1000, "bytes", "measured",
    "torch's OOM message prints sizes with two decimals of GiB (c10 CUDACachingAllocator format_size): a "
    "limit read from '18.85 GiB allowed' is within 0.005 GiB of the cap announced, two such readings within "
    "0.01 GiB of each other", "compare")
REGRESSION_PEAK_GROWTH = _rule(
    "REGRESSION_PEAK_GROWTH", 0.10, "share of the previous version's mean", "judgement",
    "a torch version whose runs' mean peak reserved grows by more than a tenth over the job's previous "
    "version is flagged (`memq versions`, the nightly report)", "compare")
REGRESSION_OOM_RATE = _rule(
    "REGRESSION_OOM_RATE", 0.10, "share of runs", "judgement",
    "... or whose OOM rate rises by ten points or more", "compare")
REGRESSION_FRAG = _rule(
    "REGRESSION_FRAG", 0.10, "share of reserved", "judgement",
    "... or whose mean share of reserved memory free in pieces at the OOM (the lists' `pieces`) rises by a "
    "tenth or more", "compare")
# ------------------------------------------------------------------ memq fit (fit.py)
FIT_MARGIN = _rule(
    "FIT_MARGIN", 0.03, "share of the predicted peak", "measured",
    "the interval either side of a predicted peak reserved, and on the limit for `fits` and the largest "
    "batch, of a trace whose program its own ops decide (no size a library chooses by shape, see "
    "FIT_MARGIN_LIBRARY): the largest error of such families on the tuning half is 0.4% (lora_gpt agent 8x; "
    "seq2seq 0.0%; the GPTs of tests/fixtures/fit within 0.4%; `python benchmarks/fit_families_calibration.py "
    "--half tuning`, `python benchmarks/fit_calibration.py`), raised to a floor of 3% (judgement: 0.4% from "
    "seven such models is too few to promise a tighter interval on an unseen one; 3% is what the five "
    "models' calibration has been held to since first measured, tests/analysis/test_fit.py); the held-back "
    "ones (bert_mlm 0.0%, moe_lm 0.3%) and gpt_ckpt_bf16 (0.0%) stay inside it", "fit")
FIT_MARGIN_LIBRARY = _rule(
    "FIT_MARGIN_LIBRARY", 0.13, "share of the predicted peak", "measured",
    "the interval of a trace that shows a size a library chooses at run time by shape (cuDNN's convolutions "
    "and their workspaces, cuDNN's LSTM; torch.compile has FIT_MARGIN_COMPILE): the tuning half's such families "
    "err by up to 5.2% (vit_bf16 8x; resnet_bn 4.6%, unet_diff 2.3%, the in-house cnn 1.0%), which the "
    "held-back half does not hold: WIDENED ON THE HELD-BACK FIGURES, as issue 40 asks, to its largest error, "
    "vit_ckpt 8x -12.6% (cuDNN took a 143 MB workspace for its patch embedding the base never made; lstm_lm "
    "9.9%), rounded up; the spent new set (vae_conv 11.5%, convnext_ln 8.3%) is inside it. "
    "Judged since by the fresh set (largest vit_ckpt_bf16 8x +11.7%) and the late one "
    "(relbias_enc_bf16 +11.1%), all inside. Read rung by rung (`python benchmarks/fit_library_sizes.py`): the "
    "allocator model is exact on each larger shape's own program, and the miss is the sizes the library chose "
    "there (cuDNN's LSTM workspace is 72 MiB plus a part per sequence; told them, the prediction is exact), "
    "which one recording does not hold. So one recording cannot narrow it", "fit")
FIT_MARGIN_COMPILE = _rule(
    "FIT_MARGIN_COMPILE", 0.08, "share of the predicted peak", "measured",
    "the interval of a torch.compile'd model's prediction, which is of a run whose compiled kernels are cached "
    "(a restart, or any run after the first at that shape: the autotuning's requests are left out of the "
    "recorded program). Each shape of the two compiled families was run by hand with inductor's cache cold, "
    "then warm (tests/fixtures/fit_compile_cache, one H100; `python benchmarks/fit_compile_cache.py`): from "
    "either base recording the warm runs' peak reserved is predicted within 3.8% on the tuning family "
    "(gpt_compile, 2x-8x the batch, 2x-4x the length), rounded up to 5%; the held-back one, gqa_lm, within 4.1% "
    "(its numbers were seen before this rule, without any change fitted to them). A first run at a new shape "
    "autotunes, and reserved from 17% less (4x the batch: 4.78 GiB against the restart's 5.72 GiB) to 1.9% "
    "more than the restart; the earlier family captures ran their shapes in one shared cache, in no known "
    "state, and do not judge it. Judged on three families compiled whole (tests/fixtures/fit_compile_judge): "
    "within 0.6% at every batch. Judged on three more (tests/fixtures/fit_compile_judge2, one H100): seq2seq "
    "within 0.3%, moe_lm from its warm recording within 0.3% but from its cold one +7.6% at the measured shape "
    "(its first run differs from the restart beyond the autotuning: 10% more allocated): widened on that "
    "judged figure to 8%; lora_gpt has FIT_MARGIN_COMPILE_FROZEN. That first run had kept two blocks of its "
    "first step to its end (the head's 125 MiB logits, after a graph break), which every later step frees: "
    "freed as a later step frees them (fit.released_first_step_holds) it is -0.1%, and every compiled batch "
    "prediction of the three sets is within 4.6% (moe_lm at 2x the batch from its cold recording), so back to "
    "5%, written before a third judging set (tests/fixtures/fit_compile_judge3, one H100) was captured. Judged "
    "there: gpt_ckpt_bf16 within 0.2%, whisper_enc within 3.0%, relbias_enc_bf16 -7.6%, +6.4% and -7.6% at 2x, "
    "4x and 8x the batch (its own runs at one shape reserved up to 17% apart, cache cold against warm, with "
    "the same bytes allocated): WIDENED ON THAT JUDGED FIGURE to 8% again", "fit")
FIT_FROZEN_GRADIENT_SHARE = _rule(
    "FIT_FROZEN_GRADIENT_SHARE", 0.5, "share of the parameters' bytes", "judgement",
    "a trace whose one step's gradients come to less than half its parameters' bytes trains a frozen base (a "
    "LoRA fine-tune: 1.4% in tests/fixtures/fit_compile_judge2's lora_gpt; every other compiled family there "
    "and in fit_compile_cache and fit_compile_judge trains all of its parameters, 100%): the midpoint, no "
    "family lying near it", "fit")
FIT_MARGIN_COMPILE_FROZEN = _rule(
    "FIT_MARGIN_COMPILE_FROZEN", 0.30, "share of the predicted peak", "measured",
    "the interval of a torch.compile'd model that trains a frozen base (FIT_FROZEN_GRADIENT_SHARE) under "
    "autocast: inside generated code autocast's half-precision copies of the weights are not told from the "
    "activations (their sizes coincide: a 768 x 3072 weight's copy is a 1024-token x 2304 output's bytes), so "
    "they are scaled with the input, and a frozen base's copies are a large share of the peak. Judged once "
    "(tests/fixtures/fit_compile_judge2, `python benchmarks/fit_compile_cache.py --set judge2`): lora_gpt "
    "compiled whole +6.8%, +9.4% and +29.5% at 2x, 4x and 8x the batch from either recording (eager, within "
    "0.4%): WIDENED ON THAT JUDGED FIGURE, rounded up. Over, never under: in the real run the copies keep "
    "their size", "fit")
FIT_MARGIN_COMPILE_LENGTH = _rule(
    "FIT_MARGIN_COMPILE_LENGTH", 0.16, "share of the predicted peak", "measured",
    "the interval of a torch.compile'd model's prediction at another sequence length: inside generated code "
    "nothing names attention's (t x t) scores (no softmax frame of the math path, and the agent's first-forward "
    "hook stands aside while dynamo traces), so they are scaled with the length once, not twice. The judging set "
    "of three families compiled whole (tests/fixtures/fit_compile_judge, one H200; `python "
    "benchmarks/fit_compile_cache.py --set judge`), judged once: every batch prediction within 0.6% and every "
    "length one of bert_mlm and alibi_lm within 0.6%, but t5_relpos, whose learned bias sends attention down its "
    "math path, -2.6% at 2x and -8.6% at 4x the length: widened on that judged figure, rounded up, to 9%. "
    "Judged on a third set (tests/fixtures/fit_compile_judge3): relbias_enc_bf16, an encoder whose learned "
    "relative bias sends attention down its math path too, -15.1% at 4x the length: WIDENED ON THAT JUDGED "
    "FIGURE, rounded up, to 16%", "fit")
FIT_MARGIN_OPTIMIZER = _rule(
    "FIT_MARGIN_OPTIMIZER", 0.12, "share of the predicted peak", "measured",
    "the interval, at the least, of a prediction for another optimizer than the recorded one (`--optimizer`; "
    "its state re-sized from the parameters): one GPT of 110M parameters measured with each of five optimizers "
    "(tests/fixtures/playbook/optim_*) predicts the others' peak reserved within 11.0% (adamw_8bit -> adamw "
    "-11.0%, sgd_momentum -> adamw -10.7%: the model packs the new state tighter than the real run; `python "
    "benchmarks/fit_calibration.py --optimizers`), rounded up", "fit")
MIDRUN_MARGIN = _rule(
    "MIDRUN_MARGIN", 0.17, "share of the predicted peak", "measured",
    "the interval of a trace that starts mid-run (a wrapped ring buffer): the five models' from-start traces "
    "cut where a ring buffer would (12 cuts, 2x-8x the batch, 180 predictions) put the real peak between "
    "0.833x and 1.157x the predicted one (`python benchmarks/fit_calibration.py --mid-run`); never narrower "
    "than the trace's own margin (FIT_MARGIN or FIT_MARGIN_LIBRARY)", "fit")
FORWARD_ONLY_MARGIN = _rule(
    "FORWARD_ONLY_MARGIN", 0.40, "share of the predicted peak", "measured",
    "the interval of a prediction from the first step's forward alone (its backward, gradients and optimizer "
    "inferred): the tuning half of the ten families' whole-run traces cut at the end of the first forward "
    "erred by up to 39.9% at 2x-8x (lora_gpt, +39.9%: a frozen base the forward cannot tell from trained "
    "weights; the others within 11.3%; `python benchmarks/fit_one_step.py --half tuning`), rounded up; a cut "
    "after the backward keeps the whole trace's margin (FIT_MARGIN, or FIT_MARGIN_LIBRARY; the error there is the "
    "whole trace's)", "fit")
ONE_STEP_REPEATS = _rule(
    "ONE_STEP_REPEATS", 2, "steps", "measured",
    "a trace of part of the first step is completed and followed by this many steps like it, beside the "
    "optimizer state: the peak of a later step is what runs reach, and the allocator's cache settles in "
    "the third (gpt_m of tests/fixtures/fit at 4x the batch peaks there: one more step -6.0% of the real "
    "peak reserved, two 0.0%, as the whole six-step trace); with two, the first step's forward and "
    "backward predict what the whole trace predicts on the five models and the tuning half of the ten "
    "families (largest difference under 0.1% of the peak reserved; `python benchmarks/fit_one_step.py --half "
    "tuning`)", "fit")
FIT_MIN_BYTES = _rule(
    "FIT_MIN_BYTES", 1 * MiB, "bytes", "judgement",
    "only blocks of at least 1 MiB are read as gradients, their temporaries, library workspaces or (half "
    "of it) autocast copies: smaller ones (biases, norms) do not move a peak and coincidences of sizes "
    "abound among them", "fit")
CAST_COVERAGE = _rule(
    "CAST_COVERAGE", 0.8, "share of the weights' bytes", "measured",
    "with no word on autocast (neither the agent's nor autocast's C++ frame), half-size copies are read as "
    "autocast's weight copies only when they cover this share of the weights: 0.96 on the bf16 GPT, 0.24 "
    "and 0.27 on the float32 GPTs (0.48 and 0.27 before float32-policy ops such as layer_norm were left out), "
    "0 on the CNN and the checkpointed GPT (tests/fixtures/fit)", "fit")
WORKSPACE_NEAR = _rule(
    "WORKSPACE_NEAR", 4096, "bytes", "measured",
    "a frameless odd-sized buffer (a library workspace) within this many bytes of an input-sized "
    "allocation's size scales with the input, else it is held: on the CNN of tests/fixtures/fit/cnn_batches "
    "(batches 8-64) the workspaces that recur at every batch are at least 32,105 bytes from any activation's "
    "size and the ones that change with the batch within 415; on the ResNet and the diffusion UNet of "
    "tests/fixtures/fit_families within 31-287 bytes (held, they made the ResNet 8-10% low)", "fit")
REDUCE_STAGING_MAX = _rule(
    "REDUCE_STAGING_MAX", 138_412_032, "bytes", "measured",
    "a CUDA reduction's staging buffer (torch's gpu_reduce_kernel, for a sum across blocks: a bias's or a "
    "norm's gradient summed over the batch) grows with the input until its grid fills the GPU, then stays: "
    "138,412,032 bytes (512 per resident thread, 132 SMs x 2048) on an H200 (hand recordings at 2x-8x the "
    "batch, tests/fixtures/fit_bighand: vit_ckpt's 39.3 MB at 16 images, 77.9 MB at 32, 138.4 MB at 64 and "
    "128; seq2seq's and lstm_lm's logits' 139.3 MB, with the rounding of 16,000 outputs, at every batch "
    "16-128 and length 128-512; ConvNeXt's, the MLP-Mixer's and the seq2seq model's 24-49 MiB buffers are "
    "this size at 4x and 8x, linear below it, tests/fixtures/fit_one_step/big); scaled past it, seq2seq was "
    "9-11% high", "fit")
REDUCE_SEMAPHORES_MAX = _rule(
    "REDUCE_SEMAPHORES_MAX", 1024, "bytes", "measured",
    "a block allocated right after a larger one and freed before it with nothing between is a reduction's "
    "semaphores (one int per block of its grid) when at most this size: 12-500 bytes under torch's "
    "gpu_reduce_kernel in the hand recordings of seq2seq, lstm_lm, vit_ckpt and gpt_ckpt_bf16 "
    "(tests/fixtures/fit_families, tests/fixtures/fit_bighand); the grid is at most a few hundred blocks "
    "wide", "fit")
GRAD_TEMP_PER_GRADIENT = _rule(
    "GRAD_TEMP_PER_GRADIENT", 2, "x the gradients of that size", "measured",
    "frameless temporaries of a gradient's size (or half of one: bfloat16) are weights' gradient temporaries, "
    "held, up to this many per gradient of that size or twice it; more are activation gradients of a "
    "coinciding size and scale: held ones 0.1-1.0 per gradient on ConvNeXt, the UNet, ViT under bf16 and the "
    "seq2seq model's 1 MiB ones, 2.0 on the tied-embedding GPT of tests/fixtures/fit (gpt_m); activation "
    "gradients 2.7-37 per gradient on the VAE, the ResNet and the seq2seq model (their C++ frames name the "
    "autograd node, and the real 2x-8x runs scale them)", "fit")
CAST_GRAD_RATIO = _rule(
    "CAST_GRAD_RATIO", 2, "x the block's bytes", "measured",
    "a float32 weight's gradient over the same gradient made in bfloat16 or float16 (4 bytes an element "
    "over 2): under autocast a matrix product's or convolution's weight gradient is made in the product's "
    "precision and cast to the weight's float32 (autograd's ToCopyBackward0) on its way to .grad; exactly "
    "2x in all 2,232 such casts of the hand recordings named under CAST_GRAD_GAP", "fit")
CAST_GRAD_GAP = _rule(
    "CAST_GRAD_GAP", 1, "ops", "measured",
    "autograd frees a half-precision weight gradient right after allocating its float32 cast: the cast's "
    "allocation is the op just before the free in all 2,232 casts that become a .grad in the hand "
    "recordings of gpt_ckpt_bf16, vit_bf16, unet_diff, lora_gpt and convnext_ln (their C++ frames name "
    "ToCopyBackward0; tests/fixtures/fit_families, tests/fixtures/fit_one_step), and in the 87 of a published "
    "einsum model's (tests/fixtures/public_snapshots/cs336_d512_3steps_ctx200_bf16), where AccumulateGrad "
    "copies the cast into .grad on the op after the free and frees the cast on the one after that", "fit")
STATE_INFER_TOLERANCE = _rule(
    "STATE_INFER_TOLERANCE", 0.15, "x one step's gradients", "measured",
    "an optimizer the trace does not name is read from its state over one step's gradients (0, 1 or 2 "
    "copies) within this much: 1.00 on the SGD-momentum GPT of tests/fixtures/real/seed_sgd, 2.00 on the "
    "AdamW GPT of tests/fixtures/captured/leak_epochs", "fit")

# Not thresholds: a library workspace's byte count is odd (a tensor's is a multiple of its element size),
# the largest scale searched for the largest batch (as in step_need.py), and the playbook's optimizer
# figures (profiler/playbook.md "Optimizer state", tests/fixtures/playbook/optim_*): state in multiples of
# the parameters' bytes; a step's temporaries beyond its state (`step_extra_peak_bytes`, later steps: AdamW
# 1.004 with torch's foreach implementation, Adafactor 0.314, the others 0); and blocks of state per
# parameter (the same bytes in half as many blocks packed 15% tighter).
WORKSPACE_ODD = 2
FIT_K_MAX = 64.0
STATE_MULTIPLE = {"sgd": 0.0, "sgd_momentum": 1.0, "adam": 2.0, "adamw": 2.0, "adafactor": 0.0, "adamw_8bit": 0.51}
TEMP_MULTIPLE = {"sgd": 0.0, "sgd_momentum": 0.0, "adam": 1.0, "adamw": 1.0, "adafactor": 0.31, "adamw_8bit": 0.0}
STATE_BLOCKS = {"sgd": 0, "sgd_momentum": 1, "adam": 2, "adamw": 2, "adafactor": 0, "adamw_8bit": 2}

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

LEAK_LISTED_CONFIDENCE = _rule(
    "LEAK_LISTED_CONFIDENCE", 0.5, "confidence", "judgement",
    "a rank's own leak (the cross-rank comparison) is a leak its diagnosis lists at even odds or more "
    "(CONF_BASE): a leak primary with no earlier cause unsettled always is, one that also holds from "
    "strength 0.5", "ranks")

# ------------------------------------------------------------------ the OOM forecast's confidence (confidence.py)
FORECAST_CONF_NO_GROWTH_BASE = _rule(
    "FORECAST_CONF_NO_GROWTH_BASE", 0.5, "confidence", "judgement",
    "'no OOM expected' because nothing grows (a plateau, a floor that moves with shapes, growth too small "
    "to matter) starts at even odds: the growth model decided it on the fewest points", "forecast")
FORECAST_CONF_NO_GROWTH_PER_POINT = _rule(
    "FORECAST_CONF_NO_GROWTH_PER_POINT", 0.05, "confidence", "judgement",
    "each point of the series adds 0.05 to a 'no growth' forecast ...", "forecast")
FORECAST_CONF_NO_GROWTH_POINTS = _rule(
    "FORECAST_CONF_NO_GROWTH_POINTS", 8, "count", "judgement",
    "... up to eight points (0.9 at most): a longer flat series does not rule out growth that starts later",
    "forecast")
FORECAST_CONF_BOUNDED = _rule(
    "FORECAST_CONF_BOUNDED", 0.7, "confidence", "judgement",
    "growth read as parameters starting to train (progressive unfreezing) is projected to its ceiling: the "
    "composition, not the trend, decides it, and an optimizer re-created in the same bounds would look alike",
    "forecast")
FORECAST_CONF_UNDATED = _rule(
    "FORECAST_CONF_UNDATED", 0.5, "confidence", "judgement",
    "a growth that never meets the reserve ceiling, or meets it beyond GROWTH_HORIZON_MULTIPLE: 'no OOM "
    "expected' at even odds (the growth may speed up or end)", "forecast")
FORECAST_CONF_DATED_BASE = _rule(
    "FORECAST_CONF_DATED_BASE", 0.55, "confidence", "judgement",
    "a dated OOM forecast starts above even odds: its trend passed the leak test (a 95% interval above zero)",
    "forecast")
FORECAST_CONF_DATED_PER_POINT = _rule(
    "FORECAST_CONF_DATED_PER_POINT", 0.04, "confidence", "judgement",
    "each point of the series adds 0.04 to a dated forecast ...", "forecast")
FORECAST_CONF_DATED_POINTS = _rule(
    "FORECAST_CONF_DATED_POINTS", 10, "count", "judgement",
    "... up to ten points (0.95 at most): the date's error is then the slope's interval's, not the count's",
    "forecast")
FORECAST_CONF_FEW_POINTS = _rule(
    "FORECAST_CONF_FEW_POINTS", 0.5, "confidence", "judgement",
    "a dated forecast on few points (GROWTH_FEW_POINTS: three that rise steadily) starts at even odds "
    "whatever their count", "forecast")
FORECAST_CONF_WIDTH_LOSS = _rule(
    "FORECAST_CONF_WIDTH_LOSS", 0.5, "share of the confidence", "judgement",
    "the slope's 95% interval, as a share of twice the slope, takes half its width off the confidence, at "
    "most half of it: an interval as wide as the slope either side halves it", "forecast")
FORECAST_CONF_FLOOR = _rule(
    "FORECAST_CONF_FLOOR", 0.3, "confidence", "judgement",
    "a dated forecast is never said under 0.3: its trend passed the leak test however wide its interval",
    "forecast")

# ------------------------------------------------------------------ an OOM message alone (message_verdict.py)
MESSAGE_NEAR_LIMIT_SHARE = _rule(
    "MESSAGE_NEAR_LIMIT_SHARE", 0.10, "share of what the process could reserve", "measured",
    "the failing request is one allocation of a step still running: allocated + request leaving less than "
    "this share fits 'if compacted' but not the rest of the step (near_limit, never fragmentation alone); "
    "both corpus messages with a confirmed fix that fit 'if compacted' left 5.2% (EpipolarPose #6) and "
    "2.5% (pytorch #16417), and a smaller batch fixed both (tests/fixtures/oom_messages/corpus.jsonl)",
    "message_verdict")
MESSAGE_PRIVATE_POOL_SHARE = _rule(
    "MESSAGE_PRIVATE_POOL_SHARE", 0.5, "share of the allocated bytes", "judgement",
    "a message's private pools (CUDA graphs, printed inside 'allocated' from torch 2.4) fill the device "
    "when they hold more than half of what is allocated: more than the eager code does", "message_verdict")
PRINTED_ROUNDING = _rule(
    "PRINTED_ROUNDING", 0.005, "share of the figure", "measured",
    "torch prints sizes with two decimals ('1.05 GiB', format_size in c10): a figure is known to within half "
    "a unit of its last digit, under 0.5% of any figure of 1.00 or more in its unit", "message_verdict, message_check")
XPU_BLOCK_LIMIT = _rule(
    "XPU_BLOCK_LIMIT", 4 * GiB, "bytes", "measured",
    "Intel XPU (Arc, Level Zero without relaxed limits) refuses one allocation above 4 GiB whatever is free "
    "(IPEX #629, intel-xpu-backend-for-triton #7477 in tests/fixtures/oom_messages/corpus.jsonl)",
    "message_verdict")
SAME_REQUEST_BYTES = _rule(
    "SAME_REQUEST_BYTES", 2 * MiB, "bytes", "definition",
    "ARCHITECTURE.md cause 7: the trace records the request rounded to the allocator's block (2 MiB above "
    "1 MiB) while the message prints it with two decimals: within 2 MiB they are the same request",
    "message_check")

# ------------------------------------------------------------------ the what-if replay (whatif.py)
REPLAY_RESERVED_TOLERANCE = _rule(
    "REPLAY_RESERVED_TOLERANCE", 0.05, "share of the recorded reserved bytes", "judgement",
    "a replay of the recorded settings reproduces the run when its reserved bytes stay within 5% of the "
    "recorded ones after every trace entry (confidence.REPLAY_CONFIDENCE, 'reproduced'): a segment of slack "
    "on a run of twenty", "whatif")
REPLAY_EVENT_SHARE = _rule(
    "REPLAY_EVENT_SHARE", 0.95, "share of the segment events", "judgement",
    "... and at least 95% of the recorded segment events come at the same request: the "
    "replay's confidence is then 'reproduced' (high), else 'approximate' (medium)", "whatif")
TRACE_TIME_SLACK_US = _rule(
    "TRACE_TIME_SLACK_US", 5, "microseconds", "judgement",
    "two snapshots' copies of one trace entry can differ by a microsecond in time_us (torch converts its "
    "clock to wall time when each snapshot is taken): five allows for that and stays far under the time "
    "between two distinct entries of one block", "whatif")

#: The confidence of each situation a message's own figures settle (confidence.message_confidence): how
#: much of the cause the figures decide, all judgement. Fragmentation from a message is
#: CONF_MESSAGE_FRAGMENTATION, as in a diagnosis.
_MESSAGE_CONFIDENCE = {
    "cut_before_figures": (0.2, "the message is cut before its figures: a guess at the likeliest cause"),
    "request_only": (0.3, "the request but not both the allocated and the free figures: step or cache not settled"),
    "xpu_block_limit": (0.7, "an XPU request over the platform's 4 GiB per-allocation limit while memory was free"),
    "block_limit": (0.8, "the platform says itself that it refuses one allocation of that size"),
    "over_device": (0.95, "one request larger than the whole device: nothing else could make it fit"),
    "cap": (0.8, "the per-process cap ran out with the device's room printed beside it"),
    "other_processes": (0.85, "other processes named with their bytes, enough to make the request fit"),
    "below_free": (0.5, "a request under the free memory reported: another limit ran out, which one not said"),
    "own_libraries": (0.7, "memory outside the cache that the message's own process figure says is its own"),
    "external": (0.75, "memory outside the cache, whose the message does not say in full"),
    "private_pools": (0.75, "CUDA graphs' private pools hold most of what is allocated"),
    "capacity": (0.85, "allocated + request over what the process could reserve, by the message's figures"),
    "near_limit": (0.45, "fits once compacted with under a tenth left for the rest of the step: as likely capacity"),
    "near_limit_capacity": (0.4, "the capacity listed beside a near-limit fragmentation, just below it"),
    "mps": (0.7, "MPS's high-watermark cap, with the other allocations printed"),
    "server_warmup": (0.7, "an inference server's warm-up with its largest batch, as its message says"),
    "cublas": (0.6, "cuBLAS's own handle or workspace allocation failed outside the cache"),
    "cudnn": (0.6, "cuDNN's workspace allocation failed outside the cache"),
    "thc_error": (0.3, "torch 0.x's THCStorage failure prints no figures"),
    "cuda_error": (0.4, "'CUDA error: out of memory' from the runtime, outside the cache, with no figures"),
}
MESSAGE_CONFIDENCE: dict[str, float] = {
    k: _rule(f"MESSAGE_CONFIDENCE[{k}]", v, "confidence", "judgement", why, "message_verdict")
    for k, (v, why) in _MESSAGE_CONFIDENCE.items()
} | {"fragmentation": CONF_MESSAGE_FRAGMENTATION}

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
