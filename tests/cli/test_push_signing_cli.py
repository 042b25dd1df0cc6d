"""`memq push` says what the pusher can know about how its envelopes will be taken (issue 42 item 9):
unsigned ones, or a key the configured keyring refuses, are not reported as plainly "pushed"; a
signed push the keyring takes says nothing more. Real Redis under a key prefix of the test's own."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from click.testing import CliRunner

from memq.cli import cli
from tests.helpers import REAL

SNAP = str(REAL / "capacity" / "oom.pickle.gz")


@pytest.fixture
def pushing(tmp_path, monkeypatch):
    prefix = f"memq-test-pushsig-{uuid.uuid4().hex[:8]}:"
    for k, v in {"MEMQ_REDIS_URL": "redis://127.0.0.1:6379/0", "MEMQ_KEY_PREFIX": prefix,
                 "MEMQ_STREAM": prefix + "ingest", "MEMQ_DATA_DIR": str(tmp_path / "data"),
                 "MEMQ_CONFIG": str(tmp_path / "none.toml")}.items():
        monkeypatch.setenv(k, v)
    for k in ("MEMQ_AGENT_KEY", "MEMQ_AGENT_KEY_FILE", "MEMQ_AGENT_KEYRING", "MEMQ_AGENT_KEYRING_FILE"):
        monkeypatch.delenv(k, raising=False)
    yield tmp_path
    r = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    for key in r.scan_iter(match=prefix + "*"):  # only this test's keys
        r.delete(key)


def push(*extra):
    res = CliRunner().invoke(cli, ["push", SNAP, "--run", "r1", "--cluster", "east", *extra])
    assert res.exit_code == 0, res.output
    return res


def test_unsigned_push_says_so(pushing):
    res = push()
    assert "unsigned" in res.stderr and "memq status" in res.stderr and "memq key new" in res.stderr
    assert "pushed " not in res.stdout and "sent " in res.stdout
    assert "unsigned" in json.loads(push("--json").stdout)["warning"]


def test_a_key_the_keyring_lacks_is_named(pushing, monkeypatch):
    ring = pushing / "ring.json"
    run = CliRunner().invoke
    assert run(cli, ["key", "new", "--principal", "a", "--key-file", pushing / "a.json",
                     "--keyring", ring]).exit_code == 0
    other = pushing / "other-ring.json"
    assert run(cli, ["key", "new", "--principal", "b", "--key-file", pushing / "b.json", "--keyring", other,
                     "--cluster", "west"]).exit_code == 0
    monkeypatch.setenv("MEMQ_AGENT_KEY_FILE", str(pushing / "a.json"))
    monkeypatch.setenv("MEMQ_AGENT_KEYRING_FILE", str(ring))
    res = push()
    assert res.stderr == "" and "pushed " in res.stdout  # the keyring takes it: nothing more to say
    monkeypatch.setenv("MEMQ_AGENT_KEYRING_FILE", str(other))
    res = push()
    assert "refuses this key" in res.stderr and "memq status" in res.stderr and "pushed " not in res.stdout
    monkeypatch.setenv("MEMQ_AGENT_KEY_FILE", str(pushing / "b.json"))
    res = push()  # in the keyring, but not for cluster east
    assert "refuses this key" in res.stderr and "east" in res.stderr
