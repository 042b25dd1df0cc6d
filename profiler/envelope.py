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

import base64
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from memq import names
from memq.errors import BadInput
from memq.model import RUN_STATUSES, TRIGGERS

VERSION = 1
KINDS = ("run_start", "stats", "snapshot", "run_end")
CODECS = ("zstd", "gzip")
OOM_KEYS = ("alloc", "device_alloc", "device_free", "device_total", "message")

_SHA_RE = re.compile(r"^[0-9a-f]{64}$")
_NONCE_RE = re.compile(r"^[0-9a-f]{32}$")
_MAX_PAYLOAD = 1 << 20  # 1 MiB of JSON: stats batches are small; blobs never travel in the entry
_IDENTITY = ("run", "cluster", "job", "host")
_SNAPSHOT_ONLY = ("sha256", "size", "codec", "trigger", "step", "epoch", "nonce")
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
    nonce: str | None = None
    v: int = VERSION
    extra: dict = field(default_factory=dict)
    #: The principal whose key signed it (profiler/identity.py, set by the dispatcher); "" unsigned.
    owner: str = ""

    @property
    def oom(self) -> dict | None:
        """The observer's OOM figures of a snapshot envelope, or None."""
        oom = self.payload.get("oom") if isinstance(self.payload, dict) else None
        return oom if isinstance(oom, dict) else None

    def to_fields(self) -> dict[str, str]:
        return build(self.kind, run=self.run, cluster=self.cluster, rank=self.rank, job=self.job,
                     host=self.host, ts=self.ts, payload=self.payload, sha256=self.sha256, size=self.size,
                     codec=self.codec, trigger=self.trigger, step=self.step, epoch=self.epoch,
                     nonce=self.nonce)

    def blob_key(self, prefix: str = "memq:") -> str:
        """Where this snapshot's blob waits in Redis."""
        return blob_key(self.sha256 or "", prefix, self.nonce)


def blob_key(sha256: str, prefix: str = "memq:", nonce: str | None = None) -> str:
    """Redis key of a snapshot blob: `<prefix>blob:<sha256>`, or `<prefix>blob:<sha256>:<nonce>`.

    Agents add a random nonce (sent only in the envelope, which the agent ACL cannot read back): every
    agent shares one Redis user that may SET `memq:blob:*`, and with the bare sha256 as the key one job
    could overwrite another job's blob in flight (identical snapshots are public knowledge: the
    sha256 of a common model's warm-up) and have it dead-lettered as corrupt. Entries without a nonce
    (`memq push` of older versions, tests) keep the bare key."""
    if not _SHA_RE.match(sha256 or ""):
        raise EnvelopeError(f"not a sha256 hex digest: {sha256!r}")
    if nonce:
        if not _NONCE_RE.match(nonce):
            raise EnvelopeError(f"not a blob nonce (32 lowercase hex digits): {nonce!r}")
        return f"{prefix}blob:{sha256}:{nonce}"
    return f"{prefix}blob:{sha256}"


def new_nonce() -> str:
    return secrets.token_hex(16)


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
          step: int | None = None, epoch: int | None = None, nonce: str | None = None) -> dict[str, str]:
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
        if nonce:
            if not _NONCE_RE.match(nonce):
                raise EnvelopeError(f"nonce must be 32 lowercase hex digits, got {nonce!r}")
            fields["nonce"] = nonce
    return fields


