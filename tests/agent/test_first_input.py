"""The agent reads, once, at the first module forward: CUDA autocast's state and the input's shapes
(what `memq fit` tells autocast's weight copies from input-sized blocks with, and the batch the run
measured), then removes its hook: nothing runs at later forwards. CPU torch here: autocast of CUDA is
off (the GPU captures of benchmarks/gpu/fit_families.py record it on)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.modules.module as mm

from memq.model import SQUARE_SITES_MAX
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
                                  "dtypes": ["float32"], "square": []}
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


class _Attention(torch.nn.Module):
    """Attention with a learned additive bias: torch's math path keeps the softmax, (batch, heads, t, t)."""

    def __init__(self, d=32, heads=4, t=16):
        super().__init__()
        self.emb, self.qkv = torch.nn.Embedding(100, d), torch.nn.Linear(d, 3 * d)
        self.bias = torch.nn.Parameter(torch.zeros(1, heads, t, t))
        self.h = heads

    def forward(self, ids):
        b, t = ids.shape
        q, k, v = self.qkv(self.emb(ids)).view(b, t, 3, self.h, -1).permute(2, 0, 3, 1, 4)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=self.bias).sum()  # SCORES_LINE


def _line_of(marker: str) -> int:
    return next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if marker in text
                and "next(" not in text)


