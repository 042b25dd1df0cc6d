"""Callbacks run right after the job's `import torch` finishes: the bootstrap starts the agent before
the job imports torch and must not import it itself."""

from __future__ import annotations

import importlib.util
import sys


class _TorchImportHook:
    """A meta-path finder that runs callbacks right after `import torch` finishes (the bootstrap
    starts the agent before the job imports torch, and must not import it itself)."""

    def __init__(self):
        self.callbacks: list = []

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" or not self.callbacks:
            return None
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


def after_torch_import(cb) -> None:
    if "torch" in sys.modules:
        return
    _hook.callbacks.append(cb)
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
