"""An uncapped run's limit is its card less what is held outside its PyTorch, known from run_start on:
the dispatcher keeps the agent's non_pytorch_bytes on the run and the run's limit reads it."""

from __future__ import annotations

import json

from sqlalchemy import select

from memq.pipeline.history import run_limit
from memq.store.orm import Run
from memq.workers.dispatcher import Dispatcher
from tests.workers.test_poison import _fields, world  # noqa: F401 - the fixture

GiB = 1 << 30


def test_run_start_gives_an_uncapped_run_its_card_less_memory_outside_pytorch(world):  # noqa: F811
    env, st, r = world
    card = {"device_total": 140 * GiB, "limit_bytes": 140 * GiB, "memory_fraction": 1.0,
            "non_pytorch_bytes": GiB // 2}
    capped = dict(card, limit_bytes=40 * GiB, memory_fraction=40 / 140, process_cap_bytes=40 * GiB)
    odd = dict(card, non_pytorch_bytes=200 * GiB)  # more than the device: not a figure to keep
    for name, payload in (("card", card), ("capped", capped), ("odd", odd)):
        r.xadd(st.stream_key, _fields("run_start", run=name, payload=json.dumps(payload)))
    d = Dispatcher(st, consumer="c1", block_ms=50, enqueue=lambda sid: None)
    d.run(install_signals=False, idle_exit_s=0.5)
    with d.store.session() as s:
        rows = {x.name: x for x in s.execute(select(Run)).scalars()}
        got = {n: (x.non_pytorch_bytes, run_limit(x, None)) for n, x in rows.items()}
    assert got["card"] == (GiB // 2, {"bytes": 140 * GiB - GiB // 2,
                                      "source": "the device less memory outside PyTorch"})
    assert got["capped"] == (GiB // 2, {"bytes": 40 * GiB, "source": "the run's cap"})
    # an implausible outside figure is not kept: the limit falls back to the device total
    assert got["odd"] == (None, {"bytes": 140 * GiB, "source": "the device total"})
