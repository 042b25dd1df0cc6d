"""The production source on a machine without CUDA (CPU torch; tests/run.sh installs torch==2.13.0, and a
missing torch fails the import here). On a machine with a GPU the no-CUDA test runs again in a process
that sees no device, rather than being skipped."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import torch  # the CPU build is part of the test set-up (tests/run.sh)

from .conftest import entries, make_agent


def test_no_cuda_production_source_is_quiet_and_fast(shared, tmp_path):
    from memq.agent.source import TorchSource

    if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES") != "":
        # a machine with a GPU: the same test again in a process that sees none (never skipped)
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                            f"{__file__}::test_no_cuda_production_source_is_quiet_and_fast"],
                           env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-2000:]
        return
    r, prefix, stream = shared
    src = TorchSource()
    assert src.present() is torch.cuda.is_available() is False
    assert src.ready() is False and src.stats() is None and src.snapshot() is None
    t0 = time.perf_counter()
    a = make_agent(source=src, stream=stream, key_prefix=prefix, spool_dir=tmp_path / "s")
    for i in range(200):
        a.mark_step(i, 0)
    a.mark_epoch(0)
    assert a.snapshot("manual") is False
    c = a.stop(5)
    assert time.perf_counter() - t0 < 2.0
    assert c["errors"] == 0 and c["dropped"] == 0
    got = entries(r, stream)
    assert [e.kind for e in got] == ["run_start", "run_end"]  # eager announce; nothing else to send
    assert got[0].payload["torch"] == torch.__version__ and got[0].payload["cuda_available"] is False
    assert not torch.cuda.is_initialized()  # the agent never initialises CUDA


def test_agent_started_before_torch_is_imported(tmp_path):
    code = f"""
import sys
from memq import agent
a = agent.start(run='early', cluster='c', spool_dir={str(tmp_path)!r}, redis_url='redis://127.0.0.1:1/0',
                signal=None)
assert 'torch' not in sys.modules  # the agent did not import it
import torch
assert a.source._present is False  # checked right after `import torch` (import hook), no CUDA here
agent.mark_step(0, 0)
print('ok', agent.stop(2)['errors'] >= 0)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok True" in out.stdout, out.stderr
