"""Ranked recommendations for a diagnosis. Each carries the number behind it, and where popular
advice will not help, a recommendation says so explicitly (so users stop trying it)."""

from __future__ import annotations

import re

from memq.analysis import frames as fr
from memq.analysis.classify import Facts, external_floor, g, optimizer_state_sizes, own_outside, step_estimate
from memq.analysis.headroom import in_last_free_bytes
from memq.analysis.leak import HOW_TO_GET_FRAMES
from memq.analysis.memory import free_in_pieces
from memq.analysis.rules import OPTIMIZER_SGD_MULTIPLE, PRIVATE_POOL_SHARE, STRANDED_SHARE
from memq.playbook import BY_ID
from memq.units import fmt_need

# A what-if conf string that names one default and so leaves every other key at torch's default.
DEFAULTS_CONF = "expandable_segments:False"


NO_CHANGE = "No change needed"
#: memory outside PyTorch's cache that the message shows is this process's own (explain and analyze)
OWN_LIBRARIES_ACTION = ("Shrink this process's memory outside PyTorch's cache: other frameworks' preallocation "
                        "(XLA_PYTHON_CLIENT_PREALLOCATE=false, cupy's pool limit), NCCL buffers (NCCL_BUFFSIZE), "
                        "cuBLAS/cuDNN workspaces (CUBLAS_WORKSPACE_CONFIG=:4096:8, cudnn.benchmark=False)")


def own_why(own: int) -> str:
    """Short: the evidence above it already says whose and how it was read."""
    return f"{g(own)} of this process's own memory is outside PyTorch's cache"
# The expected effect of advice that states none (NO_CHANGE): a dash in JSON, nothing on a screen.
NO_EFFECT = "-"


#: Where a recommendation sends the reader for a what-if the snapshot alone cannot answer; a page that
#: shows the what-if table below its verdict points there instead (render/reasons.whatif_here).
WHATIF_POINTER = "(`memq whatif` says why)"


def stated_effect(rec: dict) -> str:
    """A recommendation's expected effect as a screen shows it: "" when it states none."""
    effect = rec.get("expected_effect") or ""
    return "" if effect == NO_EFFECT else effect


def _rec(action: str, why: str, effect: str, playbook: str | None) -> dict:
    """One recommendation. `playbook` is the id of the playbook entry (profiler/playbook.py) whose
    measured figures back the advice, chosen by the caller for this advice; an unknown id is a bug
    here, so it fails loudly rather than printing a dead link. None only for NO_CHANGE, which advises
    nothing and so has no figures behind it."""
    if playbook is None and action == NO_CHANGE:
        return {"action": action, "why": why, "expected_effect": effect, "playbook": None}
    if playbook not in BY_ID:
        raise ValueError(f"unknown playbook entry {playbook!r}")
    return {"action": action, "why": why, "expected_effect": effect, "playbook": playbook}


def _setting_entry(f: Facts) -> str:
    """The playbook entry of the non-default setting that turned a fit into an OOM (the same tests as
    classify.check_allocator_config): rounding, then an unsplittable block; else the section on
    allocator settings in general."""
    if f.roundup:
        return "roundup-power2"
    if f.max_split > 0:
        return "max-split-size"
    return "allocator-settings"


