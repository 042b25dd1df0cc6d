"""Signed envelopes (profiler/identity.py): what verifies, and what each failure says."""

from __future__ import annotations

import json

import pytest

from memq import envelope, identity
from memq.errors import BadInput

SECRET = "ab" * 32
RING = identity.parse_keyring(json.dumps({"keys": [
    {"kid": "k1", "principal": "team-a", "secret": SECRET, "clusters": ["h200-*"], "jobs": ["train-*", "eval"]}]}))
KEY = identity.parse_key(json.dumps({"kid": "k1", "secret": SECRET}))


def _env(**kw):
    base = {"run": "r1", "cluster": "h200-a", "job": "train-gpt", "payload": {"status": "completed"}}
    return envelope.build("run_end", **{**base, **kw})


def test_roundtrip_and_bytes_as_read_from_redis():
    f = identity.sign(_env(), KEY)
    assert identity.verify(f, RING) == "team-a"
    assert identity.verify({k.encode(): v.encode() for k, v in f.items()}, RING) == "team-a"


@pytest.mark.parametrize("field", ["run", "cluster", "job", "payload", "ts", "kind", "rank"])
def test_any_changed_field_breaks_the_signature(field):
    f = identity.sign(_env(), KEY)
    f[field] = f[field] + "0" if field != "kind" else "run_start"
    with pytest.raises(identity.IdentityError, match="bad signature"):
        identity.verify(f, RING)


def test_an_added_field_breaks_it_too():
    f = dict(identity.sign(_env(), KEY), extra_field="x")
    with pytest.raises(identity.IdentityError, match="bad signature"):
        identity.verify(f, RING)


@pytest.mark.parametrize("kw,match", [({"cluster": "a100-a"}, "may not write cluster"),
                                      ({"job": "other"}, "may not write job")])
def test_clusters_and_jobs_are_patterns_of_the_key(kw, match):
    with pytest.raises(identity.IdentityError, match=match):
        identity.verify(identity.sign(_env(**kw), KEY), RING)
    assert identity.verify(identity.sign(_env(job="eval"), KEY), RING) == "team-a"


def test_unsigned_and_unknown_key():
    with pytest.raises(identity.IdentityError, match="unsigned"):
        identity.verify(_env(), RING)
    other = identity.Key(kid="k9", secret=b"x" * 32)
    with pytest.raises(identity.IdentityError, match="unknown key id 'k9'"):
        identity.verify(identity.sign(_env(), other), RING)


@pytest.mark.parametrize("n,ok", [(identity.MIN_SECRET_BYTES, True), (identity.MIN_SECRET_BYTES - 1, False)])
def test_secret_length_just_at_and_under_the_minimum(n, ok):
    doc = json.dumps({"kid": "k", "secret": "cd" * n})
    if ok:
        assert identity.parse_key(doc).secret == bytes.fromhex("cd" * n)
    else:
        with pytest.raises(BadInput, match="at least 32 bytes"):
            identity.parse_key(doc)


@pytest.mark.parametrize("text", ["", "[]", '{"keys": []}', '{"keys": [{"kid": "k", "secret": "' + SECRET + '"}]}',
                                  '{"keys": [{"kid": "bad kid", "principal": "p", "secret": "' + SECRET + '"}]}'])
def test_bad_keyrings_are_refused_by_name(text):
    with pytest.raises(BadInput):
        identity.parse_keyring(text)


def test_owner_mismatch():
    assert identity.owner_mismatch("r", "team-a", "team-a") is None
    assert identity.owner_mismatch("r", None, "") is None
    assert "belongs to team-a" in str(identity.owner_mismatch("r", "team-a", "team-b"))
    assert "unsigned writers" in str(identity.owner_mismatch("r", None, "team-b"))
