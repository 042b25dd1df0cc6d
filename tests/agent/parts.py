"""Stand-ins for the parts' neighbours, so that each part of the agent is built and tested alone: a
source that counts what is asked of it (and can be made to fail), and a transport that keeps what is
submitted instead of sending it."""

from __future__ import annotations

from memq.agent.guard import Guard
from memq.agent.transport import Counters

GIB = 1 << 30


class Source:
    """What the agent reads of torch.cuda, from plain values: `signals` the boundary readings (the last
    repeated), `fail` the names of the calls that raise."""

    def __init__(self, *, ready=True, limit=10 * GIB, signals=None, snapshot=None, stats=None, fail=()):
        self._ready, self.limit, self.fail = ready, limit, set(fail)
        self.signals = list(signals or [(GIB, 2 * GIB, GIB, 2 * GIB, 0)])
        self._snapshot = snapshot if snapshot is not None else {"segments": []}
        self._stats = stats
        self.history: list[bool] = []
        self.observer = None
        self.snapshots = 0

    def _maybe_fail(self, name):
        if name in self.fail:
            raise RuntimeError(f"{name} failed")

    def present(self):
        self._maybe_fail("present")
        return True

    def ready(self):
        self._maybe_fail("ready")
        return self._ready

    def metadata(self):
        return {"source": "parts", "limit_bytes": self.limit}

    def limit_bytes(self):
        return self.limit

    def device_total(self, device=None):
        return 80 * GIB

    def stats(self):
        self._maybe_fail("stats")
        return dict(self._stats) if self._stats is not None else None

    def step_signals(self, reset=True):
        self._maybe_fail("step_signals")
        return self.signals.pop(0) if len(self.signals) > 1 else self.signals[0]

    def snapshot(self):
        self._maybe_fail("snapshot")
        self.snapshots += 1
        return dict(self._snapshot) if isinstance(self._snapshot, dict) else self._snapshot

    def set_history(self, on, stacks="python", context="all", max_entries=50_000):
        self._maybe_fail("set_history")
        self.history.append(bool(on))
        return True

    def attach_oom_observer(self, fn):
        self.observer = fn
        return True


class Transport:
    codec = "gzip"

    def __init__(self):
        self.items = []

    def submit(self, item) -> bool:
        self.items.append(item)
        return True

    def kinds(self) -> list[str]:
        return [i.kind if i.kind != "snapshot" else f"snapshot:{i.trigger}" for i in self.items]


def guard() -> Guard:
    return Guard(Counters())
