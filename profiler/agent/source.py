"""Where the agent's numbers come from.

`TorchSource` reads `torch.cuda` in the training process (torch is imported lazily, inside methods,
and only if the process already imported it or CUDA is asked for). `ReplaySource` replays recorded
snapshot files and a `stats.jsonl` (the layout of tests/fixtures/real/*): the tests use it on CPU, and
it can stand in for a job when replaying recordings. Both implement the same small interface:

    present()                   -> bool: is there an allocator (torch imported, CUDA available); cheap
    ready()                     -> bool: is it initialised (no CUDA context is ever created by us)
    metadata()                  -> dict: versions, device, limit, allocator settings, scheduler ids
    stats()                     -> dict | None: a memory_stats subset + device free/total
    step_signals(reset)         -> (allocated, reserved, peak allocated, peak reserved, retries) | None;
                                   reset=True starts the peak counters afresh (one step's peak each)
    snapshot()                  -> bytes | dict | None: a pickle's bytes or the _snapshot() dict
    set_history(on, stacks, context, max_entries) -> bool
    attach_oom_observer(fn)     -> bool: fn(device, alloc, device_alloc, device_free)
    device_total(device)        -> int | None
    limit_bytes()               -> int | None: what the allocator may reserve (fraction x total)

Every method may raise; the agent catches everything.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memq import codec
from memq.launcher_ids import real_id

STAT_KEYS = (
    "allocated_bytes.all.current", "allocated_bytes.all.peak", "reserved_bytes.all.current",
    "reserved_bytes.all.peak", "active_bytes.all.current", "inactive_split_bytes.all.current",
    "requested_bytes.all.current", "num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free",
    "num_sync_all_streams", "segment.all.current", "inactive_split.all.current",
)

OomObserver = Callable[[int, int, int, int], None]


def scheduler_ids(env: dict | None = None) -> dict:
    """Job ids of SLURM, Kubernetes, torchrun and friends, when present."""
    env = os.environ if env is None else env
    keys = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_PROCID", "SLURM_JOB_NAME",
            "SLURM_CLUSTER_NAME", "KUBERNETES_SERVICE_HOST", "POD_NAME", "POD_NAMESPACE", "JOB_NAME",
            "JOB_COMPLETION_INDEX", "TORCHELASTIC_RUN_ID", "LSB_JOBID", "PBS_JOBID")
    out = {k: env[k] for k in keys if env.get(k)}
    if "KUBERNETES_SERVICE_HOST" in out:
        out["KUBERNETES_POD"] = env.get("POD_NAME") or env.get("HOSTNAME", "")
    return out


def default_job(env: dict | None = None) -> str:
    env = os.environ if env is None else env
    for k in ("MEMQ_JOB", "SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "JOB_NAME", "LSB_JOBID", "PBS_JOBID"):
        job = real_id(env.get(k))
        if job:  # torchrun's default "none" and friends are skipped: the next launcher id may be real
            return job
    return ""


def rank_and_world(env: dict | None = None) -> tuple[int, int]:
    """Global rank and world size from the launcher's environment, else torch.distributed, else 0/1."""
    env = os.environ if env is None else env
    for r, w in (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("OMPI_COMM_WORLD_RANK",
                                                                           "OMPI_COMM_WORLD_SIZE")):
        if env.get(r, "").isdigit():
            return int(env[r]), int(env[w]) if env.get(w, "").isdigit() else 1
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # noqa: BLE001
        pass
    return 0, 1


def host_name() -> str:
    return socket.gethostname()


def first_input_facts(module: Any, args: Any) -> dict:
    """At a module's forward: the autocast state of CUDA (the dtype, or "off") and the shapes and
    dtypes of the tensor arguments (at most four)."""
    torch = sys.modules["torch"]
    try:
        on, dtype = bool(torch.is_autocast_enabled("cuda")), torch.get_autocast_dtype("cuda")
    except (TypeError, AttributeError):  # torch < 2.4: the CUDA-only calls
        on, dtype = bool(torch.is_autocast_enabled()), torch.get_autocast_gpu_dtype()
    tensors = [a for a in (args if isinstance(args, tuple) else (args,)) if isinstance(a, torch.Tensor)][:4]
    return {"module": type(module).__name__[:80], "autocast": str(dtype).removeprefix("torch.") if on else "off",
            "shapes": [[int(d) for d in t.shape][:8] for t in tensors],
            "dtypes": [str(t.dtype).removeprefix("torch.") for t in tensors]}


