"""`memq key new --principal P` (issue 42 item 8): the agent's key file and the keyring entry, in the
formats memq.identity reads, files private to their owner; the key signs what the keyring verifies."""

from __future__ import annotations

import json
import stat

from click.testing import CliRunner

from memq.cli import cli
from memq.config import load_settings
from memq.identity import parse_key, parse_keyring, sign, verify


def memq(*args, code=0):
    res = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
    assert res.exit_code == code, f"memq {' '.join(map(str, args))} exited {res.exit_code}: {res.output}"
    return res


def test_key_new_writes_the_key_and_the_keyring_entry(tmp_path):
    ring, ka, kb = tmp_path / "keyring.json", tmp_path / "a.json", tmp_path / "b.json"
    out = memq("key", "new", "--principal", "team-a", "--key-file", ka, "--keyring", ring, "--cluster", "c1-*").output
    assert "MEMQ_AGENT_KEY_FILE=" in out and "MEMQ_AGENT_KEYRING_FILE" in out
    memq("key", "new", "--principal", "team-b", "--key-file", kb, "--keyring", ring)
    for p in (ring, ka, kb):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600
    keys = parse_keyring(ring.read_text())
    a = parse_key(ka.read_text())
    assert keys[a.kid].principal == "team-a" and keys[a.kid].clusters == ("c1-*",) and len(keys) == 2
    # the settings read them as the units hand them over
    st = load_settings({"MEMQ_AGENT_KEY_FILE": str(ka), "MEMQ_AGENT_KEYRING_FILE": str(ring),
                        "MEMQ_DATA_DIR": str(tmp_path)})
    assert parse_key(st.agent_key) == a
    fields = sign({"type": "run_start", "run": "r1", "cluster": "c1-east", "job": "j"}, a)
    assert verify(fields, parse_keyring(st.agent_keyring)) == "team-a"
    # a key file is never overwritten
    assert "never overwritten" in memq("key", "new", "--principal", "team-a", "--key-file", ka, "--keyring", ring,
                                       code=2).output
    assert "principal" in memq("key", "new", "--principal", "a/b", "--keyring", ring, code=2).output
    assert len(json.loads(ring.read_text())["keys"]) == 2
