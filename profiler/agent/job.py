"""What the agent knows of the job's own objects: the model and optimizer passed to start() (or their
class names), the optimizer whose step hook fired, the autocast state and input shapes at the first
forward, and the roles of their tensors sent with each snapshot (agent/roles.py)."""

from __future__ import annotations

import sys
import time
import weakref
from typing import Any

from memq.agent.guard import Guard
from memq.agent.roles import collect
from memq.agent.scores import LEARNING_FORWARD_WAIT_CALLS, learning, watch_first_forward
from memq.agent.source import first_input_facts


class JobObjects:
    def __init__(self, *, model: Any = None, optimizer: Any = None, roles: bool = True,
                 role_devices: tuple = ("cuda",), guard: Guard):
        self.model, self.optimizer = model, optimizer  # objects, or class names as strings
        self.roles_on = roles
        self.role_devices = tuple(role_devices)
        self._guard = guard
        self.hook_optimizer_name: str | None = None  # the class of the optimizer whose step hook fired
        self._hook_opt_ref: Any = None  # a weak reference to it, when start() was given none
        self._input_hook: Any = None  # the first forward's pre-hook
        self._input_seen = False
        self._input_calls = 0  # module forwards the pre-hook saw while waiting for one that learns
        self.first_input: dict | None = None  # autocast state and input shapes at the first forward

    # -- the optimizer the step hook saw --------------------------------------------------------------
    def saw_optimizer(self, optimizer: Any) -> None:
        """The first optimizer whose step hook fired: its class names the optimizer, and when start() was
        given none its tensors' roles go with each snapshot."""
        self.hook_optimizer_name = type(optimizer).__name__
        if self.optimizer is None:
            try:
                self._hook_opt_ref = weakref.ref(optimizer)
            except TypeError:
                self._hook_opt_ref = None

    def optimizer_label(self) -> str | None:
        if isinstance(self.optimizer, str):
            return self.optimizer
        if self.optimizer is not None:
            return type(self.optimizer).__name__
        return self.hook_optimizer_name

    def model_label(self) -> str | None:
        if isinstance(self.model, str):
            return self.model
        return type(self.model).__name__ if self.model is not None else None

    def metadata(self) -> dict:
        """run_start's model and optimizer names and the parameter count (never raises)."""
        out: dict[str, Any] = {}
        try:
            if isinstance(self.optimizer, str):
                out["optimizer"] = self.optimizer
            elif self.optimizer is not None:
                out["optimizer"] = type(self.optimizer).__name__
                if self.model is None:
                    out["params"] = sum(p.numel() for g in self.optimizer.param_groups for p in g["params"])
            if isinstance(self.model, str):
                out["model"] = self.model
            elif self.model is not None:
                out["params"] = sum(p.numel() for p in self.model.parameters())
                out["model"] = type(self.model).__name__
        except Exception:  # noqa: BLE001
            pass
        return out

    def roles(self) -> dict | None:
        """The roles of the tensors the job's optimizer and model hold (agent/roles.py), read right after
        the snapshot so that both describe one moment; None when off or nothing is known."""
        if not self.roles_on:
            return None
        opt = self.optimizer if not isinstance(self.optimizer, str) else None
        if opt is None and self._hook_opt_ref is not None:
            opt = self._hook_opt_ref()
        model = self.model if not isinstance(self.model, str) else None
        if opt is None and model is None:
            return None
        t0 = time.perf_counter()
        out = collect(opt, model, device_types=self.role_devices)
        if out is not None:
            out["took_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return out

    # -- the first forward ----------------------------------------------------------------------------
    def install_input_hook(self) -> None:
        """Once, after `import torch`: a global module forward pre-hook that reads, at the first forward,
        the autocast state and the input's shapes, then removes itself (one call: nothing per step);
        while that forward runs, the attention scores it saves are noted (agent/scores.py). What
        `memq fit` needs to tell autocast's weight copies from input-sized blocks, and the batch
        the run measured."""
        if self._input_seen or self._input_hook is not None or "torch" not in sys.modules:
            return
        mod = sys.modules.get("torch.nn.modules.module")
        register = getattr(mod, "register_module_forward_pre_hook", None)
        if register is not None:
            self._input_hook = register(self._on_first_forward)

    def remove_input_hook(self) -> None:
        if self._input_hook is not None:
            self._guard.call(self._input_hook.remove)
            self._input_hook = None

    def _on_first_forward(self, module, args) -> None:
        """The first forward's facts; but a forward under no_grad or inference mode first (a validation
        sanity check before training) saves nothing for backward, so the hook waits, at most
        LEARNING_FORWARD_WAIT_CALLS module calls, for the first forward that does: its facts replace the
        first's (its input is the training step's), and its attention scores are noted."""
        if self._input_seen:
            return None
        learns = self._guard.call(learning) is not False
        self._input_calls += 1
        if self.first_input is None or learns:
            self.first_input = self._guard.call(lambda: first_input_facts(module, args))
        if not learns and self._input_calls < LEARNING_FORWARD_WAIT_CALLS:
            return None
        self._input_seen = True
        handle, self._input_hook = self._input_hook, None
        if handle is not None:
            self._guard.call(handle.remove)
        facts = self.first_input
        if learns and facts is not None:  # its attention scores, noted while this forward runs (agent/scores.py)
            self._guard.call(lambda: watch_first_forward(module, facts, self.role_devices))
        return None
