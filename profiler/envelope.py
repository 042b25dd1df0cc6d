"""The stream entry an agent appends to `memq:ingest` (ARCHITECTURE.md, "Envelope"): build and parse.

Pure: no Redis, no I/O, stdlib only. The agent builds entries with `build(...)`; the dispatcher parses
what `XREAD`/`XREADGROUP` returns with `parse(fields)`, which accepts bytes or str keys and values and
raises `EnvelopeError` (a `BadInput`) for anything malformed, naming the field.

Fields (all strings on the wire):
    v         schema version, "1"
    kind      run_start | stats | snapshot | run_end
    run, cluster, job, rank, host   identity (job may be ""; rank is a decimal int)
    ts        sender's UTC time in milliseconds
    payload   JSON object (kind-specific; for an OOM snapshot {"oom": {alloc, device_alloc,
              device_free, device_total, message}})
    snapshot only: sha256 (hex of the UNCOMPRESSED pickle bytes), size (uncompressed bytes),
              codec (zstd | gzip: the blob at `memq:blob:<sha256>` is compressed with it),
              trigger (periodic | epoch_end | oom | manual | signal), step, epoch ("" when unknown)

Unknown extra fields are kept in `Envelope.extra` (forward compatibility), never rejected.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from profiler.errors import BadInput

VERSION = 1
KINDS = ("run_start", "stats", "snapshot", "run_end")
TRIGGERS = ("periodic", "epoch_end", "oom", "manual", "signal")
CODECS = ("zstd", "gzip")
OOM_KEYS = ("alloc", "device_alloc", "device_free", "device_total", "message")

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_MAX_PAYLOAD = 1 << 20  # 1 MiB of JSON: stats batches are small; blobs never travel in the entry
_IDENTITY = ("run", "cluster", "job", "host")
_SNAPSHOT_ONLY = ("sha256", "size", "codec", "trigger", "step", "epoch")
_KNOWN = ("v", "kind", "rank", "ts", "payload", *_IDENTITY, *_SNAPSHOT_ONLY)


class EnvelopeError(BadInput):
    """A stream entry that is not a valid memq envelope."""


@dataclass(frozen=True)
class Envelope:
    kind: str
    run: str
    cluster: str
    rank: int
    ts: int
    job: str = ""
    host: str = ""
    payload: dict = field(default_factory=dict)
    sha256: str | None = None
    size: int | None = None
    codec: str | None = None
    trigger: str | None = None
    step: int | None = None
    epoch: int | None = None
    v: int = VERSION
    extra: dict = field(default_factory=dict)

    @property
    def oom(self) -> dict | None:
        """The observer's OOM figures of a snapshot envelope, or None."""
        oom = self.payload.get("oom") if isinstance(self.payload, dict) else None
        return oom if isinstance(oom, dict) else None

    def to_fields(self) -> dict[str, str]:
        return build(self.kind, run=self.run, cluster=self.cluster, rank=self.rank, job=self.job,
                     host=self.host, ts=self.ts, payload=self.payload, sha256=self.sha256, size=self.size,
                     codec=self.codec, trigger=self.trigger, step=self.step, epoch=self.epoch)


def blob_key(sha256: str, prefix: str = "memq:") -> str:
    """Redis key of a snapshot blob: `<prefix>blob:<sha256>`."""
    if not _SHA_RE.match(sha256 or ""):
        raise EnvelopeError(f"not a sha256 hex digest: {sha256!r}")
    return f"{prefix}blob:{sha256}"


def now_ms() -> int:
    return int(time.time() * 1000)


def _opt_int(name: str, value: Any) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise EnvelopeError(f"{name} must be an int, got {value!r}")
    return str(value)