def recommend(primary: str, f: Facts, optimizer: str | None, leak: dict,
              whatif: list[dict] | None = None) -> list[dict]:
    recs: list[dict] = []
    S, A, R = f.S or 0, f.A, f.R
    stranded = R - A
    params = f.composition.get(fr.PARAMETERS, 0)
    opt = f.composition.get(fr.OPTIMIZER_STATE, 0)
    acts = f.composition.get(fr.ACTIVATIONS, 0)
    sim = {w["conf"]: w for w in (whatif or [])}
    n = f.step_need
    need = step_estimate(n, A + S)
    # A step that needs more than the limit fails under every allocator setting: advise none for it.
    over_limit = bool(f.has_oom and f.limit and (need > f.limit or (n is not None and n.fits_limit is False)))

    def simulated(conf: str) -> str:
        w = sim.get(conf)
        if not w:
            return ""
        if w.get("predicted_oom") is None:  # not assessable: `memq whatif` says why (no table on this screen)
            return f"; memq's allocator model cannot assess {conf} from this snapshot {WHATIF_POINTER}"
        verdict = "fails again" if w["predicted_oom"] else "succeeds"
        caveat = ""
        if w.get("verdict") == "survives_window":
            caveat = (f" over the recorded window only ({w.get('confidence')} confidence: what the run did after "
                      "the trace is in no trace)")
        elif w.get("confidence") == "low":
            caveat = " (low confidence: the trace is too short to rebuild the recorded fragmentation)"
        return (f"; replaying the recorded trace under {conf} in memq's allocator model: the request "
                f"{verdict}, peak reserved {g(w['peak_reserved_bytes'])}{caveat}")

    own = own_outside(f.non_pytorch, f.process_in_use, f.R) if primary == "external_memory" else None
    if own is not None:  # the message shows it is this process's own: the advice `memq explain` gives
        recs.append(_rec(OWN_LIBRARIES_ACTION, own_why(own),
                         f"frees up to {g(own)}; the request of {g(S)} then fits", playbook="external-memory"))
        recs.append(_rec("Do not look for another program holding the GPU first",
                         "the message's 'this process' figure shows the memory is this process's own", "no change",
                         playbook="external-memory"))
    elif primary == "external_memory":
        recs.append(_rec("Find and stop what else holds the GPU (nvidia-smi --query-compute-apps=pid,used_memory "
                         "--format=csv); give each job its own device (CUDA_VISIBLE_DEVICES)",
                         f"{g(f.non_pytorch)} of the device is used outside PyTorch's cache",
                         f"frees up to {g(f.non_pytorch)}; the request of {g(S)} then fits",
                         playbook="external-memory"))
        recs.append(_rec("If JAX, CuPy or TensorFlow share the process, stop their preallocation "
                         "(XLA_PYTHON_CLIENT_PREALLOCATE=false; cupy's memory pool limit)",
                         "these libraries reserve most of the card at import time",
                         "their memory drops to what they actually use", playbook="external-memory"))
        recs.append(_rec("Do not tune PyTorch's allocator for this OOM",
                         "expandable_segments, max_split_size_mb and empty_cache() act only on PyTorch's "
                         f"own {g(R)}; the missing memory is outside it", "no change",
                         playbook="external-memory"))
    if primary == "leak":
        site = leak.get("allocating_site")
        top = next((x for x in leak.get("growth_by_site") or [] if x["site"] == site), {})
        if site:
            recs.append(_rec(f"Release the references kept at {site}: store .item() / .detach().cpu() instead "
                             "of tensors that keep GPU memory (and autograd graphs) alive",
                             f"{g(top.get('bytes'))} allocated there after the first comparable point is still "
                             "live at the last one", "live memory stays flat across epochs; the OOM goes away",
                             playbook="kept-tensors"))
        else:
            recs.append(_rec("Find what keeps tensors alive from one epoch to the next (lists of outputs, "
                             "losses or logits kept for metrics, caches keyed by step): store .item() / "
                             ".detach().cpu() instead",
                             "the growing blocks carry no allocation frames, so the line is not known from these "
                             f"snapshots: {HOW_TO_GET_FRAMES}",
                             "live memory stays flat across epochs; the OOM goes away",
                             playbook="kept-tensors"))
        recs.append(_rec("Do not rely on torch.cuda.empty_cache() or gc.collect() for this",
                         "the growing blocks are referenced, so neither can free them", "no change",
                         playbook="empty-cache"))
    loading = f.checkpoint_load if primary == "optimizer_state" else None
    if loading is not None:
        at = f" at {loading['site']}" if loading.get("site") else ""
        recs.append(_rec(f"Load the checkpoint onto the CPU{at}: torch.load(path, map_location=\"cpu\") (or "
                         "mmap=True), then model.load_state_dict() and optimizer.load_state_dict() copy it into "
                         "the live tensors; del the loaded dict before the first step",
                         "torch.load restores every tensor onto the device it was saved from, so the GPU holds "
                         f"the model and optimizer twice: the live {g(loading['params_bytes'])} of parameters and "
                         f"{g(loading['state_bytes'])} of state, and their loaded copies",
                         "the resume needs no more GPU memory than training itself", playbook="optimizer-state"))
        recs.append(_rec("Do not shrink the batch or change allocator settings for this",
                         "the OOM is in loading, not in a training step: no input or cache arrangement is "
                         "involved", "no change", playbook="optimizer-state"))
    if primary == "optimizer_state" and loading is None:
        mult = "1x" if optimizer and "sgd" in optimizer.lower() else "2x"
        recs.append(_rec("Shard or shrink optimizer state: ZeroRedundancyOptimizer / FSDP, or an 8-bit or "
                         "factored optimizer (bitsandbytes AdamW8bit, Adafactor)",
                         f"{g(opt)} of optimizer state is created in the first step (AdamW keeps 2x parameter "
                         f"bytes, SGD momentum 1x; parameters are {g(params)}, this run keeps {mult})",
                         f"saves up to {g(opt * 3 // 4)} with 8-bit state, or (N-1)/N of it across N ranks",
                         playbook="optimizer-state"))
        recs.append(_rec("Use foreach=False (or fused=True) in the optimizer constructor",
                         "the multi-tensor (foreach) path allocates temporaries for whole parameter groups "
                         "during step()", "lowers the transient peak of the optimizer step",
                         playbook="optimizer-state"))
    if primary == "activation_spike":
        recs.append(_rec("Cap or bucket the largest inputs (max sequence length / batch by length), or split "
                         "big batches with gradient accumulation",
                         f"this step needs {'~' if need > A + S else ''}{g(need)}, over 1.5x the peak of earlier "
                         f"steps ({g(f.earlier_step_peak)})"
                         + (f" and over the limit of {g(f.limit)}" if f.limit else ""),
                         f"the step's peak returns near {g(f.earlier_step_peak)}",
                         playbook="activation-checkpointing"))
        recs.append(_rec("Enable activation checkpointing for the largest blocks",
                         f"activations are {g(acts)} of the {g(A)} live set at the OOM" if acts else
                         f"the step's input-sized tensors are what grew ({g(need)} against {g(f.earlier_step_peak)})",
                         "trades recompute time for memory", playbook="activation-checkpointing"))
        recs.append(_rec("Do not change allocator settings (expandable_segments, max_split_size_mb) for this",
                         f"the step needs more than the limit of {g(f.limit)}: no arrangement of the cache "
                         "holds it", "no change", playbook="allocator-settings"))
    if primary == "workspace":
        recs.append(_rec("Set torch.backends.cudnn.benchmark=False (or limit workspace: "
                         "CUBLAS_WORKSPACE_CONFIG=:4096:8, torch.backends.cudnn.benchmark_limit)",
                         f"the failing or peak allocation is a library workspace ({g(S)})",
                         "kernel selection stops trying algorithms whose workspace does not fit",
                         playbook="workspace"))
    if primary == "allocator_config":
        recs.append(_rec(f"Remove or relax the non-default allocator settings ({', '.join(f.settings_non_default)})",
                         f"they add {g(f.A - f.A_req)} of rounding or leave oversize blocks unsplittable, which "
                         "turns a fit into an OOM",
                         # Under roundup the trace holds rounded sizes only, so a replay under the
                         # defaults would still ask for the rounded bytes: cite the arithmetic instead.
                         f"live {g(f.A_req)} + request {g(f.S_min or S)} before rounding fits the limit of "
                         f"{g(f.limit)}" if f.roundup else
                         "the request fits the limit" + simulated(DEFAULTS_CONF).replace(DEFAULTS_CONF,
                                                                                         "the default settings"),
                         playbook=_setting_entry(f)))
    graphs_hold_it = primary == "fragmentation" and f.private_pool_free > PRIVATE_POOL_SHARE * max(1, stranded)
    if graphs_hold_it:
        # No entry measures CUDA-graph pools; the allocator-settings one shows what the cache can and
        # cannot hand back, which is the point here.
        recs.append(_rec("Share one memory pool across the CUDA graphs (torch.cuda.graph(..., pool=g.pool())) "
                         "or release graphs you no longer replay",
                         f"{g(f.private_pool_free)} of the cached free memory belongs to private pools of CUDA "
                         "graphs that are still alive; eager code cannot use it",
                         f"frees up to {g(f.private_pool_free)} for the {g(S)} request",
                         playbook="allocator-settings"))
        recs.append(_rec("Do not expect expandable_segments or empty_cache() to help here",
                         "private-pool memory stays reserved as long as its graphs exist", "no change",
                         playbook="expandable-segments"))
    elif not over_limit and (primary == "fragmentation" or (
            primary not in ("capacity", "activation_spike") and stranded > STRANDED_SHARE * max(1, R) and f.has_oom
            and not f.settings_non_default)):
        already = "expandable_segments:True" in f.settings_non_default
        if not already:
            recs.append(_rec("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True",
                             f"{g(stranded)} is cached free, {g(free_in_pieces(stranded, f.largest_usable))} of it in "
                             f"pieces outside the largest usable block ({g(f.largest_usable)} < request {g(S)}); "
                             "expandable segments grow one mapping "
                             "instead of leaving split segments behind",
                             f"the {g(S)} request fits: live {g(A)} + request = {g(A + S)} <= limit "
                             f"{g(f.limit or f.limit_lower_bound)}"
                             + (f" (and the whole step, {fmt_need(n.bytes, n.low, n.high)})"
                                if n is not None and n.fits_limit is True else
                                # the diagnosis says why, once
                                "; whether the rest of the failing step fits is not settled" if n is not None else "")
                             + simulated("expandable_segments:True"), playbook="expandable-segments"))
        if already:
            # Never advise what the run already has: with expandable segments the cache grows one mapping,
            # so what is left in pieces are blocks of other streams or pools, or pages the live set pins.
            recs.append(_rec("Keep expandable_segments:True and look at what pins the pieces: tensors of other "
                             "CUDA streams (record_stream, NCCL), private pools (CUDA graphs), or long-lived "
                             "tensors allocated between short-lived ones",
                             f"expandable segments are already on, yet {g(stranded)} is cached free, "
                             f"{g(free_in_pieces(stranded, f.largest_usable))} of it in pieces outside the largest "
                             f"usable block ({g(f.largest_usable)} < request {g(S)})",
                             "the request fits once those tensors are freed or allocated up front",
                             playbook="expandable-segments"))
        else:
            # The playbook's fragmenting job: 128 completed at the cap where 512 and the default ran out.
            recs.append(_rec("Try max_split_size_mb:128 if expandable segments are not available",
                             "stops large cached blocks from being split for small requests; a threshold above "
                             "the job's large tensors changes little",
                             "less fragmentation, at some cost of reuse" + simulated("max_split_size_mb:128"),
                             playbook="max-split-size"))
        recs.append(_rec("Do not call torch.cuda.empty_cache() for this",
                         f"{g(stranded)} of free bytes sit in segments that still hold live blocks, which "
                         "empty_cache() cannot release (the allocator already released every fully free "
                         "segment before raising the OOM)", "no change", playbook="empty-cache"))
    if primary == "capacity" and f.has_oom and f.limit is None:
        # Nothing was settled: an unknown limit is not a limit of 0. Say what settles it, advise nothing else.
        recs.append(_rec("Give memq the limit to settle the cause: --limit SIZE (the per-process cap, e.g. "
                         "set_per_process_memory_fraction x device memory), --oom-message \"<the error text>\" "
                         "(its 'allowed'), or --device-total SIZE",
                         f"without a limit the live {g(A)} + request {g(S)} cannot be compared with what the process "
                         "could reserve: whether the step did not fit (capacity) or the cache was in pieces "
                         "(fragmentation) is undetermined",
                         "the diagnosis then names one cause, with the advice for it", playbook="allocator-settings"))
    elif primary == "capacity":
        over = need - (f.limit or 0)
        biggest = max(((c, v) for c, v in f.composition.items() if c != fr.UNKNOWN), key=lambda kv: kv[1],
                      default=("activations", acts))
        if biggest[0] == fr.ACTIVATIONS:
            recs.append(_rec("Reduce activation memory: smaller micro-batch with gradient accumulation, "
                             "activation checkpointing, or shorter sequences",
                             f"activations are {g(acts)} of the {g(A)} live set; {g(over)} must go",
                             f"halving the micro-batch frees about {g(acts // 2)}",
                             playbook="activation-checkpointing"))
        if opt:
            kind = ("AdamW keeps 2x parameter bytes" if opt > OPTIMIZER_SGD_MULTIPLE * max(1, params)
                    else "SGD momentum keeps 1x")
            recs.append(_rec("Shrink optimizer state (8-bit or factored optimizers, ZeRO/FSDP sharding)",
                             f"{g(opt)} of optimizer state ({kind}; parameters {g(params)})",
                             f"saves up to {g(opt * 3 // 4)}", playbook="optimizer-state"))
        recs.append(_rec("Do not expect allocator settings or empty_cache() to fix this",
                         f"the live set plus the request exceeds the limit by {g(over)}; "
                         "expandable_segments and max_split_size_mb only rearrange cached free memory",
                         "no change" + simulated("expandable_segments:True"), playbook="allocator-settings"))
    creation = f.optimizer_creation
    if creation is not None and primary != "optimizer_state":
        recs.append(_rec("Consider a leaner optimizer or sharded state (8-bit AdamW, SGD, ZeRO/FSDP)",
                         "the failing request was the optimizer state's own creation: "
                         + optimizer_state_sizes(creation), "the first optimizer step needs that much less",
                         playbook="optimizer-state"))
    if primary == "healthy":
        # The playbook has no "healthy" entry: the batch-size section is where headroom is measured.
        if in_last_free_bytes(f.peak_reserved, f.limit):
            has = "expandable_segments:True" in f.settings_non_default
            recs.append(_rec("Leave more headroom (a smaller batch)" if has else
                             "Leave more headroom (smaller batch or expandable_segments:True)",
                             f"peak reserved {g(f.peak_reserved)} is within 5% of the {g(f.limit)} limit",
                             "a larger input no longer runs out of memory",
                             playbook="activation-checkpointing"))
        else:
            recs.append(_rec(NO_CHANGE, "no OOM and no growth across snapshots", NO_EFFECT, playbook=None))
    return recs