# ------------------------------------------------------------------------------------- the door
# `parse` is the one schema every entry passes before anything is stored: types, ranges, lengths,
# encodings and times. What it refuses is dead-lettered by the dispatcher with the message as reason.

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
MAX_RANK = 1 << 20
MAX_STEP = 1 << 53
MAX_EPOCH = 1_000_000
#: 2020-01-01T00:00:00Z. No memq agent sent anything earlier: a smaller `ts` is a broken clock or a
#: forgery (ts=0 would file the run under 1970-01-01).
MIN_TS_MS = 1_577_836_800_000
MAX_SAMPLES = 10_000
MAX_OOM_MESSAGE = 64 * 1024
MAX_EXTRA_FIELDS = 32
MAX_EXTRA_VALUE = 4096
MAX_JSON_DEPTH = 32
#: What agents before 2026-12-01 sent for a run that died of a non-OOM exception: accepted at the door
#: (a fleet upgrades slowly; their run_end must not be dead-lettered) and stored as "crashed".
LEGACY_RUN_STATUSES = {"error": "crashed"}
#: Stat sample keys the dispatcher stores (repository.stat_row) and the largest value of each column.
STAT_KEYS = {
    **dict.fromkeys(("allocated_bytes.all.current", "allocated_bytes", "reserved_bytes.all.current",
                     "reserved_bytes", "active_bytes.all.current", "active_bytes",
                     "inactive_split_bytes.all.current", "inactive_split_bytes"), INT64_MAX),
    **dict.fromkeys(("num_alloc_retries", "alloc_retries", "num_ooms", "oom_count"), INT32_MAX),
}
#: Longest wire value (bytes) of each known field; checked before anything is decoded.
_WIRE_MAX = {"payload": _MAX_PAYLOAD, "run": 800, "cluster": 800, "job": 800, "host": 1020}
_WIRE_DEFAULT = 64
_INT_RE = re.compile(r"-?(0|[1-9][0-9]{0,18})\Z")
_FIELD_NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")


@dataclass(frozen=True)
class Limits:
    """What the door accepts that depends on the deployment (MEMQ_MAX_CLOCK_SKEW_S,
    MEMQ_MAX_SNAPSHOT_BYTES) and on the time now (`now_ms`, None: the clock when parsing)."""

    max_skew_s: int = 86_400
    max_snapshot_bytes: int = 4 * 1024**3
    now_ms: int | None = None

    @classmethod
    def of(cls, settings: Any) -> Limits:
        return cls(max_skew_s=int(settings.max_clock_skew_s), max_snapshot_bytes=int(settings.max_snapshot_bytes))

    def ts_window_ms(self) -> tuple[int, int]:
        now = now_ms() if self.now_ms is None else self.now_ms
        return MIN_TS_MS, now + 1000 * max(0, self.max_skew_s)


def _shown(v: Any, n: int = 40) -> str:
    """A value quoted for a reason: escaped (no control characters reach a terminal), cut."""
    if isinstance(v, (bytes, str)) and len(v) > n:
        return ascii(v[:n]) + f"... ({len(v)} long)"
    return ascii(v)


