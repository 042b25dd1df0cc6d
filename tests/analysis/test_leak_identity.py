"""The leak test's block identity: the caching allocator gives a freed block's address and size to the
next request that fits, so a block is the same block only when its allocation site is the same too
(leak.appeared)."""

from __future__ import annotations

from memq.analysis import leak

MiB = 1024**2
S = 100 * MiB
LEAK, CHURN = "train.py:88 in validate", "train.py:40 in step"


def _points() -> list[dict]:
    """A validation loop keeps one more S-byte tensor each epoch; every new one lands on an address
    (and size) a step's transient had at an earlier epoch, while the step's two transients move to
    fresh addresses each epoch."""
    leaked: list[int] = []
    pts = []
    for epoch in range(4):
        if epoch:
            leaked.append(epoch)  # the leak takes address `epoch`, a transient's at epoch 0 or 1
        churn = [2 * epoch + 1 + 100, 2 * epoch + 2 + 100] if epoch else [1, 2]
        blocks = {(a, S): LEAK for a in leaked}
        blocks.update({(a, S): CHURN for a in churn})
        pts.append({"name": f"the end of epoch {epoch}", "active": 2 * 1024**3 + len(blocks) * S,
                    "composition": {"optimizer_state": MiB}, "blocks": blocks})
    return pts


def test_a_block_reallocated_at_the_same_address_by_another_line_is_a_new_block():
    pts = _points()
    assert (1, S) in pts[0]["blocks"] and pts[3]["blocks"][(1, S)] == LEAK  # reused address and size
    got = leak.detect_leak(pts, None)
    assert got["holds"]
    assert got["allocating_site"] == LEAK
    assert got["growth_by_site"][0] == {"site": LEAK, "bytes": 3 * S}
    # by (address, size) alone the leak's reused blocks look like the step's old ones, and the
    # step's transients at their fresh addresses would be named
    by_key = set(pts[3]["blocks"]) - set(pts[0]["blocks"])
    assert sum(k[1] for k in by_key if pts[3]["blocks"][k] == CHURN) > sum(
        k[1] for k in by_key if pts[3]["blocks"][k] == LEAK)


def test_the_same_line_at_the_same_address_and_size_stays_one_block():
    before = {(1, S): LEAK, (2, S): CHURN}
    after = {(1, S): LEAK, (2, S): LEAK, (3, S): CHURN}
    assert sorted(leak.appeared(before, after)) == [(2, S), (3, S)]
