"""Callbacks for PyTorch Lightning and Hugging Face Trainer; each imports its library lazily.

    from memq.agent.integrations import lightning_callback, hf_callback
    trainer = lightning.Trainer(callbacks=[lightning_callback(run="r", cluster="c")])
    trainer = transformers.Trainer(..., callbacks=[hf_callback(run="r", cluster="c")])

They start the agent when training begins (with the model and optimizer, for the parameter count and
optimizer class), mark every optimizer step and epoch, hand the exception that ends a run to the
agent (its OOM text reaches the OOM snapshot), and stop the agent when training ends. Options are
those of `agent.start`. No callback raises into the trainer.
"""

from __future__ import annotations

from typing import Any

from memq import agent


def _safe(fn):
    def wrapper(*a, **k):
        try:
            return fn(*a, **k)
        except Exception:  # noqa: BLE001 - never into the trainer
            return None

    wrapper.__name__ = fn.__name__
    return wrapper


def _lightning_base():
    # Lazy: neither trainer library is a dependency of the agent (a job has at most one of them).
    try:
        from lightning.pytorch import Callback
    except ImportError:
        from pytorch_lightning import Callback  # the older package name
    return Callback


def lightning_callback(run: str, cluster: str, **options: Any):
    """A `lightning.pytorch.Callback` (or `pytorch_lightning.Callback`) driving the agent."""
    base = _lightning_base()

    class MemqLightningCallback(base):
        def __init__(self):
            super().__init__()
            self.handle = None

        @_safe
        def on_fit_start(self, trainer, pl_module):
            opts = dict(options)
            opts.setdefault("model", pl_module)
            if getattr(trainer, "optimizers", None):
                opts.setdefault("optimizer", trainer.optimizers[0])
            opts.setdefault("rank", getattr(trainer, "global_rank", None))
            self.handle = agent.start(run=run, cluster=cluster, **opts)

        @_safe
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            agent.mark_step(int(trainer.global_step), int(trainer.current_epoch))

        @_safe
        def on_train_epoch_end(self, trainer, pl_module):
            agent.mark_epoch(int(trainer.current_epoch))

        @_safe
        def on_exception(self, trainer, pl_module, exception):
            if self.handle is not None and hasattr(self.handle, "note_exception"):
                self.handle.note_exception(exception)

        @_safe
        def on_fit_end(self, trainer, pl_module):
            agent.stop()

    return MemqLightningCallback()


def hf_callback(run: str, cluster: str, **options: Any):
    """A `transformers.TrainerCallback` driving the agent."""
    from transformers import TrainerCallback  # lazy: transformers is the job's, not the agent's

    class MemqTrainerCallback(TrainerCallback):
        def __init__(self):
            self.handle = None

        @_safe
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kw):
            opts = dict(options)
            if model is not None:
                opts.setdefault("model", model)
            if optimizer is not None:
                # The Trainer hands accelerate's AcceleratedOptimizer; the run's optimizer is inside it.
                inner = getattr(optimizer, "optimizer", None)
                opts.setdefault("optimizer", inner if hasattr(inner, "param_groups") else optimizer)
            opts.setdefault("rank", getattr(args, "process_index", None))
            self.handle = agent.start(run=run, cluster=cluster, **opts)

        @_safe
        def on_step_end(self, args, state, control, **kw):
            agent.mark_step(int(state.global_step), int(state.epoch or 0))

        @_safe
        def on_epoch_end(self, args, state, control, **kw):
            agent.mark_epoch(int(round(state.epoch or 0)) - 1)

        @_safe
        def on_train_end(self, args, state, control, **kw):
            agent.stop()

    return MemqTrainerCallback()