def _text(v: Any, name: str) -> str:
    if isinstance(v, bytes):
        limit = _WIRE_MAX.get(name, MAX_EXTRA_VALUE if name not in _KNOWN else _WIRE_DEFAULT)
        if len(v) > limit:
            raise EnvelopeError(f"field {_shown(name)} is {len(v)} bytes long, over its limit of {limit}")
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EnvelopeError(f"field {_shown(name)} is not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise EnvelopeError(f"field {_shown(name)} holds a lone surrogate (not UTF-8)") from exc
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    raise EnvelopeError(f"field {_shown(name)} has type {type(v).__name__}, expected str or bytes")


def _field_name(k: Any) -> str:
    if isinstance(k, bytes):
        if len(k) > 64:
            raise EnvelopeError(f"a field name is {len(k)} bytes long: {_shown(k)}")
        try:
            k = k.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise EnvelopeError(f"field name {_shown(k)} is not UTF-8") from exc
    if not isinstance(k, str) or not _FIELD_NAME_RE.match(k):
        raise EnvelopeError(f"field name {_shown(k)} is not 1-64 letters, digits or _.:-")
    return k


def _int(d: Mapping[str, str], name: str, *, required: bool, lo: int = 0, hi: int = INT64_MAX) -> int | None:
    raw = d.get(name, "")
    if raw == "":
        if required:
            raise EnvelopeError(f"missing field {name}")
        return None
    if not _INT_RE.match(raw):
        raise EnvelopeError(f"field {name} is not a decimal integer: {_shown(raw)}")
    val = int(raw)
    if not lo <= val <= hi:
        raise EnvelopeError(f"field {name} is {_shown(raw)}, outside {lo}..{hi}")
    return val


def _json_problem(obj: Any) -> str | None:
    """Why a decoded payload cannot be stored as it is (PostgreSQL text refuses NUL; int64 and
    finite floats only; bounded depth), or None."""
    stack: list[tuple[Any, str, int]] = [(obj, "payload", 0)]
    while stack:
        o, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"{path} is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(o, dict):
            for k, v in o.items():
                bad = _str_problem(k)
                if bad:
                    return f"a key of {path} {bad}"
                stack.append((v, f"{path}.{ascii(k[:30])[1:-1]}", depth + 1))
        elif isinstance(o, list):
            stack.extend((v, f"{path}[{i}]", depth + 1) for i, v in enumerate(o))
        elif isinstance(o, str):
            bad = _str_problem(o)
            if bad:
                return f"{path} {bad}"
        elif isinstance(o, bool) or o is None:
            continue
        elif isinstance(o, int):
            if not -INT64_MAX - 1 <= o <= INT64_MAX:
                return f"{path} is an integer outside int64"
        elif isinstance(o, float):
            if o != o or o in (float("inf"), float("-inf")):
                return f"{path} is not a finite number"
    return None


def _str_problem(s: str) -> str | None:
    if "\x00" in s:
        return "holds a NUL character"
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return "holds a lone surrogate (not UTF-8)"
    return None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _count(obj: Mapping, key: str, where: str, hi: int, *, lo: int = 0) -> None:
    """`obj[key]`, when present and not null, is an integer in lo..hi."""
    v = obj.get(key)
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise EnvelopeError(f"{where}.{key} must be an integer or null, got {_shown(v)}")
    if not lo <= v <= hi:
        raise EnvelopeError(f"{where}.{key} is {v}, outside {lo}..{hi}")


def _check_stats(payload: dict, lo_ms: int, hi_ms: int) -> None:
    samples = payload.get("samples")
    if not isinstance(samples, list):
        raise EnvelopeError("payload.samples must be a list")
    if len(samples) > MAX_SAMPLES:
        raise EnvelopeError(f"payload.samples has {len(samples)} samples, over {MAX_SAMPLES}")
    for i, smp in enumerate(samples):
        where = f"payload.samples[{i}]"
        if not isinstance(smp, dict):
            raise EnvelopeError(f"{where} must be an object")
        t = smp.get("t")
        if isinstance(t, bool) or not isinstance(t, (int, float)):
            raise EnvelopeError(f"{where}.t (epoch seconds) is missing or not a number: {_shown(t)}")
        if not lo_ms / 1000.0 <= t <= hi_ms / 1000.0:
            raise EnvelopeError(f"{where}.t = {_shown(t)} is outside the accepted window "
                                f"{lo_ms // 1000}..{hi_ms // 1000} (epoch seconds)")
        if "device_metadata" in smp:
            continue  # the run's metadata, not a sample: not stored as a row
        _count(smp, "step", where, MAX_STEP)
        _count(smp, "epoch", where, MAX_EPOCH)
        for key, hi in STAT_KEYS.items():
            v = smp.get(key)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= hi:
                raise EnvelopeError(f"{where}.{key} must be a count in 0..{hi}, got {_shown(v)}")


def _check_kind_payload(kind: str, payload: dict, lo_ms: int, hi_ms: int) -> None:
    if kind == "stats":
        _check_stats(payload, lo_ms, hi_ms)
    elif kind == "run_start":
        for key in ("device_total", "limit_bytes", "params"):
            _count(payload, key, "payload", INT64_MAX)
        _count(payload, "world_size", "payload", INT32_MAX)
    elif kind == "run_end":
        status = payload.get("status")
        if status is not None and status not in RUN_STATUSES and status not in LEGACY_RUN_STATUSES:
            raise EnvelopeError(f"payload.status must be one of {', '.join(RUN_STATUSES)}, got {_shown(status)}")
    elif kind == "snapshot":
        oom = payload.get("oom")
        if oom is not None:
            if not isinstance(oom, dict):
                raise EnvelopeError("payload.oom must be an object")
            for key in OOM_KEYS[:4]:
                _count(oom, key, "payload.oom", INT64_MAX)
            msg = oom.get("message")
            if msg is not None and (not isinstance(msg, str) or len(msg) > MAX_OOM_MESSAGE):
                raise EnvelopeError(f"payload.oom.message must be text of at most {MAX_OOM_MESSAGE} characters")


def parse(fields: Mapping[Any, Any], limits: Limits | None = None) -> Envelope:
    """Stream entry fields (str or bytes) -> Envelope, or EnvelopeError naming what is wrong.
    Never raises anything else for any input (tests/fuzz/test_fuzz_envelope.py)."""
    limits = limits or Limits()
    if not isinstance(fields, Mapping):
        raise EnvelopeError("an envelope is a mapping of fields")
    d: dict[str, str] = {}
    for k, v in fields.items():
        name = _field_name(k)
        d[name] = _text(v, name)
    extra = {k: val for k, val in d.items() if k not in _KNOWN}
    if len(extra) > MAX_EXTRA_FIELDS:
        raise EnvelopeError(f"{len(extra)} unknown fields, over {MAX_EXTRA_FIELDS}")
    v = _int(d, "v", required=True)
    if v != VERSION:
        raise EnvelopeError(f"unsupported envelope version {v} (this reader knows {VERSION})")
    kind = d.get("kind", "")
    if kind not in KINDS:
        raise EnvelopeError(f"unknown kind {_shown(kind)}")
    try:
        ident = {name: names.check_name(name, d.get(name, ""), required=name in ("run", "cluster"))
                 for name in _IDENTITY}
    except names.BadName as exc:
        raise EnvelopeError(exc.message) from exc
    rank = _int(d, "rank", required=True, hi=MAX_RANK)
    lo_ms, hi_ms = limits.ts_window_ms()
    ts = _int(d, "ts", required=True)
    if not lo_ms <= ts <= hi_ms:
        raise EnvelopeError(f"field ts = {ts} ms is outside the accepted window {lo_ms}..{hi_ms} "
                            f"(from 2020 to MEMQ_MAX_CLOCK_SKEW_S={limits.max_skew_s} ahead of this clock)")
    raw_payload = d.get("payload", "") or "{}"
    if len(raw_payload) > _MAX_PAYLOAD:
        raise EnvelopeError(f"payload is {len(raw_payload)} characters, over the {_MAX_PAYLOAD} limit")
    try:
        payload = json.loads(raw_payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise EnvelopeError(f"payload is not valid JSON ({str(exc)[:100]})") from exc
    if not isinstance(payload, dict):
        raise EnvelopeError("payload must be a JSON object")
    bad = _json_problem(payload)
    if bad:
        raise EnvelopeError(bad)
    _check_kind_payload(kind, payload, lo_ms, hi_ms)
    snap: dict[str, Any] = {}
    if kind == "snapshot":
        sha = d.get("sha256", "")
        if not _SHA_RE.match(sha):
            raise EnvelopeError(f"field sha256 is not a lowercase sha256 hex digest: {_shown(sha, 70)}")
        if d.get("codec") not in CODECS:
            raise EnvelopeError(f"field codec must be one of {', '.join(CODECS)}, got {_shown(d.get('codec'))}")
        if d.get("trigger") not in TRIGGERS:
            raise EnvelopeError(f"field trigger must be one of {', '.join(TRIGGERS)}, got {_shown(d.get('trigger'))}")
        nonce = d.get("nonce") or None
        if nonce is not None and not _NONCE_RE.match(nonce):
            raise EnvelopeError(f"field nonce is not 32 lowercase hex digits: {_shown(nonce, 70)}")
        snap = dict(sha256=sha, nonce=nonce,
                    size=_int(d, "size", required=True, lo=1, hi=limits.max_snapshot_bytes),
                    codec=d["codec"], trigger=d["trigger"], step=_int(d, "step", required=False, hi=MAX_STEP),
                    epoch=_int(d, "epoch", required=False, hi=MAX_EPOCH))
    else:
        present = [k for k in _SNAPSHOT_ONLY if d.get(k)]
        if present:
            raise EnvelopeError(f"fields {', '.join(present)} belong to snapshot entries, not {kind}")
    for k, val in extra.items():
        if len(val) > MAX_EXTRA_VALUE:
            raise EnvelopeError(f"unknown field {k} is {len(val)} characters, over {MAX_EXTRA_VALUE}")
    return Envelope(kind=kind, rank=rank, ts=ts, payload=payload, v=v, extra=extra, **ident, **snap)


# ---------------------------------------------------------------------------------- dead letters
#: A dead letter keeps at most this many of the original fields, each cut to DEAD_VALUE_MAX bytes:
#: the dead stream holds 100,000 entries, and a refused entry may be as large as Redis allows.
DEAD_FIELDS_MAX = 64
DEAD_VALUE_MAX = 16 * 1024


def dead_letter_fields(fields: Any) -> dict[str, str]:
    """The original fields of a refused entry as text a dead letter can hold, whatever they are.

    Text (valid UTF-8) is kept as it is. Bytes that are not UTF-8 are kept as base64, and their
    names are listed in `b64_fields` (a field name that is not UTF-8 becomes `b64:<base64>`);
    values over DEAD_VALUE_MAX bytes are cut (named in `truncated_fields`); fields beyond
    DEAD_FIELDS_MAX are counted in `fields_dropped`. Never raises."""
    def as_text(x: Any) -> tuple[str, bool]:
        if isinstance(x, str):
            try:
                x.encode("utf-8")
                return x, False
            except UnicodeEncodeError:
                x = x.encode("utf-8", "surrogatepass")
        if isinstance(x, (bytes, bytearray, memoryview)):
            x = bytes(x)
            try:
                return x.decode("utf-8"), False
            except UnicodeDecodeError:
                return base64.b64encode(x).decode("ascii"), True
        return repr(x), False

    out: dict[str, str] = {}
    b64: list[str] = []
    cut: list[str] = []
    items = list(fields.items()) if isinstance(fields, Mapping) else []
    for k, v in items[:DEAD_FIELDS_MAX]:
        name, name_b64 = as_text(k[:256] if isinstance(k, (bytes, str)) else k)
        if name_b64:
            name = "b64:" + name
        text, was_b64 = as_text(v)
        if len(text) > DEAD_VALUE_MAX:
            # cut at a character of the text (the base64 form stays decodable: a multiple of 4)
            text = text[:DEAD_VALUE_MAX]
            cut.append(name)
        if was_b64:
            b64.append(name)
        out[name] = text
    if b64:
        out["b64_fields"] = ",".join(b64)
    if cut:
        out["truncated_fields"] = ",".join(cut)
    if len(items) > DEAD_FIELDS_MAX:
        out["fields_dropped"] = str(len(items) - DEAD_FIELDS_MAX)
    return out


def dead_blob(fields: Any) -> tuple[str, str | None] | None:
    """(sha256, nonce or None) of the blob a refused snapshot entry names, read from its raw fields
    whatever else is wrong with them; None when they name no well-formed blob. The dispatcher deletes
    a refused entry's own blob (nonce key) from Redis and records the sha256 for the dead-blob cleanup
    (memq.workers.retention.clean_dead_blobs)."""
    if not isinstance(fields, Mapping):
        return None

    def get(name: str) -> str:
        v = fields.get(name, fields.get(name.encode()))
        if isinstance(v, (bytes, bytearray)):
            try:
                return bytes(v).decode("ascii")
            except UnicodeDecodeError:
                return ""
        return v if isinstance(v, str) else ""

    sha = get("sha256")
    if not _SHA_RE.match(sha):
        return None
    nonce = get("nonce")
    return sha, nonce if _NONCE_RE.match(nonce) else None
