"""The in-job agent: triggers, recording policy, run metadata; delivery is in transport.py.

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
import signal as _signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

from memq.agent.policy import RecordingPolicy
from memq.agent.source import (
    ReplaySource,
    TorchSource,
    default_job,
    host_name,
    rank_and_world,
    scheduler_ids,
)
from memq.agent.spool import Spool
from memq.agent.steps import StepTracker, stride_for
from memq.agent.transport import Counters, Item, Transport

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


class Agent:
    """A handle on one running agent; also a context manager (`with agent.start(...):`)."""

    def __init__(self, run: str, cluster: str, *, job: str | None = None, rank: int | None = None,
                 world_size: int | None = None, host: str | None = None, redis_url: str | None = None,
                 stream: str | None = None, key_prefix: str | None = None, stream_maxlen: int | None = None,
                 blob_ttl_s: int | None = None, spool_dir: str | None = None, spool_max_bytes: int | None = None,
                 fsync: bool = True, stats_interval_s: float | None = None, stats_flush_s: float = 60.0,
                 snapshot_every_s: float | None = None, snapshot_on_epoch: bool = True,
                 history: str | None = None, stacks: str = "python", context: str = "all",
                 max_entries: int | None = None, warmup_steps: int = 3, warmup_s: float = 120.0,
                 periodic_record_s: float = 2.0, headroom: float = 0.10, signal: str | int | None = "default", oom: bool = True,
                 max_oom_snapshots: int = 4, oom_message_wait_s: float = 2.0, codec: str | None = None,
                 send_timeout_s: float = 2.0, queue_size: int = 256, stop_timeout_s: float = 5.0,
                 source: Any = None, client_factory: Any = None, backoff_s: tuple[float, float] = (0.5, 30.0),
                 tick_s: float = 0.5, metadata: dict | None = None, model: Any = None, optimizer: Any = None,
                 device: int | None = None, announce: str = "eager", settings: Any = None,
                 comparable_every_steps: int = 100, comparable_min_s: float = 300.0,
                 growth_window_steps: int = 500, step_hook: bool = True,
                 step_budget: float = 0.002):
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
            _after_torch_import(self._check_source)
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

    # -- training-loop API -------------------------------------------------------------------------
    def mark_step(self, step: int | None = None, epoch: int | None = None, tokens: int | None = None) -> None:
        """`tokens`: optional input size of the step just ended (tokens, samples x length, pixels): kept
        with the step's figures, so the analysis can compare a failing step's input with earlier ones."""
        if self.stopped:
            return
        try:
            if tokens is not None:
                self._tokens = int(tokens)
            if not self._user_marks:
                self._user_marks = True  # from now on the job's marks are the boundaries, not the hook
                if self.steps_source == "optimizer_hook":
                    # the hook already closed this step: this call is the same boundary, in the job's terms
                    self.steps_source = "mark_step"
                    hook_step = self.step
                    if step is not None:
                        self.step = int(step)
                    if epoch is not None:
                        self.epoch = int(epoch)
                    with self._lock:
                        for rec in (self._samples[-1] if self._samples else None, self.tracker.last()):
                            if rec is not None and rec.get("step") == hook_step:
                                rec["step"], rec["epoch"] = self.step, self.epoch
                        fig = self.tracker.last()
                        if fig is not None and self._tokens is not None and fig.get("step") == self.step:
                            fig["tokens"] = self._tokens  # this step's input, not the next one's
                    self._tokens = None
                    return
            self._boundary("mark_step", step, epoch)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        """torch's global optimizer step post-hook: a step boundary when the job marks none."""
        if self.stopped:
            return
        try:
            if self._hook_opt is None:
                self._hook_opt = id(optimizer)
                self._optimizer_name = type(optimizer).__name__
            elif id(optimizer) != self._hook_opt:
                return  # a second optimizer (GAN, several models): the first one's steps are the steps
            if not self._user_marks:
                self._boundary("optimizer_hook", None, None)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _install_step_hook(self) -> None:
        if not self.step_hook or self._hook_handle is not None or "torch" not in sys.modules:
            return
        optim = sys.modules.get("torch.optim.optimizer")
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            self._hook_handle = register(self._on_optimizer_step)

    def _boundary(self, source: str, step: int | None, epoch: int | None) -> None:
        """One step ended: cheap readings, then what to record and whether to snapshot."""
        t_in = time.perf_counter()
        now = time.monotonic()
        self.steps_source = source
        self.step = (self.step + 1 if self.step is not None else 0) if step is None else int(step)
        if epoch is not None:
            self.epoch = int(epoch)
        ms = (now - self._last_step_t) * 1000 if self._last_step_t else None
        self._last_step_t = now
        if not self.armed:
            self._check_source()
            if not self.armed:
                return
        if now >= self._next_periodic:
            self._next_periodic = now + self.snapshot_every_s
            if self._auto_paused():
                self.policy.request_step()  # record the next step; the snapshot comes at its end
            else:
                self.take_snapshot("periodic")
        if self.tracker.boundaries <= self.tracker.warmup_steps:  # the cap is usually set by now
            self._limit = self._safe_call(self.source.limit_bytes) or self._limit
        fig = self._read_boundary(ms)
        if fig is not None and self._tokens is not None:
            fig["tokens"] = self._tokens
        self._tokens = None
        if fig is not None:
            self._note_peaks(fig["peak_allocated"], fig["peak_reserved"])
        dec = self.tracker.on_boundary(fig, self._limit, recording=bool(self.recording),
                                       epochs_marked=self._epochs_marked, now=now)
        if fig is not None:
            self.policy.on_stats({"reserved_bytes.all.current": fig["peak_reserved"],
                                  "num_alloc_retries": fig["retries"]}, self._limit)
        if dec.end_window:
            self.policy.end_window()
            self.tracker.closed()
        if dec.record:
            self.policy.start_window(dec.record, dec.window_steps)
            self.tracker.opened(dec.record)
        was_warmup = bool(self.recording) and self.policy.reason == "warmup"
        want = self.policy.on_step()
        if self.tracker.window and not self.policy.in_window and not dec.record:
            self.tracker.closed()
        if fig is not None:  # what a boundary with a reading costs (snapshots excluded): sets the stride
            cost = time.perf_counter() - t_in
            self._sig_cost = cost if not self._sig_cost else 0.9 * self._sig_cost + 0.1 * cost
            self._stride = stride_for(self._sig_cost, self._step_s, self.step_budget)
        if dec.comparable:
            reason = "warmup" if was_warmup and not want else dec.comparable
            self.take_snapshot("periodic", payload={"reason": reason}, comparable=True, at_boundary=True)
            self._apply_history(want)  # the snapshot just taken keeps what recording collected
        else:
            self._set_recording(want, at_boundary=True)
        if now >= self._next_stats:
            self._sample_stats(now)

    def _read_boundary(self, ms: float | None) -> dict | None:
        """The step's figures; read every `_stride` boundaries so that a boundary's work stays under
        `step_budget` of step time (measured on the H200: ~0.15 ms a boundary inside a training loop,
        which a 10 ms step would otherwise pay 1.5% for)."""
        if ms is not None:
            s = ms / 1000
            self._step_s = s if self._step_s is None else 0.9 * self._step_s + 0.1 * s
        self._since_read += 1
        if self._since_read < self._stride:
            return None
        span, self._since_read = self._since_read, 0
        read = getattr(self.source, "step_signals", None)
        if read is None:
            return None
        sig = self._safe_call(read)
        with self._lock:
            return self.tracker.figure(self.step, self.epoch, sig, ms, span)

    def mark_epoch(self, epoch: int | None = None) -> None:
        """Call at the end of an epoch: takes the `epoch_end` snapshot (comparable points for leaks)."""
        if self.stopped:
            return
        try:
            self._epochs_marked = True
            if epoch is not None:
                self.epoch = int(epoch)
            if not self.armed:
                self._check_source()
            if self.armed:
                read = getattr(self.source, "step_signals", None)
                sig = self._safe_call(lambda: read(reset=False)) if read is not None else None
                dec = self.tracker.on_epoch_end(sig[0] if sig else None, self._limit,
                                                recording=bool(self.recording))
                if self.snapshot_on_epoch:
                    self.take_snapshot("epoch_end", comparable=True, at_boundary=True)
                if dec.end_window:
                    self.policy.end_window()
                    self.tracker.closed()
                    if not self.policy.continuous:
                        self._apply_history(self.policy.mode == "on")
                if dec.record:  # live bytes grew since the last epoch end: record the next epoch
                    self.policy.start_window(dec.record, dec.window_steps)
                    self.tracker.opened(dec.record)
                    self.policy.reason = dec.record
                    self._apply_history(True)
            self._flush_stats()
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def snapshot(self, trigger: str = "manual") -> bool:
        try:
            return self.take_snapshot(trigger)
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")
            return False

    def note_exception(self, exc: BaseException) -> None:
        """Integrations pass the exception that ends the run (its text reaches the OOM snapshot)."""
        self._note_exception(exc)

    # -- internals -----------------------------------------------------------------------------------
    def _safe_call(self, fn, default=None):
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001
            self.counters_obj.add("errors")
            log.debug("memq agent: %s failed: %s", getattr(fn, "__name__", fn), exc)
            return default

    def _run_metadata(self) -> dict:
        md: dict[str, Any] = {"world_size": self.world_size, "pid": os.getpid(),
                              "argv": [str(a)[:200] for a in sys.argv[:20]], "scheduler": scheduler_ids(),
                              "agent": {"history": self.policy.mode, "stacks": self.stacks,
                                        "max_entries": self.max_entries, "warmup_steps": self.policy.warmup_steps,
                                        "stats_interval_s": self.stats_interval_s,
                                        "snapshot_every_s": self.snapshot_every_s,
                                        "codec": self.transport.codec}}
        md.update(self._safe_call(self.source.metadata, default={}) or {})
        md.update(self._model_metadata())
        md.update(self.user_metadata)
        return md

    def _model_metadata(self) -> dict:
        out: dict[str, Any] = {}
        try:
            if isinstance(self._optimizer, str):
                out["optimizer"] = self._optimizer
            elif self._optimizer is not None:
                out["optimizer"] = type(self._optimizer).__name__
                if self._model is None:
                    out["params"] = sum(p.numel() for g in self._optimizer.param_groups for p in g["params"])
            if isinstance(self._model, str):
                out["model"] = self._model
            elif self._model is not None:
                out["params"] = sum(p.numel() for p in self._model.parameters())
                out["model"] = type(self._model).__name__
        except Exception:  # noqa: BLE001
            pass
        return out

    def _announce(self) -> None:
        if not self.announced:
            self.announced = True
            self.transport.submit(Item("run_start", payload=self._run_metadata()))

    def _check_source(self) -> None:
        """Cheap; called at start, after `import torch`, by the ticker and by mark_step until armed."""
        try:
            self._install_step_hook()
            if not self.available and self.source.present():
                self.available = True
                # Recording switched on before CUDA initialises catches the parameters' frames; it is
                # applied again once CUDA is initialised (older torch ignores it before that).
                self._apply_history(self.policy.initial(), force=True)
            if self.available and not self.armed:
                self._maybe_arm()
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _maybe_arm(self) -> None:
        """Once CUDA is initialised: attach the OOM observer, re-apply history, send device metadata."""
        if self.armed or not self._safe_call(self.source.ready, default=False):
            return
        with self._lock:
            if self.armed:
                return
            self.armed = True
        self._announce()
        if self.oom_enabled:
            self._safe_call(lambda: self.source.attach_oom_observer(self._on_oom))
        want = self.recording if self.recording is not None else self.policy.initial()
        self._apply_history(want, force=True)
        md = self._safe_call(self.source.metadata, default={}) or {}
        with self._lock:
            self._samples.append({"t": time.time(), "device_metadata": md})
        self._limit = md.get("limit_bytes")
        if self._limit is None:
            self._limit = self._safe_call(self.source.limit_bytes)

    def _auto_paused(self) -> bool:
        return self.policy.mode == "auto" and not self.policy.continuous and not self.recording

    def _set_recording(self, want: bool, at_boundary: bool = False) -> None:
        """Apply a policy decision. Pausing empties the trace, so a recorded stretch that ends
        (warm-up, a periodic recorded step, a recording window, a near miss that passed) is
        snapshotted first."""
        if self.recording and not want and self.policy.mode == "auto":
            self.take_snapshot("periodic", payload={"reason": self.policy.reason}, at_boundary=at_boundary)
        self._apply_history(want)

    def _apply_history(self, want: bool, force: bool = False) -> None:
        if want == self.recording and not force:
            return
        ok = self._safe_call(lambda: self.source.set_history(want, stacks=self.stacks, context=self.context,
                                                             max_entries=self.max_entries), default=False)
        if ok and want and not self.recording:
            self._rec_since = self.step + 1 if self.step is not None else 0
        self.recording = want if ok else self.recording

    def _sample_stats(self, now: float) -> None:
        self._next_stats = now + self.stats_interval_s
        sample = self._safe_call(self.source.stats)
        if not sample:
            return
        sample = dict(sample, t=time.time(), step=self.step, epoch=self.epoch, recording=bool(self.recording))
        # re-read: a job may set its memory fraction after CUDA is initialised (and the agent armed)
        limit = self._safe_call(self.source.limit_bytes) or self._limit
        self._limit = limit
        self._note_peaks(sample.get("allocated_bytes.all.peak"), sample.get("reserved_bytes.all.peak"))
        self.policy.on_stats(sample, limit)
        with self._lock:
            self._samples.append(sample)
            if len(self._samples) > 1000:
                del self._samples[:-1000]
                self.counters_obj.add("dropped")

    def _flush_stats(self, rank_figures: dict | None = None) -> None:
        with self._lock:
            samples, self._samples = self._samples, []
            figures = self.tracker.unsent()
            self._next_flush = time.monotonic() + self.stats_flush_s
        if samples or figures or rank_figures:
            payload: dict[str, Any] = {"samples": samples}
            if figures:
                payload["step_figures"] = figures
            if rank_figures:
                payload["rank_figures"] = rank_figures
            self.transport.submit(Item("stats", payload=payload))

    def _note_peaks(self, alloc: Any, reserved: Any) -> None:
        if isinstance(alloc, int):
            self._peak_alloc = max(alloc, self._peak_alloc or 0)
        if isinstance(reserved, int):
            self._peak_reserved = max(reserved, self._peak_reserved or 0)

    def rank_figures(self) -> dict:
        """This rank's own figures for the cross-rank diagnosis: the run's peaks (the step in progress
        included: its peak counters were not reset yet), the last step, the limit, the per-step
        peaks' summary. Cheap: one counters read, no snapshot."""
        if self.armed:
            read = getattr(self.source, "step_signals", None)
            sig = self._safe_call(lambda: read(reset=False)) if read is not None else None
            if sig:
                self._note_peaks(int(max(sig[0], sig[2])), int(max(sig[1], sig[3])))
            # A rank that fails or is torn down in its first step never reached a boundary: its cap
            # (set_per_process_memory_fraction after start) is read here, not left at the device total.
            self._limit = self._safe_call(self.source.limit_bytes) or self._limit
        with self._lock:
            figs = [f for f in self.tracker.figures if f.get("peak_allocated") is not None]
        summary = None
        if figs:
            top = max(figs, key=lambda f: f["peak_allocated"])
            peaks = sorted(f["peak_allocated"] for f in figs)
            summary = {"count": len(figs), "median_peak_allocated": peaks[len(peaks) // 2],
                       "max_peak_allocated": top["peak_allocated"],
                       "max_peak_reserved": max(f["peak_reserved"] for f in figs),
                       "max_step": top.get("step"), "last_peak_allocated": figs[-1]["peak_allocated"]}
        return {"peak_allocated_bytes": self._peak_alloc, "peak_reserved_bytes": self._peak_reserved,
                "limit_bytes": self._limit, "last_step": self.step, "steps": self.policy.steps_seen,
                "end_reason": self.end_reason, "step_peaks": summary}

    def take_snapshot(self, trigger: str, payload: dict | None = None, wait: threading.Event | None = None,
                      finish=None, comparable: bool = False, at_boundary: bool = False) -> bool:
        if not self.armed or self.stopped:
            return False
        if getattr(self._in_snapshot, "on", False):
            return False
        self._in_snapshot.on = True
        try:
            t0 = time.perf_counter()
            obj = self.source.snapshot()
            took = time.perf_counter() - t0
        finally:
            self._in_snapshot.on = False
        if obj is None:
            return False
        # Between boundaries a step is running: the last completed one + 1 (an OOM's failing step).
        in_progress = None if at_boundary else (self.step + 1 if self.step is not None else 0)
        step = in_progress if trigger == "oom" else self.step
        if isinstance(obj, dict):
            # Self-describing and distinct: two snapshots of an unchanged state (epoch ends with
            # recording paused) would otherwise be the same bytes, hence one row in the history.
            with self._lock:
                figures = list(self.tracker.figures)
            obj["memq_agent"] = {
                "run": self.run, "rank": self.rank, "trigger": trigger, "step": step, "epoch": self.epoch,
                "time": time.time(), "step_figures": figures, "step_in_progress": in_progress,
                "step_completed": self.step, "steps_source": self.steps_source,
                "recording": {"on": bool(self.recording), "since_step": self._rec_since if self.recording else None,
                              "reason": self.policy.reason},
                "comparable": bool(comparable), "optimizer": self._optimizer_label(),
                "oom_frames": self._oom_frames if trigger == "oom" else None,
                "limit_bytes": self._limit,
                "model": self._model if isinstance(self._model, str) else
                (type(self._model).__name__ if self._model is not None else None)}
        pl = dict(payload or {})
        if comparable:
            pl["comparable"] = True
        pl.setdefault("took_ms", round(took * 1000, 3))
        pl.setdefault("recording", bool(self.recording))
        pl.setdefault("policy", self.policy.reason)
        item = Item("snapshot", payload=pl, obj=obj, trigger=trigger, step=step, epoch=self.epoch,
                    wait=wait, wait_s=self.oom_message_wait_s if wait is not None else 0.0, finish=finish)
        return self.transport.submit(item)

    def _signing_key(self, text: str):
        """The key of MEMQ_AGENT_KEY(_FILE); a bad one is reported (counters, last error), never raised
        into the job: its envelopes then go unsigned, and a signing deployment dead-letters them."""
        if not text:
            return None
        from memq.errors import BadInput
        from memq.identity import parse_key

        try:
            return parse_key(text)
        except BadInput as exc:
            self.counters_obj.add("errors")
            self.key_error = f"MEMQ_AGENT_KEY: {exc}"
            return None

    def _optimizer_label(self) -> str | None:
        if isinstance(self._optimizer, str):
            return self._optimizer
        if self._optimizer is not None:
            return type(self._optimizer).__name__
        return self._optimizer_name

    def _on_oom(self, device: int, alloc: int, device_alloc: int, device_free: int) -> None:
        """The allocator's OOM observer: runs in the allocating thread just before the OOM is raised.
        It takes the snapshot while the failing state is still there, then returns: the error then
        reaches the user unchanged."""
        if self.stopped:
            return
        try:
            self.status = "oom"
            self.policy.on_oom()
            if self.oom_snapshots >= self.max_oom_snapshots:
                return
            self.oom_snapshots += 1
            total = self._safe_call(lambda: self.source.device_total(device))
            if isinstance(total, int) and 0 < int(device_alloc) < total:
                self._limit = int(device_alloc)  # the observer's device_alloc is the process's cap
            oom = {"alloc": int(alloc), "device_alloc": int(device_alloc), "device_free": int(device_free),
                   "device_total": total, "message": None}
            # The observer runs in the allocating thread: its Python stack is the failing allocation's
            # line, which a snapshot taken with recording paused has no other way to show (once per OOM).
            self._oom_frames = _python_stack(sys._getframe(0).f_back)
            evt = threading.Event()
            with self._lock:
                self._oom_waits.append(evt)

            def finish(item: Item) -> None:
                item.payload["oom"]["message"] = self.exception_text

            self.take_snapshot("oom", payload={"oom": oom, "device": int(device), "step_completed": self.step},
                               wait=evt, finish=finish)
            if not self.recording:
                self._apply_history(True)
        except Exception:  # noqa: BLE001 - never replace the user's OOM with ours
            self.counters_obj.add("errors")

    def _note_exception(self, exc: BaseException) -> None:
        try:
            text = f"{type(exc).__name__}: {exc}"
            is_oom = type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
            if is_oom:
                self.status = "oom"
                self.exception_text = str(exc)
            else:
                self.status = "crashed"  # the envelope's run statuses: "error" would be dead-lettered
                self.exception_text = self.exception_text or text
                self.end_reason = self.end_reason or _end_reason(exc)
            with self._lock:
                waits, self._oom_waits = self._oom_waits, []
            for evt in waits:
                evt.set()
        except Exception:  # noqa: BLE001
            pass

    # signals and exception hooks
    def _install_signal(self) -> None:
        name = self.signal_name
        if not name or threading.current_thread() is not threading.main_thread():
            return
        try:
            signum = int(name) if str(name).isdigit() else int(getattr(_signal, str(name)))
            prev = _signal.getsignal(signum)

            def handler(sig, frame):
                self._signal_evt.set()
                self._wake.set()
                if callable(prev) and prev not in (_signal.SIG_DFL, _signal.SIG_IGN):
                    prev(sig, frame)

            _signal.signal(signum, handler)
            self._prev_signal, self._signum, self._handler = prev, signum, handler
        except Exception:  # noqa: BLE001 - unknown name, Windows, not the main thread
            self.counters_obj.add("errors")

    def _uninstall_signal(self) -> None:
        if self._signum is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            if _signal.getsignal(self._signum) is self._handler:
                _signal.signal(self._signum, self._prev_signal if self._prev_signal is not None else _signal.SIG_DFL)
        except Exception:  # noqa: BLE001
            pass

    def _install_term(self) -> None:
        """SIGTERM (the launcher tearing the ranks down after one failed): send this rank's figures and
        run_end, bounded, then do what the previous handler did (default: die of SIGTERM). Main
        thread only; not when SIGTERM is the snapshot signal or was ignored."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if self._signum == _signal.SIGTERM:
                return
            prev = _signal.getsignal(_signal.SIGTERM)
            if prev == _signal.SIG_IGN or prev is None:  # None: installed from C; leave it alone
                return

            def on_term(sig, frame):
                self._on_term()
                if callable(prev) and prev is not _signal.SIG_DFL:
                    prev(sig, frame)
                elif prev == _signal.SIG_DFL:
                    _signal.signal(sig, _signal.SIG_DFL)
                    os.kill(os.getpid(), sig)

            _signal.signal(_signal.SIGTERM, on_term)
            self._prev_term, self._term_handler = prev, on_term
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _on_term(self) -> None:
        """Never blocks past a bound and never raises: stop() runs in a helper thread, so a lock the
        interrupted main thread holds (a queue's mutex) costs at most the wait, not a hang."""
        try:
            if self.stopped or not self.started:
                return
            if self.status == "running":
                self.status = "crashed"
            self.end_reason = self.end_reason or "sigterm"
            self._exiting = True
            wait = min(self.stop_timeout_s, 2.0)
            t = threading.Thread(target=self.stop, args=(wait,), name="memq-agent-term", daemon=True)
            t.start()
            t.join(wait + 0.5)
        except Exception:  # noqa: BLE001
            pass

    def _uninstall_term(self) -> None:
        if self._term_handler is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            if _signal.getsignal(_signal.SIGTERM) is self._term_handler:
                _signal.signal(_signal.SIGTERM, self._prev_term)
        except Exception:  # noqa: BLE001
            pass

    def _install_excepthooks(self) -> None:
        prev, prev_t = sys.excepthook, threading.excepthook

        def hook(etype, value, tb):
            self._note_exception(value)
            prev(etype, value, tb)

        def thread_hook(args):
            if args.exc_value is not None:
                self._note_exception(args.exc_value)
            prev_t(args)

        self._prev_excepthook, self._prev_thread_excepthook = prev, prev_t
        self._hook, self._thread_hook = hook, thread_hook
        sys.excepthook, threading.excepthook = hook, thread_hook

    def _uninstall_excepthooks(self) -> None:
        if sys.excepthook is getattr(self, "_hook", None):
            sys.excepthook = self._prev_excepthook
        if threading.excepthook is getattr(self, "_thread_hook", None):
            threading.excepthook = self._prev_thread_excepthook

    # ticker
    def _tick_loop(self) -> None:
        while not self._stop_evt.is_set():
            # poll faster until CUDA is initialised, so the observer is attached early
            self._wake.wait(self.tick_s if self.armed or not self.available else min(self.tick_s, 0.1))
            self._wake.clear()
            if self._stop_evt.is_set():
                return
            try:
                self._tick()
            except Exception:  # noqa: BLE001
                self.counters_obj.add("errors")

    def _tick(self) -> None:
        now = time.monotonic()
        if not self.armed:
            self._check_source()
        if self._signal_evt.is_set():
            self._signal_evt.clear()
            self.take_snapshot("signal")
        stepping = self._last_step_t and now - self._last_step_t < max(5.0, self.stats_interval_s)
        if self.armed and not stepping:
            no_steps = self.policy.steps_seen == 0
            if now >= self._next_periodic:
                self._next_periodic = now + self.snapshot_every_s
                if no_steps and self._auto_paused():
                    self.policy.request_time(now - self._t0 + self.periodic_record_s)
                else:
                    self.take_snapshot("periodic")
            if no_steps:
                self._set_recording(self.policy.on_time(now - self._t0))
            if now >= self._next_stats:
                self._sample_stats(now)
        if now >= self._next_flush:
            self._flush_stats()


MAX_OOM_FRAMES = 48  # innermost frames kept: enough to reach the training script from inside torch


def _python_stack(frame) -> list[dict]:
    """The Python frames of `frame` and its callers, innermost first, as the snapshot's own frames are
    ({filename, line, name}); no source lines are read (linecache would touch the disk). `frame` is None
    when the allocation came from a thread with no Python code (autograd's backward thread): no frames."""
    out = []
    while frame is not None and len(out) < MAX_OOM_FRAMES:
        code = frame.f_code
        out.append({"filename": code.co_filename, "line": frame.f_lineno, "name": code.co_name})
        frame = frame.f_back
    return out


def _end_reason(exc: BaseException) -> str:
    """Why a rank ended, from the exception that ended it: a collective that failed because another
    rank died (the process group was aborted) is not this rank's own error."""
    name, text = type(exc).__name__, str(exc).lower()
    if name in ("DistBackendError", "DistNetworkError", "DistStoreError") or "nccl" in text or "gloo" in text \
            or "connection closed by peer" in text or "connection reset by peer" in text \
            or ("process group" in text or "processgroup" in text) and ("abort" in text or "timeout" in text):
        return "process_group_aborted"
    if name == "SignalException":  # torchelastic's: the agent was signalled to stop
        return "sigterm"
    return "exception"


class _TorchImportHook:
    """A meta-path finder that runs callbacks right after `import torch` finishes (the bootstrap
    starts the agent before the job imports torch, and must not import it itself)."""

    def __init__(self):
        self.callbacks: list = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or not self.callbacks:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec("torch")
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        original, callbacks = spec.loader.exec_module, self.callbacks

        def exec_module(module):
            original(module)
            for cb in list(callbacks):
                try:
                    cb()
                except Exception:  # noqa: BLE001
                    pass

        try:  # the loader instance is this spec's own: patch it, keep every other method
            spec.loader.exec_module = exec_module
        except Exception:  # noqa: BLE001
            pass
        return spec


_hook = _TorchImportHook()


def _after_torch_import(cb) -> None:
    if "torch" in sys.modules:
        return
    _hook.callbacks.append(cb)
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)


def make_source(spec: str | None):
    """`MEMQ_AGENT_SOURCE=replay:<folder>` replays a recording; anything else reads torch.cuda."""
    if spec and spec.startswith("replay:"):
        return ReplaySource(spec[len("replay:"):])
    return None
