"""Truth set for composition and phase (ARCHITECTURE.md "Composition and phase"): real snapshots of one
H200 where what every live byte is comes from the tensors themselves at the moment of the dump.

    python3 benchmarks/gpu/composition_capture.py --out DIR [--only a,b] [--budget 190] [--parallel 6]
    python3 benchmarks/gpu/composition_capture.py --job NAME --out DIR     (one job; the parent runs these)
    python3 benchmarks/gpu/composition_capture.py --list [--set fresh] | --selftest   (no GPU)
    python3 benchmarks/gpu/composition_capture.py --set fresh --out DIR --budget 150 --parallel 6
        (the fresh judging set: FRESH_JOBS below; never tune on it)

Every job trains (or serves) the same GPT (6 blocks of 1024, vocabulary 16,384, 109M parameters, AdamW
unless said) in its own process, records allocator history as its spec says, and dumps one snapshot:
after the optimizer step (a full step), after forward (forward only), after backward, inside backward
(a gradient hook), at an out-of-memory error (in the allocator's OOM observer, under a cap between the
step's own figures), or in the middle of generation (inference: bf16 weights and a KV cache).
Variants: eager and `torch.compile`, fp32 and bf16 autocast, stacks "python", "all" and none (a trace
without frames), recording from the start, from the dump step on (the model and optimizer older than
the trace), a short ring buffer (the step's start fell out of it), the memq agent's default (recorded
warm-up steps, then paused: no trace), and never. Inference (`cache`): a static cache made before
generation by the job's code or by a cache class, a cache grown by concatenation per token (as
transformers' DynamicCache), beam search reordering it between tokens outside the model, and an
evaluation loop with no cache that keeps every call's output; bf16, fp16 or fp32 weights (`dtype`). The
job declares its cache to the agent (`memq.agent.roles.declare`), as a user would.

The fresh set (`--set fresh`, FRESH_JOBS, names `fresh_*`) is for judging what was tuned on the set
above, never for tuning: the same dumps, recordings and truth for other models (a CNN with BatchNorm, a
smaller and a wider GPT, an encoder-decoder, a GPT with tied embeddings, a LoRA fine-tune whose base
weights are frozen), other optimizers (SGD momentum, Adam, Adafactor, RMSprop, Adagrad), gradients kept
as zeroed tensors between steps and gradient accumulation. Frozen weights are `parameter`s (live, no
gradient); momentum, factored and accumulated-square buffers are `optimizer_state` (whatever
`optimizer.state` holds); a `.grad` kept zeroed is a `gradient` wherever it is live.

Truth, per job (DIR/<job>/truth.json), taken at the dump from the objects that own the memory:
- `roles`: [address, nbytes, role] of every storage the job holds: parameter, buffer, gradient,
  optimizer_state, input, output (logits, loss), saved (tensors autograd saved for backward, eager
  jobs), kv_cache, workspace (cuBLAS workspaces, found at start as the blocks a matmul leaves live);
- `blocks`: [address, size, label, class, alloc_phase] for every live block of the snapshot. `label`
  is the role holding the block (first in LABEL_ORDER), else `unattributed`; `class` is the class
  memq must say (CLASS_OF; unattributed blocks are activations while forward or backward runs, and
  `other` after the step); `alloc_phase` is when the block was allocated: `before_trace`, `setup`
  (inside the trace, before the dump step), `forward`, `backward`, `optimizer_step`, from the trace
  entry's time and the job's phase boundaries of every step (`boundaries`, unix microseconds; a marker
  allocation of MARKER_BYTES at the dump step's start checks the clock: `clock_offset_us`);
- `class_bytes`, `label_bytes`, `live_bytes`; `peak_phase` (the phase of the dump step with the highest
  `max_memory_allocated`, or the phase of the failed request) and `peaks`;
- `agent_roles`: what memq's agent would send with this snapshot (memq.agent.roles.collect), when
  memq is importable, to check its CUDA addresses against the truth.
The snapshot is DIR/<job>/snapshot.pickle.gz (gzip of the `_snapshot()` dict, as a user would save it,
nothing added). DIR/summary.json is rewritten after every job; a job that crashes or runs out of time
leaves its status there and the rest go on.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import os
import pickle
import subprocess
import sys
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
MiB, GiB = 1 << 20, 1 << 30
MARKER_BYTES = 3 * MiB + 7 * 512  # a size nothing else in the job allocates

# vocabulary, width, blocks, heads, tokens per sequence (the CPU dry run's are tiny)
FULL_DIMS, DRY_DIMS = (16_384, 1024, 6, 16, 512), (512, 64, 2, 4, 32)
BATCH = 8

# The role a block is when several storages share it (a weight autograd saved is still a parameter).
LABEL_ORDER = ("parameter", "buffer", "kv_cache", "gradient", "optimizer_state", "input", "output", "saved",
               "workspace")
CLASS_OF = {"parameter": "parameters", "buffer": "parameters", "kv_cache": "parameters",
            "gradient": "gradients", "optimizer_state": "optimizer_state", "input": "activations",
            "output": "activations", "saved": "activations", "workspace": "workspace"}

# dump: after_step | after_forward | after_backward | in_backward | oom_forward | oom_backward | generate
# record: start (before the model exists) | dump_step (from the dump step's start: model, optimizer
#   and earlier steps older than the trace) | ring (start, with max_entries small) | agent (steps
#   before `warm` recorded, then paused) | off
# stacks: python | all | none (a trace without frames)
J = dict
JOBS: dict[str, dict] = {
    "full_eager_fp32_py_start": J(dump="after_step", record="start", stacks="python"),
    "full_eager_bf16_all_step0": J(dump="after_step", record="dump_step", stacks="all", amp=True, dump_step=0),
    "full_eager_fp32_all_dumpstep": J(dump="after_step", record="dump_step", stacks="all"),
    "full_eager_fp32_py_ring": J(dump="after_step", record="ring", stacks="python", max_entries=1200),
    "full_eager_fp32_none_start": J(dump="after_step", record="start", stacks="none"),
    "full_eager_fp32_py_sgd": J(dump="after_step", record="start", stacks="python", optimizer="sgd"),
    "full_eager_bf16_py_fused": J(dump="after_step", record="dump_step", stacks="python", amp=True,
                                  optimizer="adamw_fused"),
    "fwd_eager_fp32_py_start": J(dump="after_forward", record="start", stacks="python"),
    "fwd_eager_bf16_all_dumpstep": J(dump="after_forward", record="dump_step", stacks="all", amp=True),
    "fwd_eager_fp32_py_agent": J(dump="after_forward", record="agent", stacks="python"),
    "fwd_eager_fp32_py_accum": J(dump="after_forward", record="start", stacks="python", accum=2),
    "bwdend_eager_fp32_py_dumpstep": J(dump="after_backward", record="dump_step", stacks="python"),
    "inbwd_eager_bf16_py_start": J(dump="in_backward", record="start", stacks="python", amp=True),
    "oom_fwd_eager_fp32_py_start": J(dump="oom_forward", record="start", stacks="python", batch=16),
    "oom_bwd_eager_bf16_all_start": J(dump="oom_backward", record="start", stacks="all", amp=True, batch=16),
    "oom_bwd_eager_fp32_py_ring": J(dump="oom_backward", record="ring", stacks="python", batch=16,
                                    max_entries=1500),
    "oom_fwd_eager_bf16_off": J(dump="oom_forward", record="off", stacks="python", amp=True, batch=16),
    "full_compile_fp32_py_start": J(dump="after_step", record="start", stacks="python", compile=True),
    "fwd_compile_bf16_py_dumpstep": J(dump="after_forward", record="dump_step", stacks="python", amp=True,
                                      compile=True),
    "full_compile_bf16_all_dumpstep": J(dump="after_step", record="dump_step", stacks="all", amp=True,
                                        compile=True),
    "oom_bwd_compile_bf16_py_start": J(dump="oom_backward", record="start", stacks="python", amp=True,
                                       compile=True, batch=16),
    "infer_bf16_all_loaded": J(dump="generate", record="dump_step", stacks="all", infer=True),
    "infer_bf16_py_start": J(dump="generate", record="start", stacks="python", infer=True),
    # inference variants (2026-12-04, second set): a cache that grows by concatenation per token (as
    # transformers' DynamicCache), a static cache made by its own class before the trace or inside it, a
    # beam search that reorders the cache between tokens (outside the model), fp16 and fp32 weights, a
    # ring buffer that lost the cache's making, a trace without frames, no trace at all
    "infer_dyn_bf16_py_start": J(dump="generate", record="start", stacks="python", infer=True, cache="dynamic"),
    "infer_dyn_fp16_all_loaded": J(dump="generate", record="dump_step", stacks="all", infer=True,
                                   cache="dynamic", dtype="fp16"),
    "infer_beam_bf16_py_start": J(dump="generate", record="start", stacks="python", infer=True, cache="beam"),
    "infer_beam_bf16_all_loaded": J(dump="generate", record="dump_step", stacks="all", infer=True,
                                    cache="beam"),
    "infer_static_fp32_py_loaded": J(dump="generate", record="dump_step", stacks="python", infer=True,
                                     cache="static_class", dtype="fp32"),
    "infer_static_bf16_py_ring": J(dump="generate", record="ring", stacks="python", infer=True,
                                   cache="static_class", max_entries=2500),
    "infer_dyn_bf16_py_ring": J(dump="generate", record="ring", stacks="python", infer=True, cache="dynamic",
                                max_entries=2500),
    "infer_dyn_bf16_none_start": J(dump="generate", record="start", stacks="none", infer=True, cache="dynamic"),
    "infer_dyn_bf16_off": J(dump="generate", record="off", stacks="python", infer=True, cache="dynamic"),
    # no cache: an evaluation loop of forward calls under no_grad that keeps every batch's last-token
    # scores in a growing list (nothing kept across its calls is a cache)
    "infer_eval_bf16_py_start": J(dump="generate", record="start", stacks="python", infer=True, cache="none"),
    # traces without stacks from the job's start (2026-12-04, third set), held out from the two above that
    # the trace's order was read on: bf16 autocast, fused AdamW, SGD with momentum, torch.compile, dumps
    # after forward, after backward, inside backward and at an OOM; a static cache, beam search, no cache
    "full_eager_bf16_none_start": J(dump="after_step", record="start", stacks="none", amp=True),
    "full_eager_bf16_none_fused": J(dump="after_step", record="start", stacks="none", amp=True,
                                    optimizer="adamw_fused"),
    "full_eager_fp32_none_sgd": J(dump="after_step", record="start", stacks="none", optimizer="sgd"),
    "full_compile_bf16_none_start": J(dump="after_step", record="start", stacks="none", amp=True, compile=True),
    "fwd_eager_fp32_none_start": J(dump="after_forward", record="start", stacks="none"),
    "bwdend_eager_fp32_none_start": J(dump="after_backward", record="start", stacks="none"),
    "inbwd_eager_bf16_none_start": J(dump="in_backward", record="start", stacks="none", amp=True),
    "oom_fwd_eager_fp32_none_start": J(dump="oom_forward", record="start", stacks="none", batch=16),
    "oom_bwd_eager_bf16_none_start": J(dump="oom_backward", record="start", stacks="none", amp=True, batch=16),
    "infer_bf16_none_start": J(dump="generate", record="start", stacks="none", infer=True),
    "infer_beam_bf16_none_start": J(dump="generate", record="start", stacks="none", infer=True, cache="beam"),
    "infer_eval_bf16_none_start": J(dump="generate", record="start", stacks="none", infer=True, cache="none"),
}
# The fresh set (`--set fresh`): what the set above never varies, for judging only (never tuned on):
# other models (`model`: a CNN with BatchNorm, an encoder-decoder, a LoRA fine-tune whose base weights
# are frozen, a GPT whose output head is its embedding; `shape`: a smaller and a wider GPT), other
# optimizers (SGD with momentum, Adam, Adafactor's factored state, RMSprop, Adagrad whose state is made
# when the optimizer is), gradients kept as zeroed tensors between steps (`set_to_none` False), gradient
# accumulation, and the same recording variants and dump points. Its truth.json says `set: fresh`.
def _fresh(**kw) -> dict:
    return dict(set="fresh", **kw)


FRESH_JOBS: dict[str, dict] = {
    # a CNN (BatchNorm: running statistics are buffers) with SGD momentum, on images
    "fresh_cnn_sgd_step_py_start": _fresh(model="cnn", optimizer="sgd", dump="after_step", record="start",
                                          stacks="python", batch=64),
    "fresh_cnn_sgd_fwd_all_dumpstep": _fresh(model="cnn", optimizer="sgd", dump="after_forward",
                                             record="dump_step", stacks="all", batch=64),
    "fresh_cnn_sgd_keepgrad_bwd_none_start": _fresh(model="cnn", optimizer="sgd", dump="after_backward",
                                                    record="start", stacks="none", batch=64,
                                                    set_to_none=False),
    "fresh_cnn_sgd_oom_bwd_py_start": _fresh(model="cnn", optimizer="sgd", dump="oom_backward", record="start",
                                             stacks="python", batch=128),
    "fresh_cnn_rmsprop_bf16_step_py_ring": _fresh(model="cnn", optimizer="rmsprop", dump="after_step",
                                                  record="ring", stacks="python", batch=64, amp=True,
                                                  max_entries=300),
    # a smaller GPT
    "fresh_small_adam_step_all_start": _fresh(shape="small", optimizer="adam", dump="after_step", record="start",
                                              stacks="all"),
    "fresh_small_adagrad_step_py_dumpstep": _fresh(shape="small", optimizer="adagrad", dump="after_step",
                                                   record="dump_step", stacks="python"),
    "fresh_small_adam_fwd_py_agent": _fresh(shape="small", optimizer="adam", dump="after_forward",
                                            record="agent", stacks="python"),
    "fresh_small_adam_keepgrad_fwd_py_start": _fresh(shape="small", optimizer="adam", dump="after_forward",
                                                     record="start", stacks="python", set_to_none=False),
    "fresh_small_adam_accum4_step_py_start": _fresh(shape="small", optimizer="adam", dump="after_step",
                                                    record="start", stacks="python", accum=4),
    "fresh_small_bf16_oom_fwd_all_start": _fresh(shape="small", dump="oom_forward", record="start",
                                                 stacks="all", amp=True, batch=16),
    "fresh_small_infer_dyn_bf16_py_start": _fresh(shape="small", dump="generate", record="start",
                                                  stacks="python", infer=True, cache="dynamic"),
    # a wider GPT (2048 wide, 3 blocks)
    "fresh_wide_adafactor_step_py_start": _fresh(shape="wide", optimizer="adafactor", dump="after_step",
                                                 record="start", stacks="python"),
    "fresh_wide_adafactor_bwd_all_dumpstep": _fresh(shape="wide", optimizer="adafactor", dump="after_backward",
                                                    record="dump_step", stacks="all"),
    "fresh_wide_bf16_oom_bwd_py_ring": _fresh(shape="wide", optimizer="adam", dump="oom_backward", record="ring",
                                              stacks="python", amp=True, batch=16, max_entries=600),
    "fresh_wide_infer_static_bf16_all_loaded": _fresh(shape="wide", dump="generate", record="dump_step",
                                                      stacks="all", infer=True, cache="static"),
    "fresh_wide_adamw_fwd_off": _fresh(shape="wide", dump="after_forward", record="off", stacks="python"),
    # an encoder-decoder (torch's nn.Transformer, 3 + 3 layers)
    "fresh_encdec_adamw_step_py_start": _fresh(model="encdec", dump="after_step", record="start",
                                               stacks="python"),
    "fresh_encdec_bf16_fwd_none_dumpstep": _fresh(model="encdec", dump="after_forward", record="dump_step",
                                                  stacks="none", amp=True),
    "fresh_encdec_rmsprop_accum2_bwd_py_start": _fresh(model="encdec", optimizer="rmsprop", dump="after_backward",
                                                       record="start", stacks="python", accum=2),
    "fresh_encdec_oom_fwd_py_start": _fresh(model="encdec", dump="oom_forward", record="start", stacks="python",
                                            batch=16),
    # a GPT whose output head is its token embedding (one parameter, two uses)
    "fresh_tied_adamw_step_py_start": _fresh(model="tied", dump="after_step", record="start", stacks="python"),
    "fresh_tied_sgd_keepgrad_step_all_dumpstep": _fresh(model="tied", optimizer="sgd", dump="after_step",
                                                        record="dump_step", stacks="all", set_to_none=False),
    "fresh_tied_infer_static_fp16_py_start": _fresh(model="tied", dump="generate", record="start",
                                                    stacks="python", infer=True, cache="static_class",
                                                    dtype="fp16"),
    "fresh_tied_infer_dyn_bf16_py_ring": _fresh(model="tied", dump="generate", record="ring", stacks="python",
                                                infer=True, cache="dynamic", max_entries=1500),
    # LoRA: the GPT's weights frozen (parameters without gradients), rank-16 adapters trained
    "fresh_lora_adamw_step_py_start": _fresh(model="lora", dump="after_step", record="start", stacks="python"),
    "fresh_lora_adamw_fwd_all_dumpstep": _fresh(model="lora", dump="after_forward", record="dump_step",
                                                stacks="all"),
    "fresh_lora_bf16_oom_bwd_py_start": _fresh(model="lora", dump="oom_backward", record="start",
                                               stacks="python", amp=True, batch=32),
    "fresh_lora_adamw_step_py_agent": _fresh(model="lora", dump="after_step", record="agent", stacks="python"),
    "fresh_lora_adamw_step_off": _fresh(model="lora", dump="after_step", record="off", stacks="python"),
}
# The late set (`--set late`, names `late_*`): written 2026-12-05 after the fresh set had been read block
# by block (so the fresh set is no longer a clean judge), for judging only: models neither set has (a ViT
# on images, an LSTM language model whose cuDNN weights share one flat buffer, a deep MLP, a deeper and
# narrower GPT), optimizers neither has (NAdam, RAdam, Adamax, SGD without momentum: no state at all,
# AdamW without foreach), and the same recordings and dump points. Its truth.json says `set: late`.
def _late(**kw) -> dict:
    return dict(set="late", **kw)


LATE_JOBS: dict[str, dict] = {
    # a ViT (16x16 patches of 224x224 images, 6 pre-norm encoder layers of 384)
    "late_vit_adamw_step_py_start": _late(model="vit", dump="after_step", record="start", stacks="python", batch=64),
    "late_vit_nadam_bf16_fwd_all_dumpstep": _late(model="vit", optimizer="nadam", dump="after_forward",
                                                  record="dump_step", stacks="all", amp=True, batch=64),
    "late_vit_sgdplain_bwd_none_start": _late(model="vit", optimizer="sgd_plain", dump="after_backward",
                                              record="start", stacks="none", batch=64),
    "late_vit_adamw_bf16_oom_bwd_py_start": _late(model="vit", dump="oom_backward", record="start",
                                                  stacks="python", amp=True, batch=128),
    "late_vit_radam_step_compile_py_start": _late(model="vit", optimizer="radam", dump="after_step",
                                                  record="start", stacks="python", compile=True, batch=64),
    "late_vit_adamw_step_off": _late(model="vit", dump="after_step", record="off", stacks="python", batch=64),
    # an LSTM language model (2 layers of 1024; cuDNN keeps its weights in one flat buffer)
    "late_lstm_adamw_step_py_start": _late(model="lstm", dump="after_step", record="start", stacks="python"),
    "late_lstm_adamax_fwd_py_dumpstep": _late(model="lstm", optimizer="adamax", dump="after_forward",
                                              record="dump_step", stacks="python"),
    "late_lstm_sgd_keepgrad_step_none_start": _late(model="lstm", optimizer="sgd", dump="after_step",
                                                    record="start", stacks="none", set_to_none=False),
    "late_lstm_adamw_oom_fwd_all_start": _late(model="lstm", dump="oom_forward", record="start", stacks="all",
                                               batch=32),
    "late_lstm_radam_accum2_step_py_ring": _late(model="lstm", optimizer="radam", dump="after_step",
                                                 record="ring", stacks="python", accum=2, max_entries=400),
    # a deep MLP (8 layers of 4096 with LayerNorm) on vectors
    "late_mlp_adamw_step_all_start": _late(model="mlp", dump="after_step", record="start", stacks="all",
                                           batch=512),
    "late_mlp_adamw_nofe_step_py_dumpstep": _late(model="mlp", optimizer="adamw_nofe", dump="after_step",
                                                  record="dump_step", stacks="python", batch=512),
    "late_mlp_nadam_bf16_bwd_py_agent": _late(model="mlp", optimizer="nadam", dump="after_backward",
                                              record="agent", stacks="python", amp=True, batch=512),
    "late_mlp_sgdplain_fwd_none_dumpstep": _late(model="mlp", optimizer="sgd_plain", dump="after_forward",
                                                 record="dump_step", stacks="none", batch=512),
    "late_mlp_adamax_oom_bwd_py_start": _late(model="mlp", optimizer="adamax", dump="oom_backward",
                                              record="start", stacks="python", batch=8192),
    # a deeper, narrower GPT (12 blocks of 768, 32k vocabulary, 256 tokens)
    "late_deep_nadam_step_py_start": _late(shape="deep", optimizer="nadam", dump="after_step", record="start",
                                           stacks="python"),
    "late_deep_adamw_inbwd_all_start": _late(shape="deep", dump="in_backward", record="start", stacks="all"),
    "late_deep_radam_bf16_step_none_dumpstep": _late(shape="deep", optimizer="radam", dump="after_step",
                                                     record="dump_step", stacks="none", amp=True),
    "late_deep_adamw_nofe_keepgrad_bwd_py_start": _late(shape="deep", optimizer="adamw_nofe",
                                                        dump="after_backward", record="start", stacks="python",
                                                        set_to_none=False),
    "late_deep_bf16_oom_fwd_py_ring": _late(shape="deep", dump="oom_forward", record="ring", stacks="python",
                                            amp=True, batch=32, max_entries=800),
    "late_deep_adamw_compile_bf16_fwd_py_start": _late(shape="deep", dump="after_forward", record="start",
                                                       stacks="python", amp=True, compile=True),
    "late_deep_infer_static_bf16_py_start": _late(shape="deep", dump="generate", record="start", stacks="python",
                                                  infer=True, cache="static"),
    "late_deep_infer_dyn_fp16_all_loaded": _late(shape="deep", dump="generate", record="dump_step",
                                                 stacks="all", infer=True, cache="dynamic", dtype="fp16"),
    "late_deep_infer_beam_bf16_none_start": _late(shape="deep", dump="generate", record="start", stacks="none",
                                                  infer=True, cache="beam"),
    "late_deep_infer_eval_fp32_py_loaded": _late(shape="deep", dump="generate", record="dump_step",
                                                 stacks="python", infer=True, cache="none", dtype="fp32"),
}
# The evening set (`--set eve`, names `eve_*`): written 2026-12-05 19:10 UTC, after the late set had been
# read block by block, for judging only: the models and optimizers of the sets above in pairings none of
# them has, weighted to the readings that have no stacks or no trace (recorded without stacks for the dump's
# step, in a ring, or not at all). Its truth.json says `set: eve`.
def _eve(**kw) -> dict:
    return dict(set="eve", **kw)


EVE_JOBS: dict[str, dict] = {
    "eve_vit_rmsprop_bwd_none_dumpstep": _eve(model="vit", optimizer="rmsprop", dump="after_backward",
                                              record="dump_step", stacks="none", batch=64),
    "eve_vit_adamw_compile_fwd_none_start": _eve(model="vit", dump="after_forward", record="start", stacks="none",
                                                 compile=True, batch=64),
    "eve_vit_adamw_nofe_bwd_py_off": _eve(model="vit", optimizer="adamw_nofe", dump="after_backward", record="off",
                                          stacks="python", batch=64),
    "eve_cnn_adamw_bf16_fwd_none_dumpstep": _eve(model="cnn", dump="after_forward", record="dump_step",
                                                 stacks="none", amp=True, batch=64),
    "eve_tied_nadam_inbwd_py_start": _eve(model="tied", optimizer="nadam", dump="in_backward", record="start",
                                          stacks="python"),
    "eve_encdec_nadam_step_none_start": _eve(model="encdec", optimizer="nadam", dump="after_step", record="start",
                                             stacks="none"),
    "eve_encdec_sgd_fwd_all_ring": _eve(model="encdec", optimizer="sgd", dump="after_forward", record="ring",
                                        stacks="all", max_entries=500),
    "eve_tied_adagrad_step_none_dumpstep": _eve(model="tied", optimizer="adagrad", dump="after_step",
                                                record="dump_step", stacks="none"),
    "eve_tied_infer_beam_bf16_py_ring": _eve(model="tied", dump="generate", record="ring", stacks="python",
                                             infer=True, cache="beam", max_entries=1500),
    "eve_mlp_radam_fwd_all_dumpstep": _eve(model="mlp", optimizer="radam", dump="after_forward",
                                           record="dump_step", stacks="all", batch=512),
    "eve_mlp_adagrad_step_py_agent": _eve(model="mlp", optimizer="adagrad", dump="after_step", record="agent",
                                          stacks="python", batch=512),
    "eve_lstm_nadam_bwd_none_dumpstep": _eve(model="lstm", optimizer="nadam", dump="after_backward",
                                             record="dump_step", stacks="none"),
    "eve_lstm_sgdplain_bwd_py_start": _eve(model="lstm", optimizer="sgd_plain", dump="after_backward",
                                           record="start", stacks="python"),
    "eve_small_sgd_keepgrad_step_py_off": _eve(shape="small", optimizer="sgd", dump="after_step", record="off",
                                               stacks="python", set_to_none=False),
    "eve_small_rmsprop_bf16_oom_bwd_none_start": _eve(shape="small", optimizer="rmsprop", dump="oom_backward",
                                                      record="start", stacks="none", amp=True, batch=32),
    "eve_wide_adamw_oom_fwd_none_dumpstep": _eve(shape="wide", dump="oom_forward", record="dump_step",
                                                 stacks="none", batch=16),
    "eve_wide_adafactor_bf16_step_none_dumpstep": _eve(shape="wide", optimizer="adafactor", dump="after_step",
                                                       record="dump_step", stacks="none", amp=True),
    "eve_deep_adamax_bf16_bwd_py_ring": _eve(shape="deep", optimizer="adamax", dump="after_backward",
                                             record="ring", stacks="python", amp=True, max_entries=800),
    "eve_deep_infer_static_fp16_none_start": _eve(shape="deep", dump="generate", record="start", stacks="none",
                                                  infer=True, cache="static", dtype="fp16"),
    "eve_lora_adamw_step_none_dumpstep": _eve(model="lora", dump="after_step", record="dump_step", stacks="none"),
}
SETS = {"tuning": JOBS, "fresh": FRESH_JOBS, "late": LATE_JOBS, "eve": EVE_JOBS}
ALL_JOBS = {**JOBS, **FRESH_JOBS, **LATE_JOBS, **EVE_JOBS}
# vocabulary, width, blocks, heads, tokens per sequence of the fresh set's GPT shapes and encoder-decoder
SHAPE_DIMS = {"small": (8192, 512, 4, 8, 256), "wide": (16_384, 2048, 3, 16, 512),
              "encdec": (8192, 512, 3, 8, 256), "deep": (32_000, 768, 12, 12, 256),
              "vit": (1000, 384, 6, 6, 196), "lstm": (16_384, 1024, 2, 1, 256), "mlp": (1024, 4096, 8, 1, 1)}
DEFAULTS = dict(amp=False, compile=False, optimizer="adamw", dump_step=2, warm=2, batch=BATCH, accum=1,
                max_entries=200_000, infer=False, cache="static", dtype="bf16", model="gpt", shape="base",
                set_to_none=None, set="tuning")


def spec_of(name: str) -> dict:
    return {**DEFAULTS, **ALL_JOBS[name]}


# ----------------------------------------------------------------------------------------------- truth
def label_blocks(segments: list, roles: list, residual_class: str) -> list:
    """[address, size, label, class] for every live block of `segments` (the snapshot's), from the
    roles' storages [address, nbytes, role]: a block takes the first role in LABEL_ORDER among the
    storages that start inside it (a storage starts at its block's address; views share it)."""
    rank = {r: i for i, r in enumerate(LABEL_ORDER)}
    starts = sorted((int(a), int(n), r) for a, n, r in roles)
    keys = [s[0] for s in starts]
    out = []
    for seg in segments:
        for b in seg.get("blocks", []):
            if b.get("state") not in ("active_allocated", "active_pending_free"):
                continue
            a, size = int(b["address"]), int(b["size"])
            i = bisect.bisect_left(keys, a)
            best = None
            while i < len(starts) and starts[i][0] < a + size:
                r = starts[i][2]
                if best is None or rank[r] < rank[best]:
                    best = r
                i += 1
            if best is None:
                # a storage that began before this block and runs into it (an expandable segment's
                # neighbour): rare, checked so that nothing is called unattributed by mistake
                j = bisect.bisect_right(keys, a) - 1
                if j >= 0 and starts[j][0] + starts[j][1] > a:
                    best = starts[j][2]
            label = best or "unattributed"
            out.append([a, size, label, CLASS_OF.get(label, residual_class)])
    return out


def phase_at(t_us: float, boundaries: list) -> str:
    """The phase a time falls in: boundaries are [t_us, phase] in time order."""
    ph = "setup"
    for t, name in boundaries:
        if t <= t_us:
            ph = name
        else:
            break
    return ph


def alloc_phases(trace: list, blocks: list, boundaries: list, offset_us: float) -> None:
    """Appends to each block the phase its allocation happened in (the last `alloc` at its address)."""
    last: dict[int, float] = {}
    for ev in trace:
        if ev.get("action") == "alloc":
            last[int(ev["addr"])] = ev.get("time_us", 0)
        elif ev.get("action") == "free_completed":
            last.pop(int(ev["addr"]), None)
    for blk in blocks:
        t = last.get(blk[0])
        blk.append("before_trace" if t is None else phase_at(t - offset_us, boundaries))


def summarise(blocks: list) -> dict:
    lab: dict[str, int] = {}
    cls: dict[str, int] = {}
    ph: dict[str, int] = {}
    for b in blocks:
        lab[b[2]] = lab.get(b[2], 0) + b[1]
        cls[b[3]] = cls.get(b[3], 0) + b[1]
        if len(b) > 4:
            ph[b[4]] = ph.get(b[4], 0) + b[1]
    return {"live_bytes": sum(b[1] for b in blocks), "label_bytes": lab, "class_bytes": cls,
            "alloc_phase_bytes": ph}


# --------------------------------------------------------------------------------- the fresh set's models
def make_optimizer(torch, name: str, params: list):
    """The job's optimizer over the parameters that train (a LoRA job's frozen weights are left out)."""
    if name == "sgd":  # a momentum buffer per parameter, made at the first step
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=1e-4)
    if name == "adafactor":  # factored second moment: a row and a column vector per matrix
        return torch.optim.Adafactor(params, lr=1e-2)
    if name == "rmsprop":  # square_avg and a momentum buffer
        return torch.optim.RMSprop(params, lr=1e-4, momentum=0.9)
    if name == "adagrad":  # its `sum` is made with the optimizer, before any step
        return torch.optim.Adagrad(params, lr=1e-2)
    if name == "nadam":  # exp_avg, exp_avg_sq, and a mu_product scalar per parameter
        return torch.optim.NAdam(params, lr=1e-4)
    if name == "radam":
        return torch.optim.RAdam(params, lr=1e-4)
    if name == "adamax":  # exp_avg and exp_inf
        return torch.optim.Adamax(params, lr=1e-4)
    if name == "sgd_plain":  # no momentum: no state at all
        return torch.optim.SGD(params, lr=1e-3)
    if name == "adamw_nofe":  # one parameter at a time: no multi-tensor temporaries
        return torch.optim.AdamW(params, lr=1e-4, foreach=False)
    return torch.optim.AdamW(params, lr=1e-4, fused=name == "adamw_fused")


def lora_wrap(model, nn, rank: int) -> None:
    """Freezes every weight of the GPT and adds a trained low-rank pair beside each linear layer of its
    blocks (the base weights stay parameters: live, without gradients or optimizer state)."""
    import torch

    class LoRALinear(nn.Module):
        def __init__(self, base):
            super().__init__()
            self.base = base
            self.lora_a = nn.Parameter(torch.randn(rank, base.in_features) * 0.01)
            self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))

        def forward(self, x):
            return self.base(x) + (x @ self.lora_a.t()) @ self.lora_b.t()

    for p in model.parameters():
        p.requires_grad_(False)
    for blk in model.blocks:
        for name in ("qkv", "proj", "fc1", "fc2"):
            setattr(blk, name, LoRALinear(getattr(blk, name)))


