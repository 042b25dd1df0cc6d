"""What an out-of-memory message alone says happened (`memq explain`): one situation, read from the
message's own figures in the order that settles it, with the cause of the contract and the evidence.

Pure: an OomMessage (oom_message.py) and the CLI's limits in, a MessageVerdict out. No figure the
message does not give is invented: where a figure is missing the evidence says so.

Order (the first that holds decides; ARCHITECTURE.md "OOM messages, read to the letter"):
1. failures outside the caching allocator (CUDA error, cuBLAS/cuDNN, MPS, a server's warm-up,
   a platform's per-allocation limit): their own verdicts, never a batch-size one first;
2. a request larger than the whole device;
3. a per-process cap ("allowed" or --limit) that ran out while the device had room;
4. other processes named with their bytes, when theirs alone would make the request fit;
5. a request smaller than the free memory the message reports: another limit ran out;
6. memory outside PyTorch: this process's own libraries (the message's "this process" figure) or
   something else on the device;
7. CUDA graphs' private pools holding most of what is allocated;
8. allocated + request against what the process could reserve: capacity, or fragmentation when the
   cached free memory would hold the request with room left for the rest of the step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from memq.analysis.classify import external_floor, g, own_outside, own_sentence
from memq.analysis.confidence import message_confidence
from memq.analysis.rules import (
    CUDA_CONTEXT_BYTES,
    MESSAGE_NEAR_LIMIT_SHARE,
    MESSAGE_PRIVATE_POOL_SHARE,
    PRINTED_ROUNDING,
    XPU_BLOCK_LIMIT,
)
from memq.model import OomMessage

#: Its rule constants are in rules.py (MESSAGE_NEAR_LIMIT_SHARE, MESSAGE_PRIVATE_POOL_SHARE,
#: PRINTED_ROUNDING, XPU_BLOCK_LIMIT), each with its source.


@dataclass
class MessageVerdict:
    situation: str
    primary: str
    confidence: float
    evidence: list[str]
    others: list[tuple[str, float, list[str]]] = field(default_factory=list)
    limit: int | None = None
    limit_source: str | None = None
    figures: dict = field(default_factory=dict)
    confidence_key: str | None = None  # the MESSAGE_CONFIDENCE entry the confidence is (confidence.py)


def judge(msg: OomMessage, limit: int | None = None, device_total: int | None = None) -> MessageVerdict:
    """The verdict for one message. `limit` (--limit) and `device_total` (--device-total) override the
    message's own figures when given."""
    notes = list(msg.notes)
    if msg.kind != "allocator":
        v = _outside(msg)
        v.evidence.extend(notes)
        return v
    S, A, R, U = msg.requested_bytes, msg.allocated_bytes, msg.reserved_bytes, msg.reserved_unallocated_bytes
    T = device_total or msg.device_total_bytes
    F = msg.device_free_bytes
    P = msg.process_in_use_bytes
    cap, cap_src = (limit, "--limit") if limit else (msg.allowed_bytes, "the message's 'allowed'")
    others = list(msg.other_processes)
    others_sum = sum(b for _, b in others)
    fig = {"requested": S, "allocated": A, "reserved": R, "device_total": T, "device_free": F,
           "this_process": P, "allowed": cap, "other_processes": others, "private_pools": msg.private_pool_bytes}
    ev = [f"the message: request {g(S)}, allocated {g(A)}, reserved {g(R)}, device {g(T)} with {g(F)} free"
          + (f", this process {g(P)}" if P is not None else "") + (f", {g(cap)} allowed" if cap else "")]
    ev += notes

    def out(situation, primary, key, lines, lim=None, src=None, also=()):
        return MessageVerdict(situation, primary, message_confidence(key), ev + lines, list(also), lim, src, fig,
                              confidence_key=key)

    if S is None or (A is None and F is None):
        return out("no_figures", "capacity", "cut_before_figures",
                   ["the message is cut before its figures (no allocated, reserved or free bytes): the cause is "
                    "not settled; paste the whole message, or analyze a snapshot"])
    if msg.platform == "xpu" and S > XPU_BLOCK_LIMIT and (F is None or S <= F):
        return out("block_limit", "allocator_config", "xpu_block_limit",
                   [f"the {g(S)} request is over the {g(XPU_BLOCK_LIMIT)} a single XPU allocation may take, while "
                    f"{g(F)} is free: the platform's per-allocation limit refused it, not the device's memory"])
    if T is not None and S > T:
        return out("over_device", "capacity", "over_device",
                   [f"the one request of {g(S)} is larger than the whole device ({g(T)}): no setting and no other "
                    "process makes it fit"], lim=T, src="the device total")
    if cap and R is not None and R + S > cap * (1 - PRINTED_ROUNDING) and (F is None or F >= S):
        if A is None or A + S > cap:
            return out("cap", "capacity", "cap",
                       [f"the per-process cap ran out: reserved {g(R)} + request {g(S)} > {g(cap)} allowed "
                        f"({cap_src}), while the device still had {g(F)} free; allocated {g(A)} + request {g(S)} is "
                        "over the cap too"], lim=cap, src=cap_src)
        # within the cap once compacted: decided below against the cap (fragmentation or the step's edge),
        # the cap named first (the device had room: a batch size is not what ran out)
        fig["cap_ran_out"] = True
    capped = bool(cap and R is not None and R + S > cap * (1 - PRINTED_ROUNDING))
    if not capped and others and others_sum >= S and (F is None or S <= F + others_sum):
        names = ", ".join(f"process {pid} ({g(b)})" for pid, b in sorted(others, key=lambda x: -x[1]))
        return out("other_processes", "external_memory", "other_processes",
                   [f"other processes hold {g(others_sum)} of the device: {names}; the {g(S)} request fits once "
                    f"theirs is free ({g(F)} free now)"])
    if not capped and F is not None and S <= F and T is not None:
        return out("below_free", "allocator_config", "below_free",
                   [f"the request of {g(S)} is smaller than the {g(F)} the device reports free: the device did not "
                    "run out; another limit did (a per-process cap the message does not print, the platform's "
                    "per-allocation limit, memory another process took between the failure and the report, or "
                    "the driver)"])
    lim = lsrc = None
    if cap:
        lim, lsrc = cap, cap_src
    elif F is not None and R is not None:
        lim, lsrc = R + F, "reserved + device free (what this process could reserve)"
    non_pt = (T - F - R) if (T is not None and F is not None and R is not None) else None
    if not capped and non_pt is not None and T is not None and non_pt > external_floor(T) and A is not None \
            and A + S <= T - CUDA_CONTEXT_BYTES:
        mine = own_outside(non_pt, P, R)
        if mine is not None:
            return out("own_libraries", "external_memory", "own_libraries",
                       [f"{g(non_pt)} of the device is outside PyTorch's cache, and {own_sentence(mine, P, R)}"],
                       lim=lim, src=lsrc)
        own = (P - R) if P is not None and R is not None else None
        who = (f"{g(non_pt - own)} of it outside this process" if own is not None
               else "the message does not say whose (torch < 2.1 prints no process figures)")
        return out("external", "external_memory", "external",
                   [f"{g(non_pt)} of the {g(T)} device is used outside PyTorch's cache ({who}); allocated {g(A)} + "
                    f"request {g(S)} would fit the device without it"], lim=lim, src=lsrc)
    Q = msg.private_pool_bytes
    if Q and A and Q > MESSAGE_PRIVATE_POOL_SHARE * A:
        return out("private_pools", "capacity", "private_pools",
                   [f"{g(Q)} of the {g(A)} allocated is in private pools (CUDA graphs): memory eager code (an "
                    "optimizer creating its state, a new input shape) cannot use while those graphs live; torch "
                    "prints it inside 'allocated', so reserved is {R}".format(R=g(R))], lim=lim, src=lsrc)
    if A is None or lim is None:
        return out("no_figures", "capacity", "request_only",
                   ["the message gives the request but not both the allocated and the free figures: whether the "
                    "step did not fit or the cache was in pieces is not settled"], lim=lim, src=lsrc)
    need = A + S
    room = lim - need
    if room < 0:
        return out("capacity", "capacity", "capacity",
                   [f"allocated {g(A)} + request {g(S)} = {g(need)} exceeds {g(lim)} ({lsrc}) by {g(-room)}"],
                   lim=lim, src=lsrc)
    if room < MESSAGE_NEAR_LIMIT_SHARE * lim:
        # ARCHITECTURE.md cause 7 holds (the request fits a compacted cache), but the step's need cannot be
        # projected from a message: capacity is as likely, and the advice must cover both.
        return out("near_limit", "fragmentation", "near_limit",
                   [f"allocated {g(A)} + request {g(S)} = {g(need)} fits {g(lim)} ({lsrc}) once compacted, but leaves "
                    f"only {g(room)} for the rest of the step, which allocates after this request; a message does not "
                    "give the step's need, so whether the step fits is not settled"],
                   lim=lim, src=lsrc,
                   also=[("capacity", message_confidence("near_limit_capacity"),
                          [f"{g(room)} of {g(lim)} left after this request: under "
                           f"{MESSAGE_NEAR_LIMIT_SHARE:.0%} of the limit"])])
    # a message gives no free blocks: fragmentation from a message alone is never more than likely
    return out("fragmentation", "fragmentation", "fragmentation",
               [f"allocated {g(A)} + request {g(S)} = {g(need)} fits {g(lim)} ({lsrc}) with {g(room)} left, yet the "
                f"request failed: the {g(U)} reserved but unallocated is in pieces (the message does not give the "
                "free blocks)"], lim=lim, src=lsrc)


