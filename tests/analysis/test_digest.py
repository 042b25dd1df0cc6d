"""A run diagnosis fed stored digests for its earlier snapshots must equal one fed the decoded
snapshots: workers diagnose runs from digests and decode only the last blob."""

from __future__ import annotations

import json

import pytest

from memq.analysis import ANALYZER_VERSION, _comparable_points, _earlier_step_peak, _head, _per, analyze
from memq.analysis.per_snapshot import DIGEST_FORMAT, SnapshotDigest, digest
from memq.load import load_snapshot_file
from memq.model import OomContext
from memq.store.repository import json_safe
from tests.analysis.test_captured_labels import CAPTURED, CASES
from tests.helpers import REAL, REAL_RUNS

RUNS = [(REAL / f, stems, opts.get("limit")) for f, (stems, opts) in REAL_RUNS.items() if len(stems) > 1]
RUNS += [(CAPTURED / f, stems, cap) for f, (stems, cap) in CASES.items() if len(stems) > 1]


def _stored(doc: dict) -> str:
    return json.dumps(json_safe(doc), sort_keys=True)


def _triggers(stems: list[str]) -> list[str]:
    return ["oom" if s == "oom" else "epoch_end" if s.startswith("epoch") else "periodic" for s in stems]


@pytest.mark.parametrize("folder,stems,limit", RUNS, ids=[f"{r[0].parent.name}/{r[0].name}" for r in RUNS])
def test_digests_give_the_same_run_diagnosis(folder, stems, limit):
    loaded = [load_snapshot_file(folder / f"{s}.pickle.gz") for s in stems]
    names = [f"{s}.pickle.gz" for s in stems]
    ctx = OomContext(limit_bytes=limit)
    full = analyze(loaded, ctx, names=names, triggers=_triggers(stems), optimizer="adamw")
    # what the database hands back: JSON text, parsed again
    digests = [SnapshotDigest.from_json(json.loads(json.dumps(json_safe(digest(ld.snapshot, ANALYZER_VERSION)))))
               for ld in loaded[:-1]]
    fresh_last = load_snapshot_file(folder / f"{stems[-1]}.pickle.gz")  # no memo shared with `full`
    from_digests = analyze([*digests, fresh_last], ctx, names=names, triggers=_triggers(stems), optimizer="adamw")
    assert _stored(from_digests) == _stored(full)
    # and the facts behind it that these fixtures may not exercise (e.g. optimizer steps counted)
    per_full = [_per(ld.snapshot) for ld in loaded]
    per_dig = [_per(d) for d in digests] + [per_full[-1]]
    assert _earlier_step_peak(per_dig) == _earlier_step_peak(per_full)
    heads_full = [_head(ld.snapshot) for ld in loaded]
    heads_dig = [_head(d) for d in digests] + heads_full[-1:]
    assert [h[:5] + (sorted(h[5]),) for h in heads_dig] == [h[:5] + (sorted(h[5]),) for h in heads_full]
    trig = _triggers(stems)
    assert _comparable_points(heads_dig, per_dig, names, trig) == _comparable_points(heads_full, per_full, names, trig)


def test_leak_verdict_survives_digests():
    stems, cap = CASES["leak_epochs"]
    loaded = [load_snapshot_file(CAPTURED / "leak_epochs" / f"{s}.pickle.gz") for s in stems]
    digests = [SnapshotDigest.from_json(json.loads(json.dumps(json_safe(digest(ld.snapshot, ANALYZER_VERSION)))))
               for ld in loaded[:-1]]
    r = analyze([*digests, loaded[-1]], OomContext(limit_bytes=cap), triggers=_triggers(stems))
    assert r["diagnosis"]["primary_cause"] == "leak"
    assert r["details"]["leak"]["holds"] is True


def test_digest_is_small_and_plain():
    ld = load_snapshot_file(REAL / "seed_sgd" / "epoch1.pickle.gz")
    doc = digest(ld.snapshot, ANALYZER_VERSION)
    text = json.dumps(doc)  # plain JSON as it is, no json_safe needed
    assert doc["format"] == DIGEST_FORMAT and doc["trace_entries"] == len(ld.snapshot.trace)
    assert len(text) < ld.raw_size / 20, (len(text), ld.raw_size)
    assert len(doc["live_blocks"]) == sum(b.is_live for s in ld.snapshot.segments for b in s.blocks)


def test_last_item_must_be_decoded():
    ld = load_snapshot_file(REAL / "seed_sgd" / "epoch1.pickle.gz")
    d = SnapshotDigest.from_json(digest(ld.snapshot, ANALYZER_VERSION))
    with pytest.raises(ValueError, match="last snapshot"):
        analyze([ld, d])


def test_digest_of_another_analyzer_version_is_refused():
    ld = load_snapshot_file(REAL / "seed_sgd" / "epoch1.pickle.gz")
    old = SnapshotDigest.from_json(dict(digest(ld.snapshot, ANALYZER_VERSION), analyzer_version="0.9.0"))
    with pytest.raises(ValueError, match="0.9.0"):
        analyze([old, ld])


@pytest.mark.parametrize("bad", [{}, {"format": DIGEST_FORMAT}, {"format": 99},
                                 {"format": DIGEST_FORMAT, "sites": [], "live_blocks": [[1, 2, 5]]}])
def test_malformed_digest_is_a_value_error(bad):
    with pytest.raises(ValueError):
        SnapshotDigest.from_json(bad)
