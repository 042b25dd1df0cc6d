"""The in-job agent's handle: its state, start and stop. Its rooms: triggers.py (step and epoch
boundaries, the OOM observer, the ticker), recording.py (the recording policy applied, stats,
snapshots and their metadata), signals.py (signal handlers and exception hooks), transport.py
(delivery); `Agent` is the three mixins over the state set up here.

Threads: the training thread calls the API (cheap: a few comparisons per `mark_step`; a stats sample,
~0.4 ms, every `stats_interval_s`; a snapshot only on a trigger). A daemon "ticker" thread handles
what needs no step boundary: signal-requested snapshots, periodic snapshots and stats when the job
marks no steps, the time-based recording policy, flushing stats batches, and noticing when CUDA
gets initialised. A daemon transport thread does all serialization and I/O.

Every public method catches every exception: the training loop never sees one from here.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from memq.agent.policy import RecordingPolicy
from memq.agent.recording import AgentRecording
from memq.agent.signals import AgentSignals
from memq.agent.source import (
    ReplaySource,
    TorchSource,
    default_job,
    host_name,
    rank_and_world,
)
from memq.agent.spool import Spool
from memq.agent.steps import StepTracker
from memq.agent.torch_import import after_torch_import
from memq.agent.transport import Counters, Item, Transport
from memq.agent.triggers import AgentTriggers

log = logging.getLogger("memq.agent")

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_SPOOL_DIR = re.compile(r"^(?P<base>rank\d+-(?P<host>.+?)-(?P<pid>\d+))(?:\.adopted-(?P<adopter>\d+))?$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


def _safe(text: str) -> str:
    return _SAFE.sub("_", text)[:80] or "_"


class Agent(AgentTriggers, AgentRecording, AgentSignals):
    """A handle on one running agent; also a context manager (`with agent.start(...):`)."""

    def __init__(self, run: str, cluster: str, *, job: str | None = None, rank: int | None = None,
                 world_size: int | None = None, host: str | None = None, redis_url: str | None = None,
                 stream: str | None = None, key_prefix: str | None = None, stream_maxlen: int | None = None,
                 blob_ttl_s: int | None = None, spool_dir: str | None = None, spool_max_bytes: int | None = None,
                 fsync: bool = True, stats_interval_s: float | None = None, stats_flush_s: float = 30.0,
                 snapshot_every_s: float | None = None, snapshot_on_epoch: bool = True,
                 history: str | None = None, stacks: str = "python", context: str = "all",
                 max_entries: int | None = None, warmup_steps: int = 3, warmup_s: float = 120.0,
                 periodic_record_s: float = 2.0, headroom: float = 0.10, signal: str | int | None = "default",
                 oom: bool = True,
                 max_oom_snapshots: int = 4, oom_message_wait_s: float = 2.0, codec: str | None = None,
                 send_timeout_s: float = 2.0, queue_size: int = 256, stop_timeout_s: float = 5.0,
                 source: Any = None, client_factory: Any = None, backoff_s: tuple[float, float] = (0.5, 30.0),
                 tick_s: float = 0.5, metadata: dict | None = None, model: Any = None, optimizer: Any = None,
                 device: int | None = None, announce: str = "eager", settings: Any = None,
                 comparable_every_steps: int = 100, comparable_min_s: float = 300.0,
                 growth_window_steps: int = 500, step_hook: bool = True,
                 step_budget: float = 0.002, roles: bool = True, role_devices: tuple = ("cuda",)):
        from memq.config import load_settings

        st = settings or load_settings()
        self.run, self.cluster = str(run), str(cluster)
        env_rank, env_world = rank_and_world()
        self.rank = env_rank if rank is None else int(rank)
        self.world_size = env_world if world_size is None else int(world_size)
        self.identity = {"run": self.run, "cluster": self.cluster, "rank": self.rank,
                         "job": default_job() if job is None else str(job), "host": host or host_name()}
        self.source = source if source is not None else TorchSource(device=device)
        self.stats_interval_s = float(st.stats_interval_s if stats_interval_s is None else stats_interval_s)
        self.stats_flush_s = float(stats_flush_s)
        self.snapshot_every_s = float(st.snapshot_every_s if snapshot_every_s is None else snapshot_every_s)
        self.snapshot_on_epoch = snapshot_on_epoch
        self.stacks, self.context = stacks, context
        self.max_entries = int(st.agent_max_entries if max_entries is None else max_entries)
        self.policy = RecordingPolicy(mode=history or st.agent_history, warmup_steps=warmup_steps, warmup_s=warmup_s,
                                      headroom_frac=headroom)
        self.periodic_record_s = float(periodic_record_s)
        self.tracker = StepTracker(warmup_steps=warmup_steps, comparable_every=comparable_every_steps,
                                   comparable_min_s=comparable_min_s, window_steps=growth_window_steps)
        self.step_hook = step_hook
        self.step_budget = float(step_budget)
        self.signal_name = st.agent_signal if signal == "default" else signal
        self.oom_enabled = oom
        self.max_oom_snapshots = max_oom_snapshots
        self.oom_message_wait_s = oom_message_wait_s
        self.stop_timeout_s = stop_timeout_s
        self.tick_s = tick_s
        self.user_metadata = dict(metadata or {})
        self.announce = announce  # "eager": run_start at start(); "on_ready": once CUDA is initialised
        self.announced = False
        self._model, self._optimizer = model, optimizer
        root = Path(spool_dir or st.spool_dir).expanduser()
        self.spool_path = root / _safe(self.run) / f"rank{self.rank}-{_safe(self.identity['host'])}-{os.getpid()}"
        self.counters_obj = Counters()
        self.key_error: str | None = None
        self.transport = Transport(
            identity=self.identity, spool=Spool(self.spool_path, spool_max_bytes or st.spool_max_bytes, fsync=fsync),
            redis_url=redis_url or st.redis_url, stream=stream or st.stream_key,
            key_prefix=key_prefix or st.key_prefix, maxlen=stream_maxlen or st.stream_maxlen,
            blob_ttl_s=blob_ttl_s or st.blob_ttl_s, codec=codec, send_timeout_s=send_timeout_s,
            queue_size=queue_size, client_factory=client_factory, backoff_s=backoff_s, counters=self.counters_obj,
            adopt=self._claim_orphan_spools, signing_key=self._signing_key(st.agent_key),
            max_blob_bytes=st.max_blob_bytes)
        # state
        self.step: int | None = None
        self.epoch: int | None = None
        self.started = False
        self.stopped = False
        self.available = False
        self.armed = False  # CUDA initialised: observer attached, history applied, device metadata sent
        self.recording: bool | None = None
        self.steps_source: str | None = None  # "mark_step" | "optimizer_hook"
        self._user_marks = False
        self._tokens: int | None = None  # input size of the step that just ended (mark_step(tokens=))
        self._oom_frames: list[dict] | None = None  # Python stack of the failing allocation (observer)
        self._epochs_marked = False
        self._hook_handle: Any = None
        self._hook_opt: int | None = None
        self._hook_opt_ref: Any = None  # weak reference to the optimizer the step hook saw
        self.roles = roles  # send the roles of the optimizer's and the model's tensors with each snapshot
        self.role_devices = tuple(role_devices)  # the device types whose tensors are the snapshot's
        self._input_hook: Any = None  # the first forward's pre-hook (recording.py _install_input_hook)
        self._input_seen = False
        self._first_input: dict | None = None  # autocast state and input shapes at the first forward
        self._optimizer_name: str | None = None
        self._rec_since: int | None = None
        self._sig_cost = 0.0
        self._step_s: float | None = None
        self._stride = 1
        self._since_read = 0
        self._limit: int | None = None
        self.oom_snapshots = 0
        self.exception_text: str | None = None
        self.status = "running"
        self.end_reason: str | None = None  # sigterm, process_group_aborted, exception: why a rank ended early
        self._peak_alloc: int | None = None  # the run's peaks: per-step figures live in a bounded ring
        self._peak_reserved: int | None = None
        self._prev_term: Any = None
        self._term_handler: Any = None
        self._lock = threading.RLock()
        self._t0 = time.monotonic()
        self._last_step_t = 0.0
        self._next_stats = 0.0
        self._next_flush = 0.0
        self._next_periodic = 0.0
        self._samples: list[dict] = []
        self._signal_evt = threading.Event()
        self._wake = threading.Event()
        self._stop_evt = threading.Event()
        self._oom_waits: list[threading.Event] = []
        self._prev_signal: Any = None
        self._signum: int | None = None
        self._prev_excepthook: Any = None
        self._prev_thread_excepthook: Any = None
        self._ticker = threading.Thread(target=self._tick_loop, name="memq-agent-ticker", daemon=True)
        self._in_snapshot = threading.local()

    def _claim_orphan_spools(self) -> list[Path]:
        """Spool folders of this run on this host whose process is gone, claimed by an atomic rename
        (so two new processes never both send them)."""
        out: list[Path] = []
        base, host = self.spool_path.parent, _safe(self.identity["host"])
        if not base.is_dir():
            return out
        for d in sorted(base.iterdir()):
            m = _SPOOL_DIR.match(d.name)
            if not d.is_dir() or d == self.spool_path or m is None or m.group("host") != host:
                continue
            owner = int(m.group("adopter") or m.group("pid"))
            if owner == os.getpid() or _alive(owner):
                continue
            claimed = d.with_name(f"{m.group('base')}.adopted-{os.getpid()}")
            try:
                os.rename(d, claimed)
            except OSError:
                continue  # another process claimed it first
            out.append(claimed)
        return out

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Agent:
        if self.started:
            return self
        self.started = True
        now = time.monotonic()
        self._next_stats = now + self.stats_interval_s
        self._next_flush = now + self.stats_flush_s
        self._next_periodic = now + self.snapshot_every_s if self.snapshot_every_s > 0 else float("inf")
        self.transport.start()
        if self.announce == "eager":
            self._announce()
        self._check_source()
        if not self.available or self._hook_handle is None:  # also for the optimizer step hook
            after_torch_import(self._check_source)
        self._install_signal()
        self._install_term()
        self._install_excepthooks()
        atexit.register(self._atexit)
        self._ticker.start()
        return self

    def stop(self, timeout: float | None = None) -> dict:
        """Flush and stop, within `timeout` seconds (default stop_timeout_s). Returns the counters."""
        try:
            with self._lock:
                if self.stopped or not self.started:
                    return self.counters()
                self.stopped = True
            timeout = self.stop_timeout_s if timeout is None else float(timeout)
            deadline = time.monotonic() + timeout
            self._stop_evt.set()
            self._wake.set()
            self._uninstall_signal()
            self._uninstall_term()
            self._uninstall_excepthooks()
            if self._hook_handle is not None:
                self._safe_call(self._hook_handle.remove)
                self._hook_handle = None
            if self._input_hook is not None:
                self._safe_call(self._input_hook.remove)
                self._input_hook = None
            if self.recording and self.available and not getattr(self, "_exiting", False):
                self._safe_call(lambda: self.source.set_history(False))  # at exit: no need
            if self.status == "running":
                self.status = "completed"
            if not self.announced:  # nothing was sent for this process (no CUDA used): stay silent
                self._flush_stats()
                self.transport.stop(max(0.0, deadline - time.monotonic()))
                return self.counters()
            figures = self.rank_figures()
            # in the stats flush too: a rank killed right after it still has its figures stored
            measured = figures["peak_allocated_bytes"] is not None or figures["step_peaks"] is not None
            self._flush_stats(rank_figures=figures if measured else None)
            payload = {"status": self.status, "steps": self.policy.steps_seen, "step": self.step,
                       "epoch": self.epoch, "counters": self.counters(), "figures": figures}
            if self.exception_text:
                payload["exception"] = self.exception_text[:4000]
            self.transport.submit(Item("run_end", payload=payload))
            self.transport.stop(max(0.0, deadline - time.monotonic()))
            try:
                atexit.unregister(self._atexit)
            except Exception:  # noqa: BLE001
                pass
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")
        return self.counters()

    def _atexit(self) -> None:
        self._exiting = True
        self.stop()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            self._note_exception(exc)
        self.stop()
        return False

    def counters(self) -> dict:
        c = self.counters_obj.snapshot()
        c["queued"] = self.transport.pending()
        c["spool_files"] = len(self.transport.spool) if self.transport.spool._ready else 0
        return c

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait (bounded) until every message so far was sent or spooled."""
        try:
            self._flush_stats()
            return self.transport.flush(timeout)
        except Exception:  # noqa: BLE001
            return False

    # -- internals -----------------------------------------------------------------------------------
    def _safe_call(self, fn, default=None):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            self.counters_obj.add("errors")
            log.debug("memq agent: %s failed: %s", getattr(fn, "__name__", fn), exc)
            return default




def make_source(spec: str | None):
    """`MEMQ_AGENT_SOURCE=replay:<folder>` replays a recording; anything else reads torch.cuda."""
    if spec and spec.startswith("replay:"):
        return ReplaySource(spec[len("replay:"):])
    return None
