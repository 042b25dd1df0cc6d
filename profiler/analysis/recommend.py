"""Ranked recommendations for a diagnosis. Each carries the number behind it, and where popular
advice will not help, a recommendation says so explicitly (so users stop trying it)."""

from __future__ import annotations

from profiler.analysis import frames as fr
from profiler.analysis.classify import Facts, g, optimizer_state_sizes
from profiler.analysis.leak import HOW_TO_GET_FRAMES

# A what-if conf string that names one default and so leaves every other key at torch's default.
DEFAULTS_CONF = "expandable_segments:False"


def _rec(action: str, why: str, effect: str) -> dict:
    return {"action": action, "why": why, "expected_effect": effect}


def recommend(primary: str, f: Facts, optimizer: str | None, leak: dict, whatif: list[dict] | None = None) -> list[dict]:
    recs: list[dict] = []
    S, A, R = f.S or 0, f.A, f.R
    stranded = R - A
    params = f.composition.get(fr.PARAMETERS, 0)
    opt = f.composition.get(fr.OPTIMIZER_STATE, 0)
    acts = f.composition.get(fr.ACTIVATIONS, 0)
    sim = {w["conf"]: w for w in (whatif or [])}
    proj = f.projection
    need = max(A + S, proj.need if proj is not None else 0)
    # A step that needs more than the limit fails under every allocator setting: advise none for it.
    over_limit = bool(f.has_oom and f.limit and need > f.limit)

    def simulated(conf: str) -> str:
        w = sim.get(conf)
        if not w:
            return ""
        if w.get("predicted_oom") is None:  # not assessable: say why instead of an outcome
            return (f"; memq's allocator model cannot tell what {conf} would have done here: "
                    f"{w.get('reason') or 'not assessable from this snapshot'}")
        verdict = "fails again" if w["predicted_oom"] else "succeeds"
        caveat = ""
        if w.get("verdict") == "survives_window":
            caveat = (f" over the recorded window only ({w.get('confidence')} confidence: what the run did after "
                      "the trace is in no trace)")
        elif w.get("confidence") == "low":
            caveat = " (low confidence: the trace is too short to rebuild the recorded fragmentation)"
        return (f"; replaying the recorded trace under {conf} in memq's allocator model: the request "
                f"{verdict}, peak reserved {g(w['peak_reserved_bytes'])}{caveat}")

    if primary == "external_memory":
        recs.append(_rec("Find and stop what else holds the GPU (nvidia-smi --query-compute-apps=pid,used_memory "
                         "--format=csv); give each job its own device (CUDA_VISIBLE_DEVICES)",
                         f"{g(f.non_pytorch)} of the device is used outside PyTorch's cache",
                         f"frees up to {g(f.non_pytorch)}; the request of {g(S)} then fits"))
        recs.append(_rec("If JAX, CuPy or TensorFlow share the process, stop their preallocation "
                         "(XLA_PYTHON_CLIENT_PREALLOCATE=false; cupy's memory pool limit)",
                         "these libraries reserve most of the card at import time",
                         "their memory drops to what they actually use"))
        recs.append(_rec("Do not tune PyTorch's allocator for this OOM",
                         "expandable_segments, max_split_size_mb and empty_cache() act only on PyTorch's "
                         f"own {g(R)}; the missing memory is outside it", "no change"))
    if primary == "leak":
        site = leak.get("allocating_site")
        top = next((x for x in leak.get("growth_by_site") or [] if x["site"] == site), {})
        if site:
            recs.append(_rec(f"Release the references kept at {site}: store .item() / .detach().cpu() instead "
                             "of tensors that keep GPU memory (and autograd graphs) alive",
                             f"{g(top.get('bytes'))} allocated there after the first comparable point is still "
                             "live at the last one", "live memory stays flat across epochs; the OOM goes away"))
        else:
            recs.append(_rec("Find what keeps tensors alive from one epoch to the next (lists of outputs, "
                             "losses or logits kept for metrics, caches keyed by step): store .item() / "
                             ".detach().cpu() instead",
                             "the growing blocks carry no allocation frames, so the line is not known from these "
                             f"snapshots: {HOW_TO_GET_FRAMES}",
                             "live memory stays flat across epochs; the OOM goes away"))
        recs.append(_rec("Do not rely on torch.cuda.empty_cache() or gc.collect() for this",
                         "the growing blocks are referenced, so neither can free them", "no change"))
    if primary == "optimizer_state":
        mult = "1x" if optimizer and "sgd" in optimizer.lower() else "2x"
        recs.append(_rec("Shard or shrink optimizer state: ZeroRedundancyOptimizer / FSDP, or an 8-bit or "
                         "factored optimizer (bitsandbytes AdamW8bit, Adafactor)",
                         f"{g(opt)} of optimizer state is created in the first step (AdamW keeps 2x parameter "
                         f"bytes, SGD momentum 1x; parameters are {g(params)}, this run keeps {mult})",
                         f"saves up to {g(opt * 3 // 4)} with 8-bit state, or (N-1)/N of it across N ranks"))
        recs.append(_rec("Use foreach=False (or fused=True) in the optimizer constructor",
                         "the multi-tensor (foreach) path allocates temporaries for whole parameter groups "
                         "during step()", "lowers the transient peak of the optimizer step"))
    if primary == "activation_spike":
        recs.append(_rec("Cap or bucket the largest inputs (max sequence length / batch by length), or split "
                         "big batches with gradient accumulation",
                         f"this step needs {'~' if need > A + S else ''}{g(need)}, over 1.5x the peak of earlier "
                         f"steps ({g(f.earlier_step_peak)})", f"the step's peak returns near {g(f.earlier_step_peak)}"))
        step_bytes = A - (proj.floor_now if proj is not None else A - acts)
        recs.append(_rec("Enable activation checkpointing for the largest blocks",
                         f"the failing step's own tensors are {g(step_bytes)} of the {g(A)} live set",
                         "trades recompute time for memory"))
        recs.append(_rec("Do not change allocator settings (expandable_segments, max_split_size_mb) for this",
                         f"the step needs more than the limit of {g(f.limit)}: no arrangement of the cache "
                         "holds it", "no change"))
    if primary == "workspace":
        recs.append(_rec("Set torch.backends.cudnn.benchmark=False (or limit workspace: "
                         "CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.backends.cudnn.benchmark_limit)",
                         f"the failing or peak allocation is a library workspace ({g(S)})",
                         "kernel selection stops trying algorithms whose workspace does not fit"))
    if primary == "allocator_config":
        recs.append(_rec(f"Remove or relax the non-default allocator settings ({', '.join(f.settings_non_default)})",
                         f"they add {g(f.A - f.A_req)} of rounding or leave oversize blocks unsplittable, which "
                         "turns a fit into an OOM",
                         # Under roundup the trace holds rounded sizes only, so a replay under the
                         # defaults would still ask for the rounded bytes: cite the arithmetic instead.
                         f"live {g(f.A_req)} + request {g(f.S_min or S)} before rounding fits the limit of "
                         f"{g(f.limit)}" if f.roundup else
                         "the request fits the limit" + simulated(DEFAULTS_CONF).replace(DEFAULTS_CONF,
                                                                                         "the default settings")))
    graphs_hold_it = primary == "fragmentation" and f.private_pool_free > 0.5 * max(1, stranded)
    if graphs_hold_it:
        recs.append(_rec("Share one memory pool across the CUDA graphs (torch.cuda.graph(..., pool=g.pool())) "
                         "or release graphs you no longer replay",
                         f"{g(f.private_pool_free)} of the cached free memory belongs to private pools of CUDA "
                         "graphs that are still alive; eager code cannot use it",
                         f"frees up to {g(f.private_pool_free)} for the {g(S)} request"))
        recs.append(_rec("Do not expect expandable_segments or empty_cache() to help here",
                         "private-pool memory stays reserved as long as its graphs exist", "no change"))
    elif not over_limit and (primary == "fragmentation" or (
            primary not in ("capacity", "activation_spike") and stranded > 0.2 * max(1, R) and f.has_oom
            and not f.settings_non_default)):
        already = "expandable_segments:True" in f.settings_non_default
        if not already:
            recs.append(_rec("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                             f"{g(stranded)} is cached but free in pieces (largest usable block "
                             f"{g(f.largest_usable)} < request {g(S)}); expandable segments grow one mapping "
                             "instead of leaving split segments behind",
                             f"the {g(S)} request fits: live {g(A)} + request = {g(A + S)} <= limit "
                             f"{g(f.limit or f.limit_lower_bound)}"
                             + (f" (and the whole step, ~{g(proj.need)})" if proj is not None else
                                "; whether the rest of the failing step fits is not known (no earlier step "
                                "was recorded to project it from)" if f.not_projected else "")
                             + simulated("expandable_segments:True")))
        recs.append(_rec("Try max_split_size_mb:128 (or 512) if expandable segments are not available",
                         "stops large cached blocks from being split for small requests",
                         "less fragmentation, at some cost of reuse" + simulated("max_split_size_mb:128")))
        recs.append(_rec("Do not call torch.cuda.empty_cache() for this",
                         f"{g(stranded)} of free bytes sit in segments that still hold live blocks, which "
                         "empty_cache() cannot release (the allocator already released every fully free "
                         "segment before raising the OOM)", "no change"))
    if primary == "capacity":
        over = need - (f.limit or 0)
        biggest = max(((c, v) for c, v in f.composition.items() if c != fr.UNKNOWN), key=lambda kv: kv[1],
                      default=("activations", acts))
        if biggest[0] == fr.ACTIVATIONS:
            recs.append(_rec("Reduce activation memory: smaller micro-batch with gradient accumulation, "
                             "activation checkpointing, or shorter sequences",
                             f"activations are {g(acts)} of the {g(A)} live set; {g(over)} must go",
                             f"halving the micro-batch frees about {g(acts // 2)}"))
        if opt:
            kind = "AdamW keeps 2x parameter bytes" if opt > 1.5 * max(1, params) else "SGD momentum keeps 1x"
            recs.append(_rec("Shrink optimizer state (8-bit or factored optimizers, ZeRO/FSDP sharding)",
                             f"{g(opt)} of optimizer state ({kind}; parameters {g(params)})",
                             f"saves up to {g(opt * 3 // 4)}"))
        recs.append(_rec("Do not expect allocator settings or empty_cache() to fix this",
                         f"the live set plus the request exceeds the limit by {g(over)}; "
                         "expandable_segments and max_split_size_mb only rearrange cached free memory",
                         "no change" + simulated("expandable_segments:True")))
    creation = f.optimizer_creation
    if creation is not None and primary != "optimizer_state":
        recs.append(_rec("Consider a leaner optimizer or sharded state (8-bit AdamW, SGD, ZeRO/FSDP)",
                         "the failing request was the optimizer state's own creation: "
                         + optimizer_state_sizes(creation), "the first optimizer step needs that much less"))
    if primary == "healthy":
        if f.limit and f.limit - f.peak_reserved < 0.05 * f.limit:
            recs.append(_rec("Leave more headroom (smaller batch or expandable_segments:True)",
                             f"peak reserved {g(f.peak_reserved)} is within 5% of the {g(f.limit)} limit",
                             "a larger input no longer runs out of memory"))
        else:
            recs.append(_rec("No change needed", "no OOM and no growth across snapshots", "-"))
    return recs
