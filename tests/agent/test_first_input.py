"""The agent reads, once, at the first module forward: CUDA autocast's state and the input's shapes
(what `memq fit` tells autocast's weight copies from input-sized blocks with, and the batch the run
measured), then removes its hook: nothing runs at later forwards. CPU torch here: autocast of CUDA is
off (the GPU captures of benchmarks/gpu/fit_families.py record it on)."""

from __future__ import annotations

import torch
import torch.nn.modules.module as mm

from memq.snapshot import parse_agent_info

from .conftest import make_agent


def test_first_forward_is_read_once_and_the_hook_removed(tmp_path):
    before = len(mm._global_forward_pre_hooks)
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0")
    try:
        assert len(mm._global_forward_pre_hooks) == before + 1
        model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())
        model(torch.zeros(16, 8))
        assert len(mm._global_forward_pre_hooks) == before  # gone after the first forward
        assert a._first_input == {"module": "Sequential", "autocast": "off", "shapes": [[16, 8]],
                                  "dtypes": ["float32"]}
        model(torch.zeros(32, 8))
        assert a._first_input["shapes"] == [[16, 8]]  # the first one, not the latest
    finally:
        a.stop(2)
    assert len(mm._global_forward_pre_hooks) == before


def test_the_hook_goes_with_the_agent_when_no_forward_ran(tmp_path):
    before = len(mm._global_forward_pre_hooks)
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0")
    a.stop(2)
    assert len(mm._global_forward_pre_hooks) == before and a._first_input is None


def test_first_input_is_read_back_from_the_snapshot():
    info = parse_agent_info({"run": "r", "first_input": {"module": "ViT", "autocast": "bfloat16",
                                                         "shapes": [[16, 3, 224, 224]], "dtypes": ["float32"]}})
    assert info.autocast == "bfloat16" and info.input_shapes == ((16, 3, 224, 224),) and info.input_module == "ViT"
    bad = parse_agent_info({"run": "r", "first_input": {"autocast": 3, "shapes": [["x"]]}})
    assert bad.autocast is None and bad.input_shapes == ()
    assert parse_agent_info({"run": "r"}).autocast is None
