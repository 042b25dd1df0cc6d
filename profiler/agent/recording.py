"""What the agent records and sends: history recording armed, paused and resumed by the policy, stat
samples and their batches, the rank's peak figures, snapshots with their metadata and signature, the
run's announcement. A mixin of `Agent` (core.py).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any

from memq.agent.source import scheduler_ids
from memq.agent.transport import Item

log = logging.getLogger("memq.agent")


class AgentRecording:
    """Methods of `Agent` (core.py): recording and sending."""

    def _check_source(self) -> None:
        """Cheap; called at start, after `import torch`, by the ticker and by mark_step until armed."""
        try:
            self._install_step_hook()
            self._install_input_hook()
            if not self.available and self.source.present():
                self.available = True
                # Recording switched on before CUDA initialises catches the parameters' frames; it is
                # applied again once CUDA is initialised (older torch ignores it before that).
                self._apply_history(self.policy.initial(), force=True)
            if self.available and not self.armed:
                self._maybe_arm()
        except Exception:  # noqa: BLE001
            self.counters_obj.add("errors")

    def _install_input_hook(self) -> None:
        """Once: a global module forward pre-hook that reads, at the first forward, the autocast state
        and the input's shapes, then removes itself (one call: nothing per step). What `memq fit` needs
        to tell autocast's weight copies from input-sized blocks, and the batch the run measured."""
        if getattr(self, "_input_seen", False) or getattr(self, "_input_hook", None) is not None \
                or "torch" not in sys.modules:
            return
        mod = sys.modules.get("torch.nn.modules.module")
        register = getattr(mod, "register_module_forward_pre_hook", None)
        if register is not None:
            self._input_hook = register(self._on_first_forward)

    def _on_first_forward(self, module, args) -> None:
        handle, self._input_hook = getattr(self, "_input_hook", None), None
        if handle is not None:
            self._safe_call(handle.remove)
        if getattr(self, "_input_seen", False):
            return None
        self._input_seen = True
        from memq.agent.source import first_input_facts

        self._first_input = self._safe_call(lambda: first_input_facts(module, args))
        return None

    def _maybe_arm(self) -> None:
        """Once CUDA is initialised: attach the OOM observer, re-apply history, send device metadata."""
        if self.armed or not self._safe_call(self.source.ready, default=False):
            return
        with self._lock:
            if self.armed:
                return
            self.armed = True
        self._announce()
        if self.oom_enabled:
            self._safe_call(lambda: self.source.attach_oom_observer(self._on_oom))
        want = self.recording if self.recording is not None else self.policy.initial()
        self._apply_history(want, force=True)
        md = self._safe_call(self.source.metadata, default={}) or {}
        with self._lock:
            self._samples.append({"t": time.time(), "device_metadata": md})
        self._limit = md.get("limit_bytes")
        if self._limit is None:
            self._limit = self._safe_call(self.source.limit_bytes)

    def _auto_paused(self) -> bool:
        return self.policy.mode == "auto" and not self.policy.continuous and not self.recording

    def _set_recording(self, want: bool, at_boundary: bool = False) -> None:
        """Apply a policy decision. Pausing empties the trace, so a recorded stretch that ends
        (warm-up, a periodic recorded step, a recording window, low headroom that passed) is
        snapshotted first."""
        if self.recording and not want and self.policy.mode == "auto":
            self.take_snapshot("periodic", payload={"reason": self.policy.reason}, at_boundary=at_boundary)
        self._apply_history(want)

    def _apply_history(self, want: bool, force: bool = False) -> None:
        if want == self.recording and not force:
            return
        ok = self._safe_call(lambda: self.source.set_history(want, stacks=self.stacks, context=self.context,
                                                             max_entries=self.max_entries), default=False)
        if ok and want and not self.recording:
            self._rec_since = self.step + 1 if self.step is not None else 0
        self.recording = want if ok else self.recording

    def _sample_stats(self, now: float) -> None:
        self._next_stats = now + self.stats_interval_s
        sample = self._safe_call(self.source.stats)
        if not sample:
            return
        sample = dict(sample, t=time.time(), step=self.step, epoch=self.epoch, recording=bool(self.recording))
        # re-read: a job may set its memory fraction after CUDA is initialised (and the agent armed)
        limit = self._safe_call(self.source.limit_bytes) or self._limit
        self._limit = limit
        self._note_peaks(sample.get("allocated_bytes.all.peak"), sample.get("reserved_bytes.all.peak"))
        self.policy.on_stats(sample, limit)
        with self._lock:
            self._samples.append(sample)
            if len(self._samples) > 1000:
                del self._samples[:-1000]
                self.counters_obj.add("dropped")

    def _flush_stats(self, rank_figures: dict | None = None) -> None:
        with self._lock:
            samples, self._samples = self._samples, []
            figures = self.tracker.unsent()
            self._next_flush = time.monotonic() + self.stats_flush_s
        if samples or figures or rank_figures:
            payload: dict[str, Any] = {"samples": samples}
            if figures:
                payload["step_figures"] = figures
            if rank_figures:
                payload["rank_figures"] = rank_figures
            self.transport.submit(Item("stats", payload=payload))

    def _note_peaks(self, alloc: Any, reserved: Any) -> None:
        if isinstance(alloc, int):
            self._peak_alloc = max(alloc, self._peak_alloc or 0)
        if isinstance(reserved, int):
            self._peak_reserved = max(reserved, self._peak_reserved or 0)

    def rank_figures(self) -> dict:
        """This rank's own figures for the cross-rank diagnosis: the run's peaks (the step in progress
        included: its peak counters were not reset yet), the last step, the limit, the per-step
        peaks' summary. Cheap: one counters read, no snapshot."""
        if self.armed:
            read = getattr(self.source, "step_signals", None)
            sig = self._safe_call(lambda: read(reset=False)) if read is not None else None
            if sig:
                self._note_peaks(int(max(sig[0], sig[2])), int(max(sig[1], sig[3])))
            # A rank that fails or is torn down in its first step never reached a boundary: its cap
            # (set_per_process_memory_fraction after start) is read here, not left at the device total.
            self._limit = self._safe_call(self.source.limit_bytes) or self._limit
        with self._lock:
            figs = [f for f in self.tracker.figures if f.get("peak_allocated") is not None]
        summary = None
        if figs:
            top = max(figs, key=lambda f: f["peak_allocated"])
            peaks = sorted(f["peak_allocated"] for f in figs)
            summary = {"count": len(figs), "median_peak_allocated": peaks[len(peaks) // 2],
                       "max_peak_allocated": top["peak_allocated"],
                       "max_peak_reserved": max(f["peak_reserved"] for f in figs),
                       "max_step": top.get("step"), "last_peak_allocated": figs[-1]["peak_allocated"]}
        return {"peak_allocated_bytes": self._peak_alloc, "peak_reserved_bytes": self._peak_reserved,
                "limit_bytes": self._limit, "last_step": self.step, "steps": self.policy.steps_seen,
                "end_reason": self.end_reason, "step_peaks": summary}

    def take_snapshot(self, trigger: str, payload: dict | None = None, wait: threading.Event | None = None,
                      finish=None, comparable: bool = False, at_boundary: bool = False) -> bool:
        if not self.armed or self.stopped:
            return False
        if getattr(self._in_snapshot, "on", False):
            return False
        self._in_snapshot.on = True
        try:
            t0 = time.perf_counter()
            obj = self.source.snapshot()
            took = time.perf_counter() - t0
        finally:
            self._in_snapshot.on = False
        if obj is None:
            return False
        roles = self._roles() if isinstance(obj, dict) else None
        # Between boundaries a step is running: the last completed one + 1 (an OOM's failing step).
        in_progress = None if at_boundary else (self.step + 1 if self.step is not None else 0)
        step = in_progress if trigger == "oom" else self.step
        if isinstance(obj, dict):
            # Self-describing and distinct: two snapshots of an unchanged state (epoch ends with
            # recording paused) would otherwise be the same bytes, hence one row in the history.
            with self._lock:
                figures = list(self.tracker.figures)
            obj["memq_agent"] = {
                "run": self.run, "rank": self.rank, "trigger": trigger, "step": step, "epoch": self.epoch,
                "time": time.time(), "step_figures": figures, "step_in_progress": in_progress,
                "step_completed": self.step, "steps_source": self.steps_source,
                "recording": {"on": bool(self.recording), "since_step": self._rec_since if self.recording else None,
                              "reason": self.policy.reason},
                "comparable": bool(comparable), "optimizer": self._optimizer_label(),
                "oom_frames": self._oom_frames if trigger == "oom" else None,
                "limit_bytes": self._limit, "roles": roles,
                "first_input": getattr(self, "_first_input", None),
                "model": self._model if isinstance(self._model, str) else
                (type(self._model).__name__ if self._model is not None else None)}
        pl = dict(payload or {})
        if comparable:
            pl["comparable"] = True
        pl.setdefault("took_ms", round(took * 1000, 3))
        pl.setdefault("recording", bool(self.recording))
        pl.setdefault("policy", self.policy.reason)
        item = Item("snapshot", payload=pl, obj=obj, trigger=trigger, step=step, epoch=self.epoch,
                    wait=wait, wait_s=self.oom_message_wait_s if wait is not None else 0.0, finish=finish)
        return self.transport.submit(item)

    def _roles(self) -> dict | None:
        """The roles of the tensors the job's optimizer and model hold (agent/roles.py), read right after
        the snapshot so that both describe one moment; None when off or nothing is known."""
        if not self.roles:
            return None
        opt = self._optimizer if not isinstance(self._optimizer, str) else None
        if opt is None and self._hook_opt_ref is not None:
            opt = self._hook_opt_ref()
        model = self._model if not isinstance(self._model, str) else None
        if opt is None and model is None:
            return None
        from memq.agent.roles import collect

        t0 = time.perf_counter()
        out = collect(opt, model, device_types=self.role_devices)
        if out is not None:
            out["took_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        return out

    def _signing_key(self, text: str):
        """The key of MEMQ_AGENT_KEY(_FILE); a bad one is reported (counters, last error), never raised
        into the job: its envelopes then go unsigned, and a signing deployment dead-letters them."""
        if not text:
            return None
        from memq.errors import BadInput
        from memq.identity import parse_key

        try:
            return parse_key(text)
        except BadInput as exc:
            self.counters_obj.add("errors")
            self.key_error = f"MEMQ_AGENT_KEY: {exc}"
            return None

    def _optimizer_label(self) -> str | None:
        if isinstance(self._optimizer, str):
            return self._optimizer
        if self._optimizer is not None:
            return type(self._optimizer).__name__
        return self._optimizer_name

    def _run_metadata(self) -> dict:
        md: dict[str, Any] = {"world_size": self.world_size, "pid": os.getpid(),
                              "argv": [str(a)[:200] for a in sys.argv[:20]], "scheduler": scheduler_ids(),
                              "agent": {"history": self.policy.mode, "stacks": self.stacks,
                                        "max_entries": self.max_entries, "warmup_steps": self.policy.warmup_steps,
                                        "stats_interval_s": self.stats_interval_s,
                                        "snapshot_every_s": self.snapshot_every_s,
                                        "codec": self.transport.codec}}
        md.update(self._safe_call(self.source.metadata, default={}) or {})
        md.update(self._model_metadata())
        md.update(self.user_metadata)
        return md

    def _model_metadata(self) -> dict:
        out: dict[str, Any] = {}
        try:
            if isinstance(self._optimizer, str):
                out["optimizer"] = self._optimizer
            elif self._optimizer is not None:
                out["optimizer"] = type(self._optimizer).__name__
                if self._model is None:
                    out["params"] = sum(p.numel() for g in self._optimizer.param_groups for p in g["params"])
            if isinstance(self._model, str):
                out["model"] = self._model
            elif self._model is not None:
                out["params"] = sum(p.numel() for p in self._model.parameters())
                out["model"] = type(self._model).__name__
        except Exception:  # noqa: BLE001
            pass
        return out

    def _announce(self) -> None:
        if not self.announced:
            self.announced = True
            self.transport.submit(Item("run_start", payload=self._run_metadata()))