# What a pasted traceback says about the failing phase (the message itself names no frame). Only the
# frames' own words: torch's optimizer modules, an optimizer's step() call; backward/forward/autograd.
_OPTIMIZER_FRAMES = re.compile(r"torch/optim/|\b(?:opt|optim|optimizer)\.step\(|_multi_tensor_|\bexp_avg", re.I)
_ACTIVATION_FRAMES = re.compile(r"\.backward\(|torch/autograd/|\bforward\(|\bin forward\b")
_WORKSPACE_TEXT = re.compile(r"cudnn|cublas|CUBLAS_WORKSPACE", re.I)


def message_playbook(f: Facts, unallocated: int | None, text: str) -> list[dict]:
    """The playbook entries an OOM message points to, each with the message's figures behind it
    (`memq explain`): [{"id", "title", "why", "helps"}], `helps` false for popular advice the figures
    rule out. Reserved-but-unallocated memory that would hold the request -> the allocator settings
    (not empty_cache(), which cannot release segments that hold live blocks); memory outside PyTorch
    -> external-memory; a live set plus request over the limit -> what shrinks the step
    (optimizer state or activations, as far as pasted frames tell)."""
    out: list[dict] = []

    def add(entry_id: str, why: str, helps: bool = True) -> None:
        out.append({"id": entry_id, "title": BY_ID[entry_id].title, "why": why, "helps": helps})

    S, A, L = f.S, f.A, f.limit
    opt = _OPTIMIZER_FRAMES.search(text)
    external = bool(f.non_pytorch is not None and f.device_total
                    and f.non_pytorch > external_floor(f.device_total))
    if external:
        add("external-memory", f"{g(f.non_pytorch)} of the {g(f.device_total)} device is used outside PyTorch's "
                               f"cache (the message's device and process figures): no PyTorch setting frees it")
    if S is not None and unallocated is not None and L:
        over = A + S - L
        if over <= 0 and unallocated > 0:
            add("allocator-settings", f"{g(unallocated)} is reserved by PyTorch but unallocated, and allocated "
                                      f"{g(A)} + the {g(S)} request fits the limit of {g(L)}: the cached free "
                                      "memory is in pieces, which is what allocator settings rearrange")
            add("expandable-segments", "expandable segments grow one mapping instead of leaving free space "
                                       "stranded between split segments (the fix torch's message suggests)")
            add("empty-cache", f"cannot help: empty_cache() releases only whole free segments, and the allocator "
                               f"already released those before raising; the {g(unallocated)} sits in segments "
                               "that hold live blocks", helps=False)
        elif over > 0:
            add("allocator-settings", f"cannot help: allocated {g(A)} + the {g(S)} request exceeds the limit of "
                                      f"{g(L)} by {g(over)}, and only {g(unallocated)} is reserved but "
                                      "unallocated; no arrangement of the cache makes room", helps=False)
            add("empty-cache", f"cannot help: the live {g(A)} stays allocated; empty_cache() returns only "
                               "unused cached segments", helps=False)
            if not external:
                act = _ACTIVATION_FRAMES.search(text)
                if act or not opt:
                    add("activation-checkpointing",
                        (f"the pasted frames fail in {act.group(0).strip()!r}" if act else
                         "the message names no phase (paste the traceback, or analyze a snapshot, to tell)")
                        + f"; {g(over)} must go from the step: smaller batch, shorter inputs or checkpointing")
    elif S is not None and unallocated is not None and unallocated >= S:
        # No limit in the message ("allowed" absent, no --limit): the request would fit the free cache.
        add("allocator-settings", f"{g(unallocated)} is reserved but unallocated, more than the {g(S)} request: "
                                  "the free cache may be in pieces (the message gives no limit to confirm)")
        add("expandable-segments", "expandable segments leave no free space stranded between split segments")
    if opt and not external:
        add("optimizer-state", f"the pasted frames fail in the optimizer ({opt.group(0).strip()!r}): its state "
                               "is created in the first step, a fixed multiple of the parameter bytes")
    if _WORKSPACE_TEXT.search(text):
        add("workspace", "the text names cuDNN/cuBLAS: their workspaces are sized from the device's free "
                         "memory, not the cap")
    return out


