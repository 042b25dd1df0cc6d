"""Write docs/playbook.md (and its packaged copy profiler/playbook.md) from the runs behind it.

    python benchmarks/playbook.py            # regenerate both files
    python benchmarks/playbook.py --check    # exit 1 and print a diff when a committed file differs

Inputs, all in the repository (no GPU, no torch, no services):
- tests/fixtures/playbook/<scenario>/: one H200 job each (benchmarks/gpu/playbook_capture.py): `result.json`
  is what torch measured inside the job; `spool/` is what memq's agent sent from the same job. memq's
  figures in the tables are memq's analysis of those snapshots (memq.analysis.analyze, the function
  the workers run), so the playbook changes when the analyzer does.
- tests/fixtures/ddp_ranks, tests/fixtures/real/external, tests/fixtures/captured/cudnn_workspace: earlier
  captures that other entries cite.
The section anchors are the entry ids of profiler/playbook.py; recommendations link to them.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memq import playbook as pb  # noqa: E402
from memq.agent.spool import SUFFIX, decode  # noqa: E402
from memq.analysis import analyze  # noqa: E402
from memq.analysis.limits import observer_facts  # noqa: E402
from memq.analysis.ranks import diagnose_ranks, rank_facts_from  # noqa: E402
from memq.load import decode_snapshot_bytes, load_snapshot_file  # noqa: E402
from memq.pipeline.analyse import oom_context  # noqa: E402
from memq.units import fmt_bytes  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures"
PLAYBOOK_FIX = FIXTURES / "playbook"
PLAYBOOK_FIX_REL = "tests/fixtures/playbook"
OUTPUTS = (ROOT / pb.DOC_PATH, ROOT / "profiler" / pb.PACKAGED_NAME)  # what users read: situations, no fixtures
SOURCES = ROOT / "benchmarks" / "playbook_sources.md"  # for developers: the same page, each figure with its fixture
OPTIMIZER_NAMES = {"sgd": "SGD", "sgd_momentum": "SGD, momentum 0.9", "adam": "Adam",
                   "adamw": "AdamW (foreach, default)",
                   "adamw_forloop": "AdamW (foreach=False)", "adamw_fused": "AdamW (fused=True)",
                   "adafactor": "Adafactor (torch.optim)", "adamw_8bit": "AdamW 8-bit (bitsandbytes)"}


# ---------------------------------------------------------------- loading (the only I/O besides main)

@dataclass
class Snap:
    loaded: Any
    trigger: str | None
    step: int | None
    epoch: int | None
    oom: dict
    rank: int = 0
    ts_s: float | None = None  # the sender's clock


@dataclass
class Job:
    name: str
    path: str  # repository-relative, as the playbook cites it
    result: dict
    snaps: list[Snap] = field(default_factory=list)
    run_end: dict = field(default_factory=dict)


def _rel(p: Path) -> str:
    p = p.resolve()
    return p.relative_to(ROOT).as_posix() if p.is_relative_to(ROOT) else p.as_posix()


def _num(fields: dict, key: str) -> int | None:
    v = fields.get(key)
    return int(v) if v not in (None, "") else None


def read_spool(folder: Path) -> tuple[list[Snap], dict[int, dict]]:
    """Every snapshot of every rank folder under `folder`, in send order, and each rank's run_end payload."""
    snaps, ends = [], {}
    for rank_dir in sorted({p.parent for p in folder.rglob(f"*{SUFFIX}")}):
        for f in sorted(rank_dir.glob(f"*{SUFFIX}")):
            msg = decode(f.read_bytes())
            kind = msg.fields.get("kind")
            payload = json.loads(msg.fields.get("payload") or "{}")
            if kind == "run_end":
                ends[int(msg.fields.get("rank") or 0)] = payload
            if kind != "snapshot" or not msg.blob:
                continue
            ts = _num(msg.fields, "ts")
            snaps.append(Snap(decode_snapshot_bytes(msg.blob, name=f"{_rel(f)}"), msg.fields.get("trigger"),
                              _num(msg.fields, "step"), _num(msg.fields, "epoch"), payload.get("oom") or {},
                              _num(msg.fields, "rank") or 0, ts / 1000 if ts is not None else None))
    return snaps, ends


def load_job(folder: Path) -> Job:
    res_path = folder / "result.json"
    result = json.loads(res_path.read_text()) if res_path.exists() else {}
    snaps, ends = read_spool(folder / "spool") if (folder / "spool").exists() else ([], {})
    return Job(folder.name, _rel(folder), result, snaps, ends.get(0, {}))


