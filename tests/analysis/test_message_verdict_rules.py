"""The rule constants of a message-only verdict (analysis/message_verdict.py, message_check.py), each just
under and just over its figure, through torch's own message layout."""

from __future__ import annotations

import pytest

from memq.analysis.message_verdict import judge
from memq.oom_message import parse_oom_message

GiB, MiB = 1 << 30, 1 << 20
# The rules' documented values, literal: a value changed in rules.py fails here.
NEAR_LIMIT_SHARE, PRIVATE_POOL_SHARE, PRINTED_ROUNDING, XPU_BLOCK_LIMIT = 0.10, 0.5, 0.005, 4 * GiB
SAME_REQUEST_BYTES = 2 * MiB


def current(S, T, F, A, U, *, allowed=None, pools=None, dev="CUDA"):
    """A torch >= 2.4 message with the given figures (GiB)."""
    cap = f"{allowed:.2f} GiB allowed; " if allowed else ""
    pool = f"with {pools:.2f} GiB allocated in private pools (e.g., CUDA Graphs), " if pools else ""
    return (f"{dev} out of memory. Tried to allocate {S:.2f} GiB. GPU 0 has a total capacity of {T:.2f} GiB of which "
            f"{F:.2f} GiB is free. {cap}Of the allocated memory {A:.2f} GiB is allocated by PyTorch, {pool}and "
            f"{U:.2f} GiB is reserved by PyTorch but unallocated.")


def verdict(text):
    return judge(parse_oom_message(text))


@pytest.mark.rule("MESSAGE_NEAR_LIMIT_SHARE")
def test_near_limit_share_just_under_and_over():
    # what the process could reserve: R + F = 10 GiB; allocated 8 + request s leaves 10 - 8 - s
    lim = 10.0
    just_inside = lim * (1 - NEAR_LIMIT_SHARE) - 8.0 - 0.02  # room just over 10%: fragmentation
    just_over = lim * (1 - NEAR_LIMIT_SHARE) - 8.0 + 0.02  # room just under 10%: the step's edge
    assert verdict(current(just_inside, 10.2, 0.5, 8.0, 1.5)).situation in ("fragmentation",)
    v = verdict(current(just_over, 10.2, 0.5, 8.0, 1.5))
    assert v.situation == "near_limit" and [c for c, _, _ in v.others] == ["capacity"]


@pytest.mark.rule("MESSAGE_PRIVATE_POOL_SHARE")
def test_private_pool_share_just_under_and_over():
    over = verdict(current(0.5, 48.0, 0.001, 47.0, 0.1, pools=47.0 * PRIVATE_POOL_SHARE + 0.1))
    under = verdict(current(0.5, 48.0, 0.001, 47.0, 0.1, pools=47.0 * PRIVATE_POOL_SHARE - 0.1))
    assert over.situation == "private_pools" and under.situation != "private_pools"


@pytest.mark.rule("PRINTED_ROUNDING")
def test_printed_rounding_reads_a_cap_at_its_printed_figure():
    # reserved 1.00 + request 0.04 against 1.05 allowed: over the cap once the print's rounding is allowed for
    cap = 1.05
    inside = (1 - PRINTED_ROUNDING) * cap - 1.0 - 0.01
    over = (1 - PRINTED_ROUNDING) * cap - 1.0 + 0.01
    assert verdict(current(inside, 255.0, 244.0, 0.9, 0.1, allowed=cap)).situation == "below_free"
    assert verdict(current(over, 255.0, 244.0, 0.99, 0.01, allowed=cap)).figures.get("cap_ran_out")


@pytest.mark.rule("XPU_BLOCK_LIMIT")
def test_xpu_block_limit_just_under_and_over():
    limit = XPU_BLOCK_LIMIT / GiB
    assert verdict(current(limit + 0.01, 15.11, 15.11, 0.0, 0.0, dev="XPU")).situation == "block_limit"
    assert verdict(current(limit - 0.01, 15.11, 15.11, 0.0, 0.0, dev="XPU")).situation == "below_free"


@pytest.mark.rule("SAME_REQUEST_BYTES")
def test_same_request_bytes_just_under_and_over():
    from memq.analysis.message_check import _differs

    s = 64 * MiB
    assert not _differs(s, s + SAME_REQUEST_BYTES - 1, SAME_REQUEST_BYTES)
    assert _differs(s, s + SAME_REQUEST_BYTES + 1, SAME_REQUEST_BYTES)


# ------------------------------------------------------------------ confidence (confidence.message_confidence)

#: Each situation's confidence, literal: a value changed in rules.py fails here.
MESSAGE_CONFIDENCE = {"cut_before_figures": 0.2, "request_only": 0.3, "xpu_block_limit": 0.7, "block_limit": 0.8,
                      "over_device": 0.95, "cap": 0.8, "other_processes": 0.85, "below_free": 0.5,
                      "own_libraries": 0.7, "external": 0.75, "private_pools": 0.75, "capacity": 0.85,
                      "near_limit": 0.45, "near_limit_capacity": 0.4, "fragmentation": 0.6, "mps": 0.7,
                      "server_warmup": 0.7, "cublas": 0.6, "cudnn": 0.6, "thc_error": 0.3, "cuda_error": 0.4}


@pytest.mark.rule("MESSAGE_CONFIDENCE[cut_before_figures]", "MESSAGE_CONFIDENCE[request_only]",
                  "MESSAGE_CONFIDENCE[xpu_block_limit]", "MESSAGE_CONFIDENCE[block_limit]",
                  "MESSAGE_CONFIDENCE[over_device]", "MESSAGE_CONFIDENCE[cap]", "MESSAGE_CONFIDENCE[other_processes]",
                  "MESSAGE_CONFIDENCE[below_free]", "MESSAGE_CONFIDENCE[own_libraries]",
                  "MESSAGE_CONFIDENCE[external]", "MESSAGE_CONFIDENCE[private_pools]", "MESSAGE_CONFIDENCE[capacity]",
                  "MESSAGE_CONFIDENCE[near_limit]", "MESSAGE_CONFIDENCE[near_limit_capacity]",
                  "MESSAGE_CONFIDENCE[mps]", "MESSAGE_CONFIDENCE[server_warmup]", "MESSAGE_CONFIDENCE[cublas]",
                  "MESSAGE_CONFIDENCE[cudnn]", "MESSAGE_CONFIDENCE[thc_error]", "MESSAGE_CONFIDENCE[cuda_error]")
def test_each_message_situation_has_its_confidence_from_the_one_table():
    import json
    from pathlib import Path

    from memq.analysis.confidence import message_confidence

    corpus = Path(__file__).resolve().parents[1] / "fixtures" / "oom_messages" / "corpus.jsonl"
    seen = set()
    for line in corpus.read_text().splitlines():
        if not line.strip():
            continue
        v = judge(parse_oom_message(json.loads(line)["text"]))
        assert v.confidence == MESSAGE_CONFIDENCE[v.confidence_key], (v.situation, v.confidence_key)
        for cause, conf, _ in v.others:
            if v.situation == "near_limit":
                assert (cause, conf) == ("capacity", MESSAGE_CONFIDENCE["near_limit_capacity"])
        seen.add(v.confidence_key)
    assert len(seen) >= 10, seen  # the corpus reaches most situations; every entry is in the table
    for key, value in MESSAGE_CONFIDENCE.items():
        assert message_confidence(key) == value, key
    with pytest.raises(ValueError, match="unknown message situation"):
        message_confidence("healthy")