class TorchSource:
    """The production source: torch.cuda of this process. Never creates a CUDA context itself."""

    name = "torch"

    def __init__(self, device: int | None = None):
        self._device = device
        self._torch: Any = None
        self._observer_attached = False
        self._present: bool | None = None
        self._dev: int | None = None
        self.backend: str | None = None

    # -- helpers ---------------------------------------------------------------------------------
    def _t(self):
        if self._torch is None:
            import torch  # lazy: the agent never imports torch before the job (tests/agent/test_torch_source.py)

            self._torch = torch
        return self._torch

    def present(self) -> bool:
        """torch is imported by the job and CUDA is available. Never imports torch itself: a process
        that does not use torch (a launcher, a tool) pays nothing."""
        if self._present is None:
            torch = sys.modules.get("torch")
            if torch is None or not hasattr(torch, "cuda"):
                return False
            try:
                self._present = bool(torch.cuda.is_available())
            except Exception:  # noqa: BLE001 - broken driver: no source
                self._present = False
        return self._present

    def ready(self) -> bool:
        torch = sys.modules.get("torch")
        try:
            return torch is not None and self.present() and bool(torch.cuda.is_initialized())
        except Exception:  # noqa: BLE001
            return False

    def device(self) -> int:
        if self._device is None:
            torch = self._t()
            local = os.environ.get("LOCAL_RANK", "")
            n = torch.cuda.device_count()
            if local.isdigit() and int(local) < n and os.environ.get("MEMQ_DEVICE_FROM_LOCAL_RANK", "1") == "1" \
                    and n > 1:
                return int(local)
            return int(torch.cuda.current_device())
        return int(self._device)

    def allocator_backend(self) -> str:
        if self.backend is None:
            try:
                self.backend = str(self._t().cuda.get_allocator_backend())
            except Exception:  # noqa: BLE001 - old torch: only the native allocator existed
                self.backend = "native"
        return self.backend

    def can_snapshot(self) -> bool:
        return self.allocator_backend() != "cudaMallocAsync"

    # -- interface -------------------------------------------------------------------------------
    def metadata(self) -> dict:
        md: dict[str, Any] = {"source": self.name, "python": sys.version.split()[0]}
        if "torch" not in sys.modules:
            return md
        torch = self._t()
        md.update(torch=getattr(torch, "__version__", None), cuda=getattr(torch.version, "cuda", None),
                  cuda_available=self.present())
        md["alloc_conf_env"] = {k: os.environ[k] for k in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
                                if k in os.environ}
        try:
            md["cudnn_benchmark"] = bool(torch.backends.cudnn.benchmark)
            md["cudnn"] = torch.backends.cudnn.version()
        except Exception:  # noqa: BLE001
            pass
        if not md["cuda_available"]:
            return md
        md["allocator_backend"] = self.allocator_backend()
        md["device_count"] = torch.cuda.device_count()
        if not self.ready():
            return md
        dev = self.device()
        md["device"] = dev
        for key, fn in (
            ("gpu", lambda: torch.cuda.get_device_name(dev)),
            ("device_total", lambda: int(torch.cuda.get_device_properties(dev).total_memory)),
            ("capability", lambda: list(torch.cuda.get_device_capability(dev))),
            ("memory_fraction", lambda: self._fraction(dev)),
            ("driver", lambda: torch._C._cuda_getDriverVersion()),
            ("allocator_settings", self._allocator_settings),
        ):
            try:
                md[key] = fn()
            except Exception:  # noqa: BLE001 - absent on this torch: leave it out
                pass
        try:  # what is held outside this process's PyTorch: an uncapped job's limit is the card less it
            free, total = torch.cuda.mem_get_info(dev)
            reserved = int(torch.cuda.memory_reserved(dev))
            md["device_free"] = int(free)
            md["non_pytorch_bytes"] = max(0, int(total) - int(free) - reserved)
        except Exception:  # noqa: BLE001
            pass
        limit = self.limit_bytes()
        if limit:
            md["limit_bytes"] = limit
            if md.get("memory_fraction", 1.0) < 1.0:
                md["process_cap_bytes"] = limit
        return md

    def _allocator_settings(self) -> dict | None:
        # The same dict the snapshot carries (2.3+); a segments-only snapshot is cheap (~0.6 ms).
        if not self.can_snapshot():
            return None
        snap = self._t().cuda.memory._snapshot()
        return snap.get("allocator_settings") if isinstance(snap, dict) else None

    def stats(self) -> dict | None:
        torch = self._t()
        if not self.ready():
            return None
        dev = self.device()
        raw = torch.cuda.memory_stats(dev)
        out = {k: int(raw[k]) for k in STAT_KEYS if k in raw}
        try:
            free, total = torch.cuda.mem_get_info(dev)
            out["device_free"], out["device_total"] = int(free), int(total)
        except Exception:  # noqa: BLE001
            pass
        return out

    def step_signals(self, reset: bool = True) -> tuple[int, int, int, int, int] | None:
        """The boundary reading, microseconds: the C++ stats dict without memory_stats()'s Python
        flattening (which makes memory_allocated() and friends cost ~0.4 ms each)."""
        torch, dev = self._torch, self._dev
        if torch is None or dev is None:
            if not self.ready():
                return None
            torch, dev = self._t(), self.device()
            self._dev = dev
        d = torch._C._cuda_memoryStats(dev)
        a, r = d["allocated_bytes"]["all"], d["reserved_bytes"]["all"]
        out = (a["current"], r["current"], a["peak"], r["peak"], d["num_alloc_retries"])
        if reset:
            torch._C._cuda_resetPeakMemoryStats(dev)
        return out

    def snapshot(self) -> dict | None:
        if not self.ready() or not self.can_snapshot():
            return None
        return self._t().cuda.memory._snapshot()

    def set_history(self, on: bool, stacks: str = "python", context: str = "all", max_entries: int = 50_000) -> bool:
        if not self.can_snapshot():
            return False
        mem = self._t().cuda.memory
        try:
            if on:
                mem._record_memory_history(enabled="all", context=context, stacks=stacks, max_entries=max_entries)
            else:
                mem._record_memory_history(enabled=None)
        except TypeError:  # torch 2.0: only the boolean (legacy) form
            mem._record_memory_history(bool(on), record_context=True, trace_alloc_max_entries=max_entries,
                                       trace_alloc_record_context=True)
        return True

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        if self._observer_attached or not self.ready():
            return self._observer_attached
        attach = getattr(self._t()._C, "_cuda_attach_out_of_memory_observer", None)
        if attach is None:
            return False
        attach(fn)
        self._observer_attached = True
        return True

    def device_total(self, device: int | None = None) -> int | None:
        dev = self.device() if device is None else device
        return int(self._t().cuda.get_device_properties(dev).total_memory)

    def limit_bytes(self) -> int | None:
        dev = self.device()
        total = self.device_total(dev)
        frac = self._fraction(dev)
        return int(total * frac) if total else None

    def _fraction(self, dev: int) -> float:
        try:
            frac = float(self._t().cuda.get_per_process_memory_fraction(dev))
        except Exception:  # noqa: BLE001 - older torch cannot read the fraction back
            return 1.0
        # under backend:cudaMallocAsync the value read back is meaningless (seen: 1.2e8 on torch 2.11)
        return frac if 0.0 < frac <= 1.0 else 1.0


