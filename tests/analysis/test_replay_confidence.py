"""A what-if replay's confidence words come from confidence.py (`replay_confidence`), one per case."""

from __future__ import annotations

import pytest

from memq.analysis.confidence import REPLAY_CONFIDENCE, REPLAY_LEVELS, replay_confidence


def test_each_case_has_its_word():
    assert REPLAY_CONFIDENCE == {"reproduced": "high", "approximate": "medium", "from_start": "high",
                                 "past_recorded_oom": "medium", "live_over_limit": "medium",
                                 "window_only": "low", "not_assessable": "none"}
    assert set(REPLAY_CONFIDENCE.values()) == set(REPLAY_LEVELS)
    assert replay_confidence("window_only") == "low"
    with pytest.raises(ValueError, match="unknown replay case"):
        replay_confidence("sure")
