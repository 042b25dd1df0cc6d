"""analysis/compare.py: what changed between snapshots, runs and torch versions, each rule just under and
just over its value (literal numbers: a rule changed in rules.py fails here)."""

from __future__ import annotations

import pytest

from memq.analysis.compare import (
    VersionFigures,
    changes_between,
    compare_sides,
    explain_gap,
    same_limit,
    significant,
    version_regressions,
)
from memq.analysis.frames import CATEGORIES

MiB, GiB = 1 << 20, 1 << 30
rule = pytest.mark.rule


@rule("CHANGE_MIN_BYTES", "CHANGE_MIN_SHARE")
def test_a_change_is_named_from_64_mib_and_one_percent():
    assert significant(64 * MiB, GiB) and not significant(64 * MiB - 1, GiB)
    assert significant(-64 * MiB, None)
    base = 100 * GiB  # 1% of it is 1 GiB, above 64 MiB
    assert not significant(GiB - 1024, base) and significant(GiB, base)


def _snap(i, alloc, frag=0.2, comp=None, cause="healthy"):
    return {"id": i, "rank": 0, "trigger": "periodic", "epoch": None, "step": i, "reserved_bytes": alloc + GiB,
            "allocated_bytes": alloc, "fragmentation_ratio": frag, "composition": comp or {},
            "diagnosis": {"primary_cause": cause}}


@rule("CHANGE_FRAG_RATIO")
def test_changes_between_snapshots_name_what_moved():
    out = changes_between([_snap(1, 4 * GiB, 0.2), _snap(2, 4 * GiB + 63 * MiB, 0.299)])
    assert out[0]["summary"] == "no significant change"
    out = changes_between([_snap(1, 4 * GiB, 0.2), _snap(2, 5 * GiB, 0.301, {"activations": GiB}, "leak")])
    s = out[0]["summary"]
    assert "allocated +1.00 GiB" in s and "activations +1.00 GiB" in s and "fragmentation 0.20 -> 0.30" in s
    assert "diagnosis healthy -> leak" in s and out[0]["from"] == "periodic step 1"
    out = changes_between([_snap(1, 4 * GiB, 0.2, None, "capacity"),
                           _snap(2, 5 * GiB, 0.2, {"optimizer_state": GiB}, "activation_spike")])
    s = out[0]["summary"]  # classes and causes in words, as every screen says them
    assert "optimizer state +1.00 GiB" in s and "diagnosis capacity -> activation spike" in s, s
    assert "_" not in s
    # the screens' words, not identifiers with spaces: allocator_config reads "allocator settings"
    out = changes_between([_snap(1, 4 * GiB), _snap(2, 4 * GiB, 0.2, None, "allocator_config")])
    assert out[0]["summary"] == "diagnosis healthy -> allocator settings"


@rule("SAME_LIMIT_WITHIN_BYTES")
def test_two_limits_within_a_hundredth_of_a_gib_are_one():
    cap = 20244645632
    assert same_limit(cap, cap + 10737418) and not same_limit(cap, cap + 10737419)
    assert same_limit(None, None) and not same_limit(cap, None)


def _side(peak, comp, **kw):
    side = {"peak_reserved_bytes": peak + GiB, "peak_allocated_bytes": peak, "fragmentation_ratio": 0.1,
            "composition": {c: comp.get(c, 0) for c in CATEGORIES}, "allocator_settings": None,
            "limit": {"bytes": 16 * GiB, "source": "the run's cap"}, "labels": {}}
    for f in ("torch_version", "cuda_version", "driver_version", "gpu_model", "gpu_memory_bytes",
              "memory_limit_bytes", "allocator_conf", "optimizer", "param_count", "world_size", "cluster", "job",
              "host"):
        side[f] = kw.get(f)
    return side


def test_compare_sides_explains_the_gap_by_the_category_and_the_setting_that_drives_it():
    A = _side(4 * GiB, {"optimizer_state": GiB}, optimizer="SGD")
    B = _side(6 * GiB, {"optimizer_state": 3 * GiB}, optimizer="AdamW")
    doc = compare_sides(A, B)
    assert doc["composition_delta"]["optimizer_state"] == 2 * GiB
    ex = doc["explanation"]
    assert ex["category"] == "optimizer_state" and ex["settings"][0]["field"] == "optimizer"
    assert explain_gap(A, _side(4 * GiB + 63 * MiB, {}), {c: 0 for c in CATEGORIES}, [])["category"] is None


def V(v, runs, ooms, peak, frag):  # noqa: N802
    return VersionFigures(v, runs, ooms, peak, frag)


@rule("REGRESSION_PEAK_GROWTH")
def test_a_version_whose_mean_peak_grows_by_more_than_a_tenth():
    prev = V("2.10", 10, 0, 10 * GiB, 0.1)
    assert version_regressions(prev, V("2.11", 10, 0, 11 * GiB + GiB // 100, 0.1)) == ["mean peak reserved +10%"]
    assert version_regressions(prev, V("2.11", 10, 0, 11 * GiB - 1, 0.1)) == []


@rule("REGRESSION_OOM_RATE")
def test_a_version_whose_oom_rate_rises_by_ten_points():
    prev = V("2.10", 3, 1, None, None)
    assert version_regressions(prev, V("2.11", 30, 13, None, None), vs=True) == ["OOM rate 33% -> 43% vs 2.10"]
    assert version_regressions(prev, V("2.11", 300, 129, None, None)) == []  # 9.67 points


@rule("REGRESSION_FRAG")
def test_a_version_whose_mean_pieces_at_the_oom_rises_by_a_tenth():
    prev = V("2.10", 1, 0, None, 0.30)
    assert version_regressions(prev, V("2.11", 1, 0, None, 0.40)) == ["pieces at the OOM 0.30 -> 0.40"]
    assert version_regressions(prev, V("2.11", 1, 0, None, 0.399)) == []
