from __future__ import annotations

import pytest

from memq.agent.policy import RecordingPolicy


def test_warmup_then_paused():
    p = RecordingPolicy(warmup_steps=3)
    assert p.initial() is True
    assert [p.on_step() for _ in range(6)] == [True, True, False, False, False, False]


def test_periodic_request_records_exactly_one_step():
    p = RecordingPolicy(warmup_steps=1)
    assert p.on_step() is False
    p.request_step()
    assert p.on_step() is True and p.reason == "periodic"
    assert p.on_step() is False


def test_continuous_on_low_headroom_and_back():
    p = RecordingPolicy(warmup_steps=0, headroom_frac=0.10)
    limit = 100
    p.on_stats({"reserved_bytes.all.current": 50, "num_alloc_retries": 0}, limit)
    assert p.on_step() is False
    p.on_stats({"reserved_bytes.all.current": 95, "num_alloc_retries": 0}, limit)
    assert p.continuous and p.reason == "low_headroom" and p.on_step() is True
    p.on_stats({"reserved_bytes.all.current": 85, "num_alloc_retries": 0}, limit)  # 15%: not yet 2x
    assert p.continuous
    p.on_stats({"reserved_bytes.all.current": 70, "num_alloc_retries": 0}, limit)
    assert not p.continuous and p.on_step() is False


def test_device_free_counts_and_retries_switch_on():
    p = RecordingPolicy(warmup_steps=0)
    p.on_stats({"reserved_bytes.all.current": 10, "device_free": 5}, 100)  # another process holds the card
    assert p.continuous
    q = RecordingPolicy(warmup_steps=0)
    q.on_stats({"reserved_bytes.all.current": 10, "num_alloc_retries": 0}, 100)
    q.on_stats({"reserved_bytes.all.current": 10, "num_alloc_retries": 2}, 100)
    assert q.continuous and q.reason == "retries"


def test_oom_is_sticky():
    p = RecordingPolicy(warmup_steps=0)
    p.on_oom()
    p.on_stats({"reserved_bytes.all.current": 1}, 100)
    assert p.continuous and p.on_step() is True


def test_time_based_for_jobs_without_steps():
    p = RecordingPolicy(warmup_s=10)
    assert p.on_time(5) is True and p.on_time(11) is False
    p.request_time(13)
    assert p.on_time(12) is True and p.on_time(14) is False


def test_modes():
    on, off = RecordingPolicy(mode="on"), RecordingPolicy(mode="off")
    assert on.initial() and all(on.on_step() for _ in range(5))
    assert not off.initial() and not any(off.on_step() for _ in range(5))
    with pytest.raises(ValueError):
        RecordingPolicy(mode="sometimes")


def test_window_records_its_steps_then_pauses():
    p = RecordingPolicy(warmup_steps=1)
    assert p.on_step() is False
    p.start_window("growth", 2)
    assert p.in_window and [p.on_step(), p.on_step(), p.on_step()] == [True, True, False]
    assert p.reason == "growth" and not p.in_window
    p.start_window("large_step", 10)
    p.end_window()  # the next comparable point closes a growth window early
    assert p.on_step() is False
