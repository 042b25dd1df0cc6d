"""Each rank's own figures at exit (run_end `figures` and the `stats` flush before it), also when the
launcher kills the rank with SIGTERM or the process group was aborted: a real agent on ReplaySource
(the seed_adamw recording) against the shared Redis under a test prefix."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch.distributed as dist

from .conftest import REAL, SHARED_URL, entries, make_agent

ROOT = Path(__file__).resolve().parents[2]


def _line_peaks(folder: str) -> tuple[int, int]:
    lines = [json.loads(x) for x in (REAL / folder / "stats.jsonl").read_text().splitlines() if x.strip()]
    return (max(x["allocated_bytes.all.peak"] for x in lines), max(x["reserved_bytes.all.peak"] for x in lines))


def _steps(a, n: int) -> None:
    for step in range(n):
        time.sleep(0.002)  # a step longer than a boundary's reading: every boundary is read
        a.mark_step(step, step // 15)


def test_run_end_carries_the_rank_figures(shared):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, rank=1, step_budget=1.0)
    _steps(a, 45)  # seed_adamw/stats.jsonl has 45 lines: the boundaries read every one of them
    a.stop(10)
    got = entries(r, stream)
    end = got[-1]
    assert end.kind == "run_end" and end.rank == 1
    fig = end.payload["figures"]
    peak_alloc, peak_res = _line_peaks("seed_adamw")
    assert (fig["peak_allocated_bytes"], fig["peak_reserved_bytes"]) == (peak_alloc, peak_res)
    assert fig["last_step"] == 44 and fig["steps"] == 45 and fig["end_reason"] is None
    assert fig["limit_bytes"] == 150109880320  # no cap in this recording: the device's total
    sent = [f for e in got if e.kind == "stats" for f in e.payload.get("step_figures", [])]
    sp = fig["step_peaks"]
    assert sp["count"] == len(sent) == 45
    assert sp["max_peak_allocated"] == max(f["peak_allocated"] for f in sent) == peak_alloc
    assert sp["median_peak_allocated"] == sorted(f["peak_allocated"] for f in sent)[22]
    # the stats flush just before run_end carries the same figures (kept if run_end never arrives)
    stats = [e for e in got if e.kind == "stats" and "rank_figures" in e.payload]
    assert len(stats) == 1 and got.index(stats[0]) < len(got) - 1
    assert stats[0].payload["rank_figures"] == fig


def test_process_group_abort_is_named(shared):
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, rank=0, step_budget=1.0)
    _steps(a, 5)
    a.__exit__(dist.DistBackendError, dist.DistBackendError("NCCL communicator was aborted on rank 0"), None)
    end = entries(r, stream)[-1]
    assert end.kind == "run_end" and end.payload["status"] == "crashed"
    assert end.payload["figures"]["end_reason"] == "process_group_aborted"
    assert end.payload["figures"]["last_step"] == 4


_CHILD = textwrap.dedent("""
    import os, signal, sys, time
    sys.path.insert(0, {root!r})
    from memq.agent import Agent
    from memq.agent.source import ReplaySource
    chained = {chain!r}
    if chained:
        signal.signal(signal.SIGTERM, lambda s, f: (open(chained, "w").write("called"), sys.exit(7)))
    a = Agent("term-run", "test-cluster", rank=1, source=ReplaySource({folder!r}), redis_url={url!r},
              stream={stream!r}, key_prefix={prefix!r}, fsync=False, signal=None, stats_interval_s=3600,
              snapshot_every_s=0, spool_dir={spool!r}, step_budget=1.0).start()
    for step in range(7):
        time.sleep(0.002)
        a.mark_step(step, 0)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    print("not killed")
""")


def _term_child(tmp_path, shared, chain: str | None) -> subprocess.CompletedProcess:
    r, prefix, stream = shared
    code = _CHILD.format(root=str(ROOT), chain=chain, folder=str(REAL / "seed_adamw"), url=SHARED_URL,
                         stream=stream, prefix=prefix, spool=str(tmp_path / "spool"))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_sigterm_sends_figures_then_dies_of_sigterm(tmp_path, shared):
    r, _, stream = shared
    p = _term_child(tmp_path, shared, None)
    assert p.returncode == -signal.SIGTERM, p.stderr  # the default action is kept
    assert "not killed" not in p.stdout
    end = entries(r, stream)[-1]
    assert end.kind == "run_end" and end.run == "term-run" and end.rank == 1
    assert end.payload["status"] == "crashed"
    fig = end.payload["figures"]
    assert fig["end_reason"] == "sigterm" and fig["last_step"] == 6 and fig["peak_allocated_bytes"] > 0


def test_sigterm_chains_the_previous_handler(tmp_path, shared):
    r, _, stream = shared
    mark = tmp_path / "chained"
    p = _term_child(tmp_path, shared, str(mark))
    assert p.returncode == 7 and mark.read_text() == "called", p.stderr
    end = entries(r, stream)[-1]
    assert end.kind == "run_end" and end.payload["figures"]["end_reason"] == "sigterm"


def test_cap_set_after_start_reaches_the_figures_without_a_step_boundary(shared):
    """A rank that dies in its first step (the DDP capture's data-imbalanced rank 1) never reaches a
    step boundary; its cap, set with set_per_process_memory_fraction after the agent started, must still
    be the figures' limit, not the device total read when the agent armed."""
    r, prefix, stream = shared
    a = make_agent(stream=stream, key_prefix=prefix, rank=1, step_budget=1.0)
    cap = 15_011_000_000
    a.source.meta["cap_bytes"] = cap  # what the job's set_per_process_memory_fraction does after start
    a.stop(10)
    end = entries(r, stream)[-1]
    assert end.kind == "run_end"
    assert end.payload["figures"]["limit_bytes"] == cap
    assert end.payload["figures"]["last_step"] is None
