"""memq.units: the one byte formatter and the one sparkline, in each style their callers use."""

from __future__ import annotations

import pytest

from memq.errors import BadInput
from memq.units import GiB, MiB, fmt_bytes, parse_size, sparkline


@pytest.mark.parametrize(("n", "text"), [
    (None, "n/a"), (0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (3 * MiB // 2, "1.50 MiB"),
    (17 * GiB + GiB // 4, "17.25 GiB"), (-2 * GiB, "-2.00 GiB"),
])
def test_auto_picks_the_largest_unit_reached(n, text):
    assert fmt_bytes(n) == text


@pytest.mark.parametrize(("n", "text"), [
    (GiB // 10 + 1, "0.10 GiB"), (GiB // 10, "102.4 MiB"), (12 * MiB + MiB // 2, "12.5 MiB"),
    (-GiB, "-1.00 GiB"), (None, "unknown"),
])
def test_brief_is_gib_down_to_a_tenth_then_mib(n, text):
    assert fmt_bytes(n, "brief", unknown="unknown") == text


def test_gib_is_always_gib_and_unknown_is_the_callers_word():
    assert fmt_bytes(512 * MiB, "GiB") == "0.50 GiB"
    assert fmt_bytes(None, "GiB", unknown="?") == "?"
    assert fmt_bytes(None, unknown="-") == "-"
    with pytest.raises(ValueError):
        fmt_bytes(1, "MB")


def test_parse_size_reads_what_fmt_writes():
    assert parse_size("17.25GiB") == 17 * GiB + GiB // 4
    assert parse_size("40GB") == 40 * 10**9
    with pytest.raises(BadInput):
        parse_size("12 parsecs")


def test_sparkline_scales_from_smallest_to_largest_by_default():
    assert sparkline([]) == ""
    assert sparkline([5, 5, 5]) == "▁▁▁"
    assert sparkline([10, 20, 30]) == "▁▄█"


def test_sparkline_from_zero_to_a_given_top_with_gaps_as_zero():
    assert sparkline([None, 50, 100], base=0, top=100) == "▁▄█"
    assert sparkline([50, 100], base=0, top=200) == "▂▄"
    assert sparkline([0, 0], base=0) == "▁▁"


def test_sparkline_past_width_keeps_each_runs_peak():
    vals = [0] * 100
    vals[37] = 9
    line = sparkline(vals, width=10)
    assert len(line) == 10 and line.count("█") == 1 and line[3] == "█"
