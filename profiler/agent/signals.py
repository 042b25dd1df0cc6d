"""The agent's signal handlers and exception hooks: a signal (SIGUSR1 unless configured) asks for a
snapshot, SIGTERM records why the rank ended before the launcher's kill, and the excepthooks note the
exception that ended the job (an OOM among them). Each handler chains to the one it replaced and is
put back on stop. A mixin of `Agent` (core.py), which holds the state these methods read and write.
"""

from __future__ import annotations

import logging
import os
import signal as _signal
import sys
import threading

log = logging.getLogger("memq.agent")


class AgentSignals:
    """Methods of `Agent` (core.py): signals and exception hooks."""

    def note_exception(self, exc: BaseException) -> None:
        """Integrations pass the exception that ends the run (its text reaches the OOM snapshot)."""
        self._note_exception(exc)

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
