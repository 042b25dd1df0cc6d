"""One job cannot touch another's data (deploy/SECURITY.md, "Identity"): a dispatcher with a keyring takes only
signed envelopes, each within its key's clusters and jobs, and scopes every run name by the principal that
signed it (`team-a/victim`), so no key can claim, fill or shadow another's run. A private redis-server with the
shipped ACL file (deploy/redis, via make-secrets.sh): the services as `memq`, every writer as `memq-agent`,
which may only SET blobs and RPUSH to the inbox, so every envelope here goes through the inbox and the
dispatcher's relay. A real dispatcher and worker (with its beat) on their own PostgreSQL database; the victim's
run is pushed with `memq push` under its own key, the attacks are what an agent with another team's key (or
none) can write."""

from __future__ import annotations

import json
import secrets

import pytest

from memq import envelope, identity, redis_functions
from tests.ops.acl_redis import acl_redis
from tests.workers.stack import REAL, as_training_job, keyring_stack, wait_for

pytestmark = [pytest.mark.redis, pytest.mark.postgres, pytest.mark.timeout(300)]

SGD = REAL / "seed_sgd"


def _key(kid: str, principal: str, clusters: list[str]) -> dict:
    return {"kid": kid, "principal": principal, "secret": secrets.token_hex(32), "clusters": clusters}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    ring = [_key("a1", "team-a", ["c-a"]), _key("a2", "team-a", ["c-a"]), _key("b1", "team-b", ["c-b", "c-b-*"])]
    (d / "keyring.json").write_text(json.dumps({"keys": ring}))
    files = {}
    for k in ring:
        files[k["kid"]] = d / f"{k['kid']}.json"
        files[k["kid"]].write_text(json.dumps({"kid": k["kid"], "secret": k["secret"]}))
    return {"ring": d / "keyring.json", "files": files,
            "keys": {k["kid"]: identity.Key(kid=k["kid"], secret=bytes.fromhex(k["secret"])) for k in ring}}


@pytest.fixture(scope="module")
def acl(tmp_path_factory):
    with acl_redis(tmp_path_factory.mktemp("ident_acl")) as srv:
        yield srv


@pytest.fixture(scope="module")
def stack(tmp_path_factory, acl, pg_server, keys):
    with keyring_stack(tmp_path_factory.mktemp("ident"), acl["memq_url"], keys["ring"], "ident", worker=True) as s:
        yield s


def _push(stack, acl, key_file, *args, check=True):
    """`memq push` as a training job: the agent's Redis user (XADD refused: the inbox), its own key."""
    with as_training_job(stack, acl["agent_url"], key_file):
        return stack.memq("push", *args, check=check)


def _inbox(acl, fields: dict) -> None:
    """What an agent with the agent user's password can append: one inbox element."""
    acl["agents"]["file"].rpush("memq:ingest:inbox", redis_functions.encode_fields(fields))


def _victim(stack, name: str = "team-a/victim") -> dict:
    return stack.memq_json("history", "--run", name)


def _dead_reasons(stack) -> list[str]:
    return [d.get("reason", "") for d in stack.dead()]


def test_a_run_is_its_creators(stack, acl, keys):
    _push(stack, acl, keys["files"]["a1"], str(SGD / "epoch0.pickle.gz"), "--run", "victim", "--cluster", "c-a",
          "--job", "train")
    _push(stack, acl, keys["files"]["a2"], str(SGD / "epoch1.pickle.gz"), "--run", "victim", "--cluster", "c-a",
          "--job", "train")  # the same team's rotated key writes the same run
    try:
        wait_for(lambda: _victim(stack)["run"]["snapshot_count"] == 2, 90, 0.5, "the two snapshots")
    except AssertionError as exc:
        raise AssertionError((_dead_reasons(stack), stack.log_tail("dispatcher", 1500))) from exc
    before = _victim(stack)["run"]
    assert stack.rows("SELECT owner FROM runs WHERE name = 'team-a/victim'")[0][0] == "team-a"

    # another team's key, its own cluster, the victim's run name: an OOM snapshot, a run_start, a run_end
    # (stored under team-b/victim: the other team's own run, nothing of the victim's)
    _push(stack, acl, keys["files"]["b1"], str(REAL / "capacity" / "oom.pickle.gz"), "--run", "victim",
          "--cluster", "c-b", "--trigger", "oom", "--status", "oom",
          "--oom-message", "CUDA out of memory. Tried to allocate 2.00 GiB")  # a forged OOM
    for kind, payload in (("run_start", {"world_size": 1, "device_total": 1}), ("run_end", {"status": "oom"})):
        _inbox(acl, identity.sign(envelope.build(kind, run="victim", cluster="c-b", job="train", payload=payload),
                                  keys["keys"]["b1"]))
    # the other team claiming the victim's cluster; a tampered signature; no signature at all
    _push(stack, acl, keys["files"]["b1"], str(SGD / "epoch2.pickle.gz"), "--run", "b-run", "--cluster", "c-a")
    good = identity.sign(envelope.build("run_end", run="victim", cluster="c-a", job="train",
                                        payload={"status": "completed"}), keys["keys"]["a1"])
    _inbox(acl, dict(good, payload=json.dumps({"status": "oom"})))
    _push(stack, acl, None, str(SGD / "epoch2.pickle.gz"), "--run", "victim", "--cluster", "c-a", "--job", "train")

    # each push is three envelopes (run_start, snapshot, run_end): 3 + 1 dead letters at the dispatcher;
    # the unsigned push's 3 never reach it: the relay drops them (no signature of a key in the keyring)
    expected = {"may not write cluster 'c-a'": 3, "bad signature": 1}

    def all_dead():
        r = _dead_reasons(stack)
        dropped = sum(int(d.get("dropped", 0)) for d in stack.dead() if d.get("relay_error"))
        return all(sum(k in x for x in r) >= n for k, n in expected.items()) and dropped >= 3 and r
    try:
        wait_for(all_dead, 90, 0.5, "every forged envelope dead-lettered")
    except AssertionError as exc:
        raise AssertionError((_dead_reasons(stack), stack.log_tail("dispatcher", 1500))) from exc
    after = _victim(stack)["run"]
    for k in ("cluster", "job", "status", "world_size", "gpu_memory_bytes", "snapshot_count", "ended_at",
              "oom_count", "primary_cause"):
        assert after[k] == before[k], k
    assert stack.rows("SELECT count(*) FROM runs WHERE name IN ('b-run', 'team-b/b-run')")[0][0] == 0
    assert stack.rows("SELECT count(*) FROM runs WHERE name = 'victim'")[0][0] == 0
    wait_for(lambda: _victim(stack, "team-b/victim")["run"]["oom_count"] >= 1, 90, 0.5, "team-b's own OOM")
    assert not any("belongs to" in r for r in _dead_reasons(stack))