def _outside(msg: OomMessage) -> MessageVerdict:
    """Failures outside the caching allocator: what each means."""
    k = msg.kind
    fig = {"requested": msg.requested_bytes}
    if k == "mps":
        S, A, other, M = msg.requested_bytes, msg.allocated_bytes, msg.other_allocations_bytes, msg.allowed_bytes
        fig.update(allocated=A, other_allocations=other, allowed=M)
        total = (A or 0) + (other or 0) + (S or 0)
        return MessageVerdict("mps", "capacity" if (other or 0) <= (A or 0) else "external_memory",
                              message_confidence("mps"),
                              [f"MPS: allocated {g(A)} + other allocations {g(other)} + request {g(S)} = {g(total)} "
                               "is over "
                               f"the {g(M)} high-watermark cap (PYTORCH_MPS_HIGH_WATERMARK_RATIO times the "
                               "recommended working set of the unified memory)"], limit=M,
                              limit_source="the message's 'max allowed'", figures=fig, confidence_key="mps")
    if k == "server_warmup":
        return MessageVerdict("server_warmup", "capacity", message_confidence("server_warmup"),
                              ["the inference server ran out while warming up with its maximum batch (max_num_seqs "
                               "dummy requests) in the memory its gpu_memory_utilization left"], figures=fig,
                              confidence_key="server_warmup")
    if k == "block_limit":
        return MessageVerdict("block_limit", "allocator_config", message_confidence("block_limit"),
                              [f"the platform refuses a single allocation of {g(msg.requested_bytes)}: "
                               + "; ".join(msg.notes) + "; the device's memory did not run out"], figures=fig,
                              confidence_key="block_limit")
    if k == "cublas":
        return MessageVerdict("cublas", "workspace", message_confidence("cublas"),
                              ["cuBLAS could not allocate its handle or workspace: that allocation goes to the driver, "
                               "outside PyTorch's cache, and fails when the cache or another process holds the device"],
                              figures=fig, confidence_key="cublas")
    if k == "cudnn":
        return MessageVerdict("cudnn", "workspace", message_confidence("cudnn"),
                              ["cuDNN could not allocate its workspace (outside PyTorch's cache): benchmarking "
                               "(cudnn.benchmark) tries algorithms with large workspaces, in the memory the cache "
                               "left"],
                              figures=fig, confidence_key="cudnn")
    if msg.layout == "thc":
        return MessageVerdict("cuda_error", "capacity", message_confidence("thc_error"),
                              ["torch 0.x's allocator failed (THCStorage): the message gives no figures; the cause is "
                               "not settled"], figures=fig, confidence_key="thc_error")
    return MessageVerdict("cuda_error", "external_memory", message_confidence("cuda_error"),
                          ["'CUDA error: out of memory' comes from the CUDA runtime, not from PyTorch's caching "
                           "allocator: a cudaMalloc outside the cache (a kernel launch, cuBLAS/cuDNN/NCCL buffers, "
                           "CUDA-graph capture, context creation) found the device full; the message gives no figures, "
                           "and the failing call may be an earlier asynchronous one"], figures=fig,
                          confidence_key="cuda_error")
