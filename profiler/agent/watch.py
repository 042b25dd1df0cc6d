"""Whether the agent's source can be used yet: `available` once torch with CUDA is there, `armed` once
CUDA is initialised (before that a snapshot or the OOM observer would initialise it in the job's
place). `check()` is cheap and is called at start, after `import torch`, by the ticker and at step
and epoch marks until armed; what to do at each stage is given as callables, run in order."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from memq.agent.guard import Guard


class SourceWatch:
    def __init__(self, source: Any, guard: Guard, *, each_check: Sequence[Callable[[], None]] = (),
                 on_present: Sequence[Callable[[], None]] = (), on_ready: Sequence[Callable[[], None]] = ()):
        self.source = source
        self._guard = guard
        self.each_check, self.on_present, self.on_ready = list(each_check), list(on_present), list(on_ready)
        self.available = False
        self.armed = False
        self._lock = threading.Lock()

    def check(self) -> None:
        """Never raises: a failing stage is counted and tried again at the next check."""
        try:
            for fn in self.each_check:
                fn()
            if not self.available and self.source.present():
                self.available = True
                for fn in self.on_present:
                    fn()
            if self.available and not self.armed:
                self._arm()
        except Exception:  # noqa: BLE001
            self._guard.error()

    def _arm(self) -> None:
        if self.armed or not self._guard.call(self.source.ready, default=False):
            return
        with self._lock:
            if self.armed:
                return
            self.armed = True
        for fn in self.on_ready:
            fn()