def test_a_squatted_run_name_neither_dead_letters_the_owner_nor_shows_the_forgery(stack, acl, keys):
    """Round 4, attack 3: team-b's key claims run `llama-sft-0412` first, with a forged OOM; then the
    real owner (team-a) pushes its run of that name. Every envelope of team-a is taken (none
    dead-lettered "belongs to team-b"), and team-a's history of the run holds its snapshot, not the
    squatter's OOM: the two are different runs, `team-b/llama-sft-0412` and `team-a/llama-sft-0412`."""
    run = "llama-sft-0412"
    _push(stack, acl, keys["files"]["b1"], str(REAL / "capacity" / "oom.pickle.gz"), "--run", run,
          "--cluster", "c-b", "--trigger", "oom", "--status", "oom",
          "--oom-message", "CUDA out of memory. Tried to allocate 2.00 GiB")
    wait_for(lambda: stack.rows("SELECT count(*) FROM runs WHERE name = :n", n=f"team-b/{run}")[0][0] == 1,
             90, 0.5, "the squatter's run")
    _push(stack, acl, keys["files"]["a1"], str(SGD / "epoch0.pickle.gz"), "--run", run, "--cluster", "c-a",
          "--job", "sft")
    try:
        wait_for(lambda: _victim(stack, f"team-a/{run}")["run"]["snapshot_count"] == 1, 90, 0.5, "the owner's run")
    except AssertionError as exc:
        raise AssertionError((_dead_reasons(stack), stack.log_tail("dispatcher", 1500))) from exc
    mine = _victim(stack, f"team-a/{run}")["run"]
    assert mine["cluster"] == "c-a" and mine["job"] == "sft" and mine["oom_count"] == 0
    assert mine["status"] != "oom"
    assert not any(run in r and "belongs to" in r for r in _dead_reasons(stack))
    owners = stack.rows("SELECT name, owner FROM runs WHERE name LIKE :p ORDER BY owner", p=f"%{run}")
    assert [tuple(r) for r in owners] == [(f"team-a/{run}", "team-a"), (f"team-b/{run}", "team-b")]


def test_a_key_cannot_claim_another_principals_scoped_name(stack, acl, keys):
    """Round 5 (run-name scope turned against another team): team-b sends the victim's full stored name,
    `team-a/<run>`, first, with a forged OOM, hoping it is kept as it is (a name that already carries the
    signer's prefix is). It is stored under team-b's own prefix; team-a's own run of that name is taken
    whole and shows no OOM."""
    run = "qwen-dpo-0501"
    _push(stack, acl, keys["files"]["b1"], str(REAL / "capacity" / "oom.pickle.gz"), "--run", f"team-a/{run}",
          "--cluster", "c-b", "--trigger", "oom", "--status", "oom",
          "--oom-message", "CUDA out of memory. Tried to allocate 2.00 GiB")
    wait_for(lambda: stack.rows("SELECT count(*) FROM runs WHERE name = :n", n=f"team-b/team-a/{run}")[0][0] == 1,
             90, 0.5, "the squatter's run under its own prefix")
    assert stack.rows("SELECT count(*) FROM runs WHERE name = :n", n=f"team-a/{run}")[0][0] == 0
    _push(stack, acl, keys["files"]["a1"], str(SGD / "epoch1.pickle.gz"), "--run", run, "--cluster", "c-a",
          "--job", "dpo")
    wait_for(lambda: _victim(stack, f"team-a/{run}")["run"]["snapshot_count"] == 1, 90, 0.5, "the owner's run")
    mine = _victim(stack, f"team-a/{run}")["run"]
    assert mine["oom_count"] == 0 and mine["status"] != "oom" and mine["cluster"] == "c-a"
    assert not any(run in r for r in _dead_reasons(stack))
