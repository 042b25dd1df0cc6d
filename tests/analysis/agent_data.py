"""Snapshots as the agent sends them at its defaults, for the analysis tests.

- `spool_snapshots(folder)`: the snapshots of a real agent spool from the H200
  (tests/fixtures/agent_gpu), with their envelope fields, read as the dispatcher reads them.
- `agent_default(raw, keep)`: a full-history real snapshot turned into what the agent sends at its
  defaults: no trace (recording paused), and block frames only where `keep(block)` says the block
  was allocated while recording was on (warm-up, or a window recorded on growth).
- `with_agent(raw, **facts)`: the dict with the agent's `memq_agent` facts embedded (the contract of
  engineers D/F/G), as the agent embeds them.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path

from memq import codec
from memq.agent.spool import decode
from memq.model import OomContext
from memq.oom_message import parse_oom_message
from memq.snapshot import parse_snapshot

AGENT_GPU = Path(__file__).resolve().parents[1] / "fixtures" / "agent_gpu"


def spool_snapshots(folder: str) -> list[tuple[dict, dict]]:
    """(envelope fields with the payload parsed, raw snapshot dict) of each snapshot, in send order."""
    out = []
    for f in sorted((AGENT_GPU / folder).rglob("*.mqs")):
        msg = decode(f.read_bytes())
        if msg.fields["kind"] != "snapshot":
            continue
        fields = dict(msg.fields, payload=json.loads(msg.fields.get("payload") or "{}"))
        out.append((fields, codec.decode(msg.blob)))
    return out


def oom_context(fields: dict) -> OomContext:
    """What the service builds from an OOM envelope's observer payload."""
    oom = fields["payload"]["oom"]
    return OomContext(requested_bytes=oom["alloc"], device_total_bytes=oom["device_total"],
                      device_free_bytes=oom["device_free"], message=parse_oom_message(oom["message"]))


def agent_default(raw: dict, keep: Callable[[dict], bool]) -> dict:
    d = copy.deepcopy(raw)
    d["device_traces"] = [[] for _ in d.get("device_traces", [])]
    for seg in d["segments"]:
        for b in seg["blocks"]:
            if not keep(b):
                b["frames"] = []
    return d


def live_keys(raw: dict) -> set[tuple[int, int]]:
    return {(b["address"], b["size"]) for seg in raw["segments"] for b in seg["blocks"] if b["state"] != "inactive"}


def with_agent(raw: dict, **facts) -> dict:
    d = dict(raw)
    d["memq_agent"] = {"run": "r", "rank": 0, "time": 1.0, **facts}
    return d


def parse(raw: dict):
    return parse_snapshot(raw)


STEP_NEED = Path(__file__).resolve().parents[1] / "fixtures" / "step_need"


def step_need_truth() -> dict:
    """Ground truth of the calibration set (tests/fixtures/step_need/README.md)."""
    return json.loads((STEP_NEED / "truth.json").read_text())


def rank_folder(sc: str, variant: str) -> Path:
    """The calibration spool of a scenario's variant; of a multi-rank job, the failing rank's (its
    `rank` in truth.json), which is the rank the measured need is of."""
    rank = step_need_truth()[sc].get("rank")
    base = STEP_NEED / sc / variant
    return base if rank is None else next(base.glob(f"*/rank{rank}-*"))


def spool_run(folder: Path) -> tuple[list, OomContext | None, list[str | None]]:
    """A spool's snapshots as the worker analyses them: parsed snapshots in send order, the OOM
    context from the last OOM envelope's observer payload (as the dispatcher stores it), triggers.
    One rank's: pass a rank's folder for a multi-rank spool."""
    from memq.analysis.limits import observer_facts
    from memq.pipeline.analyse import oom_context as stored_context

    snaps, triggers, ctx, start = [], [], None, {}
    for f in sorted(folder.rglob("*.mqs")):
        msg = decode(f.read_bytes())
        kind = msg.fields["kind"]
        if kind == "run_start":
            start = json.loads(msg.fields.get("payload") or "{}")
        if kind != "snapshot":
            continue
        payload = json.loads(msg.fields.get("payload") or "{}")
        snaps.append(parse_snapshot(codec.decode(msg.blob)))
        triggers.append(msg.fields.get("trigger"))
        if payload.get("oom"):
            dev = start.get("device") or {}
            ctx = stored_context(observer_facts(payload["oom"], start.get("memory_limit_bytes"),
                                                dev.get("total_memory") if isinstance(dev, dict) else None))
    return snaps, ctx, triggers


FORECAST = Path(__file__).resolve().parents[1] / "fixtures" / "forecast"


def spool_files(folder: Path, dest: Path, *, before_oom: bool = True) -> list[Path]:
    """A spool's snapshots written out as the files `memq ingest` reads (the agent's compressed pickle
    bytes, unchanged), in send order; with `before_oom`, only those the run sent before its OOM."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for f in sorted(Path(folder).rglob("*.mqs")):
        msg = decode(f.read_bytes())
        if msg.fields["kind"] != "snapshot":
            continue
        if before_oom and msg.fields.get("trigger") == "oom":
            break
        ext = {"gzip": ".pickle.gz", "zstd": ".pickle.zst"}[msg.fields["codec"]]
        p = dest / f"snap{len(out):03d}{ext}"
        p.write_bytes(msg.blob)
        out.append(p)
    return out
