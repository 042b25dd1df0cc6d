"""Refused snapshots leave no bytes behind (issue 36: "blobs of dead-lettered snapshots stay"), on the real
services: a private redis-server with the shipped ACL file (every writer is `memq-agent`, so every envelope goes
through the inbox and the relay), a real dispatcher with a keyring on its own PostgreSQL database, a real blob
directory, and `memq gc` as an operator runs it.

Before: a forged or refused snapshot's blob stayed in Redis for MEMQ_BLOB_TTL_S (7 days: a team whose key is
missing pushes gigabytes that all wait there, and a full Redis makes every agent spool), and one refused after
its bytes reached the blob store stayed on disk until retention's orphan pass (never with
MEMQ_RETENTION_DAYS=0). Now the dispatcher deletes the entry's own Redis blob in the dead letter's MULTI and
records a blob-store sha256 for the dead-blob cleanup, which removes the file once MEMQ_DEAD_BLOB_GRACE_S has
passed, unless a row names it: the legitimate run's blobs, the same bytes included, stay readable."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from tests.ops.acl_redis import acl_redis
from tests.workers.stack import REAL, as_training_job, keyring_stack, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(300)]

SGD = REAL / "seed_sgd"


def _key(kid: str, principal: str, clusters: list[str]) -> dict:
    return {"kid": kid, "principal": principal, "secret": secrets.token_hex(32), "clusters": clusters}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    ring = [_key("a1", "team-a", ["c-a"]), _key("b1", "team-b", ["c-b"])]
    (d / "keyring.json").write_text(json.dumps({"keys": ring}))
    files = {}
    for k in ring:
        files[k["kid"]] = d / f"{k['kid']}.json"
        files[k["kid"]].write_text(json.dumps({"kid": k["kid"], "secret": k["secret"]}))
    return {"ring": d / "keyring.json", "files": files}


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    with acl_redis(tmp_path_factory.mktemp("deadblob_acl")) as srv:
        yield srv


@pytest.fixture(scope="module")
def stack(tmp_path_factory, acl, pg_server, keys):
    with keyring_stack(tmp_path_factory.mktemp("deadblob"), acl["memq_url"], keys["ring"], "deadblob",
                       worker=False, MEMQ_RETENTION_DAYS="0") as s:
        yield s


def _push(stack, acl, key_file, *args) -> list[str]:
    """`memq push --json` as a training job (the agent's Redis user); the sha256s it sent."""
    with as_training_job(stack, acl["agent_url"], key_file):
        return [s["sha256"] for s in stack.memq_json("push", *args)["snapshots"]]


def _on_disk(stack, sha: str) -> bool:
    d = Path(stack.env["MEMQ_BLOB_DIR"]) / sha[:2]
    return any((d / f"{sha}{ext}").exists() for ext in (".zst", ".gz"))


def _redis_blobs(acl) -> list[bytes]:
    return sorted(acl["memq"].scan_iter(match="memq:blob:*"))


def _gc(stack, **env) -> dict:
    saved = dict(stack.env)
    stack.env.update(env)
    try:
        return stack.memq_json("gc")
    finally:
        stack.env = saved


def test_refused_snapshots_leave_nothing_behind_and_the_legit_run_keeps_its_blobs(stack, acl, keys):
    # an unsigned run written by an operator before the keyring (runs.owner NULL): team-b's pushes to
    # `legacy` (stored as team-b/legacy) are refused after their bytes reached the blob store
    stack.memq("ingest", str(REAL / "frag_synthetic" / "fragmented.pickle.gz"), "--run", "team-b/legacy",
               "--cluster", "c-b")
    legacy_sha = stack.rows("SELECT sha256 FROM snapshots")[0][0]

    # the legitimate run: team-a, its own key
    victim = _push(stack, acl, keys["files"]["a1"], str(SGD / "epoch0.pickle.gz"), str(SGD / "epoch1.pickle.gz"),
                   "--run", "victim", "--cluster", "c-a", "--job", "train")
    wait_for(lambda: stack.rows("SELECT count(*) FROM snapshots")[0][0] == 3, 90, 0.3, "the victim's snapshots")

    # refused before the bytes move (they wait in Redis): unsigned, another team's cluster
    unsigned = _push(stack, acl, None, str(SGD / "epoch2.pickle.gz"), "--run", "victim", "--cluster", "c-a",
                     "--job", "train")
    foreign = _push(stack, acl, keys["files"]["b1"], str(REAL / "capacity" / "oom.pickle.gz"), "--run", "x",
                    "--cluster", "c-a")
    # refused after the bytes moved into the blob store: team-b's run `legacy` belongs to nobody who signs;
    # once with new bytes, once with the victim's own bytes (which must stay: the victim's row names them)
    moved = _push(stack, acl, keys["files"]["b1"], str(REAL / "opt_state_first_step" / "before_step.pickle.gz"),
                  "--run", "legacy", "--cluster", "c-b")
    shared = _push(stack, acl, keys["files"]["b1"], str(SGD / "epoch0.pickle.gz"), "--run", "legacy",
                   "--cluster", "c-b")
    assert shared == victim[:1]

    def all_dead():
        reasons = [d.get("reason", "") for d in stack.dead() if d.get("kind") == "snapshot"]
        dropped = sum(int(d.get("dropped", 0)) for d in stack.dead() if d.get("relay_error"))
        return len(reasons) >= 3 and dropped >= 3 and reasons
    try:
        reasons = wait_for(all_dead, 90, 0.3, "the refused snapshots dead-lettered")
    except AssertionError as exc:
        raise AssertionError((stack.dead(), stack.log_tail("dispatcher", 1500))) from exc
    # the unsigned push (run_start, snapshot, run_end) never reaches the dispatcher: the relay drops it
    # (memq_functions.lua, "no signature of a key in the keyring") with the snapshot's own blob
    assert sum("may not write cluster" in r for r in reasons) == 1
    assert sum("belongs to unsigned writers" in r for r in reasons) == 2, reasons

    # Redis: no refused snapshot's blob waits for its TTL (every other blob was moved and deleted)
    wait_for(lambda: not _redis_blobs(acl), 30, 0.3, f"no blob left in Redis: {_redis_blobs(acl)}")

    # the blob store: the refused-after-move bytes are there until the cleanup, recorded for it
    assert _on_disk(stack, moved[0])
    recorded = {m.decode() for m in acl["memq"].zrange("memq:dead:blobs", 0, -1)}
    assert recorded == {moved[0], victim[0]}, recorded
    assert not any(_on_disk(stack, s) for s in unsigned + foreign)

    # within the grace (default one hour) nothing goes; past it, the unnamed file goes, the named stay
    first = _gc(stack)
    assert first["dead_blobs"]["dead_blobs_due"] == 0 and first["dead_blobs"]["dead_blobs_waiting"] == 2
    assert _on_disk(stack, moved[0])
    done = _gc(stack, MEMQ_DEAD_BLOB_GRACE_S="0")["dead_blobs"]
    assert done["dead_blobs_removed"] == 1 and done["kept"]["referenced"] == 1, done
    assert not _on_disk(stack, moved[0])
    assert acl["memq"].zcard("memq:dead:blobs") == 0
    for sha in [*victim, legacy_sha]:
        assert _on_disk(stack, sha), sha
    hist = stack.memq_json("history", "--run", "team-a/victim")
    assert len(hist["snapshots"]) == 2
    stack.memq("reanalyze", "--run", "team-a/victim")  # reads both blobs back from the store
    # idempotent: a second cleanup finds nothing more
    again = _gc(stack, MEMQ_DEAD_BLOB_GRACE_S="0")["dead_blobs"]
    assert again["dead_blobs_due"] == 0 and again["dead_blobs_removed"] == 0


def test_the_workers_beat_removes_them_without_anyone_running_gc(stack, acl, keys):
    """The cleanup rides on the stream-trim tick of the workers' beat (MEMQ_STREAM_TRIM_INTERVAL_S): with
    retention off (MEMQ_RETENTION_DAYS=0, no daily gc at all), a refused snapshot's file still goes once its
    grace has passed."""
    stack.env.update(MEMQ_STREAM_TRIM_INTERVAL_S="1", MEMQ_DEAD_BLOB_GRACE_S="2")
    stack.start_worker(concurrency=1, beat=True)
    moved = _push(stack, acl, keys["files"]["b1"], str(REAL / "opt_state_first_step" / "after_first_step.pickle.gz"),
                  "--run", "legacy", "--cluster", "c-b")
    wait_for(lambda: acl["memq"].zscore("memq:dead:blobs", moved[0]) is not None, 60, 0.2, "the dead-blob record")
    assert _on_disk(stack, moved[0])
    try:
        wait_for(lambda: not _on_disk(stack, moved[0]) and acl["memq"].zcard("memq:dead:blobs") == 0, 90, 0.5,
                 "the beat's cleanup")
    except AssertionError as exc:
        raise AssertionError(stack.log_tail("worker", 3000)) from exc
    assert all(_on_disk(stack, row[0]) for row in stack.rows("SELECT sha256 FROM snapshots"))