class ReplaySource:
    """Replays a recorded folder: `meta.json`, `stats.jsonl` and the snapshot files of meta's list.

    `snapshot()` returns the next file's uncompressed pickle bytes (so its sha256 equals that of the
    recorded file, as `memq push` computes it), cycling; `stats()` returns the next stats line.
    `fire_oom()` calls the attached observer with the OOM figures of the folder's OOM snapshot, as the
    allocator would just before raising, and positions `snapshot()` on that file.
    """

    name = "replay"

    def __init__(self, folder: str | os.PathLike, *, ready: bool = True, max_bytes: int = codec.DEFAULT_MAX_BYTES):
        self.folder = Path(folder)
        self.meta = json.loads((self.folder / "meta.json").read_text())
        entries = self.meta.get("snapshots") or []
        self.entries = [e for e in entries if (self.folder / e.get("file", "")).is_file()]
        if not self.entries:
            self.entries = [{"file": p.name, "tag": p.name.split(".")[0]}
                            for p in sorted(self.folder.glob("*.pickle*"))]
        stats_path = self.folder / "stats.jsonl"
        self.stat_lines = [json.loads(line) for line in stats_path.read_text().splitlines() if line.strip()] \
            if stats_path.exists() else []
        self._max_bytes = max_bytes
        self._i = 0
        self._s = 0
        self._ready = ready
        self.observer: OomObserver | None = None
        self.history_calls: list[tuple[bool, str, int]] = []
        self.snapshot_calls = 0

    def present(self) -> bool:
        return True

    def ready(self) -> bool:
        return self._ready

    def set_ready(self, value: bool = True) -> None:
        self._ready = value

    def metadata(self) -> dict:
        m = self.meta
        snap0 = self.entries[0] if self.entries else {}
        md = {"source": self.name, "replay_of": self.folder.name, "torch": m.get("torch"), "cuda": m.get("cuda"),
              "gpu": m.get("gpu"), "cuda_available": True, "allocator_backend": "native",
              "alloc_conf_env": {"PYTORCH_CUDA_ALLOC_CONF": m.get("alloc_conf", "")},
              "device": 0, "device_total": snap0.get("device_total")}
        if m.get("cap_bytes"):
            md["limit_bytes"] = int(m["cap_bytes"])
        return md

    def stats(self) -> dict | None:
        if not self.stat_lines:
            return None
        line = dict(self.stat_lines[self._s % len(self.stat_lines)])
        self._s += 1
        for k in ("step", "epoch", "phase", "t"):
            line.pop(k, None)
        return line

    def step_signals(self, reset: bool = True) -> tuple[int, int, int, int, int] | None:
        """Boundary readings: `self.signals` (a list the test sets, consumed in order, the last one
        repeated) or else the stats lines' figures."""
        sigs = getattr(self, "signals", None)
        if sigs:
            return tuple(sigs.pop(0) if len(sigs) > 1 else sigs[0])  # type: ignore[return-value]
        line = self.stats()
        if not line:
            return None
        alloc, res = line.get("allocated_bytes.all.current", 0), line.get("reserved_bytes.all.current", 0)
        return (alloc, res, line.get("allocated_bytes.all.peak", alloc), line.get("reserved_bytes.all.peak", res),
                line.get("num_alloc_retries", 0))

    def read(self, entry: dict) -> bytes:
        return codec.decompress((self.folder / entry["file"]).read_bytes(), self._max_bytes)

    def snapshot(self) -> bytes | None:
        if not self.entries:
            return None
        entry = self.entries[self._i % len(self.entries)]
        self._i += 1
        self.snapshot_calls += 1
        return self.read(entry)

    def set_history(self, on: bool, stacks: str = "python", context: str = "all", max_entries: int = 50_000) -> bool:
        self.history_calls.append((bool(on), stacks, max_entries))
        return True

    def attach_oom_observer(self, fn: OomObserver) -> bool:
        self.observer = fn
        return True

    def device_total(self, device: int | None = None) -> int | None:
        for e in self.entries:
            if e.get("device_total"):
                return int(e["device_total"])
        return None

    def limit_bytes(self) -> int | None:
        return int(self.meta["cap_bytes"]) if self.meta.get("cap_bytes") else self.device_total()

    def oom_entry(self) -> dict | None:
        for e in self.entries:
            if e.get("alloc") is not None:
                return e
        return None

    def fire_oom(self) -> bool:
        """Call the observer as the allocator would; False when there is no observer or OOM entry."""
        entry = self.oom_entry()
        if self.observer is None or entry is None:
            return False
        self._i = self.entries.index(entry)
        free = entry.get("device_free_at_oom", entry.get("device_free", 0))
        self.observer(0, int(entry["alloc"]), int(entry.get("device_alloc") or 0), int(free or 0))
        return True
