"""The agent's options as one typed object (memq.config.AgentOptions): what falls back to the settings,
and that `Agent(run, cluster, options)` and the keyword arguments of `agent.start()` are the same."""

from __future__ import annotations

import dataclasses

import pytest

from memq.agent import Agent
from memq.config import AgentOptions, Settings

from .conftest import REAL


def test_unset_options_take_the_settings_and_empty_names_fall_back():
    st = Settings(redis_url="redis://h:1/0", spool_dir="/s", stats_interval_s=7, agent_signal="SIGUSR1")
    o = AgentOptions(redis_url="", stream="", stats_interval_s=0, max_entries=0, signal="default").resolve(st)
    assert (o.redis_url, o.stream, o.spool_dir) == ("redis://h:1/0", "memq:ingest", "/s")
    assert (o.stats_interval_s, o.max_entries, o.signal) == (0.0, 0, "SIGUSR1")  # a zero is an answer
    assert AgentOptions(signal=None).resolve(st).signal is None
    assert AgentOptions().resolve(st).stats_interval_s == 7.0 and AgentOptions().resolve(st).history == "auto"


def test_every_constructor_keyword_before_the_options_object_is_still_accepted():
    """The keywords agent.start() documented (and MEMQ_AGENT_OPTIONS passes) are the fields, plus the
    job's objects and injected parts."""
    fields = {f.name for f in dataclasses.fields(AgentOptions)}
    assert len(fields) == 44
    for name in ("redis_url", "stream", "key_prefix", "spool_dir", "spool_max_bytes", "stats_interval_s",
                 "snapshot_every_s", "snapshot_on_epoch", "history", "stacks", "max_entries", "warmup_steps",
                 "headroom", "signal", "oom", "codec", "send_timeout_s", "stop_timeout_s", "job", "rank", "host",
                 "metadata", "device", "comparable_every_steps", "comparable_min_s", "growth_window_steps",
                 "step_hook", "step_budget", "roles", "role_devices"):
        assert name in fields, name


def test_an_unknown_option_is_refused(tmp_path):
    with pytest.raises(TypeError):
        Agent("r", "c", spool_dir=str(tmp_path), histroy="on")


def test_the_options_object_and_the_keywords_build_the_same_agent(tmp_path):
    from memq.agent.source import ReplaySource

    kw = dict(spool_dir=str(tmp_path), redis_url="redis://127.0.0.1:1/0", history="off", warmup_steps=5,
              signal=None, rank=2)
    a = Agent("r", "c", source=ReplaySource(REAL / "seed_adamw"), **kw)
    b = Agent("r", "c", AgentOptions(**kw), source=ReplaySource(REAL / "seed_adamw"))
    c = Agent("r", "c", AgentOptions(history="on"), source=ReplaySource(REAL / "seed_adamw"),
              **{k: v for k, v in kw.items() if k != "history"} | {"history": "off"})
    assert a.options == b.options == c.options and a.rank == 2 and a.policy.mode == "off"


def test_agent_start_takes_the_options_whole(tmp_path):
    from memq import agent
    from memq.agent.source import ReplaySource

    opts = AgentOptions(spool_dir=str(tmp_path), redis_url="redis://127.0.0.1:1/0", signal=None, history="off")
    a = agent.start(run="r", cluster="c", options=opts, source=ReplaySource(REAL / "seed_adamw"))
    try:
        assert isinstance(a, Agent) and a.options.history == "off" and a.options.spool_dir == str(tmp_path)
    finally:
        agent.stop(2)
