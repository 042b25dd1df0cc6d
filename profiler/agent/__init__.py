"""memq in-job agent: one line in a training script, invisible when all is well.

    from memq import agent
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

Step boundaries: `mark_step` calls, or, when the job makes none (`memq run` with no memq line),
torch's global optimizer step hook (`steps_source` says which; `mark_step` wins when both happen). At
each boundary the agent reads the allocator's counters (~15 us: live and reserved bytes, the step's
peak, which it resets there, so a job's own `max_memory_allocated()` reads per step, and retries),
keeps them in a ring buffer of per-step figures (512), sends them with the stats, and embeds them in
every snapshot (`memq_agent`: step_figures, step_in_progress, step_completed, steps_source, recording,
comparable, optimizer, model, and `roles`: the address ranges of the tensors the optimizer and the
model hold, parameters, their `.grad` and `optimizer.state`, from the optimizer passed to start() or
the one whose step hook fired; profiler/agent/roles.py). Boundary work is thinned to stay under
`step_budget` of step time.

Recording at default settings (`history="auto"`, profiler/agent/policy.py and steps.py): Python-stack
history during the first 3 steps (then a snapshot of them); continuously when headroom (checked at
every boundary and every stats sample) drops under 10% or the allocator starts retrying, and after an
OOM; one recorded step per periodic snapshot (every 30 min); a window from a growth of live bytes
between comparable points until the next one (at most 2 a run), and 10 steps after a step far larger
than the earlier ones. Comparable points: epoch ends when the job calls `mark_epoch`; otherwise the
agent's own snapshots (trigger `periodic`, payload `comparable`) after warm-up, at most every 5 min,
and on growth. The OOM snapshot's step is the step in progress (last completed + 1).
What a default-settings OOM snapshot can tell: every segment and block (sizes, states, streams,
pools, so fragmentation, stranded bytes, the fit test), the observer's request size, the allowed
maximum and the device's free and total bytes (so LIMIT and non-PyTorch memory), the exception
text, the per-step peaks of earlier steps, and frames for blocks allocated while recording was on:
parameters and optimizer state (measured on the H200: 100% of their bytes keep frames after the
pause), leaked blocks once growth opened a window. What it cannot: frames of activations allocated in
the failing step and the alloc/free trace of that step, unless headroom was already low. Set
`history="on"` when the failing step's trace matters more than ~9-13% of a CPU-bound step.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from memq.agent.core import Agent
from memq.config import Settings, load_settings, redact_url

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

    Options: the fields of `memq.config.AgentOptions`, as keywords or whole as `options=AgentOptions(...)`
    (defaults from MEMQ_* settings, profiler/config.py): redis_url, stream, key_prefix,
    spool_dir, spool_max_bytes, stats_interval_s, snapshot_every_s, snapshot_on_epoch, history
    ("auto"|"on"|"off"), stacks ("python"|"all"), max_entries, warmup_steps, headroom,
    signal (name, number or None), oom, codec, send_timeout_s, stop_timeout_s, job, rank, host,
    metadata, model, optimizer (objects or class names as strings), device, source (a ReplaySource for
    replays and tests), comparable_every_steps, comparable_min_s, growth_window_steps, step_hook,
    step_budget, roles (send the roles of the optimizer's and the model's tensors with each snapshot:
    default True), role_devices (the device types whose tensors those are: default ("cuda",)).
    """
    global _current
    try:
        with _lock:
            if _current is not None and not _current.stopped:
                return _current
            _current = Agent(run, cluster, **options).start()
            if not (options.get("redis_url") or getattr(options.get("options"), "redis_url", None)):
                _say_default_destination()
            return _current
    except Exception:  # noqa: BLE001 - a broken config must not stop training
        logging.getLogger("memq.agent").warning("memq agent not started", exc_info=True)
        return _Null()  # type: ignore[return-value]


_said_destination = False


def _say_default_destination() -> None:
    """Once per process: the agent sends to the default Redis because nothing named one, which on a
    training host is rarely where the service runs; a warning, never an exception."""
    global _said_destination
    try:
        url = load_settings().redis_url
    except Exception:  # noqa: BLE001 - the agent already started; this is only a hint
        return
    if _said_destination or url != Settings.redis_url:
        return
    _said_destination = True
    logging.getLogger("memq.agent").warning(
        "memq agent sends to %s (the default: no redis_url given); set MEMQ_REDIS_URL or "
        "memq.agent.start(..., redis_url=...) to send to the memq service", redact_url(url))


def current() -> Agent | None:
    return _current


def stop(timeout: float | None = None) -> dict:
    a = _current
    return a.stop(timeout) if a is not None else {}


def mark_step(step: int | None = None, epoch: int | None = None, tokens: int | None = None) -> None:
    """A step ended. `tokens` (optional): its input size (tokens, or samples x length), which lets the
    analysis tell a larger input from a fragmented cache when a later step runs out of memory."""
    a = _current
    if a is not None:
        a.mark_step(step, epoch, tokens=tokens)


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