# --- advice for a message alone (`memq explain`; analysis/message_verdict.py decides the situation) ---

_SERVER_ACTION = {
    "vllm": ("Lower vLLM's memory settings: gpu_memory_utilization (the share of the device it takes for weights, "
             "KV cache and CUDA graphs), max_num_seqs and max_model_len; --enforce-eager skips CUDA-graph memory; a "
             "quantized model (AWQ/GPTQ/FP8) halves the weights"),
    "sglang": ("Lower SGLang's memory settings: --mem-fraction-static, --max-running-requests and --context-length; "
               "--disable-cuda-graph skips CUDA-graph memory; a quantized model halves the weights"),
}
_SHRINK = ("Reduce the step's memory: smaller micro-batch with gradient accumulation, activation checkpointing, "
           "shorter sequences or smaller images (for inference: torch.no_grad() / inference_mode(), fp16/bf16)")


def _context_sized(others: list) -> bool:
    """Other processes of a few hundred MiB each, all alike: other ranks' CUDA contexts on this device."""
    sizes = [b for _, b in others]
    return len(sizes) >= 2 and max(sizes) < 1 << 30 and max(sizes) - min(sizes) < 64 << 20


def message_recommendations(v, msg) -> list[dict]:
    """Ranked advice for a message-only verdict (MessageVerdict `v` of OomMessage `msg`): what the
    message's own figures point to first; never a figure the message does not give."""
    recs: list[dict] = []
    f = v.figures
    S, A, R = f.get("requested"), f.get("allocated"), f.get("reserved")
    server = msg.server

    def add(action, why, effect, playbook):
        recs.append(_rec(action, why, effect, playbook))

    def server_first(why):
        if server:
            add(_SERVER_ACTION[server], why, "the server's own reservation leaves the device the room it ran out of",
                "allocator-settings")

    sit = v.situation
    if sit == "mps":
        add("Raise or lift the MPS memory cap: PYTORCH_MPS_HIGH_WATERMARK_RATIO (a higher ratio, or 0.0 to remove the "
            "cap; the system may then swap or stall)",
            f"the cap is {g(f.get('allowed'))} and this process's Metal memory plus the {g(S)} request is over it",
            f"the {g(S)} request is served from unified memory above the old cap", "allocator-settings")
        add(_SHRINK, "the unified memory is shared with the system: what the step needs is what runs out",
            "the step's peak drops below the cap", "activation-checkpointing")
        if (f.get("other_allocations") or 0) > (f.get("allocated") or 0):
            add("Release Metal memory PyTorch no longer uses: torch.mps.empty_cache(), and other models loaded in the "
                "same process", f"other allocations ({g(f.get('other_allocations'))}) exceed MPS allocated "
                f"({g(f.get('allocated'))})", "frees the other allocations' cached part", "empty-cache")
        return recs
    if sit == "server_warmup":
        server = server or "vllm"
        server_first("the server reserves memory for its largest batch at start-up and that did not fit")
        return recs
    if sit == "block_limit":
        add("Split the tensor below the per-allocation limit (chunk the operation), or allow large allocations on "
            "Intel GPUs (UR_L0_USE_RELAXED_ALLOCATION_LIMITS=1 with a build that supports it)",
            v.evidence[-1], "the request is served from the device's free memory", "allocator-settings")
        add("Do not shrink the batch for this first", "the device had room; one allocation's size is what was refused",
            "no change", "activation-checkpointing")
        return recs
    if sit == "cublas":
        add("Free device memory for cuBLAS before the first matmul: check nvidia-smi for other processes on this GPU, "
            "run on one GPU that has free memory (CUDA_VISIBLE_DEVICES), or cap PyTorch's cache "
            "(torch.cuda.set_per_process_memory_fraction) so the library has room",
            v.evidence[-1], "cuBLAS creates its handle and workspace", "workspace")
        add("Run once with CUDA_LAUNCH_BLOCKING=1 to see the call that failed", "CUDA reports errors asynchronously",
            "the traceback names the failing operation", "workspace")
        return recs
    if sit == "cudnn":
        add("Set torch.backends.cudnn.benchmark=False (benchmarking tries algorithms with large workspaces), and "
            "shrink the batch if it still fails", v.evidence[-1],
            "cuDNN picks an algorithm whose workspace fits", "workspace")
        return recs
    if sit == "cuda_error":
        server_first("the server sizes its reservation from the device, leaving CUDA graphs and libraries little room")
        add("Find the call that ran out: rerun with CUDA_LAUNCH_BLOCKING=1; check nvidia-smi for other processes; "
            "leave headroom outside PyTorch's cache for libraries (torch.cuda.set_per_process_memory_fraction below "
            "1, smaller NCCL buffers with NCCL_BUFFSIZE, CUBLAS_WORKSPACE_CONFIG=:4096:8)",
            v.evidence[-1], "the failing call and the memory it needed become visible", "external-memory")
        add("Do not read this as PyTorch's allocator running out", "the caching allocator's message ('Tried to "
            "allocate ...') was not raised: allocator settings and empty_cache() act on another memory",
            "no change", "external-memory")
        return recs
    if sit == "no_figures":
        server_first("the pasted text names an inference server")
        add("Paste the whole message (it is cut before its figures), or analyze a snapshot (memq analyze FILE)",
            v.evidence[-1], "the diagnosis then names one cause, with the advice for it", "allocator-settings")
        return recs
    if sit == "over_device":
        add("Shrink the tensor behind this one request (batch, resolution, sequence length), process it in chunks, or "
            "shard/offload the model", v.evidence[-1], f"the request drops below the {g(f.get('device_total'))} device",
            "activation-checkpointing")
        return recs
    if sit == "cap":
        add("Raise the per-process cap (torch.cuda.set_per_process_memory_fraction) or fit the job under it",
            v.evidence[-1], f"the {g(S)} request fits once the cap allows reserved + request", "allocator-settings")
        add(_SHRINK, f"under the {g(v.limit)} cap the step must need less", "the step fits the cap",
            "activation-checkpointing")
        return recs
    if sit == "other_processes":
        others = sorted(f.get("other_processes") or [], key=lambda x: -x[1])
        names = ", ".join(f"process {pid} ({g(b)})" for pid, b in others)
        ranks = _context_sized(others)
        add(f"Stop or move the other processes on this GPU: {names}"
            + ("; they look like other ranks' CUDA contexts on this device: call torch.cuda.set_device(local_rank) "
               "before any CUDA call in each rank" if ranks
               else "; give each job its own device (CUDA_VISIBLE_DEVICES)"),
            v.evidence[-1], f"frees up to {g(sum(b for _, b in others))}; the {g(S)} request then fits",
            "external-memory")
        server_first("the pasted text names an inference server")
        return recs
    if sit == "below_free":
        if msg.platform == "xpu" and S is not None and S >= 4 << 30:
            add("Split the tensor below 4 GiB: Intel GPUs refuse one allocation above 4 GiB unless relaxed limits "
                "are on", v.evidence[-1], "the request is served from the free memory", "allocator-settings")
        add("Do not shrink the batch first: find the limit that ran out. Look for "
            "torch.cuda.set_per_process_memory_fraction and PYTORCH_CUDA_ALLOC_CONF in the job; watch nvidia-smi "
            "for another process whose use jumps; on Windows (WDDM) and unified-memory devices the free figure is "
            "not what can be committed; rerun once to rule out a transient driver failure",
            v.evidence[-1], "the limit that refused the request is named", "allocator-settings")
        return recs
    if sit == "own_libraries":
        add(OWN_LIBRARIES_ACTION, own_why((f.get("this_process") or 0) - (R or 0)),
            "the request fits once those buffers shrink", "external-memory")
        add("Do not look for another program holding the GPU first",
            "the message's 'this process' figure shows the memory is this process's own", "no change",
            "external-memory")
        return recs
    if sit == "external":
        server_first("the pasted text names an inference server")
        add("Find and stop what else holds the GPU (nvidia-smi --query-compute-apps=pid,used_memory --format=csv); "
            "give each job its own device (CUDA_VISIBLE_DEVICES)", v.evidence[-1],
            f"the {g(S)} request then fits", "external-memory")
        add("Do not tune PyTorch's allocator for this OOM",
            f"allocator settings and empty_cache() act only on PyTorch's own {g(R)}", "no change", "external-memory")
        return recs
    if sit == "private_pools":
        add("Release the CUDA graphs' private pools before eager allocations: torch.compile(mode='default') or "
            "'max-autotune-no-cudagraphs' instead of 'reduce-overhead', share one pool across graphs "
            "(torch.cuda.graph(..., pool=...)), or create optimizer state before capturing",
            v.evidence[-1], f"frees up to {g(f.get('private_pools'))} for eager code", "allocator-settings")
        add("Do not expect expandable_segments or empty_cache() to help here",
            "private-pool memory stays reserved as long as its graphs exist", "no change", "expandable-segments")
        return recs
    server_first("the pasted text names an inference server")
    if f.get("cap_ran_out"):
        add(f"The per-process cap ran out, not the device: raise torch.cuda.set_per_process_memory_fraction if the "
            f"device is this job's (it had {g(f.get('device_free'))} free), or make the job fit the {g(v.limit)} cap",
            f"reserved {g(R)} + request {g(S)} is over the {g(v.limit)} cap ({v.limit_source})",
            "the request is served under a higher cap", "allocator-settings")
    if sit == "near_limit":
        add("Leave the step headroom: a smaller micro-batch with gradient accumulation (or activation checkpointing); "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True gets this request through the cached pieces but "
            f"leaves only {g(v.limit - A - S)} for the rest of the step",
            v.evidence[-1], "the step fits with room to spare, whichever of the two it was", "activation-checkpointing")
        add("Do not call torch.cuda.empty_cache() for this", "the unallocated bytes sit in segments that still hold "
            "live blocks, which empty_cache() cannot release", "no change", "empty-cache")
        return recs
    if sit == "capacity":
        add(_SHRINK, v.evidence[-1] + ": the live set does not fit",
            "the step's peak drops by what the batch or sequence holds", "activation-checkpointing")
        add("Do not expect allocator settings or empty_cache() to fix this",
            "expandable_segments and max_split_size_mb only rearrange cached free memory", "no change",
            "allocator-settings")
        return recs
    add("Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", v.evidence[-1],
        f"the {g(S)} request fits: allocated {g(A)} + request <= {g(v.limit)}", "expandable-segments")
    add("Do not call torch.cuda.empty_cache() for this", "the unallocated bytes sit in segments that still hold live "
        "blocks, which empty_cache() cannot release", "no change", "empty-cache")
    return recs
