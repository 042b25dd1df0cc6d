"""The OOM playbook's entries: one per piece of popular advice, each measured on real runs.

docs/playbook.md is generated from the fixtures in tests/fixtures/playbook (benchmarks/playbook.py);
its section anchors are the ids below, so a recommendation that names an entry id links to the section
that holds the figures behind it. Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

DOC_PATH = "docs/playbook.md"
# The same text ships inside the package (an installed memq has no docs/): `memq playbook ID` prints an
# entry from it and `memq serve` renders it at /playbook. Both files are written by benchmarks/playbook.py.
PACKAGED_NAME = "playbook.md"


@dataclass(frozen=True)
class Entry:
    id: str          # the section anchor in docs/playbook.md
    title: str       # the section heading
    advice: str      # the popular advice the section measures
    summary: str     # one line: when it helps and when it cannot


ENTRIES: tuple[Entry, ...] = (
    Entry("optimizer-state", "Optimizer state: what each optimizer keeps",
          "\"SGD with momentum takes more memory than AdamW\"; \"use a fused or 8-bit optimizer\"",
          "state is a fixed multiple of the parameter bytes per optimizer; it matters when the OOM is in the "
          "first optimizer step"),
    Entry("activation-checkpointing", "Activation checkpointing and batch size",
          "\"turn on gradient checkpointing\"; \"reduce the batch size\"",
          "activations scale with batch x sequence; checkpointing trades them for recomputation time"),
    Entry("empty-cache", "torch.cuda.empty_cache()",
          "\"call torch.cuda.empty_cache()\"",
          "returns only whole free segments to the driver; never prevents an OOM in the same process"),
    Entry("allocator-settings", "Allocator settings at the same cap",
          "\"set PYTORCH_CUDA_ALLOC_CONF\"; \"it's fragmentation\"",
          "settings change how cached memory is split and returned; they help only a fragmentation OOM"),
    Entry("expandable-segments", "expandable_segments:True",
          "\"set expandable_segments:True\"",
          "maps memory into growing segments, so free space is not stranded between allocations"),
    Entry("max-split-size", "max_split_size_mb",
          "\"set max_split_size_mb:128\"",
          "stops large cached blocks from being split; the oversize blocks it leaves can cost memory"),
    Entry("gc-threshold", "garbage_collection_threshold",
          "\"set garbage_collection_threshold:0.6\"",
          "frees unused cached blocks early once reserved passes the threshold; no help when the cache is in pieces"),
    Entry("roundup-power2", "roundup_power2_divisions",
          "\"set roundup_power2_divisions\"",
          "rounds requests up to fewer sizes for reuse, at the price of rounding waste"),
    Entry("kept-tensors", "A leak through kept tensors",
          "\"store loss.item(), not the tensor\"",
          "a tensor kept across steps keeps its memory; live bytes at epoch ends grow until the OOM"),
    Entry("external-memory", "Memory outside PyTorch",
          "\"another process is using the GPU\"",
          "no PyTorch setting frees memory that PyTorch does not hold"),
    Entry("workspace", "cuDNN / cuBLAS workspaces",
          "\"turn off cudnn.benchmark\"",
          "benchmark mode asks for workspaces sized from the device's free memory, not the cap"),
    Entry("rank-imbalance", "One rank unlike the others",
          "\"reduce the batch size\" (for every rank)",
          "when one data-parallel rank fails, compare it with the others before shrinking every rank"),
)

BY_ID = {e.id: e for e in ENTRIES}


def anchor(entry_id: str) -> str:
    """`docs/playbook.md#<id>`; a KeyError for an unknown id is a programming error, not user input."""
    return f"{DOC_PATH}#{BY_ID[entry_id].id}"
