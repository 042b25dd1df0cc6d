"""`memq explain` and `memq analyze --oom-message` on what people paste (issue 39): each case the issue
found has its own test, through the command itself."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memq.cli import cli
from tests.helpers import REAL, meta

GiB, MiB = 1 << 30, 1 << 20

CUDA_ERROR = ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at some "
              "other API call, so the stacktrace below might be incorrect.\nFor debugging consider passing "
              "CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
MPS = ("MPS backend out of memory (MPS allocated: 17.68 GB, other allocations: 3.95 MB, max allowed: 18.13 GB). Tried "
       "to allocate 1024.00 MB on private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for "
       "memory allocations (may cause system failure).")
MPS_OTHER = ("MPS backend out of memory (MPS allocated: 9.57 GiB, other allocations: 17.35 GiB, max allowed: 27.20 "
             "GiB). Tried to allocate 292.50 MiB on private pool.")
PRIVATE_POOLS = ("OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of "
                 "47.53 GiB of which 896.00 KiB is free. Process 1686436 has 47.51 GiB memory in use. Of the allocated "
                 "memory 47.00 GiB is allocated by PyTorch, with 46.22 GiB allocated in private pools (e.g., CUDA "
                 "Graphs), and 149.10 MiB is reserved by PyTorch but unallocated.")
BELOW_FREE = [
    "CUDA out of memory. Tried to allocate 2.26 GiB (GPU 0; 6.00 GiB total capacity; 781.59 MiB already allocated; "
    "3.03 GiB free; 1.24 GiB reserved in total by PyTorch) ",
    "RuntimeError: CUDA out of memory. Tried to allocate 12.50 MiB (GPU 0; 10.92 GiB total capacity; 8.57 MiB already "
    "allocated; 9.28 GiB free; 4.68 MiB cached)",
    "HIP out of memory. Tried to allocate 432.00 MiB. GPU 0 has a total capacity of 15.92 GiB of which 7.12 GiB is "
    "free. Of the allocated memory 8.08 GiB is allocated by PyTorch, and 321.96 MiB is reserved by PyTorch but "
    "unallocated.",
]
# this process holds 126 GiB outside PyTorch's 11 GiB: its own libraries, not another program
OWN = meta("external")["oom_message"]
OTHERS = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 86.00 MiB. GPU 0 has a total capacity of "
          "23.64 GiB of which 264.00 MiB is free. Process 2086283 has 419.48 MiB memory in use. Including non-PyTorch "
          "memory, this process has 8.04 GiB memory in use. Process 2797307 has 14.85 GiB memory in use. Of the "
          "allocated memory 7.63 GiB is allocated by PyTorch, and 40.11 MiB is reserved by PyTorch but unallocated.")
VLLM = ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB (GPU 0; 10.73 GiB total "
        "capacity; 9.85 GiB already allocated; 46.44 MiB free; 9.86 GiB reserved in total by PyTorch)\n(python -u -m "
        "vllm.entrypoints.openai.api_server --model mistralai/Mistral-7B-v0.1 --gpu-memory-utilization 0.8)")


def explain(*args: str) -> tuple[int, dict | None, str]:
    res = CliRunner().invoke(cli, ["explain", *args, "--json"], terminal_width=200)
    doc = json.loads(res.stdout) if res.exit_code == 0 else None
    return res.exit_code, doc, res.output


def first(doc: dict) -> str:
    return doc["diagnosis"]["recommendations"][0]["action"]


def test_a_cuda_error_outside_the_allocator_is_explained_never_healthy():
    code, doc, _ = explain(CUDA_ERROR)
    assert code == 0 and doc["diagnosis"]["primary_cause"] != "healthy"
    assert "CUDA_LAUNCH_BLOCKING=1" in first(doc) and "nvidia-smi" in first(doc)
    assert "not from PyTorch's caching allocator" in doc["diagnosis"]["causes"][0]["evidence"][0]
    assert doc["details"]["message_kind"] == "cuda_error"


def test_an_mps_message_gets_mps_advice():
    code, doc, _ = explain(MPS)
    assert code == 0 and doc["diagnosis"]["primary_cause"] != "healthy"
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in first(doc)
    assert doc["oom"]["requested_bytes"] == 1024 * MiB and doc["oom"]["limit_bytes"] == int(round(18.13 * GiB))
    # the cap counts the other Metal allocations too: 9.57 + 17.35 + 0.29 GiB is over 27.20 GiB
    _, other, _ = explain(MPS_OTHER)
    assert other["oom"]["fits_if_compacted"] is False and other["diagnosis"]["primary_cause"] == "external_memory"


def test_private_pools_are_inside_allocated_not_added_again():
    code, doc, _ = explain(PRIVATE_POOLS)
    reserved = doc["metrics"]["reserved_bytes"]
    assert reserved == int(round(47.00 * GiB)) + int(round(149.10 * MiB))  # not 93.37 GiB
    assert reserved <= doc["details"]["limits"]["device_total_bytes"]
    assert doc["details"]["message_verdict"] == "private_pools"
    assert "CUDA graphs' private pools" in first(doc)
    assert doc["diagnosis"]["primary_cause"] != "fragmentation"


@pytest.mark.parametrize("text", BELOW_FREE)
def test_a_request_below_the_free_memory_names_the_other_limit_first(text):
    code, doc, _ = explain(text)
    assert code == 0 and doc["details"]["message_verdict"] == "below_free"
    assert first(doc).startswith("Do not shrink the batch first")
    assert "set_per_process_memory_fraction" in first(doc)
    assert "smaller than the" in doc["diagnosis"]["causes"][0]["evidence"][-1]


def test_memory_outside_pytorch_that_is_this_process_own_is_said_so():
    code, doc, _ = explain(OWN)
    assert doc["details"]["message_verdict"] == "own_libraries"
    assert "this process's own" in doc["diagnosis"]["causes"][0]["evidence"][-1]
    assert not first(doc).startswith("Find and stop what else holds the GPU")


def test_other_processes_are_named_with_their_bytes_first():
    code, doc, _ = explain(OTHERS)
    assert doc["details"]["message_verdict"] == "other_processes"
    assert "process 2797307 (14.85 GiB)" in first(doc) and "process 2086283" in first(doc)
    assert {"pid": 2797307, "bytes": int(round(14.85 * GiB))} in doc["details"]["other_processes"]
    text = json.dumps(doc["diagnosis"])
    assert "activations are" not in text and "halving the micro-batch frees" not in text


def test_an_inference_server_gets_inference_advice():
    code, doc, _ = explain(VLLM)
    assert "gpu_memory_utilization" in first(doc) and "max_num_seqs" in first(doc)


@pytest.mark.parametrize("text", ["segmentation fault", "java.lang.OutOfMemoryError: Java heap space",
                                  "Killed: out of memory (oom-kill)"])
def test_text_that_is_no_known_oom_message_is_unrecognised(text):
    code, doc, out = explain(text)
    assert code == 2 and doc is None
    assert "not an out-of-memory message of a layout memq knows" in out and "healthy" not in out


def test_no_free_block_figure_a_message_does_not_give():
    res = CliRunner().invoke(cli, ["explain", PRIVATE_POOLS], terminal_width=200)
    text = " ".join(res.output.split())
    assert "Largest usable block 0.0 MiB" not in text and "largest usable block" not in text.lower()


# ------------------------------------------------------------------ a message given with a snapshot

def analyze(*args: str):
    return CliRunner().invoke(cli, ["analyze", *args, "--json"], terminal_width=200)


def test_another_ooms_message_is_said_and_the_snapshots_figures_win():
    """The README's `grep -m1` recipe picks a log's first OOM: here the message of another run (1.50 GiB
    under an 8 GiB cap) given with the capacity snapshot."""
    snap = str(REAL / "capacity" / "oom.pickle.gz")
    alone = json.loads(analyze(snap).stdout)
    res = analyze(snap, "--oom-message", meta("frag_synthetic")["oom_message"])
    assert res.exit_code == 0
    doc = json.loads(res.stdout)
    warning = [w for w in doc["details"]["warnings"] if "not this snapshot's OOM" in w]
    assert warning and "asks for 1.50 GiB" in warning[0]
    assert "not this snapshot's OOM" in res.stderr
    assert doc["oom"] == alone["oom"]  # the snapshot's request and limit, not the message's cap
    assert "by -" not in json.dumps(doc["diagnosis"])


def test_the_snapshots_own_message_is_used_without_a_warning():
    snap = str(REAL / "capacity" / "oom.pickle.gz")
    res = analyze(snap, "--oom-message", meta("capacity")["oom_message"])
    doc = json.loads(res.stdout)
    assert not [w for w in doc["details"]["warnings"] if "not this snapshot's OOM" in w]
    assert doc["oom"]["limit_bytes"] is not None
