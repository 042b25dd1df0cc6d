"""How the run is ending: the status that run_end carries, the text of the exception that ended it
(which the OOM snapshot waits for, briefly, as its message) and why a rank ended early. Written by
the exception hooks, the OOM observer, SIGTERM and stop; read by the snapshots and run_end."""

from __future__ import annotations

import threading


class Outcome:
    def __init__(self):
        self.status = "running"  # running, completed, oom, crashed (the envelope's run statuses)
        self.exception_text: str | None = None
        self.end_reason: str | None = None  # sigterm, process_group_aborted, exception
        self._waits: list[threading.Event] = []
        self._lock = threading.Lock()

    def note_exception(self, exc: BaseException) -> None:
        """The exception that ends the run; releases the OOM snapshots waiting for its text. Never raises."""
        try:
            text = f"{type(exc).__name__}: {exc}"
            is_oom = type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
            if is_oom:
                self.status = "oom"
                self.exception_text = str(exc)
            else:
                self.status = "crashed"  # the envelope's run statuses: "error" would be dead-lettered
                self.exception_text = self.exception_text or text
                self.end_reason = self.end_reason or end_reason(exc)
            with self._lock:
                waits, self._waits = self._waits, []
            for evt in waits:
                evt.set()
        except Exception:  # noqa: BLE001
            pass

    def oom(self) -> None:
        self.status = "oom"

    def message_wait(self) -> threading.Event:
        """An event set when the exception's text is known (the OOM snapshot's message waits on it)."""
        evt = threading.Event()
        with self._lock:
            self._waits.append(evt)
        return evt

    def terminated(self) -> None:
        """SIGTERM: the launcher tears the rank down (after another one failed)."""
        if self.status == "running":
            self.status = "crashed"
        self.end_reason = self.end_reason or "sigterm"

    def completed(self) -> None:
        if self.status == "running":
            self.status = "completed"


def end_reason(exc: BaseException) -> str:
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
