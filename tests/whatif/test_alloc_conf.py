"""PYTORCH_CUDA_ALLOC_CONF parsing (memq.analysis.alloc_conf), as torch's AllocatorConfig::parseArgs reads it."""

from __future__ import annotations

import pytest

from memq.analysis.alloc_conf import parse_alloc_conf, split_settings
from memq.analysis.allocator_model import K_LARGE_BUFFER, N_INTERVALS, SIZE_MAX, AllocatorConfig
from memq.errors import EXIT_BAD_INPUT, BadInput

MiB = 1 << 20


def test_empty_is_default():
    assert parse_alloc_conf("") == AllocatorConfig()
    assert AllocatorConfig().max_split_size == SIZE_MAX


def test_several_settings_joined_by_commas():
    c = parse_alloc_conf("expandable_segments:True, max_split_size_mb:128,garbage_collection_threshold:0.6")
    assert c.expandable_segments is True
    assert c.max_split_size == 128 * MiB
    assert c.garbage_collection_threshold == 0.6
    assert c.max_non_split_rounding_size == K_LARGE_BUFFER


def test_roundup_scalar_and_list():
    assert parse_alloc_conf("roundup_power2_divisions:4").roundup_power2_divisions == (4,) * N_INTERVALS
    # torch 2.11's AllocatorConfigTest: the first entry also fills the intervals below it, '>' fills
    # everything after the last one named, intervals not named stay 0
    d = parse_alloc_conf("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]").roundup_power2_divisions
    assert [d[5], d[6], d[7], d[8], d[9], d[10], d[11], d[12]] == [8, 8, 2, 4, 2, 4, 1, 1]
    d = parse_alloc_conf("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]").roundup_power2_divisions
    assert [d[6], d[7], d[8], d[9], d[10], d[11], d[12]] == [8, 8, 16, 1, 0, 8, 2]


def test_other_keys():
    c = parse_alloc_conf("max_non_split_rounding_mb:64,large_segment_size_mb:40,backend:native,"
                         "release_lock_on_cudamalloc:True,pinned_use_cuda_host_register:False")
    assert c.max_non_split_rounding_size == 64 * MiB
    assert c.large_segment_size == 40 * MiB


@pytest.mark.parametrize("text", [
    "max_split_size_mb:10",  # torch: must be >= 20
    "max_split_size_mb:abc",
    "garbage_collection_threshold:1.5",
    "garbage_collection_threshold:0",
    "expandable_segments:true",  # torch accepts only True/False
    "roundup_power2_divisions:3",
    "roundup_power2_divisions:[3:4]",
    "no_such_option:1",
    "expandable_segments",
    "max_split_size_mb:20,large_segment_size_mb:25",
    "backend:cudaMallocAsync",
])
def test_bad_values_are_bad_input(text):
    with pytest.raises(BadInput) as exc:
        parse_alloc_conf(text)
    assert exc.value.exit_code == EXIT_BAD_INPUT
    assert "\n" not in str(exc.value)
    assert text.split(":")[0] in str(exc.value) or "expected" in str(exc.value)


def test_trailing_comma_is_accepted_as_in_torch():
    assert parse_alloc_conf("expandable_segments:False,") == AllocatorConfig()


def test_split_settings_keeps_lists_together():
    assert split_settings("a:1,roundup_power2_divisions:[64:8,>:1],b:2") == [
        "a:1", "roundup_power2_divisions:[64:8,>:1]", "b:2"]