def build(kind: str, *, run: str, cluster: str, rank: int = 0, job: str | None = "", host: str | None = "",
          ts: int | None = None, payload: Mapping | None = None, sha256: str | None = None,
          size: int | None = None, codec: str | None = None, trigger: str | None = None,
          step: int | None = None, epoch: int | None = None) -> dict[str, str]:
    """The stream fields of one envelope, validated. Raises EnvelopeError."""
    if kind not in KINDS:
        raise EnvelopeError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    for name, val in (("run", run), ("cluster", cluster)):
        if not isinstance(val, str) or not val:
            raise EnvelopeError(f"{name} must be a non-empty string")
    try:
        body = json.dumps(dict(payload or {}), separators=(",", ":"), default=str, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise EnvelopeError(f"payload is not JSON-serialisable ({exc})") from exc
    if len(body) > _MAX_PAYLOAD:
        raise EnvelopeError(f"payload is {len(body)} bytes, over the {_MAX_PAYLOAD} byte limit")
    fields = {
        "v": str(VERSION), "kind": kind, "run": run, "cluster": cluster, "job": str(job or ""),
        "rank": _opt_int("rank", rank) or "0", "host": str(host or ""),
        "ts": _opt_int("ts", now_ms() if ts is None else ts), "payload": body,
    }
    if kind == "snapshot":
        if not _SHA_RE.match(sha256 or ""):
            raise EnvelopeError(f"snapshot needs a lowercase sha256 hex digest, got {sha256!r}")
        if codec not in CODECS:
            raise EnvelopeError(f"codec must be one of {', '.join(CODECS)}, got {codec!r}")
        if trigger not in TRIGGERS:
            raise EnvelopeError(f"trigger must be one of {', '.join(TRIGGERS)}, got {trigger!r}")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise EnvelopeError(f"size must be a positive int, got {size!r}")
        fields.update(sha256=sha256, size=str(size), codec=codec, trigger=trigger,
                      step=_opt_int("step", step), epoch=_opt_int("epoch", epoch))
    return fields


def _text(v: Any, name: str) -> str:
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EnvelopeError(f"field {name} is not UTF-8") from exc
    if isinstance(v, str):
        return v
    raise EnvelopeError(f"field {name} has type {type(v).__name__}, expected str or bytes")


def _int(d: Mapping[str, str], name: str, *, required: bool, minimum: int | None = None) -> int | None:
    raw = d.get(name, "")
    if raw == "":
        if required:
            raise EnvelopeError(f"missing field {name}")
        return None
    try:
        val = int(raw)
    except ValueError as exc:
        raise EnvelopeError(f"field {name} is not an integer: {raw[:40]!r}") from exc
    if minimum is not None and val < minimum:
        raise EnvelopeError(f"field {name} must be >= {minimum}, got {val}")
    return val


def parse(fields: Mapping[Any, Any]) -> Envelope:
    """Stream entry fields (str or bytes) -> Envelope. Raises EnvelopeError."""
    if not isinstance(fields, Mapping):
        raise EnvelopeError("an envelope is a mapping of fields")
    d = {_text(k, "name"): _text(v, str(k)) for k, v in fields.items()}
    v = _int(d, "v", required=True)
    if v != VERSION:
        raise EnvelopeError(f"unsupported envelope version {v} (this reader knows {VERSION})")
    kind = d.get("kind", "")
    if kind not in KINDS:
        raise EnvelopeError(f"unknown kind {kind!r}")
    for name in ("run", "cluster"):
        if not d.get(name):
            raise EnvelopeError(f"missing field {name}")
    raw_payload = d.get("payload", "") or "{}"
    if len(raw_payload) > _MAX_PAYLOAD:
        raise EnvelopeError("payload is too large")
    try:
        payload = json.loads(raw_payload)
    except (ValueError, RecursionError) as exc:
        raise EnvelopeError(f"payload is not valid JSON ({exc})") from exc
    if not isinstance(payload, dict):
        raise EnvelopeError("payload must be a JSON object")
    snap: dict[str, Any] = {}
    if kind == "snapshot":
        sha = d.get("sha256", "")
        if not _SHA_RE.match(sha):
            raise EnvelopeError(f"field sha256 is not a lowercase sha256 hex digest: {sha[:70]!r}")
        if d.get("codec") not in CODECS:
            raise EnvelopeError(f"field codec must be one of {', '.join(CODECS)}")
        if d.get("trigger") not in TRIGGERS:
            raise EnvelopeError(f"field trigger must be one of {', '.join(TRIGGERS)}")
        oom = payload.get("oom")
        if oom is not None:
            if not isinstance(oom, dict):
                raise EnvelopeError("payload.oom must be an object")
            for key in OOM_KEYS[:4]:
                if oom.get(key) is not None and (not isinstance(oom[key], int) or isinstance(oom[key], bool)):
                    raise EnvelopeError(f"payload.oom.{key} must be an integer or null")
        snap = dict(sha256=sha, size=_int(d, "size", required=True, minimum=1), codec=d["codec"],
                    trigger=d["trigger"], step=_int(d, "step", required=False),
                    epoch=_int(d, "epoch", required=False))
    return Envelope(kind=kind, run=d["run"], cluster=d["cluster"], job=d.get("job", ""), host=d.get("host", ""),
                    rank=_int(d, "rank", required=True, minimum=0), ts=_int(d, "ts", required=True, minimum=0),
                    payload=payload, v=v, extra={k: val for k, val in d.items() if k not in _KNOWN}, **snap)
