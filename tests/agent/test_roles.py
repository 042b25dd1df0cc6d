"""The roles of the tensors the agent can see (profiler/agent/roles.py), sent with each snapshot, and read
first by the analysis (ARCHITECTURE.md "Composition and phase"). CPU torch: the collection logic is the
same for CUDA tensors, whose addresses the H200 capture (benchmarks/gpu/composition_capture.py) checks
against the tensors themselves."""

from __future__ import annotations

import torch  # the CPU build is part of the test set-up (tests/run.sh)

from memq import codec
from memq.agent.roles import MAX_RANGES, ROLES, collect
from memq.model import AGENT_ROLES
from memq.snapshot import parse_snapshot

from .conftest import REAL, blob_of, entries, make_agent
from .test_steps import DictSource, sig

GIB = 1 << 30


def _trained(opt_cls=torch.optim.AdamW, steps=1, **kw):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 4))
    opt = opt_cls(model.parameters(), lr=1e-3, **kw)
    for _ in range(steps):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        opt.step()
    return model, opt


def _nbytes(ts) -> int:
    return sum(t.untyped_storage().nbytes() for t in ts)


def test_the_roles_of_an_adamw_step_are_its_parameters_gradients_and_state():
    model, opt = _trained()
    out = collect(opt, model, device_types=("cpu",))
    params = list(model.parameters())
    assert out["v"] == 1 and not out["truncated"] and ROLES == AGENT_ROLES
    assert out["bytes"]["parameter"] == _nbytes(params)
    assert out["bytes"]["gradient"] == _nbytes(p.grad for p in params)
    moments = [v for st in opt.state.values() for k, v in st.items() if k in ("exp_avg", "exp_avg_sq")]
    steps = [st["step"] for st in opt.state.values()]
    assert len(moments) == 2 * len(params)
    assert out["bytes"]["optimizer_state"] == _nbytes(moments) + _nbytes(steps)
    # the batch norm's running statistics and counter: buffers, known only through the model
    assert out["bytes"]["buffer"] == _nbytes(model.buffers())
    ranges = out["ranges"]
    assert ranges == sorted(ranges) and len({r[0] for r in ranges}) == len(ranges)
    by_addr = {r[0]: (r[1], ROLES[r[2]]) for r in ranges}
    w = params[0]
    assert by_addr[w.untyped_storage().data_ptr()] == (w.untyped_storage().nbytes(), "parameter")
    assert by_addr[w.grad.untyped_storage().data_ptr()][1] == "gradient"
    assert by_addr[opt.state[w]["exp_avg"].untyped_storage().data_ptr()][1] == "optimizer_state"


def test_sgd_without_the_model_and_after_zero_grad():
    model, opt = _trained(torch.optim.SGD, momentum=0.9)
    opt.zero_grad(set_to_none=True)
    out = collect(opt, device_types=("cpu",))
    assert set(out["bytes"]) == {"parameter", "optimizer_state"}  # no .grad, no buffers without the model
    assert out["bytes"]["optimizer_state"] == out["bytes"]["parameter"]  # one momentum buffer each


def test_a_storage_in_two_roles_keeps_the_first_and_views_count_once():
    flat = torch.nn.Parameter(torch.zeros(64))
    opt = torch.optim.SGD([flat], lr=0.1, momentum=0.9)
    opt.state[flat]["momentum_buffer"] = flat.detach()[:32]  # a view of the parameter's own storage
    out = collect(opt, device_types=("cpu",))
    assert out["ranges"] == [[flat.untyped_storage().data_ptr(), 256, ROLES.index("parameter")]]
    assert out["bytes"] == {"parameter": 256}


def test_nothing_to_say_and_other_devices():
    model, opt = _trained()
    assert collect(None, None) is None
    assert collect(opt, model) is None  # the default device type is cuda: CPU tensors are another device's
    assert collect(object(), object(), device_types=("cpu",)) is None  # no param_groups, no parameters()
    out = collect(opt, model, device_types=("cpu",), max_ranges=3)
    assert out["truncated"] and len(out["ranges"]) == 3 and MAX_RANGES >= 100_000


def test_the_agent_sends_the_roles_of_the_optimizer_its_step_hook_saw(shared):
    """No optimizer passed to start(): the one whose steps the hook counts is the one whose tensors'
    roles go with each snapshot, parsed back as the analysis reads them."""
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB)] * 8
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0, step_budget=1.0,
                   warmup_steps=2, role_devices=("cpu",))
    model, opt = _trained(steps=3)
    a.snapshot("manual")
    a.stop(10)
    snaps = [e for e in entries(r, stream) if e.kind == "snapshot"]
    assert snaps
    raw = codec.loads_restricted(blob_of(r, snaps[-1], prefix))
    roles = raw["memq_agent"]["roles"]
    assert roles["bytes"]["parameter"] == _nbytes(model.parameters())
    assert roles["bytes"]["optimizer_state"] > 2 * roles["bytes"]["parameter"] - 1
    info = parse_snapshot(raw).agent
    assert len(info.roles) == len(roles["ranges"]) and info.roles[0] == tuple(roles["ranges"][0])


def test_roles_off(shared):
    r, prefix, stream = shared
    src = DictSource(REAL / "capacity")
    src.signals = [sig(GIB)] * 8
    model, opt = _trained()
    a = make_agent(source=src, stream=stream, key_prefix=prefix, optimizer=opt, model=model, roles=False,
                   role_devices=("cpu",))
    a.snapshot("manual")
    a.stop(10)
    snap = [e for e in entries(r, stream) if e.kind == "snapshot"][-1]
    assert codec.loads_restricted(blob_of(r, snap, prefix))["memq_agent"]["roles"] is None


def test_a_declared_cache_is_followed_as_it_grows_and_never_kept_alive():
    """`roles.declare(cache)`: the tensors the cache object holds at each snapshot (a cache grown by
    concatenation holds new ones every token) are sent as role "cache"; a list of tensors is declared by
    its tensors; the declaration keeps nothing alive, and a cache that is gone is simply absent."""
    import gc
    import weakref

    from memq.agent import roles as rmod

    class Cache:  # as transformers' DynamicCache: one key and one value tensor per layer
        def __init__(self):
            self.keys = [torch.zeros(2, 4, 3, 8) for _ in range(2)]
            self.values = [torch.zeros(2, 4, 3, 8) for _ in range(2)]

    model, opt = _trained()
    saved = list(rmod._declared)
    try:
        rmod._declared.clear()
        cache = Cache()
        assert rmod.declare(cache) and not rmod.declare(cache, "parameter")
        cache.keys[0] = torch.cat([cache.keys[0], torch.zeros(2, 4, 1, 8)], dim=2)  # a token later
        out = collect(opt, model, device_types=("cpu",))
        code = ROLES.index("cache")
        got = {r[0] for r in out["ranges"] if r[2] == code}
        want = {t.untyped_storage().data_ptr() for t in cache.keys + cache.values}
        assert got == want and out["bytes"]["cache"] == _nbytes(cache.keys + cache.values)
        static = [torch.ones(64) for _ in range(3)]
        assert rmod.declare(static)
        out = collect(None, None, device_types=("cpu",))  # declared caches alone are worth sending
        assert out["bytes"]["cache"] == _nbytes(cache.keys + cache.values) + _nbytes(static)
        ref = weakref.ref(cache)
        del cache, static
        gc.collect()
        assert ref() is None and collect(None, None, device_types=("cpu",)) is None
    finally:
        rmod._declared[:] = saved
