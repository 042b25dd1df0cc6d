"""The agent's process hooks: a signal (SIGUSR2 unless configured) asks for a snapshot, SIGTERM records
why the rank ended before the launcher's kill, and the excepthooks pass on the exception that ended
the job (an OOM among them). Each handler chains to the one it replaced and is put back on
`uninstall()`. What the hooks do is given as callables: this class owns only the handlers."""

from __future__ import annotations

import logging
import os
import signal as _signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from memq.agent.guard import Guard

log = logging.getLogger("memq.agent")


class ProcessHooks:
    def __init__(self, *, signal_name: str | int | None, on_signal: Callable[[], None],
                 on_term: Callable[[], None], on_exception: Callable[[BaseException], None], guard: Guard):
        self.signal_name = signal_name
        self._on_signal, self._on_term, self._on_exception = on_signal, on_term, on_exception
        self._guard = guard
        self._signum: int | None = None
        self._prev_signal: Any = None
        self._handler: Any = None
        self._prev_term: Any = None
        self._term_handler: Any = None
        self._prev_excepthook: Any = None
        self._prev_thread_excepthook: Any = None
        self._hook: Any = None
        self._thread_hook: Any = None

    def install(self) -> None:
        self._install_signal()
        self._install_term()
        self._install_excepthooks()

    def uninstall(self) -> None:
        self._uninstall_signal()
        self._uninstall_term()
        self._uninstall_excepthooks()

    def _install_signal(self) -> None:
        name = self.signal_name
        if not name or threading.current_thread() is not threading.main_thread():
            return
        try:
            signum = int(name) if str(name).isdigit() else int(getattr(_signal, str(name)))
            prev = _signal.getsignal(signum)
            on_signal = self._on_signal

            def handler(sig, frame):
                on_signal()
                if callable(prev) and prev not in (_signal.SIG_DFL, _signal.SIG_IGN):
                    prev(sig, frame)

            _signal.signal(signum, handler)
            self._prev_signal, self._signum, self._handler = prev, signum, handler
        except Exception:  # noqa: BLE001 - unknown name, Windows, not the main thread
            self._guard.error()

    def _uninstall_signal(self) -> None:
        if self._signum is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            if _signal.getsignal(self._signum) is self._handler:
                _signal.signal(self._signum, self._prev_signal if self._prev_signal is not None else _signal.SIG_DFL)
        except Exception:  # noqa: BLE001
            pass

    def _install_term(self) -> None:
        """SIGTERM (the launcher tearing the ranks down after one failed): `on_term` (bounded), then
        what the previous handler did (default: die of SIGTERM). Main thread only; not when SIGTERM is
        the snapshot signal or was ignored."""
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            if self._signum == _signal.SIGTERM:
                return
            prev = _signal.getsignal(_signal.SIGTERM)
            if prev == _signal.SIG_IGN or prev is None:  # None: installed from C; leave it alone
                return
            on_term_cb = self._on_term

            def on_term(sig, frame):
                on_term_cb()
                if callable(prev) and prev is not _signal.SIG_DFL:
                    prev(sig, frame)
                elif prev == _signal.SIG_DFL:
                    _signal.signal(sig, _signal.SIG_DFL)
                    os.kill(os.getpid(), sig)

            _signal.signal(_signal.SIGTERM, on_term)
            self._prev_term, self._term_handler = prev, on_term
        except Exception:  # noqa: BLE001
            self._guard.error()

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
        note = self._on_exception

        def hook(etype, value, tb):
            note(value)
            prev(etype, value, tb)

        def thread_hook(args):
            if args.exc_value is not None:
                note(args.exc_value)
            prev_t(args)

        self._prev_excepthook, self._prev_thread_excepthook = prev, prev_t
        self._hook, self._thread_hook = hook, thread_hook
        sys.excepthook, threading.excepthook = hook, thread_hook

    def _uninstall_excepthooks(self) -> None:
        if self._hook is not None and sys.excepthook is self._hook:
            sys.excepthook = self._prev_excepthook
        if self._thread_hook is not None and threading.excepthook is self._thread_hook:
            threading.excepthook = self._prev_thread_excepthook
