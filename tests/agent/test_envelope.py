from __future__ import annotations

import json

import pytest

from memq import envelope
from memq.envelope import EnvelopeError
from memq.errors import BadInput

SHA = "a" * 64


def snap_fields(**over):
    kw = dict(run="r", cluster="c", rank=3, job="j1", host="h", ts=1700000000000, payload={"oom": {
        "alloc": 10, "device_alloc": 20, "device_free": 5, "device_total": 100, "message": "CUDA out of memory."}},
        sha256=SHA, size=1234, codec="zstd", trigger="oom", step=7, epoch=1)
    kw.update(over)
    return envelope.build("snapshot", **kw)


def test_snapshot_roundtrip_bytes_and_str():
    fields = snap_fields()
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in fields.items())
    assert fields["v"] == "1" and fields["kind"] == "snapshot" and fields["step"] == "7"
    for form in (fields, {k.encode(): v.encode() for k, v in fields.items()}):
        env = envelope.parse(form)
        assert (env.run, env.cluster, env.rank, env.job, env.host) == ("r", "c", 3, "j1", "h")
        assert (env.sha256, env.size, env.codec, env.trigger, env.step, env.epoch) == (SHA, 1234, "zstd", "oom", 7, 1)
        assert env.oom["alloc"] == 10 and env.oom["message"].startswith("CUDA")
        assert env.to_fields() == fields


def test_other_kinds_and_optional_fields():
    f = envelope.build("stats", run="r", cluster="c", payload={"samples": [{"a": 1, "t": 1.7e9}]})
    env = envelope.parse(f)
    assert env.kind == "stats" and env.payload["samples"] == [{"a": 1, "t": 1.7e9}] and env.sha256 is None
    assert env.rank == 0 and env.ts > 0
    s = envelope.parse(snap_fields(step=None, epoch=None, payload={}))
    assert s.step is None and s.epoch is None and s.oom is None


def test_unknown_fields_are_kept():
    f = snap_fields()
    f["future"] = "x"
    assert envelope.parse(f).extra == {"future": "x"}


def test_blob_key():
    assert envelope.blob_key(SHA) == f"memq:blob:{SHA}"
    assert envelope.blob_key(SHA, "p:") == f"p:blob:{SHA}"
    with pytest.raises(EnvelopeError):
        envelope.blob_key("nothex")
    nonce = envelope.new_nonce()
    assert envelope.blob_key(SHA, "p:", nonce) == f"p:blob:{SHA}:{nonce}" and len(nonce) == 32
    with pytest.raises(EnvelopeError):
        envelope.blob_key(SHA, "p:", "../../x")


def test_nonce_travels_in_the_envelope_and_names_the_blob():
    nonce = envelope.new_nonce()
    f = envelope.build("snapshot", run="r", cluster="c", sha256=SHA, size=10, codec="zstd", trigger="oom",
                       nonce=nonce)
    env = envelope.parse(f)
    assert env.nonce == nonce and env.blob_key("p:") == f"p:blob:{SHA}:{nonce}"
    assert envelope.parse(env.to_fields()).nonce == nonce
    for bad in ("UPPER" * 6 + "ab", "0" * 31, "z" * 32):
        with pytest.raises(EnvelopeError, match="nonce"):
            envelope.parse({**f, "nonce": bad})
    with pytest.raises(EnvelopeError, match="belong to snapshot"):
        envelope.parse({**envelope.build("run_start", run="r", cluster="c"), "nonce": nonce})


@pytest.mark.parametrize("mutate", [
    lambda f: f.pop("v"),
    lambda f: f.update(v="2"),
    lambda f: f.update(kind="weird"),
    lambda f: f.pop("run"),
    lambda f: f.update(cluster=""),
    lambda f: f.update(rank="-1"),
    lambda f: f.update(rank="x"),
    lambda f: f.pop("ts"),
    lambda f: f.update(payload="{not json"),
    lambda f: f.update(payload="[1,2]"),
    lambda f: f.update(sha256="ABC"),
    lambda f: f.update(sha256="A" * 64),
    lambda f: f.update(codec="lz4"),
    lambda f: f.update(trigger="sometimes"),
    lambda f: f.update(size="0"),
    lambda f: f.pop("size"),
    lambda f: f.update(step="1.5"),
    lambda f: f.update(payload=json.dumps({"oom": {"alloc": "big"}})),
    lambda f: f.update(payload=json.dumps({"oom": [1]})),
])
def test_parse_rejects(mutate):
    f = snap_fields()
    mutate(f)
    with pytest.raises(EnvelopeError) as ei:
        envelope.parse(f)
    assert isinstance(ei.value, BadInput)


def test_parse_rejects_non_mapping_and_bad_bytes():
    with pytest.raises(EnvelopeError):
        envelope.parse([("v", "1")])
    f = {k.encode(): v.encode() for k, v in snap_fields().items()}
    f[b"run"] = b"\xff\xfe"
    with pytest.raises(EnvelopeError):
        envelope.parse(f)


@pytest.mark.parametrize("kw", [
    dict(kind="nope"), dict(run=""), dict(sha256=None), dict(codec=None), dict(trigger=None), dict(size=0),
    dict(step="3"), dict(payload={"x": float("nan")}), dict(payload={"x": "y" * (2 << 20)}),
])
def test_build_rejects(kw):
    kind = kw.pop("kind", "snapshot")
    base = dict(run="r", cluster="c", sha256=SHA, size=1, codec="gzip", trigger="manual")
    base.update(kw)
    with pytest.raises(EnvelopeError):
        envelope.build(kind, **base)