def load_all(root: Path = PLAYBOOK_FIX) -> dict[str, Job]:
    return {d.name: load_job(d) for d in sorted(root.iterdir()) if d.is_dir()}


# ---------------------------------------------------------------- memq's view of a job (pure)

def memq_result(snaps: list[Snap], upto: int | None = None, limit: int | None = None) -> dict:
    """memq's analysis of snapshots [0..upto] of one run, as the worker computes a run's diagnosis."""
    chosen = snaps[: (upto + 1) if upto is not None else None]
    facts = observer_facts(chosen[-1].oom)  # what the dispatcher stores with the snapshot
    if limit and "limit_bytes" not in facts:
        facts["limit_bytes"] = limit
    ctx = oom_context(facts)
    return analyze([s.loaded for s in chosen], ctx, names=[s.loaded.path for s in chosen],
                   triggers=[s.trigger for s in chosen])


def cause(res: dict) -> str:
    d = res["diagnosis"]
    return f"{d['primary_cause']} ({d['confidence']:.2f})"


# ---------------------------------------------------------------- formatting helpers (pure)

def b(n: int | float | None) -> str:
    return "n/a" if n is None else fmt_bytes(int(n))


def ms(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1f} ms"


def x(a: float | None, base: float | None) -> str:
    return "n/a" if not a or not base else f"{a / base:.2f}x"


