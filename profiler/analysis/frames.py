"""Reading meaning out of stack frames: which phase or category an allocation belongs to.

Rules look at every frame of a block (innermost first) and use file paths and function names that
PyTorch itself uses, so they hold for any user model. `stacks="python"` frames carry Python files;
`stacks="all"` adds C++ frames whose `name` is a demangled symbol (e.g. `at::native::cudnn_convolution`).
"""

from __future__ import annotations

import functools
import re

from memq.model import frame_file, frame_line, frame_name

WORKSPACE = re.compile(r"cudnn|cublas|cublaslt|workspace|nccl|cusparse|cufft|cusolver|getCurrentCUDABlasHandle",
                       re.IGNORECASE)
GRAD_NAME = re.compile(r"AccumulateGrad|accumulate_grad|AccumulateGrad::apply|_accumulate_grad")
# Backward is where the autograd engine runs: its frames, a backward node (`MmBackward0::apply`,
# `torch::autograd::generated::*`), a Python `backward()`. `torch::autograd::VariableType::*` is forward
# dispatch (every forward op passes it with stacks="all"), so it says nothing about the phase.
BACKWARD = re.compile(r"(^|[^a-z])backward|_engine_run_backward|autograd::Engine|autograd/graph\.py|"
                      r"autograd::generated::|Backward\d*::apply|PythonEngine|autograd::CopySlices|"
                      r"autograd::AccumulateGrad")
# Freeing a graph nobody ran backward through (its output dropped) runs the nodes' own teardown, named
# like them (`torch::autograd::generated::BmmBackward0::release_variables`, `deleteNode`); during a real
# backward the engine's frames are on the same stack.
TEARDOWN = re.compile(r"release_variables|deleteNode|SavedVariable::reset_data")
ENGINE = re.compile(r"autograd::Engine|_engine_run_backward|PythonEngine")
PARAM_NAME = re.compile(r"^(_apply|convert|to|cuda|reset_parameters|_load_from_state_dict|load_state_dict|"
                        r"kaiming_uniform_|xavier_uniform_|normal_|uniform_|trunc_normal_|empty_like)$")
PARAM_FILE = re.compile(r"torch/nn/parameter\.py|torch/nn/init\.py|torch/serialization\.py|safetensors")
MODULE_FILE = re.compile(r"torch/nn/modules/")
FORWARD_NAME = re.compile(r"^forward$|^_call_impl$|^_wrapped_call_impl$|checkpoint|^recompute_fn$")
FUNCTIONAL_FILE = re.compile(r"torch/nn/functional\.py|torch/functional\.py|torch/_tensor\.py|_ops\.py")

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
WORKSPACE_CAT = "workspace"
OTHER = "other"
UNKNOWN = "unknown"
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, WORKSPACE_CAT, OTHER, UNKNOWN)


# Entries with the same stack share one frames list (profiler/snapshot.py interns them), so a per-list
# memo turns the per-event rules of a million-event trace into a few thousand evaluations. An entry
# holds its list, so an id is never reused for another list while it is remembered; the memo is
# emptied when full, bounding what it keeps alive in a long-lived worker.
MEMO_MAX = 65_536


def per_frames_list(fn):
    memo: dict[int, tuple] = {}

    @functools.wraps(fn)
    def wrapper(frames):
        hit = memo.get(id(frames))
        if hit is not None and hit[0] is frames:
            return hit[1]
        out = fn(frames)
        if len(memo) >= MEMO_MAX:
            memo.clear()
        memo[id(frames)] = (frames, out)
        return out

    wrapper.memo = memo
    return wrapper


@per_frames_list
def is_optimizer(frames: list) -> bool:
    """Any frame in optimizer code. Hot path (once per distinct stack of a trace: 38,000 in the
    100k-entry snapshot): plain substring tests on the common dict frames, stopping at the first
    optimizer frame (joining the frames and searching in C measured 2x slower), the general readers
    only for other shapes."""
    for f in frames:
        if type(f) is dict:
            path = f.get("filename", "")
            name = f.get("name", "")
            if type(path) is not str or type(name) is not str or "\\" in path:  # as the readers do
                path, name = frame_file(f), frame_name(f)
        else:
            path, name = frame_file(f), frame_name(f)
        if "/optim/" in path or "optim::" in name or "_fused_adam" in name:
            return True
    return False


