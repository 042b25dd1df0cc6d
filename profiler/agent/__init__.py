"""memq in-job agent: one line in a training script, invisible when all is well.

    from profiler import agent
    agent.start(run="llama-7b-sft", cluster="h200-a")      # or: with agent.start(...):
    for step, batch in enumerate(loader):
        ...
        agent.mark_step(step, epoch)                       # optional: step-aligned data
    agent.mark_epoch(epoch)                                # optional: epoch-end snapshot
    agent.stop()                                           # optional: also runs at exit

Or with no code change: `memq run --run R --cluster C -- python train.py`.

What it sends (ARCHITECTURE.md "Envelope"): `run_start` metadata, `stats` batches (a memory_stats subset
every `stats_interval_s`), `snapshot`s (allocator snapshot blob stored by sha256, envelope in the
stream) on epoch end, every `snapshot_every_s`, on a signal (SIGUSR2), on `agent.snapshot()`, and on
an out-of-memory error (through the allocator's OOM observer; the error itself reaches the caller
unchanged), and `run_end`.

Guarantees: no call raises, no call blocks on the network; without CUDA, torch, redis-py or a
reachable Redis every call returns at once. Undeliverable messages go to a bounded disk spool that is
replayed in order when Redis answers again. `agent.counters()` says what was sent, spooled, dropped,
replayed and how many errors were absorbed.

Recording at default settings (`history="auto"`, see profiler/agent/policy.py): Python-stack history
during the first 3 marked steps (then a snapshot of them), one recorded step per periodic snapshot
(every 30 min), continuously when headroom drops under 10% or the allocator starts retrying, and
after an OOM.
What a default-settings OOM snapshot can tell: every segment and block (sizes, states, streams,
pools, so fragmentation, stranded bytes, the fit test), the observer's request size, the allowed
maximum and the device's free and total bytes (so LIMIT and non-PyTorch memory), the exception
text, and frames for blocks allocated while recording was on: parameters and optimizer state
(measured on the H200: 100% of their bytes keep frames after the pause). What it cannot: frames of
activations allocated in the failing step and the alloc/free trace of that step (pausing empties
the trace), unless headroom was already low and recording had switched on. Earlier steps' peaks
come from the warm-up and periodic snapshots and the stats samples. Set `history="on"` when the
failing step's trace matters more than ~12% of step time.
"""

from __future__ import annotations

import threading
from typing import Any

from profiler.agent.core import Agent

__all__ = ["Agent", "start", "stop", "mark_step", "mark_epoch", "snapshot", "counters", "current", "flush"]

_current: Agent | None = None
_lock = threading.Lock()


class _Null:
    """Returned when the agent could not even be built: every method is a quick no-op."""

    run = cluster = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getattr__(self, name):
        return lambda *a, **k: {} if name in ("counters", "stop") else None


def start(run: str, cluster: str, **options: Any) -> Agent:
    """Start the agent (once per process; a second call returns the running one). Never raises.

    Options (defaults from MEMQ_* settings, profiler/config.py): redis_url, stream, key_prefix,
    spool_dir, spool_max_bytes, stats_interval_s, snapshot_every_s, snapshot_on_epoch, history
    ("auto"|"on"|"off"), stacks ("python"|"all"), max_entries, warmup_steps, headroom,
    signal (name, number or None), oom, codec, send_timeout_s, stop_timeout_s, job, rank, host,
    metadata, model, optimizer, device, source (a ReplaySource for replays and tests).
    """
    global _current
    try:
        with _lock:
            if _current is not None and not _current.stopped:
                return _current
            _current = Agent(run, cluster, **options).start()
            return _current
    except Exception:  # noqa: BLE001 - a broken config must not stop training
        import logging

        logging.getLogger("memq.agent").warning("memq agent not started", exc_info=True)
        return _Null()  # type: ignore[return-value]


def current() -> Agent | None:
    return _current


def stop(timeout: float | None = None) -> dict:
    a = _current
    return a.stop(timeout) if a is not None else {}


def mark_step(step: int | None = None, epoch: int | None = None) -> None:
    a = _current
    if a is not None:
        a.mark_step(step, epoch)


def mark_epoch(epoch: int | None = None) -> None:
    a = _current
    if a is not None:
        a.mark_epoch(epoch)


def snapshot(trigger: str = "manual") -> bool:
    a = _current
    return a.snapshot(trigger) if a is not None else False


def flush(timeout: float = 5.0) -> bool:
    a = _current
    return a.flush(timeout) if a is not None else True


def counters() -> dict:
    a = _current
    return a.counters() if a is not None else {}
