"""The process hooks alone (profiler/agent/signals.py ProcessHooks): the snapshot signal, SIGTERM and the
exception hooks call what they were given, chain to the handlers they replaced, and are put back on
uninstall; a bad signal name is counted, never raised. Real signals, in this (main) thread."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from memq.agent.signals import ProcessHooks

from .parts import guard


def hooks(signal_name="SIGUSR2"):
    got: dict[str, list] = {"signal": [], "term": [], "exc": []}
    g = guard()
    h = ProcessHooks(signal_name=signal_name, on_signal=lambda: got["signal"].append(1),
                     on_term=lambda: got["term"].append(1), on_exception=got["exc"].append, guard=g)
    return h, got, g


def _wait(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.01)
    return pred()


def test_the_snapshot_signal_calls_back_and_chains_to_the_previous_handler():
    prev_calls = []
    old = signal.signal(signal.SIGUSR2, lambda s, f: prev_calls.append(s))
    try:
        h, got, _ = hooks()
        h.install()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert _wait(lambda: got["signal"] and prev_calls)
        h.uninstall()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert _wait(lambda: len(prev_calls) == 2) and got["signal"] == [1]  # ours is gone, theirs is back
    finally:
        signal.signal(signal.SIGUSR2, old)


def test_sigterm_runs_on_term_then_the_previous_handler():
    prev_calls = []
    old = signal.signal(signal.SIGTERM, lambda s, f: prev_calls.append(s))
    try:
        h, got, _ = hooks(signal_name=None)
        h.install()
        signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)
        assert got["term"] == [1] and prev_calls == [signal.SIGTERM]
        h.uninstall()
        assert signal.getsignal(signal.SIGTERM) is not h._term_handler
    finally:
        signal.signal(signal.SIGTERM, old)


def test_an_ignored_sigterm_stays_ignored():
    old = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        h, _, _ = hooks(signal_name=None)
        h.install()
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        h.uninstall()
    finally:
        signal.signal(signal.SIGTERM, old)


def test_the_exception_hooks_pass_the_exception_on_and_chain():
    seen = []
    old, old_t = sys.excepthook, threading.excepthook
    sys.excepthook = lambda t, v, tb: seen.append(("sys", v))
    threading.excepthook = lambda args: seen.append(("thread", args.exc_value))
    try:
        h, got, _ = hooks(signal_name=None)
        h.install()
        err = RuntimeError("CUDA out of memory")
        sys.excepthook(RuntimeError, err, None)
        t = threading.Thread(target=lambda: (_ for _ in ()).throw(ValueError("in a thread")))
        t.start()
        t.join()
        assert got["exc"][0] is err and isinstance(got["exc"][1], ValueError)
        assert [k for k, _ in seen] == ["sys", "thread"]
        h.uninstall()
        assert sys.excepthook is not h._hook and threading.excepthook is not h._thread_hook
    finally:
        sys.excepthook, threading.excepthook = old, old_t


def test_a_bad_signal_name_is_counted_not_raised():
    h, _, g = hooks(signal_name="SIGNOPE")
    old = signal.getsignal(signal.SIGTERM)
    try:
        h.install()
        assert g.counters.snapshot()["errors"] == 1
    finally:
        h.uninstall()
        signal.signal(signal.SIGTERM, old)


def test_off_the_main_thread_no_signal_handler_is_installed():
    h, _, g = hooks()
    old = signal.getsignal(signal.SIGUSR2)
    old_hook = sys.excepthook
    t = threading.Thread(target=h.install)
    t.start()
    t.join()
    try:
        assert signal.getsignal(signal.SIGUSR2) is old and g.counters.snapshot()["errors"] == 0
    finally:
        h.uninstall()
        sys.excepthook = old_hook
