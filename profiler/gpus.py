"""What `--gpu NAME` stands for: the memory torch reports for a card (`total capacity` in its OOM
messages, `torch.cuda.get_device_properties().total_memory`), less what the CUDA context and the
libraries hold outside PyTorch's cache.

Totals: the figures torch prints for these cards in public OOM reports (they vary by a few hundred
MiB with the driver and ECC; the smallest reported is kept), the H200's measured on the machine in
benchmarks/RESULTS.md. `memq fit --limit` takes the exact figure of a job's own card or cap."""

from __future__ import annotations

from memq.errors import BadInput

GiB = 1 << 30
# CUDA context, cuBLAS and cuDNN handles: memory a process holds outside PyTorch's cache. Judgement
# from OOM messages' "non-PyTorch memory" on idle-started processes (0.3-0.6 GiB); the upper end.
CONTEXT_BYTES = 640 << 20

#: name (lower case, no spaces) -> total bytes as torch reports them
TOTALS = {
    "t4": int(14.75 * GiB),
    "v100-16gb": int(15.78 * GiB),
    "v100-32gb": int(31.74 * GiB),
    "a10g": int(22.19 * GiB),
    "l4": int(22.05 * GiB),
    "rtx3090": int(23.69 * GiB),
    "rtx4090": int(23.64 * GiB),
    "a100-40gb": int(39.39 * GiB),
    "a100-80gb": int(79.14 * GiB),
    "h100-80gb": int(79.11 * GiB),
    "h200": 150_109_880_320,
}
ALIASES = {"v100": "v100-16gb", "a100": "a100-40gb", "h100": "h100-80gb", "h200-141gb": "h200",
           "3090": "rtx3090", "4090": "rtx4090"}


def _key(name: str) -> str:
    k = "".join(name.lower().replace("nvidia", "").split())
    k = k.replace("_", "-")
    for size in ("16gb", "32gb", "40gb", "80gb", "141gb"):
        if k.endswith(size) and not k.endswith("-" + size):
            k = k[: -len(size)] + "-" + size
    return ALIASES.get(k, k)


def gpu_limit(name: str) -> tuple[int, str]:
    """(bytes PyTorch may reserve on the card, where the figure comes from). BadInput for an unknown card."""
    k = _key(name)
    if k not in TOTALS:
        raise BadInput(f"unknown GPU {name!r}", hint="known: " + ", ".join(sorted(TOTALS)) + "; or give --limit SIZE")
    return TOTALS[k] - CONTEXT_BYTES, (f"--gpu {k} ({TOTALS[k] / GiB:.2f} GiB, "
                                       f"less {CONTEXT_BYTES >> 20} MiB CUDA context)")