# A tensor made (at::empty and what it calls): a library op's output, such as cudnn_convolution's or
# cudnn_batch_norm's, is made this way inside the library's frames; its scratch is asked of the allocator
# directly (`Workspace`, run_conv_plan, setWorkspaceForHandle: tests/fixtures/captured/cudnn_workspace).
TENSOR_FACTORY = re.compile(r"^at::detail::empty_(generic|strided_generic)\b")
COMMS = re.compile(r"nccl", re.IGNORECASE)


@per_frames_list
def is_workspace(frames: list) -> bool:
    """A library's scratch: a frame of cuDNN, cuBLAS(Lt), cuSPARSE, cuFFT, cuSOLVER or NCCL code, or one named
    for a workspace, reached before any tensor factory (innermost first: with stacks="all" a convolution's
    output is made by at::empty inside `at::native::cudnn_convolution`, and is the step's, not scratch).
    NCCL's buffers count as workspace however they are made."""
    made_tensor = False
    for f in frames:
        name = frame_name(f)
        if WORKSPACE.search(name):
            return not made_tensor or bool(COMMS.search(name))
        if not made_tensor and TENSOR_FACTORY.match(name):
            made_tensor = True
    return False


@per_frames_list
def is_backward(frames: list) -> bool:
    names = [frame_name(f) for f in frames]
    if any(TEARDOWN.search(n) for n in names) and not any(ENGINE.search(n) for n in names):
        return False  # a graph torn down, not run
    return any(BACKWARD.search(n) for n in names) or any(BACKWARD.search(frame_file(f)) for f in frames)


@per_frames_list
def categorize(frames: list) -> str:
    """Category of one live block from its allocation stack (rules documented in docs/analysis.md).

    Order matters: optimizer code calls module code (`load_state_dict`), and workspace requests
    happen inside forward and backward, so the more specific rules run first."""
    if not frames:
        return UNKNOWN
    if is_optimizer(frames):
        return OPTIMIZER_STATE
    if is_workspace(frames):
        return WORKSPACE_CAT
    if any(GRAD_NAME.search(frame_name(f)) for f in frames):
        return GRADIENTS
    for f in frames:
        name, path = frame_name(f), frame_file(f)
        if PARAM_FILE.search(path):
            return PARAMETERS
        if MODULE_FILE.search(path) and PARAM_NAME.match(name):
            return PARAMETERS
        if name == "__init__" and MODULE_FILE.search(path):
            return PARAMETERS
    if is_backward(frames):
        return ACTIVATIONS
    for f in frames:
        name, path = frame_name(f), frame_file(f)
        if FORWARD_NAME.search(name) or FUNCTIONAL_FILE.search(path) or MODULE_FILE.search(path):
            return ACTIVATIONS
    return OTHER


PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER = "forward", "backward", "optimizer_step"


def event_phase(frames: list, trace_has_frames: bool) -> str | None:
    """The phase of one trace entry. The autograd engine's frames, or none at all in a trace that
    records Python frames elsewhere (the engine's thread has no Python stack), are backward;
    optimizer code is the optimizer step; any other framed entry is forward (or setup)."""
    if not frames:
        return PHASE_BACKWARD if trace_has_frames else None
    if is_optimizer(frames):
        return PHASE_OPTIMIZER
    if is_backward(frames):
        return PHASE_BACKWARD
    return PHASE_FORWARD


def phase_of(frames: list) -> str | None:
    """forward / backward / optimizer_step, or None when the frames do not tell."""
    if not frames:
        return None
    if is_optimizer(frames):
        return "optimizer_step"
    if is_backward(frames):
        return "backward"
    for f in frames:
        path = frame_file(f)
        if FORWARD_NAME.search(frame_name(f)) or MODULE_FILE.search(path) or FUNCTIONAL_FILE.search(path):
            return "forward"
    return None


_SKIP_FILES = re.compile(r"torch/nn/modules/module\.py|torch/utils/|torch/_|/contextlib\.py|functools\.py|"
                         r"torch/autograd/function\.py|torch/amp/")