def table(head: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def heading(entry_id: str, level: int = 2) -> str:
    return f"{'#' * level} <a id=\"{entry_id}\"></a>{pb.BY_ID[entry_id].title}"


def advice(entry_id: str) -> str:
    return f"*The advice:* {pb.BY_ID[entry_id].advice}."


def steady(vals: list[float] | None, skip: int = 1) -> float | None:
    """The median of a job's per-step figures after the first (CUDA context, autotuning, state creation)."""
    v = list(vals or [])[skip:]
    return statistics.median(v) if v else None


# ---------------------------------------------------------------- sections (pure: jobs in, markdown out)

def section_optimizer(jobs: dict[str, Job]) -> str:
    rows, figs = [], {}
    for kind, label in OPTIMIZER_NAMES.items():
        j = jobs.get(f"optim_{kind}")
        if j is None:
            continue
        r = j.result
        if r.get("outcome") == "unavailable":
            rows.append([label, "not measured: " + r.get("reason", "unavailable").split(":")[0], "", "", "", "",
                         f"`{j.path}`"])
            continue
        memq_state = memq_result(j.snaps)["composition"]["optimizer_state"] if j.snaps else None
        extra = r.get("step_extra_peak_bytes") or []
        figs[kind] = r
        rows.append([label, b(r["state_bytes"]), x(r["state_bytes"], r["param_bytes"]) if r["state_bytes"] else "0",
                     b(memq_state), b(extra[0] if extra else None) + " / " + b(steady(extra)),
                     ms(steady(r.get("opt_step_ms"))), f"`{j.path}`"])
    p = next(iter(figs.values()))
    lines = [heading("optimizer-state"), "", advice("optimizer-state"), "",
             f"A GPT of {p['param_count'] / 1e6:.0f}M parameters ({b(p['param_bytes'])} of fp32 parameters, "
             f"gradients the same), three optimizer steps at batch 8 x 256 on an H200. *State* is what the "
             "optimizer keeps between steps (its `state` tensors, measured by torch); *memq counted* is the "
             "optimizer state memq's composition finds in the agent's snapshot after the last step; the *step's "
             "own peak* is what `opt.step()` allocates above what was live before it, in the first step (the "
             "state is created) and later steps (temporaries). (`" + PLAYBOOK_FIX_REL + "/optim_*`)", "",
             table(["optimizer", "state", "state / parameter bytes", "memq counted", "step's own peak (first / later)",
                    "opt.step() time", "fixture"], rows), ""]
    sgdm, adamw = figs.get("sgd_momentum"), figs.get("adamw")
    if sgdm and adamw:
        more = "more" if sgdm["state_bytes"] > adamw["state_bytes"] else "less"
        lines.append(f"- SGD with momentum keeps {x(sgdm['state_bytes'], sgdm['param_bytes'])} the parameter bytes, "
                     f"AdamW {x(adamw['state_bytes'], adamw['param_bytes'])}: SGD with momentum needs {more} "
                     f"memory than AdamW ({b(sgdm['state_bytes'])} against {b(adamw['state_bytes'])}). "
                     f"Plain SGD keeps none. (`{jobs['optim_sgd_momentum'].path}`, `{jobs['optim_adamw'].path}`)")
    fused, fe = figs.get("adamw_fused"), figs.get("adamw")
    loop = figs.get("adamw_forloop")
    if fused and fe and loop:
        lines.append(f"- Same state for every AdamW implementation; what differs is the step's temporaries: "
                     f"foreach {b(steady(fe['step_extra_peak_bytes']))} per step above the live set, "
                     f"for-loop {b(steady(loop['step_extra_peak_bytes']))}, fused "
                     f"{b(steady(fused['step_extra_peak_bytes']))}. Near the limit, `fused=True` removes the "
                     f"foreach step's extra peak; it saves no state. (`{jobs['optim_adamw_fused'].path}`)")
    if fe:
        lines.append("- The first step creates the state: AdamW's first `opt.step()` needed "
                     f"{b(fe['step_extra_peak_bytes'][0])} "
                     "more than the step before it. An OOM there is memq's `optimizer_state` cause; a leaner optimizer "
                     "or sharding the state (ZeRO/FSDP) is the fix, not an allocator setting. "
                     f"(`{jobs['optim_adamw'].path}`)")
    eightbit = jobs.get("optim_adamw_8bit")
    e8 = figs.get("adamw_8bit")
    if e8 and adamw:
        counted = memq_result(eightbit.snaps)["composition"]["optimizer_state"]
        lines.append(f"- 8-bit AdamW (bitsandbytes) keeps {x(e8['state_bytes'], e8['param_bytes'])} the parameter "
                     f"bytes in its state tensors, {x(e8['state_bytes'], adamw['state_bytes'])} of AdamW's; its first "
                     f"step left {b(e8['step_extra_peak_bytes'][0])} live, which is what memq counted ({b(counted)}), "
                     f"{b(counted - e8['state_bytes'])} more than the tensors in `opt.state`. Its step took "
                     f"{ms(steady(e8['opt_step_ms']))} against {ms(steady(adamw['opt_step_ms']))} for foreach AdamW. "
                     f"(`{eightbit.path}`)")
    elif eightbit is not None and eightbit.result.get("outcome") == "unavailable":
        lines.append("- 8-bit AdamW was not measured: bitsandbytes was not installed on the capture machine "
                     f"(`{eightbit.path}/result.json` says why). Its state is 2 bytes per parameter by design "
                     "(0.5x the fp32 parameter bytes); that figure is the library's, not ours.")
    return "\n".join(lines)


def section_checkpointing(jobs: dict[str, Job]) -> str:
    rows, by = [], {}
    for bsz in (8, 32):
        for c in ("on", "off"):
            j = jobs.get(f"ckpt_{c}_b{bsz}")
            if j is None:
                continue
            r = j.result
            agent = j.snaps[-1].loaded.snapshot.agent if j.snaps else None
            memq_peak = max((f.peak_allocated for f in (agent.step_figures if agent else ())[1:]), default=None)
            by[(c, bsz)] = r
            rows.append([f"{bsz} x {r['seq']}", c, b(steady(r["saved_after_forward"])),
                         b(steady(r["step_peak_above_static"])), b(memq_peak), ms(steady(r["step_ms"])), f"`{j.path}`"])
    lines = [heading("activation-checkpointing"), "", advice("activation-checkpointing"), "",
             "The same GPT with AdamW, checkpointing per transformer block on or off, at two batch sizes of 512-token "
             "sequences. *Saved by forward* is what autograd keeps for the backward pass at the end of the forward "
             "pass; *step peak* is the step's peak above parameters and optimizer state; *memq's step peak* is the "
             "largest per-step peak the agent measured (its `step_figures`, agent defaults) over the steps after "
             "the first; times are medians of steps after the first.", "",
             table(["batch", "checkpointing", "saved by forward", "step peak above static", "memq's step peak",
                    "step time", "fixture"], rows), ""]
    for bsz in (8, 32):
        on, off = by.get(("on", bsz)), by.get(("off", bsz))
        if on and off:
            s_on, s_off = steady(on["saved_after_forward"]), steady(off["saved_after_forward"])
            p_on, p_off = steady(on["step_peak_above_static"]), steady(off["step_peak_above_static"])
            t_on, t_off = steady(on["step_ms"]), steady(off["step_ms"])
            lines.append(f"- Batch {bsz}: checkpointing keeps {x(s_on, s_off)} of the activations "
                         f"({b(s_on)} against {b(s_off)}) and lowers the step's peak {b(p_off)} -> {b(p_on)}, "
                         f"for {(t_on / t_off - 1) * 100:+.0f}% step time. (`{jobs[f'ckpt_on_b{bsz}'].path}`, "
                         f"`{jobs[f'ckpt_off_b{bsz}'].path}`)")
    a8, a32 = by.get(("off", 8)), by.get(("off", 32))
    if a8 and a32:
        ratio = x(steady(a32["saved_after_forward"]), steady(a8["saved_after_forward"]))
        lines.append(f"- Activations scale with the batch: 4x the batch saved {ratio} "
                     "the bytes. Halving the batch halves them; it does nothing for parameters, gradients or "
                     "optimizer state, so when those dominate (memq's composition says which), a smaller batch "
                     f"cannot fix the OOM. (`{jobs['ckpt_off_b8'].path}`, `{jobs['ckpt_off_b32'].path}`)")
    on8, on32 = by.get(("on", 8)), by.get(("on", 32))
    if on8 and on32 and abs(steady(on8["step_ms"]) / steady(on32["step_ms"]) - 1) < 0.15:
        lines.append(f"- With checkpointing, batch 8 took as long as batch 32 ({ms(steady(on8['step_ms']))} against "
                     f"{ms(steady(on32['step_ms']))}): a step that small is bound by the CPU launching kernels, and "
                     "recomputation doubles the launches, so its relative cost is largest on small steps. "
                     f"(`{jobs['ckpt_on_b8'].path}`, `{jobs['ckpt_on_b32'].path}`)")
    lines.append("- The step peak falls less than the saved activations: the recomputed block, the logits and "
                 "the loss still peak inside the step. A memq `activation_spike` (one input far larger than the "
                 "others) needs the input bounded (bucketing, a max length), not checkpointing everywhere.")
    return "\n".join(lines)


def section_empty_cache(jobs: dict[str, Job]) -> str:
    j = jobs["empty_cache"]
    r = j.result
    before = memq_result(j.snaps, 0)["metrics"]
    after = memq_result(j.snaps, 1)["metrics"]
    released = r["reserved_before"] - r["reserved_after"]
    whole_free = before["reserved_bytes"] - before["allocated_bytes"] - before["stranded_bytes"]
    oom_idx = next((i for i, s in enumerate(j.snaps) if s.trigger == "oom"), None)
    oom_res = memq_result(j.snaps, oom_idx) if oom_idx is not None else None
    cite = f"`{j.path}`"
    rows = [["reserved", b(r["reserved_before"]), b(r["reserved_after"]), b(before["reserved_bytes"]),
             b(after["reserved_bytes"]), cite],
            ["allocated (live)", b(r["allocated_before"]), b(r["allocated_after"]), b(before["allocated_bytes"]),
             b(after["allocated_bytes"]), cite],
            ["free, in segments with live blocks (stranded)", "", "", b(before["stranded_bytes"]),
             b(after["stranded_bytes"]), cite]]
    lines = [heading("empty-cache"), "", advice("empty-cache"), "",
             "32 segments of 20 MiB each holding one live 8 MiB tensor and 12 MiB free beside it, and 16 whole "
             "64 MiB segments with nothing live: torch's counters and memq's analysis of the agent's snapshots "
             f"taken just before and just after `torch.cuda.empty_cache()` (`{j.path}`).", "",
             table(["", "torch, before", "torch, after", "memq, before", "memq, after", "fixture"], rows), "",
             f"- `empty_cache()` returned {b(released)}: exactly the free bytes memq counted outside segments "
             f"with live blocks before the call ({b(whole_free)}). The {b(after['stranded_bytes'])} memq calls "
             f"stranded stayed reserved: a segment goes back to the driver only when nothing in it is live. "
             f"(`{j.path}`)"]
    att = r.get("attempts") or []
    if att:
        outs = ", ".join(f"{a['attempt']}: {'out of memory' if a['outcome'] == 'oom' else 'allocated'}" for a in att)
        lines.append(f"- Then, under a cap of {b(r['cap_bytes'])}, a request of {b(r['request_bytes'])} while "
                     f"{b(after['stranded_bytes'])} sat free in pieces: {outs}. Before raising, the allocator "
                     "already frees every cached segment it can and retries, so calling `empty_cache()` after an "
                     "OOM (or before one) cannot make the request fit in the same process."
                     + (f" memq's diagnosis of that OOM: {cause(oom_res)}." if oom_res else "")
                     + f" Once the live neighbours were freed, the same request was "
                     f"{r.get('after_freeing_neighbours')}. (`{j.path}`)")
    ck = jobs.get("ckpt_off_b32")
    if ck:
        c = ck.result
        lines.append(f"- Between training steps (checkpointing off, batch 32): `empty_cache()` took reserved from "
                     f"{b(c['reserved_before_empty_cache'])} to {b(c['reserved_after_empty_cache'])}, and the next "
                     f"step reserved {b(c['reserved_after_next_step'])} again, taking "
                     f"{ms(c['step_ms_after_empty_cache'])} "
                     f"against a median of {ms(steady(c['step_ms']))}. What it gives back, the next step takes "
                     f"again. (`{ck.path}`)")
    every, default = jobs.get("alloc_empty_cache_every_step"), jobs.get("alloc_default")
    if every and default:
        e, d = every.result, default.result
        lines.append("- `empty_cache()` after every step of the fragmenting job of "
                     "[the next section](#allocator-settings), "
                     f"at the same cap: {outcome(e)} (the default allocator: {outcome(d)}), median step "
                     f"{ms(common_step_ms(e))} against {ms(common_step_ms(d))} over the steps both ran. "
                     f"(`{every.path}`)")
    return "\n".join(lines)


def outcome(r: dict) -> str:
    if r.get("outcome") == "oom":
        return f"out of memory in step {r.get('oom_step')}"
    return f"completed {r.get('steps_completed')} steps"


COMMON_STEPS = (1, 5)  # steps 1-4: every allocator setting's run got that far (the first OOM was in step 5)


def common_step_ms(r: dict) -> float | None:
    v = (r.get("step_ms") or [])[COMMON_STEPS[0]:COMMON_STEPS[1]]
    return statistics.median(v) if v else None


ALLOC_ORDER = (("default", "(none: torch's default)", "allocator-settings"),
               ("expandable", "expandable_segments:True", "expandable-segments"),
               ("split128", "max_split_size_mb:128", "max-split-size"),
               ("split512", "max_split_size_mb:512", "max-split-size"),
               ("gc06", "garbage_collection_threshold:0.6", "gc-threshold"),
               ("gc06_split256", "garbage_collection_threshold:0.6,max_split_size_mb:256", "gc-threshold"),
               ("roundup4", "roundup_power2_divisions:4", "roundup-power2"),
               ("empty_cache_every_step", "(none) + empty_cache() after every step", "empty-cache"))


def section_allocator(jobs: dict[str, Job], captures: dict) -> str:
    cap = next((c.get("alloc_cap") for c in captures.get("captures", []) if c.get("alloc_cap")), {})
    rows, res = [], {}
    for key, conf, _entry in ALLOC_ORDER:
        j = jobs.get(f"alloc_{key}")
        if j is None:
            continue
        r = j.result
        res[key] = (j, r)
        verdict = "no OOM to diagnose"
        if r.get("outcome") == "oom" and j.snaps:
            verdict = cause(memq_result(j.snaps, limit=cap.get("cap_bytes")))
        rows.append([f"`{conf}`" if not conf.startswith("(") else conf, outcome(r), b(r.get("run_peak_reserved")),
                     ms(common_step_ms(r)), ms(steady(r.get("step_ms"))) if r.get("outcome") != "oom" else "",
                     verdict, f"`{j.path}`"])
    probe = jobs.get("alloc_probe")
    lines = [heading("allocator-settings"), "", advice("allocator-settings"), "",
             f"A fragmenting job: the ~120M GPT with SGD+momentum on a seeded schedule of 45 random (batch, sequence) "
             f"shapes, each setting in its own process under the same cap of {b(cap.get('cap_bytes'))} "
             f"({cap.get('ratio')} x the {b(cap.get('probe_max_allocated'))} the job needs at its peak, measured "
             f"without a cap under expandable segments: `{probe.path if probe else 'n/a'}`). Step times: the "
             f"median of steps {COMMON_STEPS[0]}-{COMMON_STEPS[1] - 1} (every run got that far) and of the whole run "
             "for runs that completed. *memq says* is memq's diagnosis of the run's OOM snapshot (agent defaults).", "",
             table(["setting", "outcome", "peak reserved", f"step time, steps {COMMON_STEPS[0]}-{COMMON_STEPS[1] - 1}",
                    "step time, whole run", "memq says", "fixture"], rows), ""]
    ok = [conf for key, conf, _ in ALLOC_ORDER if key in res and res[key][1].get("outcome") != "oom"]
    bad = [conf for key, conf, _ in ALLOC_ORDER if key in res and res[key][1].get("outcome") == "oom"]
    lines.append(f"- At this cap, these completed: {', '.join(ok) or 'none'}; these ran out of memory: "
                 f"{', '.join(bad) or 'none'}. The live set fits the cap in every run; what differs is how the "
                 "cached free memory is cut up, which is why only a fragmentation OOM can be fixed this way. An OOM "
                 "memq calls capacity, activation_spike, optimizer_state or leak fails under every setting.")
    return "\n".join(lines) + "\n\n" + "\n\n".join(_setting_notes(res))


def _setting_notes(res: dict) -> list[str]:
    def row(key):
        j, r = res[key]
        return f"{outcome(r)}, peak reserved {b(r.get('run_peak_reserved'))} (`{j.path}`)"

    d = res.get("default")
    base = f" The default allocator at the same cap: {row('default')}." if d else ""
    notes = []
    if "expandable" in res:
        notes.append(heading("expandable-segments", 3) + "\n\n" + advice("expandable-segments") + "\n\n"
                     f"- Measured: {row('expandable')}.{base} Segments grow in place, so the free bytes between "
                     "allocations of different sizes can be mapped to the next request instead of staying "
                     "stranded. It is the setting to try first for a fragmentation OOM; it cannot help when the "
                     "live set alone exceeds the limit.")
    if "split128" in res or "split512" in res:
        parts = [f"`max_split_size_mb:{k[5:]}`: {row(k)}" for k in ("split128", "split512") if k in res]
        notes.append(heading("max-split-size", 3) + "\n\n" + advice("max-split-size") + "\n\n"
                     f"- Measured: {'; '.join(parts)}.{base} The value matters: blocks above it are never split, "
                     "so a threshold below the job's large tensors keeps them whole for reuse, while one above "
                     "them changes little.")
    if "gc06" in res or "gc06_split256" in res:
        parts = [f"`{c}`: {row(k)}" for k, c, _ in ALLOC_ORDER if k in ("gc06", "gc06_split256") and k in res]
        notes.append(heading("gc-threshold", 3) + "\n\n" + advice("gc-threshold") + "\n\n"
                     f"- Measured: {'; '.join(parts)}.{base} Freeing cached blocks early lowers reserved memory "
                     "between peaks; it does not join the pieces a large request needs.")
    if "roundup4" in res:
        notes.append(heading("roundup-power2", 3) + "\n\n" + advice("roundup-power2") + "\n\n"
                     f"- Measured: {row('roundup4')}.{base} Rounding requests up to fewer sizes helps reuse and "
                     "costs rounding waste on every block; memq's `allocator_config` cause is that waste turning a "
                     "fit into an OOM.")
    return notes


def epoch_live(job: Job) -> list[tuple[int | None, int]]:
    """memq's live bytes at each epoch-end snapshot (its comparable points)."""
    out = []
    for i, s in enumerate(job.snaps):
        if s.trigger == "epoch_end":
            out.append((s.epoch, memq_result(job.snaps, i)["metrics"]["allocated_bytes"]))
    return out


def section_leak(jobs: dict[str, Job]) -> str:
    kept, fixed = jobs.get("leak_kept"), jobs.get("leak_fixed")
    lines = [heading("kept-tensors"), "", advice("kept-tensors"), ""]
    rows = []
    for j in (kept, fixed):
        if j is None:
            continue
        live = epoch_live(j)
        growth = [b2 - a2 for (_, a2), (_, b2) in zip(live, live[1:], strict=False)]
        res = memq_result(j.snaps, limit=j.result.get("cap_bytes"))
        ev = next((c["evidence"] for c in res["diagnosis"]["causes"] if c["cause"] == "leak"), [])
        where = next((e for e in ev if ".py:" in e), "")
        rows.append(["kept logits (the bug)" if j is kept else "a float per batch (the fix)", outcome(j.result),
                     " -> ".join(b(v) for _, v in live[:6]) + (" ..." if len(live) > 6 else ""),
                     b(statistics.median(growth)) if growth else "n/a", cause(res), f"`{j.path}`"])
        if j is kept:
            kept_where = where
    lines += ["A 4-layer GPT whose validation loop appends each batch's logits to a list "
              "(`all_logits.append(logits.float())`), "
              "under a cap of the first step's reserved bytes plus 8 epochs of that growth; the fix keeps a float per "
              "batch instead. Live bytes are memq's, at the agent's epoch-end snapshots (agent defaults).", "",
              table(["job", "outcome", "live bytes at epoch ends", "growth per epoch", "memq says", "fixture"], rows),
              ""]
    if kept:
        lines.append(f"- The kept logits add {b(kept.result.get('growth_per_epoch'))} an epoch by construction "
                     "(2 batches x 4 x 256 x 32,000 fp32); memq's epoch-end live bytes grow by that much, and the "
                     "OOM comes when they reach the cap, however the allocator is set."
                     + (f" memq names the line: {kept_where}." if kept_where else "") + f" (`{kept.path}`)")
    lines.append("- `empty_cache()` and allocator settings cannot help: the bytes are live. The fix is in the "
                 "code that keeps them (`.item()`, `.detach().cpu()`, or aggregating on the GPU into one tensor).")
    return "\n".join(lines)


def section_external(real: Path) -> str:
    meta = json.loads((real / "meta.json").read_text())
    from memq.model import OomContext
    from memq.oom_message import parse_oom_message

    loaded = load_snapshot_file(real / "oom.pickle.gz")
    res = analyze([loaded], OomContext(message=parse_oom_message(meta["oom_message"])))
    return "\n".join([heading("external-memory"), "", advice("external-memory"), "",
                      f"- Measured: another process held {b(meta['external_bytes'])} of the H200; the job's own "
                      f"reserved memory was {b(res['metrics']['reserved_bytes'])} when a request of "
                      f"{b(res['oom']['requested_bytes'])} failed. memq, given the OOM message: {cause(res)}. "
                      f"(`{_rel(real)}`)",
                      "- No PyTorch setting and no `empty_cache()` frees memory that PyTorch does not hold: find the "
                      "other process (`nvidia-smi --query-compute-apps=pid,used_memory --format=csv`) or give each "
                      "job its own device."])


def _first_alloc(meta: dict) -> int | None:
    snaps = meta.get("snapshots")
    return snaps[0].get("alloc") if isinstance(snaps, list) and snaps else None


def section_workspace(cap_dir: Path) -> str:
    meta = json.loads((cap_dir / "meta.json").read_text())
    return "\n".join([heading("workspace"), "", advice("workspace"), "",
                      f"- Measured (`{_rel(cap_dir)}`): a conv net with `cudnn.benchmark=True` under a cap of "
                      f"{b(meta['cap_bytes'])}: cuDNN asked for {b(_first_alloc(meta))} at once and "
                      f"{meta.get('internal_ooms')} requests ran out of memory during its plan search; the job "
                      f"{meta.get('outcome')} with peak reserved {b(meta.get('max_reserved'))}. "
                      "cuDNN's benchmark mode sizes its first workspace request from the device's free memory, not "
                      "from the per-process cap, catches the OOM and halves the request: the job goes on, but "
                      "`num_ooms` counts every catch and reserved memory swings far above allocated while plans "
                      "are tried.",
                      "- When such a request is the one that fails (frames in cuDNN or cuBLAS, memq's `workspace` "
                      "cause), turn benchmark mode off for that shape or cap the workspace "
                      "(`CUBLAS_WORKSPACE_CONFIG`, `torch.backends.cudnn.benchmark = False`); "
                      "an allocator setting does "
                      "not change the request."])


def memq_ranks(snaps: list[Snap], ends: dict[int, dict]) -> dict:
    """memq's cross-rank diagnosis: each rank's snapshots analysed together, then compared."""
    facts = []
    for rank in sorted(set(ends) | {s.rank for s in snaps}):
        own = [s for s in snaps if s.rank == rank]
        res = memq_result(own) if own else None
        oom = next((s for s in own if s.trigger == "oom"), None)
        facts.append(rank_facts_from(rank, ends.get(rank, {}), res, oom_step=oom.step if oom else None,
                                     oom_at=oom.ts_s if oom else None))
    return diagnose_ranks(facts)


def section_ranks(ddp: Path) -> str:
    rows, verdicts = [], []
    for sc in ("balanced", "data", "leak"):
        d = ddp / sc / "spool"
        if not d.exists():
            continue
        snaps, ends = read_spool(d)
        for rank in sorted(ends):
            f = ends[rank].get("figures") or {}
            rows.append([sc, str(rank), ends[rank].get("status", "?"), b(f.get("peak_allocated_bytes")),
                         b(f.get("peak_reserved_bytes")), b(f.get("limit_bytes")), f"`{_rel(ddp / sc)}`"])
        out = memq_ranks(snaps, ends)
        first = (out["recommendations"] or [{}])[0].get("action", "")
        verdicts.append([sc, "none" if out["failed_rank"] is None else str(out["failed_rank"]),
                         out["cause"] or "n/a", out["imbalance"] or "none", first or "n/a", f"`{_rel(ddp / sc)}`"])
    return "\n".join([heading("rank-imbalance"), "", advice("rank-imbalance"), "",
                      "Two-rank DDP jobs under torchrun on one H200 (gloo), the same cap on each rank, "
                      "the agent in each "
                      "rank: balanced; rank 1 fed 4x longer sequences (a sharding bug); rank 1 keeping every step's "
                      "logits. Each rank's own figures, sent by its agent at exit (also when torchrun tears it down):",
                      "",
                      table(["job", "rank", "status", "peak allocated", "peak reserved", "cap", "fixture"], rows), "",
                      "memq's cross-rank diagnosis of the same spools (each rank's snapshots analysed, "
                      "then compared):", "",
                      table(["job", "failing rank", "its cause", "imbalance", "memq's first advice", "fixture"],
                            verdicts),
                      "",
                      "- When one rank fails and the others sit far below the cap, a smaller batch for every rank "
                      "wastes the others' memory: rebalance or bucket the shards by length for data imbalance, fix "
                      "the rank's own code for a leak. `memq history --run R` shows the ranks side by side."])


def render(jobs: dict[str, Job], captures: dict) -> str:
    machine = captures.get("machine", "n/a")
    # The page is the product's: it names the machine and where the capture is described, not the
    # commands and scratch folders of the capture itself (benchmarks/gpu/README.md has those). It is
    # generated, never edited by hand: tests/analysis/test_playbook_doc.py regenerates and compares it.
    parts = ["# The OOM playbook: popular advice, measured", "",
             "Each section takes one piece of advice that forum threads give for `CUDA out of memory`, says when it "
             "helps and when it cannot, and shows the figures from real runs. Every figure cites the fixture it was "
             "measured on; memq's figures are memq's own analysis of what its agent sent from the same job, so this "
             "page is regenerated (and checked in CI) whenever the analyzer changes. memq's recommendations link "
             "to these sections (`memq playbook ID` prints one).", "",
             f"Runs: {machine}; each job ran once with the memq agent in it, as the capture script "
             "benchmarks/gpu/playbook_capture.py records them (benchmarks/gpu/README.md, \"The OOM playbook's "
             "runs\").", "",
             "| entry | the advice | in one line |", "|---|---|---|"]
    parts += [f"| [{e.title}](#{e.id}) | {e.advice} | {e.summary} |" for e in pb.ENTRIES]
    parts += ["", section_optimizer(jobs), "", section_checkpointing(jobs), "", section_empty_cache(jobs), "",
              section_allocator(jobs, captures), "", section_leak(jobs), "",
              section_external(FIXTURES / "real" / "external"), "",
              section_workspace(FIXTURES / "captured" / "cudnn_workspace"), "",
              section_ranks(FIXTURES / "ddp_ranks"), ""]
    return "\n".join(parts)


CITATION = re.compile(r" ?\((?:`tests/fixtures/[^`]+`(?:, )?)+\)")
SOURCES_NOTE = ("Every figure cites the fixture it was measured on; memq's figures are memq's own analysis of what "
                "its agent sent from the same job, so this page is regenerated (and checked in CI) whenever the "
                "analyzer changes. ")
USER_NOTE = "memq's figures are memq's own analysis of what its agent sent from the same job. "


def user_text(dev: str) -> str:
    """The page a user reads (the wheel's `memq playbook`, /playbook, docs/playbook.md): the situations
    and figures without the repository's fixture paths, columns, or how the page is kept up to date."""
    out, drop = [], None
    for line in dev.replace(SOURCES_NOTE, USER_NOTE).splitlines():
        if line.startswith("|"):
            cells = line[1:-1].split("|")
            names = [c.strip() for c in cells]
            if "fixture" in names:
                drop = names.index("fixture")
            if drop is not None and drop < len(cells):
                cells = cells[:drop] + cells[drop + 1:]
            line = "|" + "|".join(cells) + "|"
        else:
            drop = None  # a table ended
            line = CITATION.sub("", line).replace("Measured (`", "Measured (").replace("`): ", "): ")
            line = re.sub(r": `tests/fixtures/[^`]+`\)", ")", line)  # "(..., measured ...: `tests/fixtures/x`)"
        out.append(line)
    return "\n".join(out)


def generate() -> str:
    captures = json.loads((PLAYBOOK_FIX / "captures.json").read_text())
    return render(load_all(), captures)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed files instead of writing")
    a = ap.parse_args(argv)
    dev = generate()
    texts = {out: user_text(dev) for out in OUTPUTS} | {SOURCES: dev}
    if a.check:
        bad = 0
        for out, text in texts.items():
            old = out.read_text() if out.exists() else ""
            if old != text:
                bad = 1
                sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                           f"{_rel(out)} (committed)", f"{_rel(out)} (regenerated)"))
        if bad:
            print("\nthe playbook differs from its fixtures: run `python benchmarks/playbook.py`", file=sys.stderr)
        return bad
    for out, text in texts.items():
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        print(f"wrote {_rel(out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