def test_the_first_forward_notes_its_attention_scores_by_line_and_bytes(tmp_path):
    """Tokens of length 16: the softmax the math path keeps is (2, 4, 16, 16) float32, 8 KiB, made on the
    line that calls attention; the only other saved (..., 16, 16) tensor is the (1, 4, 16, 16) bias itself;
    the hook is gone afterwards, and a second forward notes nothing more."""
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        model = _Attention()
        model(torch.zeros(2, 16, dtype=torch.long)).backward()
        square = a._first_input["square"]
        assert [__file__, _line_of("# SCORES_LINE"), 2 * 4 * 16 * 16 * 4] in square
        assert all(n in (2 * 4 * 16 * 16 * 4, 4 * 16 * 16 * 4) for _f, _l, n in square)  # scores; the bias
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None  # popped at the forward's end
        model(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert a._first_input["square"] == square  # the first forward's, once
    finally:
        a.stop(2)
    info = parse_agent_info({"run": "r", "first_input": dict(a._first_input)})
    assert (__file__, _line_of("# SCORES_LINE"), 8192) in info.square_sites


def test_no_length_no_scores_and_nothing_left_pushed(tmp_path):
    """An image (4-D input) has no length to scale: nothing is noted; a forward that raises still pops the
    hook; a device type the agent does not watch is not noted."""
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        torch.nn.Conv2d(3, 4, 3)(torch.zeros(2, 3, 16, 16))
        assert a._first_input["square"] == []
    finally:
        a.stop(2)
    b = make_agent(spool_dir=tmp_path / "t", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        model = _Attention()
        try:
            model(torch.zeros(2, 15, dtype=torch.long))  # the bias is 16 x 16: the forward raises
        except RuntimeError:
            pass
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
        assert b._first_input["square"] == []
    finally:
        b.stop(2)
    c = make_agent(spool_dir=tmp_path / "u", redis_url="redis://127.0.0.1:1/0")  # ("cuda",): CPU tensors ignored
    try:
        _Attention()(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert c._first_input["square"] == []
    finally:
        c.stop(2)


def test_a_compiled_first_forward_runs_as_it_would_without_the_agent(tmp_path):
    """torch.compile with fullgraph=True (AOTAutograd, no inductor needed): the agent's hooks are there
    when the compiled module first runs, and the job's forward and backward give what they give without the
    agent; the hook is popped after it."""
    torch.manual_seed(0)
    model = _Attention()
    ids = torch.randint(0, 100, (2, 16))
    want = model(ids)
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
        got = compiled(ids)
        got.backward()
        assert torch.allclose(got, want)
        assert model.bias.grad is not None
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
        assert isinstance(a._first_input["square"], list)
    finally:
        a.stop(2)


class _Keywords(_Attention):
    """Called as Hugging Face models are: `model(input_ids=..., attention_mask=...)`, no positional input."""

    def forward(self, input_ids=None, attention_mask=None):
        return super().forward(input_ids)


def test_a_forward_called_with_keywords_gives_its_input_and_scores(tmp_path):
    """No positional input for the pre-hook to read: the keywords are read when the forward returns,
    input_ids first, and the scores of its length kept."""
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        _Keywords()(attention_mask=torch.ones(2, 16), input_ids=torch.zeros(2, 16, dtype=torch.long)).backward()
        facts = a._first_input
        assert facts["shapes"] == [[2, 16], [2, 16]] and facts["dtypes"] == ["int64", "float32"]
        assert [__file__, _line_of("# SCORES_LINE"), 2 * 4 * 16 * 16 * 4] in facts["square"]
    finally:
        a.stop(2)


class _OtherSquare(torch.nn.Module):
    """Tokens of length 16, and a saved (2, 3, 8, 8) product: square, but not in the length."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(2, 3, 8, 8))

    def forward(self, ids):
        return (self.w @ self.w).sum() + ids.sum()  # OTHER_LINE


def test_a_square_tensor_of_another_size_than_the_length_is_not_a_score(tmp_path):
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        _OtherSquare()(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert a._first_input["square"] == []
    finally:
        a.stop(2)
    b = make_agent(spool_dir=tmp_path / "t", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        _OtherSquare()(torch.zeros(2, 8, dtype=torch.long)).backward()  # now the length is 8: it is one
        assert b._first_input["square"] == [[__file__, _line_of("# OTHER_LINE"), 2 * 3 * 8 * 8 * 4]]
    finally:
        b.stop(2)


class _ManySizes(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ws = torch.nn.ParameterList(torch.nn.Parameter(torch.ones(1, i + 1, 16, 16)) for i in range(n))

    def forward(self, ids):
        return sum((w @ w).sum() for w in self.ws) + ids.sum()


@pytest.mark.parametrize("n", [SQUARE_SITES_MAX, SQUARE_SITES_MAX + 1])
def test_at_most_sixty_four_sites_are_kept(tmp_path, n):
    """SQUARE_SITES_MAX: one per attention line and score size is a handful in any model; 64 of them kept
    (and sent), the 65th not, so that no forward grows the agent's memory."""
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        _ManySizes(n)(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert len(a._first_input["square"]) == min(n, SQUARE_SITES_MAX)
    finally:
        a.stop(2)
    sites = [["f.py", 1, 512 * (i + 1)] for i in range(n)]
    got = parse_agent_info({"run": "r", "first_input": {"shapes": [[2, 16]], "square": sites}}).square_sites
    assert len(got) == min(n, SQUARE_SITES_MAX)


def test_where_saved_tensor_hooks_are_disabled_the_forward_runs_and_nothing_is_pushed(tmp_path):
    """A functorch transform (or any library) may disable saved-tensor hooks: pushing one raises there. The
    agent then notes no scores, and the job's forward runs as it would."""
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        with torch.autograd.graph.disable_saved_tensors_hooks("not here"):
            _Attention()(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert torch._C._autograd._top_saved_tensors_default_hooks(False) is None
        assert "square" not in a._first_input and a._first_input["shapes"] == [[2, 16]]
    finally:
        a.stop(2)


def test_a_first_forward_that_does_not_learn_leaves_the_facts_to_the_first_that_does(tmp_path):
    """A validation sanity check before training (no_grad, then inference mode; its own batch and length)
    saves nothing for backward: the hook waits for the first forward that does, whose input and scores
    are the ones kept; then the hook is gone."""
    before = len(mm._global_forward_pre_hooks)
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        model = _Attention()
        with torch.no_grad():
            model(torch.zeros(4, 16, dtype=torch.long))
        assert a._first_input["shapes"] == [[4, 16]] and "square" not in a._first_input
        with torch.inference_mode():
            model(torch.zeros(4, 16, dtype=torch.long))
        assert len(mm._global_forward_pre_hooks) == before + 1  # still waiting
        model(torch.zeros(2, 16, dtype=torch.long)).backward()
        assert a._first_input["shapes"] == [[2, 16]]
        assert [__file__, _line_of("# SCORES_LINE"), 2 * 4 * 16 * 16 * 4] in a._first_input["square"]
        assert len(mm._global_forward_pre_hooks) == before
    finally:
        a.stop(2)


def test_an_inference_job_stops_paying_for_the_wait(tmp_path):
    """LEARNING_FORWARD_WAIT_CALLS module calls under no_grad: one short of it the hook still waits; at it the
    hook is gone, the first forward's facts kept and no scores noted."""
    from memq.agent.scores import LEARNING_FORWARD_WAIT_CALLS

    before = len(mm._global_forward_pre_hooks)
    a = make_agent(spool_dir=tmp_path / "s", redis_url="redis://127.0.0.1:1/0", role_devices=("cpu",))
    try:
        layer = torch.nn.Identity()
        x = torch.zeros(3, 5)
        with torch.no_grad():
            for _ in range(LEARNING_FORWARD_WAIT_CALLS - 1):
                layer(x)
            assert len(mm._global_forward_pre_hooks) == before + 1
            layer(x)
        assert len(mm._global_forward_pre_hooks) == before
        assert a._first_input["shapes"] == [[3, 5]] and "square" not in a._first_input
    finally:
        a.stop(2)