def _image_data(torch, F, dev, batch: int, img: int, classes: int):  # noqa: N803
    """(batch_of(step) -> (images, labels), loss_of(fwd, x, y) -> (output, loss)) of an image classifier."""
    def batch_of(step: int):
        g = torch.Generator(device="cpu").manual_seed(step)
        return (torch.randn(batch, 3, img, img, generator=g).to(dev),
                torch.randint(0, classes, (batch,), generator=g).to(dev))

    def loss_of(fwd, x, y):
        out = fwd(x)
        return out, F.cross_entropy(out.float(), y)

    return batch_of, loss_of


def _token_data(torch, F, dev, batch: int, seq: int, vocab: int):  # noqa: N803
    """(batch_of(step) -> (tokens, next tokens), loss_of(fwd, x, y) -> (logits, loss)) of a language model."""
    def batch_of(step: int):
        g = torch.Generator(device="cpu").manual_seed(step)
        x = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(dev)
        return x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def loss_of(fwd, x, y):
        logits = fwd(x)
        return logits, F.cross_entropy(logits.float().view(-1, vocab), y.view(-1))

    return batch_of, loss_of


def fresh_model(kind: str, torch, nn, F, dims: tuple, dev, batch: int, dry: bool):  # noqa: N803
    """(model on dev, batch_of(step) -> (x, y), loss_of(fwd, x, y) -> (output, loss)) of the fresh set's
    models that are not the GPT: `cnn` (conv, BatchNorm, ReLU; images) and `encdec` (nn.Transformer)."""
    vocab, d, layers, heads, seq = dims
    if kind == "cnn":
        chans, img, classes = ((8, 16), 16, 10) if dry else ((64, 128, 256, 512), 64, 1000)

        def conv_bn(i, o, stride):
            return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.ReLU(inplace=True))

        mods = [conv_bn(3, chans[0], 1)]
        for i, o in zip(chans[:-1], chans[1:], strict=True):
            mods += [conv_bn(i, o, 2), conv_bn(o, o, 1)]
        model = nn.Sequential(*mods, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(chans[-1], classes))

        return (model.to(dev), *_image_data(torch, F, dev, batch, img, classes))
    if kind == "encdec":
        class EncDec(nn.Module):
            def __init__(self):
                super().__init__()
                self.src_emb, self.tgt_emb = nn.Embedding(vocab, d), nn.Embedding(vocab, d)
                self.pos = nn.Embedding(4096, d)
                self.tf = nn.Transformer(d, heads, layers, layers, 4 * d, dropout=0.0, batch_first=True)
                self.head = nn.Linear(d, vocab, bias=False)

            def forward(self, src, tgt):
                ps = self.pos(torch.arange(src.shape[1], device=src.device))
                pt = self.pos(torch.arange(tgt.shape[1], device=tgt.device))
                mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
                h = self.tf(self.src_emb(src) + ps, self.tgt_emb(tgt) + pt, tgt_mask=mask, tgt_is_causal=True)
                return self.head(h)

        def batch_of(step: int):
            g = torch.Generator(device="cpu").manual_seed(step)
            src = torch.randint(0, vocab, (batch, seq), generator=g).to(dev)
            t = torch.randint(0, vocab, (batch, seq + 1), generator=g).to(dev)
            return (src, t[:, :-1].contiguous()), t[:, 1:].contiguous()

        def loss_of(fwd, x, y):
            out = fwd(*x)
            return out, F.cross_entropy(out.float().view(-1, vocab), y.view(-1))

        return EncDec().to(dev), batch_of, loss_of
    if kind == "vit":
        img, patch, classes = (32, 8, vocab) if dry else (224, 16, vocab)

        class ViT(nn.Module):
            def __init__(self):
                super().__init__()
                self.patch = nn.Conv2d(3, d, patch, patch)
                self.cls = nn.Parameter(torch.zeros(1, 1, d))
                self.pos = nn.Parameter(torch.randn(1, (img // patch) ** 2 + 1, d) * 0.02)
                layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                                   batch_first=True, norm_first=True)
                self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
                self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, classes)

            def forward(self, x):
                h = self.patch(x).flatten(2).transpose(1, 2)
                h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], 1) + self.pos
                return self.head(self.norm(self.enc(h))[:, 0])

        return (ViT().to(dev), *_image_data(torch, F, dev, batch, img, classes))
    if kind == "lstm":
        class LSTMLM(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(vocab, d)
                self.rnn = nn.LSTM(d, d, layers, batch_first=True)
                self.head = nn.Linear(d, vocab)

            def forward(self, idx):
                return self.head(self.rnn(self.emb(idx))[0])

        return (LSTMLM().to(dev), *_token_data(torch, F, dev, batch, seq, vocab))
    if kind == "mlp":
        mods = [nn.Linear(vocab, d)]
        for _ in range(layers):
            mods += [nn.LayerNorm(d), nn.GELU(), nn.Linear(d, d)]
        model = nn.Sequential(*mods, nn.LayerNorm(d), nn.Linear(d, vocab))

        def batch_of(step: int):
            g = torch.Generator(device="cpu").manual_seed(step)
            return (torch.randn(batch, vocab, generator=g).to(dev),
                    torch.randint(0, vocab, (batch,), generator=g).to(dev))

        def loss_of(fwd, x, y):
            out = fwd(x)
            return out, F.cross_entropy(out.float(), y)

        return model.to(dev), batch_of, loss_of
    raise ValueError(f"unknown model {kind}")


# ------------------------------------------------------------------------------------------------- job
def run_job(name: str, out: str) -> None:
    spec = spec_of(name)
    jdir = os.path.join(out, name)
    os.makedirs(jdir, exist_ok=True)
    result = {"job": name, "spec": spec, "outcome": "started", "t0": time.time()}

    def save_result():
        with open(os.path.join(jdir, "result.json"), "w") as fh:
            json.dump(result, fh, indent=1)

    save_result()
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dry = os.environ.get("COMPOSITION_CPU_DRY") == "1"  # the job's logic on the CPU, no memory figures
    if not torch.cuda.is_available() and not dry:
        result["outcome"] = "no cuda"
        save_result()
        return
    cu = _DryCuda() if dry else _Cuda(torch)
    shape = spec["model"] if spec["model"] in ("encdec", "vit", "lstm", "mlp") else spec["shape"]
    VOCAB, D, LAYERS, HEADS, SEQ = DRY_DIMS if dry else SHAPE_DIMS.get(shape, FULL_DIMS)  # noqa: N806
    dev = torch.device("cpu") if dry else torch.device("cuda", 0)
    result.update(torch=torch.__version__, device=cu.get_device_name(0),
                  total_memory=cu.get_device_properties(0).total_memory)
    rec_state = {"on": False}

    def record(on: bool, max_entries: int | None = None) -> None:
        mem = cu.memory
        if not on:
            mem._record_memory_history(enabled=None)
        elif spec["stacks"] == "none":
            mem._record_memory_history(enabled="all", context=None, stacks="python",
                                       max_entries=max_entries or spec["max_entries"])
        else:
            mem._record_memory_history(enabled="all", context="all", stacks=spec["stacks"],
                                       max_entries=max_entries or spec["max_entries"])
        rec_state["on"] = on

    cu.init()
    if spec["record"] in ("start", "ring", "agent"):
        record(True)

    # cuBLAS workspaces: the blocks a forward and backward matmul leave live once their tensors are gone
    def live_blocks() -> set:
        return {(b["address"], b["size"]) for s in cu.memory._snapshot()["segments"]
                for b in s["blocks"] if b["state"] == "active_allocated"}

    before = live_blocks()
    for dt in (torch.float32, torch.bfloat16):
        a = torch.randn(256, 256, device=dev, dtype=dt, requires_grad=True)
        (a @ a).sum().backward()
        del a
    cu.synchronize()
    workspace = [[addr, size, "workspace"] for addr, size in live_blocks() - before]

    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            self.fc1, self.fc2 = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(self, x, cache=None, pos=0):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, HEADS, D // HEADS).transpose(1, 3).unbind(2)
            if cache is None:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif not torch.is_tensor(cache[0]):  # (a growing cache object, this layer's index)
                ck, cv = cache[0].update(cache[1], k, v)
                a = F.scaled_dot_product_attention(q, ck, cv, is_causal=t > 1)
            else:
                ck, cv = cache
                ck[:, :, pos:pos + t] = k
                cv[:, :, pos:pos + t] = v
                a = F.scaled_dot_product_attention(q, ck[:, :, :pos + t], cv[:, :, :pos + t], is_causal=t > 1)
            x = x + self.proj(a.transpose(1, 2).reshape(b, t, D))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(VOCAB, D)
            self.pos = nn.Embedding(4096, D)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.lnf = nn.LayerNorm(D)
            self.head = nn.Linear(D, VOCAB, bias=False)
            self.register_buffer("scale", torch.ones(D))

        def forward(self, idx, caches=None, pos=0):
            t = idx.shape[1]
            x = self.emb(idx) + self.pos(torch.arange(pos, pos + t, device=idx.device)) * self.scale
            for i, blk in enumerate(self.blocks):
                c = None if caches is None else caches[i] if isinstance(caches, list) else (caches, i)
                x = blk(x, c, pos)
            return self.head(self.lnf(x))

    batch = spec["batch"]

    batch_of, loss_of = _token_data(torch, F, dev, batch, SEQ, VOCAB)

    if spec["model"] in ("gpt", "tied", "lora"):
        model = GPT()
        if spec["model"] == "tied":
            model.head.weight = model.emb.weight
        elif spec["model"] == "lora":
            lora_wrap(model, nn, 4 if dry else 16)
        model = model.to(dev)
    else:
        model, batch_of, loss_of = fresh_model(spec["model"], torch, nn, F, (VOCAB, D, LAYERS, HEADS, SEQ),
                                               dev, batch, dry)
    result["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
    opt = None
    if not spec["infer"]:
        opt = make_optimizer(torch, spec["optimizer"], [p for p in model.parameters() if p.requires_grad])
    fwd = torch.compile(model) if spec["compile"] else model
    set_to_none = spec["accum"] == 1 if spec["set_to_none"] is None else spec["set_to_none"]

    boundaries: list = []  # [t_us, phase] of the dump step (and of generation)
    peaks: dict = {}
    cur = {"phase": "setup", "dump": False}
    extra: list = []  # [weakref or tensor, role]
    saved: list = []

    def mark(phase: str) -> None:
        if cur["dump"]:
            cu.synchronize()
            peaks[cur["phase"]] = max(peaks.get(cur["phase"], 0), cu.max_memory_allocated(dev))
            cu.reset_peak_memory_stats(dev)
        boundaries.append([time.time() * 1e6, phase])  # every step's: a block's phase in whichever step
        cur["phase"] = phase

    def all_roles() -> list:
        roles = [list(w) for w in workspace]

        def add(t, role):
            if t is None or not torch.is_tensor(t) or t.device.type != dev.type:
                return
            st = t.untyped_storage()
            if st.nbytes() > 0:
                roles.append([st.data_ptr(), st.nbytes(), role])

        for p in model.parameters():
            add(p, "parameter")
            add(p.grad, "gradient")
        for b in model.buffers():
            add(b, "buffer")
        if opt is not None:
            for st in opt.state.values():
                for v in st.values():
                    add(v, "optimizer_state")
        for ref, role in extra:
            add(ref() if isinstance(ref, weakref.ref) else ref, role)
        for ref in saved:
            add(ref(), "saved")
        return roles

    def agent_roles():
        try:
            sys.path.insert(0, ROOT)
            from memq.agent import roles as agent_roles_mod
        except Exception as exc:  # noqa: BLE001
            return {"error": f"memq not importable: {exc}"}
        try:
            if cur.get("cache_obj") is not None and hasattr(agent_roles_mod, "declare"):
                agent_roles_mod.declare(cur["cache_obj"], "cache")  # what a user of the agent would write
            return agent_roles_mod.collect(opt, model, device_types=(dev.type,))
        except Exception as exc:  # noqa: BLE001
            return {"error": repr(exc)}

    def dump(point: str, oom: dict | None = None) -> None:
        t0 = time.perf_counter()
        snap = cu.memory._snapshot()
        took = time.perf_counter() - t0
        roles = all_roles()
        if oom is None:
            peaks[cur["phase"]] = max(peaks.get(cur["phase"], 0), cu.max_memory_allocated(dev))
        # what no role holds: forward's and backward's intermediates while the step runs, leftovers after
        in_step = point not in ("after_step", "after_backward")
        blocks = label_blocks(snap["segments"], roles, "activations" if in_step else "other")
        dev_trace = (snap.get("device_traces") or [[]])[0]
        marker = [ev for ev in dev_trace if ev.get("action") == "alloc" and ev.get("size") == MARKER_BYTES]
        offset = (marker[-1]["time_us"] - cur["marker_t_us"]) if marker and cur.get("marker_t_us") else 0.0
        alloc_phases(dev_trace, blocks, boundaries, offset)
        if oom is None:
            peak_phase = max(peaks, key=peaks.get) if peaks else None
        else:
            peak_phase = cur["phase"]
        truth = {"job": name, "spec": spec, "dump_point": point, "phase_at_dump": cur["phase"],
                 "peak_phase": peak_phase, "peaks": peaks, "boundaries": boundaries,
                 "clock_offset_us": offset, "marker_found": bool(marker), "trace_entries": len(dev_trace),
                 "recording": rec_state["on"], "oom": oom, "snapshot_s": round(took, 3),
                 "param_bytes": result["param_bytes"], "roles": roles, "blocks": blocks,
                 "agent_roles": agent_roles(), **summarise(blocks)}
        with gzip.open(os.path.join(jdir, "snapshot.pickle.gz"), "wb", compresslevel=6) as fh:
            pickle.dump(snap, fh, protocol=4)
        with open(os.path.join(jdir, "truth.json"), "w") as fh:
            json.dump(truth, fh)
        result.update(dumped=point, live_bytes=truth["live_bytes"], class_bytes=truth["class_bytes"],
                      peak_phase=peak_phase, trace_entries=len(dev_trace))
        cur["dumped"] = True

    def on_oom(device, alloc, device_alloc, device_free):
        if cur.get("dumped") or not cur["dump"]:
            return
        # the step's peak is this request: what was live plus what was asked for
        dump(spec["dump"], oom={"alloc": int(alloc), "device_alloc": int(device_alloc),
                                "device_free": int(device_free), "phase": cur["phase"]})

    def train_step(step: int, is_dump: bool) -> None:
        cur["dump"] = is_dump
        if is_dump:
            cu.synchronize()
            cu.reset_peak_memory_stats(dev)
            m = torch.empty(MARKER_BYTES, dtype=torch.uint8, device=dev)
            cur["marker_t_us"] = time.time() * 1e6
            del m
        boundaries.append([time.time() * 1e6, "zero_grad"])
        cur["phase"] = "zero_grad"
        opt.zero_grad(set_to_none=set_to_none)
        for micro in range(spec["accum"]):
            x, y = batch_of(step * 10 + micro)
            extra[:] = [(weakref.ref(t), "input") for t in (*(x if isinstance(x, tuple) else (x,)), y)]
            last = micro == spec["accum"] - 1
            mark("forward")
            hooks = torch.autograd.graph.saved_tensors_hooks(
                lambda t: (saved.append(weakref.ref(t)), t)[1], lambda t: t) if not spec["compile"] else None
            if hooks is not None:
                hooks.__enter__()
            try:
                with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=spec["amp"]):
                    logits, loss = loss_of(fwd, x, y)
                    loss = loss / spec["accum"]
            finally:
                if hooks is not None:
                    hooks.__exit__(None, None, None)
            extra.extend([(weakref.ref(logits), "output"), (weakref.ref(loss), "output")])
            if is_dump and last and spec["dump"] == "after_forward":
                dump("after_forward")
                return
            if is_dump and last and spec["dump"] == "in_backward":
                def grad_hook(g, seen={"n": 0}):  # noqa: B006 - one counter for the one hook
                    seen["n"] += 1
                    if seen["n"] == 1:  # a middle block's weight gradient is made: backward is half done
                        dump("in_backward")
                    return g

                model.blocks[LAYERS // 2].fc2.weight.register_hook(grad_hook)
            mark("backward")
            loss.backward()
            del logits, loss
            saved.clear()
        extra[:] = [e for e in extra if e[1] == "input"]
        if is_dump and spec["dump"] == "after_backward":
            mark("after_backward")
            dump("after_backward")
            return
        mark("optimizer_step")
        opt.step()
        mark("end")
        if is_dump and spec["dump"] == "after_step":
            dump("after_step")

    class DynCache:
        """A cache that grows by concatenation per token, one key and one value tensor per layer (as
        transformers' DynamicCache); a beam search reorders it between tokens."""

        def __init__(self):
            self.keys, self.values = [], []

        def update(self, i, k, v):
            if len(self.keys) <= i:
                self.keys.append(k.contiguous())
                self.values.append(v.contiguous())
            else:
                self.keys[i] = torch.cat([self.keys[i], k], dim=2)
                self.values[i] = torch.cat([self.values[i], v], dim=2)
            return self.keys[i], self.values[i]

        def reorder(self, idx):
            for i in range(len(self.keys)):
                self.keys[i] = self.keys[i].index_select(0, idx)
                self.values[i] = self.values[i].index_select(0, idx)

    class StaticCache:
        """A cache allocated whole before generation, written in place (as transformers' StaticCache)."""

        def __init__(self, layers, shape, dtype):
            self.layers = []
            for _ in range(layers):
                self.layers.append((torch.zeros(shape, device=dev, dtype=dtype),
                                    torch.zeros(shape, device=dev, dtype=dtype)))

    try:
        if spec["infer"]:
            dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[spec["dtype"]]
            model.to(dt).eval()
            result["param_bytes"] = sum(p.numel() * p.element_size() for p in model.parameters())
            pb, plen, gen = 8, 512, 64
            beams = 4 if spec["cache"] == "beam" else 1
            cache_obj = None
            if spec["cache"] == "static":
                caches = [(torch.zeros(pb, HEADS, plen + gen, D // HEADS, device=dev, dtype=dt),
                           torch.zeros(pb, HEADS, plen + gen, D // HEADS, device=dev, dtype=dt))
                          for _ in range(LAYERS)]
            elif spec["cache"] == "static_class":
                cache_obj = StaticCache(LAYERS, (pb, HEADS, plen + gen, D // HEADS), dt)
                caches = cache_obj.layers
            elif spec["cache"] == "none":
                caches = None
            else:
                caches = cache_obj = DynCache()
            cur["cache_obj"] = cache_obj if cache_obj is not None else caches

            def cache_tensors():
                if caches is None:
                    return []
                if isinstance(caches, list):
                    return [t for kv in caches for t in kv]
                return caches.keys + caches.values

            if spec["record"] == "dump_step":
                record(True)
            cur["dump"] = True
            cu.reset_peak_memory_stats(dev)
            m = torch.empty(MARKER_BYTES, dtype=torch.uint8, device=dev)
            cur["marker_t_us"] = time.time() * 1e6
            del m
            with torch.no_grad():
                prompt = torch.randint(0, VOCAB, (pb // beams, plen), device=dev)
                if beams > 1:
                    prompt = prompt.repeat_interleave(beams, 0)
                extra.append((weakref.ref(prompt), "input"))
                boundaries.append([time.time() * 1e6, "forward"])
                cur["phase"] = "forward"
                if caches is None:  # an evaluation loop: a batch per call, every batch's scores kept
                    kept = []
                    for i in range(8):
                        g = torch.Generator(device="cpu").manual_seed(100 + i)
                        xb = torch.randint(0, VOCAB, (pb, plen), generator=g).to(dev)
                        kept.append(fwd(xb)[:, -1].float())
                    extra.extend((weakref.ref(t), "output") for t in kept)
                elif beams == 1:
                    tok = fwd(prompt, caches, 0)[:, -1:].argmax(-1)
                    for i in range(gen // 2):
                        tok = fwd(tok, caches, plen + i)[:, -1:].argmax(-1)
                    extra.append((weakref.ref(tok), "output"))
                else:  # beam search: the best `beams` continuations of each prompt, the cache reordered
                    scores = torch.zeros(pb, device=dev)
                    seqs, inp, pos = prompt, prompt, 0
                    for _ in range(gen // 2):
                        logp = fwd(inp, caches, pos)[:, -1].float().log_softmax(-1) + scores[:, None]
                        pos += inp.shape[1]
                        top, idx = logp.view(pb // beams, -1).topk(beams, dim=-1)
                        rows = (idx // VOCAB + torch.arange(0, pb, beams, device=dev)[:, None]).view(-1)
                        inp = (idx % VOCAB).view(-1, 1)
                        scores = top.view(-1)
                        caches.reorder(rows)
                        seqs = torch.cat([seqs.index_select(0, rows), inp], 1)
                    extra.extend([(weakref.ref(seqs), "output"), (weakref.ref(scores), "output"),
                                  (weakref.ref(inp), "output")])
                extra.extend((t, "kv_cache") for t in cache_tensors())
                peaks["forward"] = cu.max_memory_allocated(dev)
                dump("generate")
            result["outcome"] = "completed"
        else:
            if spec["dump"].startswith("oom"):
                cu.attach_oom_observer(on_oom)
            dump_step = spec["dump_step"]
            for step in range(dump_step + 1):
                if spec["record"] in ("dump_step",) and step == dump_step:
                    record(True)
                if spec["record"] == "ring" and step == 0:
                    record(True, spec["max_entries"])
                if spec["record"] == "agent" and step == spec["warm"]:
                    record(False)
                if spec["dump"].startswith("oom") and step == dump_step:
                    # the cap: between the live bytes at the step's start and the end of forward (an OOM in
                    # forward), or between the end of forward and the step's peak (in backward), measured
                    # on the step before at the same batch
                    base, fwd_end, peak = cur["base"], cur["fwd_end"], cur["peak"]
                    cap = base + (fwd_end - base) // 2 if spec["dump"] == "oom_forward" else \
                        fwd_end + max(peak - fwd_end, 0) // 2
                    cu.empty_cache()
                    frac = min(1.0, cap / result["total_memory"])
                    cu.set_per_process_memory_fraction(frac, dev)
                    result.update(cap_bytes=int(frac * result["total_memory"]), base=base, fwd_end=fwd_end,
                                  warm_peak=peak)
                if spec["dump"].startswith("oom") and step == dump_step - 1:
                    cu.synchronize()
                    opt.zero_grad(set_to_none=set_to_none)
                    cur["base"] = cu.memory_allocated(dev)
                    cu.reset_peak_memory_stats(dev)
                    x, y = batch_of(step)
                    mark("forward")
                    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=spec["amp"]):
                        logits, loss = loss_of(fwd, x, y)
                    cu.synchronize()
                    cur["fwd_end"] = cu.memory_allocated(dev)
                    mark("backward")
                    loss.backward()
                    mark("optimizer_step")
                    opt.step()
                    mark("end")
                    del logits, loss, x, y
                    cu.synchronize()
                    cur["peak"] = cu.max_memory_allocated(dev)
                    continue
                train_step(step, step == dump_step)
            result["outcome"] = "completed" if cur.get("dumped") else "no dump"
            if spec["dump"].startswith("oom") and not cur.get("dumped"):
                result["outcome"] = "no oom"
    except torch.cuda.OutOfMemoryError as exc:
        result.update(outcome="oom" if cur.get("dumped") else "oom without dump", message=str(exc)[:600])
    result["wall_s"] = round(time.time() - result["t0"], 2)
    save_result()


class _Cuda:
    """torch.cuda, and the allocator's OOM observer under one name."""

    def __init__(self, torch):
        self._torch = torch

    def __getattr__(self, name):
        return getattr(self._torch.cuda, name)

    def attach_oom_observer(self, fn):
        self._torch._C._cuda_attach_out_of_memory_observer(fn)


class _DryCuda:
    """COMPOSITION_CPU_DRY=1: what the job asks of torch.cuda, answered without a GPU (empty snapshots,
    zero figures), to check the job's own logic on a machine without one."""

    class OutOfMemoryError(RuntimeError):
        pass

    class memory:  # noqa: N801 - stands in for the module
        @staticmethod
        def _record_memory_history(**kw):
            return None

        @staticmethod
        def _snapshot():
            return {"segments": [], "device_traces": [[]]}

    class _Props:
        total_memory = 140 * GiB

    def get_device_name(self, i):
        return "cpu (dry run)"

    def get_device_properties(self, i):
        return self._Props()

    def init(self):
        return None

    def synchronize(self, *a):
        return None

    def max_memory_allocated(self, *a):
        return 0

    def memory_allocated(self, *a):
        return 0

    def reset_peak_memory_stats(self, *a):
        return None

    def empty_cache(self):
        return None

    def set_per_process_memory_fraction(self, *a):
        return None

    def attach_oom_observer(self, fn):
        return None


# ---------------------------------------------------------------------------------------------- parent
class Runner:
    def __init__(self, out: str, budget: float, timeout: float):
        self.out, self.deadline, self.timeout = out, time.time() + budget, timeout
        self.summary: dict = {"started": time.time(), "budget_s": budget, "jobs": {}}
        self.lock = threading.Lock()
        os.makedirs(out, exist_ok=True)

    def write(self) -> None:
        with self.lock:
            tmp = os.path.join(self.out, "summary.json.tmp")
            with open(tmp, "w") as fh:
                json.dump(self.summary, fh, indent=1)
            os.replace(tmp, os.path.join(self.out, "summary.json"))

    def job(self, name: str) -> None:
        left = self.deadline - time.time()
        if left < (40 if ALL_JOBS[name].get("compile") else 12):
            self.summary["jobs"][name] = {"outcome": "skipped: budget"}
            self.write()
            print(f"[skip] {name}: budget", flush=True)
            return
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("PYTORCH_ALLOC_CONF", None)
        cmd = [sys.executable, os.path.abspath(__file__), "--job", name, "--out", self.out]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=ROOT,
                               timeout=min(self.timeout, max(5.0, left - 2)))
            rc, tail = p.returncode, (p.stdout + p.stderr)[-2000:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", ""
        try:
            with open(os.path.join(self.out, name, "result.json")) as fh:
                res = json.load(fh)
        except (OSError, ValueError):
            res = {"outcome": "no result"}
        res.update(rc=rc, wall_s=round(time.time() - t0, 1))
        if rc != 0:
            res["tail"] = tail
        res.pop("spec", None)
        with self.lock:
            self.summary["jobs"][name] = res
        self.write()
        cb = res.get("class_bytes") or {}
        print(f"[{name}] {res.get('outcome')} rc={rc} {res['wall_s']}s live={res.get('live_bytes', 0) / GiB:.2f}GiB "
              + " ".join(f"{k}={v / GiB:.2f}" for k, v in sorted(cb.items())), flush=True)


def selftest() -> None:
    """No torch: the labelling and phase logic on made-up blocks."""
    segs = [{"blocks": [{"address": 1000, "size": 512, "state": "active_allocated"},
                        {"address": 1512, "size": 512, "state": "active_allocated"},
                        {"address": 2024, "size": 1024, "state": "inactive"},
                        {"address": 3048, "size": 1024, "state": "active_allocated"},
                        {"address": 4072, "size": 2048, "state": "active_pending_free"}]}]
    roles = [[1000, 512, "saved"], [1000, 512, "parameter"], [1512, 100, "gradient"], [4072, 2048, "input"]]
    blocks = label_blocks(segs, roles, "activations")
    assert [b[2] for b in blocks] == ["parameter", "gradient", "unattributed", "input"], blocks
    assert [b[3] for b in blocks] == ["parameters", "gradients", "activations", "activations"], blocks
    bounds = [[100.0, "forward"], [200.0, "backward"], [300.0, "optimizer_step"]]
    assert phase_at(50, bounds) == "setup" and phase_at(150, bounds) == "forward"
    assert phase_at(250, bounds) == "backward" and phase_at(350, bounds) == "optimizer_step"
    trace = [{"action": "alloc", "addr": 1000, "time_us": 150}, {"action": "alloc", "addr": 3048, "time_us": 90},
             {"action": "free_completed", "addr": 3048, "time_us": 95},
             {"action": "alloc", "addr": 3048, "time_us": 260}]
    alloc_phases(trace, blocks, bounds, 0.0)
    assert [b[4] for b in blocks] == ["forward", "before_trace", "backward", "before_trace"], blocks
    s = summarise(blocks)
    assert s["live_bytes"] == 512 + 512 + 1024 + 2048 and s["class_bytes"]["activations"] == 3072
    assert not set(JOBS) & set(FRESH_JOBS) and all(n.startswith("fresh_") for n in FRESH_JOBS)
    assert not set(JOBS) & set(LATE_JOBS) and all(n.startswith("late_") for n in LATE_JOBS)
    assert set(CLASS_OF) == set(LABEL_ORDER)
    for name in ALL_JOBS:
        sp = spec_of(name)
        assert sp["set"] == next(k for k, v in SETS.items() if name in v), name
        assert sp["model"] in ("gpt", "tied", "lora", "cnn", "encdec", "vit", "lstm", "mlp")
        assert sp["shape"] in ("base", *SHAPE_DIMS), name
        assert sp["optimizer"] in ("adamw", "adamw_fused", "sgd", "adam", "adafactor", "rmsprop", "adagrad",
                                   "nadam", "radam", "adamax", "sgd_plain", "adamw_nofe"), name
        assert sp["set_to_none"] in (None, True, False), name
        # the GPT's cache, beams and gradient hook are the only inference and in-backward code
        assert not (sp["infer"] or sp["dump"] == "in_backward") or sp["model"] in ("gpt", "tied"), name
        assert sp["dump"] in ("after_step", "after_forward", "after_backward", "in_backward", "oom_forward",
                              "oom_backward", "generate"), name
        assert sp["record"] in ("start", "dump_step", "ring", "agent", "off"), name
        assert sp["stacks"] in ("python", "all", "none"), name
        assert sp["cache"] in ("static", "static_class", "dynamic", "beam", "none"), name
    print(f"selftest ok ({len(JOBS)} tuning jobs, {len(FRESH_JOBS)} fresh jobs, {len(LATE_JOBS)} late jobs, "
          f"{len(EVE_JOBS)} eve jobs)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="folder for everything this writes")
    ap.add_argument("--only", default="", help="comma-separated job names (default: all of --set)")
    ap.add_argument("--set", default="tuning", choices=tuple(SETS),
                    help="tuning: the jobs of one GPT; fresh and late: judging sets of other models and optimizers")
    ap.add_argument("--budget", type=float, default=190.0, help="seconds all jobs may take together")
    ap.add_argument("--parallel", type=int, default=6, help="jobs at once on the one GPU")
    ap.add_argument("--timeout", type=float, default=150.0, help="seconds one job may take")
    ap.add_argument("--job", default="", help=argparse.SUPPRESS)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.list:
        for n in SETS[args.set]:
            print(n, json.dumps(SETS[args.set][n]))
        return
    if args.selftest:
        selftest()
        return
    if not args.out:
        ap.error("--out is required")
    if args.job:
        if args.job not in ALL_JOBS:
            ap.error(f"unknown job {args.job}")
        run_job(args.job, args.out)
        return
    names = [n for n in (args.only.split(",") if args.only else SETS[args.set]) if n]
    bad = [n for n in names if n not in ALL_JOBS]
    if bad:
        ap.error(f"unknown jobs: {', '.join(bad)}")
    # the slow ones (torch.compile) first, so that the short ones fill in behind them
    names.sort(key=lambda n: not ALL_JOBS[n].get("compile"))
    r = Runner(args.out, args.budget, args.timeout)
    r.write()
    with ThreadPoolExecutor(max_workers=max(1, args.parallel)) as ex:
        list(ex.map(r.job, names))
    r.summary["finished"] = time.time()
    r.write()
    done = sum(1 for v in r.summary["jobs"].values() if v.get("truth", True) and v.get("dumped"))
    print(f"{done}/{len(names)} jobs dumped a snapshot; {args.out}/summary.json", flush=True)


if __name__ == "__main__":
    main()
