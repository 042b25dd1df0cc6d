"""The in-job agent's handle: a facade that builds the parts, wires them and keeps the public API.

    Agent ──> Transport (transport.py: delivery, spool)
          ──> Recorder (recorder.py: policy, per-step figures, stats, snapshots, announcement)
          ──> Triggers (triggers.py: step and epoch marks, optimizer step hook, ticker)
          ──> OomObserver (triggers.py), ProcessHooks (signals.py: signal, SIGTERM, excepthooks)
          ──> SourceWatch (watch.py: torch/CUDA present, then initialised), JobObjects (job.py),
              Outcome (outcome.py: status, exception, end reason), Position (steps.py), Guard (guard.py)

Dependencies point one way: the triggers call the recorder; the recorder reads the position, the
watch and the job objects; the hooks and the watch call what they are given as callables. No part
holds the facade.

Threads: the training thread calls the API (cheap: a few comparisons per `mark_step`; a stats sample,
~0.4 ms, every `stats_interval_s`; a snapshot only on a trigger). A daemon "ticker" thread handles
what needs no step boundary: signal-requested snapshots, periodic snapshots and stats when the job
marks no steps, the time-based recording policy, flushing stats batches, and noticing when CUDA
gets initialised. A daemon transport thread does all serialization and I/O.

Every public method catches every exception: the training loop never sees one from here.
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

from memq.agent.guard import Guard
from memq.agent.job import JobObjects
from memq.agent.outcome import Outcome
from memq.agent.recorder import Recorder
from memq.agent.signals import ProcessHooks
from memq.agent.source import ReplaySource, TorchSource, default_job, host_name, rank_and_world
from memq.agent.spool import Spool, claim_orphans
from memq.agent.steps import Position
from memq.agent.torch_import import after_torch_import
from memq.agent.transport import Counters, Item, Transport
from memq.agent.triggers import OomObserver, Triggers
from memq.agent.watch import SourceWatch
from memq.config import AgentOptions, load_settings
from memq.errors import BadInput
from memq.identity import parse_key

_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def _safe(text: str) -> str:
    return _SAFE.sub("_", text)[:80] or "_"


def signing_key(text: str) -> tuple[Any, str | None]:
    """The key of MEMQ_AGENT_KEY(_FILE) and the error that made it unusable: a bad one is reported
    (counters, last error), never raised into the job: its envelopes then go unsigned, and a signing
    deployment dead-letters them."""
    if not text:
        return None, None
    try:
        return parse_key(text), None
    except BadInput as exc:
        return None, f"MEMQ_AGENT_KEY: {exc}"


class Agent:
    """A handle on one running agent; also a context manager (`with agent.start(...):`).

    `Agent(run, cluster, options)` takes an `AgentOptions` (memq.config); the options may also be
    given as keyword arguments, as `agent.start()` passes them. `model` and `optimizer` (the job's
    objects, or their class names), `source` (a ReplaySource for replays and tests) and
    `client_factory` are the job's objects and injected parts, not options."""

    def __init__(self, run: str, cluster: str, options: AgentOptions | None = None, *, settings: Any = None,
                 source: Any = None, client_factory: Any = None, model: Any = None, optimizer: Any = None,
                 **option_kw: Any):
        opts = dataclasses.replace(options or AgentOptions(), **option_kw)
        st = settings or load_settings()
        o = self.options = opts.resolve(st)
        self.run, self.cluster = str(run), str(cluster)
        env_rank, env_world = rank_and_world()
        self.rank = env_rank if o.rank is None else int(o.rank)
        self.world_size = env_world if o.world_size is None else int(o.world_size)
        self.identity = {"run": self.run, "cluster": self.cluster, "rank": self.rank,
                         "job": default_job() if o.job is None else str(o.job), "host": o.host or host_name()}
        self.source = source if source is not None else TorchSource(device=o.device)
        self.counters_obj = Counters()
        guard = self.guard = Guard(self.counters_obj)
        self.outcome = Outcome()
        self.position = Position()
        root = Path(o.spool_dir).expanduser()
        self.spool_path = root / _safe(self.run) / f"rank{self.rank}-{_safe(self.identity['host'])}-{os.getpid()}"
        key, self.key_error = signing_key(st.agent_key)
        if self.key_error:
            guard.error()
        spool_path, host = self.spool_path, _safe(self.identity["host"])
        self.transport = Transport(
            identity=self.identity, spool=Spool(self.spool_path, o.spool_max_bytes, fsync=o.fsync),
            redis_url=o.redis_url, stream=o.stream, key_prefix=o.key_prefix, maxlen=o.stream_maxlen,
            blob_ttl_s=o.blob_ttl_s, codec=o.codec, send_timeout_s=o.send_timeout_s, queue_size=o.queue_size,
            client_factory=client_factory, backoff_s=o.backoff_s, counters=self.counters_obj,
            adopt=lambda: claim_orphans(spool_path, host), signing_key=key,
            max_blob_bytes=st.max_blob_bytes)
        self.job = JobObjects(model=model, optimizer=optimizer, roles=o.roles, role_devices=o.role_devices,
                              guard=guard)
        self.watch = SourceWatch(self.source, guard)
        outcome = self.outcome
        self.recorder = Recorder(o, source=self.source, transport=self.transport, job=self.job,
                                 position=self.position, watch=self.watch, guard=guard,
                                 end_reason=lambda: outcome.end_reason, run=self.run, rank=self.rank,
                                 world_size=self.world_size)
        self.triggers = Triggers(o, recorder=self.recorder, watch=self.watch, position=self.position, guard=guard,
                                 on_optimizer=self.job.saw_optimizer)
        self.observer = OomObserver(source=self.source, recorder=self.recorder, outcome=self.outcome,
                                    position=self.position, guard=guard, max_snapshots=o.max_oom_snapshots)
        self.hooks = ProcessHooks(signal_name=o.signal, on_signal=self.triggers.request_signal_snapshot,
                                  on_term=self._on_term, on_exception=self.outcome.note_exception, guard=guard)
        # what to do as the source shows up (torch imported, CUDA there) and once CUDA is initialised
        self.watch.each_check += [self.triggers.install_step_hook, self.job.install_input_hook]
        self.watch.on_present.append(self.recorder.on_present)
        self.watch.on_ready.append(self.recorder.announce)
        if o.oom:
            source, observer = self.source, self.observer
            self.watch.on_ready.append(lambda: guard.call(lambda: source.attach_oom_observer(observer.on_oom)))
        self.watch.on_ready.append(self.recorder.on_armed)
        self.started = False
        self.stopped = False
        self._exiting = False
        self._lock = threading.RLock()

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> Agent:
        if self.started:
            return self
        self.started = True
        now = time.monotonic()
        self.recorder.start(now)
        self.transport.start()
        if self.options.announce == "eager":
            self.recorder.announce()
        self.watch.check()
        if not self.watch.available or self.triggers.hook_handle is None:  # also for the optimizer step hook
            after_torch_import(self.watch.check)
        self.hooks.install()
        atexit.register(self._atexit)
        self.triggers.start(now)
        return self

    def stop(self, timeout: float | None = None) -> dict:
        """Flush and stop, within `timeout` seconds (default stop_timeout_s). Returns the counters."""
        try:
            with self._lock:
                if self.stopped or not self.started:
                    return self.counters()
                self.stopped = True
            self.recorder.close()
            self.observer.close()
            timeout = self.options.stop_timeout_s if timeout is None else float(timeout)
            deadline = time.monotonic() + timeout
            self.triggers.close()
            self.hooks.uninstall()
            self.job.remove_input_hook()
            self.recorder.pause_at_exit(self._exiting)
            self.outcome.completed()
            if not self.recorder.announced:  # nothing was sent for this process (no CUDA used): stay silent
                self.recorder.flush_stats()
                self.transport.stop(max(0.0, deadline - time.monotonic()))
                return self.counters()
            figures = self.recorder.rank_figures()
            # in the stats flush too: a rank killed right after it still has its figures stored
            measured = figures["peak_allocated_bytes"] is not None or figures["step_peaks"] is not None
            self.recorder.flush_stats(rank_figures=figures if measured else None)
            payload = {"status": self.outcome.status, "steps": self.recorder.policy.steps_seen,
                       "step": self.position.step, "epoch": self.position.epoch, "counters": self.counters(),
                       "figures": figures}
            if self.outcome.exception_text:
                payload["exception"] = self.outcome.exception_text[:4000]
            self.transport.submit(Item("run_end", payload=payload))
            self.transport.stop(max(0.0, deadline - time.monotonic()))
            try:
                atexit.unregister(self._atexit)
            except Exception:  # noqa: BLE001
                pass
        except Exception:  # noqa: BLE001
            self.guard.error()
        return self.counters()

    def _atexit(self) -> None:
        self._exiting = True
        self.stop()

    def _on_term(self) -> None:
        """SIGTERM: this rank's figures and run_end go out before the previous handler runs. Never blocks
        past a bound and never raises: stop() runs in a helper thread, so a lock the interrupted main
        thread holds (a queue's mutex) costs at most the wait, not a hang."""
        try:
            if self.stopped or not self.started:
                return
            self.outcome.terminated()
            self._exiting = True
            wait = min(self.options.stop_timeout_s, 2.0)
            t = threading.Thread(target=self.stop, args=(wait,), name="memq-agent-term", daemon=True)
            t.start()
            t.join(wait + 0.5)
        except Exception:  # noqa: BLE001
            pass

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None:
            self.outcome.note_exception(exc)
        self.stop()
        return False

    # -- the training loop's API ------------------------------------------------------------------
    def mark_step(self, step: int | None = None, epoch: int | None = None, tokens: int | None = None) -> None:
        """`tokens`: optional input size of the step just ended (tokens, samples x length, pixels): kept
        with the step's figures, so the analysis can compare a failing step's input with earlier ones."""
        self.triggers.mark_step(step, epoch, tokens)

    def mark_epoch(self, epoch: int | None = None) -> None:
        """Call at the end of an epoch: takes the `epoch_end` snapshot (comparable points for leaks)."""
        self.triggers.mark_epoch(epoch)

    def snapshot(self, trigger: str = "manual") -> bool:
        return self.triggers.snapshot(trigger)

    def note_exception(self, exc: BaseException) -> None:
        """Integrations pass the exception that ends the run (its text reaches the OOM snapshot)."""
        self.outcome.note_exception(exc)

    def take_snapshot(self, trigger: str, **kw: Any) -> bool:
        """A snapshot now, from the calling thread (benchmarks time it); `snapshot()` never raises."""
        return self.recorder.take_snapshot(trigger, **kw)

    def rank_figures(self) -> dict:
        return self.recorder.rank_figures()

    def counters(self) -> dict:
        c = self.counters_obj.snapshot()
        c["queued"] = self.transport.pending()
        c["spool_files"] = len(self.transport.spool) if self.transport.spool._ready else 0
        return c

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait (bounded) until every message so far was sent or spooled."""
        try:
            self.recorder.flush_stats()
            return self.transport.flush(timeout)
        except Exception:  # noqa: BLE001
            return False

    # -- read-only views of the parts' state (tests, integrations and benchmarks read these) -------
    announce = property(lambda self: self.options.announce)
    step = property(lambda self: self.position.step)
    epoch = property(lambda self: self.position.epoch)
    steps_source = property(lambda self: self.position.source)
    status = property(lambda self: self.outcome.status)
    exception_text = property(lambda self: self.outcome.exception_text)
    end_reason = property(lambda self: self.outcome.end_reason)
    policy = property(lambda self: self.recorder.policy)
    tracker = property(lambda self: self.recorder.tracker)
    recording = property(lambda self: self.recorder.recording)
    announced = property(lambda self: self.recorder.announced)
    available = property(lambda self: self.watch.available)
    armed = property(lambda self: self.watch.armed)
    oom_snapshots = property(lambda self: self.observer.snapshots)
    _first_input = property(lambda self: self.job.first_input)
    _optimizer_name = property(lambda self: self.job.hook_optimizer_name)


def make_source(spec: str | None):
    """`MEMQ_AGENT_SOURCE=replay:<folder>` replays a recording; anything else reads torch.cuda."""
    if spec and spec.startswith("replay:"):
        return ReplaySource(spec[len("replay:"):])
    return None