# The recorder's own C++ frames (stacks="all") and the allocator's internals say nothing about the caller.
_SKIP_NAMES = re.compile(r"^(torch::unwind|torch::CapturedTraceback|torch::cuda::\(anonymous|"
                         r"c10::cuda::CUDACachingAllocator|"
                         r"c10::cuda::|c10::impl::|c10::Dispatcher|c10::BoxedKernel|c10::KernelFunction|"
                         r"at::_ops::|std::|_PyEval|_PyObject|PyObject_|method_vectorcall|cfunction|"
                         r"\?\?|at::TensorBase::|at::empty|at::detail::empty)")


def stack_signature(frames: list, depth: int = 3) -> str:
    """A short, stable name for an allocation site: the innermost frames outside torch plumbing.
    Read once per frames list at the default depth: a C++ stack (stacks="all") passes a dozen
    plumbing frames before the first that names a site, for each of thousands of live blocks."""
    if depth == 3:
        return _site_of(frames)
    return _stack_signature(frames, depth)


@per_frames_list
def _site_of(frames: list) -> str:
    return _stack_signature(frames, 3)


def _stack_signature(frames: list, depth: int) -> str:
    if not frames:
        return "<no frames>"
    picked = []
    for f in frames:
        label = _frame_label(frame_file(f), frame_line(f), frame_name(f))
        if label is None:
            continue
        picked.append(label)
        if len(picked) >= depth:
            break
    if not picked:
        picked = [frame_name(frames[0])]
    return " < ".join(picked)


@functools.lru_cache(maxsize=1 << 16)
def _frame_label(path: str, line: int, name: str) -> str | None:
    """How one frame reads in a site name, or None for plumbing. Memoised: a snapshot repeats the
    same few hundred frames across thousands of blocks and trace entries."""
    if _SKIP_FILES.search(path) or _SKIP_NAMES.match(name):
        return None
    short = path.rsplit("/", 2)
    short = "/".join(short[-2:]) if len(short) > 1 else path
    name = short_name(name)
    return f"{name} ({short}:{line})" if path and not path.startswith("??") else name


def short_name(name: str) -> str:
    """C++ symbols without their argument lists: `at::native::run_single_conv(...)` -> `at::native::run_single_conv`."""
    if "::" in name and "(" in name:
        name = name[: name.index("(")]
    return name[:120]


def workspace_frame(frames: list) -> str | None:
    """The first frame that names a library workspace, for evidence lines."""
    for f in frames:
        if WORKSPACE.search(frame_name(f)):
            return short_name(frame_name(f))
    return None


# Library code: what the user cannot edit. The innermost frame outside it is the user's allocating line.
_LIBRARY_PATH = re.compile(r"/(site-packages|dist-packages)/|/lib/python3[.\d]*/|^<|(^|/)torch/|"
                           r"(^|/)profiler/agent/|(^|/)lightning/|(^|/)transformers/")
NO_FRAMES = "<no frames>"


@functools.lru_cache(maxsize=1 << 14)
def _user_label(path: str, line: int, name: str) -> str | None:
    if not path.endswith(".py") or _LIBRARY_PATH.search(path):
        return None
    short = path.rsplit("/", 2)
    short = "/".join(short[-2:]) if len(short) > 1 else path
    return f"{short}:{line} in {short_name(name)}"


def user_line(frames: list) -> str | None:
    """`dir/train.py:57 in forward < train.py:90 in validate`: the innermost frame in the user's own
    code (not torch, not an installed package, not the standard library) and the user's frame that
    called it; None when no frame is the user's."""
    picked = []
    for f in frames:
        label = _user_label(frame_file(f), frame_line(f), frame_name(f))
        if label is not None:
            picked.append(label)
            if len(picked) == 2:  # the allocating line and its caller (e.g. a model's forward and the loop)
                break
    return " < ".join(picked) if picked else None


def allocation_site(frames: list) -> str:
    """Where a block was allocated, in the user's terms: the user's line with the innermost library
    call it went through (`train.py:57 in validate (via forward (modules/linear.py:125))`); the library
    signature alone when no frame is the user's; NO_FRAMES when nothing was recorded."""
    if not frames:
        return NO_FRAMES
    mine = user_line(frames)
    lib = stack_signature(frames, depth=1)
    if mine is None:
        return stack_signature(frames)
    inner = mine.split(" < ")[0]
    return mine if lib.startswith(inner.split(" in ")[-1] + " (") else f"{mine} (via {lib})"
