"""Who wrote an envelope: per-principal keys, signed envelopes, and the runs they may write. Pure (stdlib).

Redis cannot say which ACL user appended a stream entry, so the writer signs it. An agent holds one key
(`MEMQ_AGENT_KEY_FILE`: `{"kid": ..., "secret": ...}`); the dispatcher holds the keyring
(`MEMQ_AGENT_KEYRING_FILE`: `{"keys": [{"kid", "principal", "secret", "clusters", "jobs"}]}`):

- `sign(fields, key)` adds `kid` and `sig` = HMAC-SHA256(secret, the canonical form of every other field).
  A snapshot's fields hold the sha256 of its bytes, which the dispatcher checks against the blob, so
  the signature covers the blob too.
- `verify(fields, keyring)` returns the key's principal, or raises IdentityError naming what failed:
  unsigned, unknown key, bad signature, a cluster or job the key may not write (fnmatch patterns).
- Run names are scoped by principal: with a keyring, the run a signed envelope names is stored as
  `<principal>/<run>` (`scoped_run`; a name that already starts with the principal's own prefix is
  kept), so no key can claim, fill or shadow another principal's run: a squatter's `llama-sft-0412`
  is `team-c/llama-sft-0412`, the owner's is `team-a/llama-sft-0412`. A principal is a name without
  `/` (checked when the keyring is read), so the prefix is unambiguous.
- A run also belongs to the principal whose envelope created it (`runs.owner`); the dispatcher
  dead-letters any later envelope of that run from another principal (runs created before names were
  scoped, or unsigned), so a forged run_start, run_end or OOM changes nothing of the victim's.
- Rotation: a principal may hold several keys at once (a new kid beside the old one); runs belong to the
  principal, not the key, so a job restarted with the new key keeps writing its runs.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from memq.errors import BadInput
from memq.names import MAX_LEN, name_problem

#: HMAC keys shorter than this are refused (RFC 2104: at least the hash's output length).
MIN_SECRET_BYTES = 32
_KID_RE = re.compile(r"[A-Za-z0-9_.:-]{1,64}\Z")
_SIG_FIELDS = ("kid", "sig")
#: Between a principal and its run names (`team-a/llama-sft-0412`); refused in principals.
SCOPE_SEP = "/"


class IdentityError(BadInput):
    """An envelope whose writer cannot be established, or who may not write it."""


@dataclass(frozen=True)
class Key:
    kid: str
    secret: bytes
    principal: str = ""
    clusters: tuple[str, ...] = ("*",)
    jobs: tuple[str, ...] = ("*",)


def _secret(v) -> bytes:
    if not isinstance(v, str):
        raise BadInput("a key's secret must be a string (hex, or text)")
    try:
        raw = bytes.fromhex(v)
    except ValueError:
        raw = v.encode()
    if len(raw) < MIN_SECRET_BYTES:
        raise BadInput(f"a key's secret must hold at least {MIN_SECRET_BYTES} bytes, got {len(raw)}")
    return raw


def _kid(v) -> str:
    if not isinstance(v, str) or not _KID_RE.match(v):
        raise BadInput(f"a key id must be 1-64 characters of letters, digits and _.:-, got {v!r}")
    return v


def parse_key(text: str) -> Key:
    """The agent's key file."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"the agent key file is not JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise BadInput("the agent key file must hold a JSON object with kid and secret")
    return Key(kid=_kid(doc.get("kid")), secret=_secret(doc.get("secret")))


def parse_keyring(text: str) -> dict[str, Key]:
    """The dispatcher's keyring file: kid -> Key."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BadInput(f"the keyring file is not JSON ({exc})") from exc
    keys = doc.get("keys") if isinstance(doc, dict) else None
    if not isinstance(keys, list) or not keys:
        raise BadInput('the keyring file must hold {"keys": [...]} with at least one key')
    out: dict[str, Key] = {}
    for k in keys:
        if not isinstance(k, dict):
            raise BadInput("each keyring entry must be an object")
        kid = _kid(k.get("kid"))
        principal = k.get("principal")
        if not isinstance(principal, str) or not principal or len(principal) > 200:
            raise BadInput(f"key {kid}: principal must be a name of 1-200 characters")
        if SCOPE_SEP in principal or name_problem(principal, max_len=200):
            raise BadInput(f"key {kid}: principal {principal[:60]!r} must be printable text without "
                           f"{SCOPE_SEP!r} (it prefixes the principal's run names)")
        pats = {}
        for name in ("clusters", "jobs"):
            v = k.get(name, ["*"])
            if not isinstance(v, list) or not v or not all(isinstance(p, str) and p for p in v):
                raise BadInput(f"key {kid}: {name} must be a non-empty list of patterns")
            pats[name] = tuple(v)
        if kid in out:
            raise BadInput(f"key id {kid} appears twice in the keyring")
        out[kid] = Key(kid=kid, secret=_secret(k.get("secret")), principal=principal, **pats)
    return out


def canonical(fields: Mapping[str, str]) -> bytes:
    """Every field but the signature's own, sorted, as JSON (no separator can be forged into a value)."""
    return json.dumps(sorted((str(k), str(v)) for k, v in fields.items() if k not in _SIG_FIELDS),
                      separators=(",", ":"), ensure_ascii=True).encode()


def sign(fields: Mapping[str, str], key: Key) -> dict[str, str]:
    out = {k: v for k, v in fields.items() if k not in _SIG_FIELDS}
    out["kid"] = key.kid
    out["sig"] = hmac.new(key.secret, canonical(out), hashlib.sha256).hexdigest()
    return out


def _text(v) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def verify(fields: Mapping, keyring: Mapping[str, Key]) -> str:
    """The principal that signed `fields` (as read from the stream: bytes or str), or IdentityError."""
    f = {_text(k): _text(v) for k, v in fields.items()}
    kid, sig = f.get("kid"), f.get("sig")
    if not kid or not sig:
        raise IdentityError("unsigned envelope: this deployment takes only signed envelopes (MEMQ_AGENT_KEY_FILE)")
    key = keyring.get(kid)
    if key is None:
        raise IdentityError(f"unknown key id {kid[:64]!r}")
    want = hmac.new(key.secret, canonical(f), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(want, sig):
        raise IdentityError(f"bad signature for key {kid}")
    cluster, job = f.get("cluster", ""), f.get("job", "")
    if not any(fnmatch.fnmatchcase(cluster, p) for p in key.clusters):
        raise IdentityError(f"key {kid} ({key.principal}) may not write cluster {cluster[:200]!r}")
    if not any(fnmatch.fnmatchcase(job, p) for p in key.jobs):
        raise IdentityError(f"key {kid} ({key.principal}) may not write job {job[:200]!r}")
    return key.principal


def owner_mismatch(run: str, owner: str | None, principal: str | None) -> IdentityError | None:
    """The error for an envelope of `run` (owned by `owner`) from `principal`, or None when it may."""
    if (owner or "") == (principal or ""):
        return None
    return IdentityError(f"run {run[:200]!r} belongs to {owner or 'unsigned writers'}, not to "
                         f"{principal or 'an unsigned writer'}: envelopes of a run come from the identity "
                         "that created it")


def scoped_run(principal: str, run: str) -> str:
    """The stored name of `run` sent by `principal`: `<principal>/<run>`, or `run` itself when it
    already carries that prefix (so `memq history team-a/x` and a push of `team-a/x` agree). An
    IdentityError when the scoped name is longer than a run name may be (runs.name)."""
    prefix = principal + SCOPE_SEP
    out = run if run.startswith(prefix) else prefix + run
    if len(out) > MAX_LEN["run"]:
        raise IdentityError(f"run name {run[:60]!r} scoped by its principal ({out[:60]!r}...) is {len(out)} "
                            f"characters long, over the limit of {MAX_LEN['run']}: use a shorter run name")
    return out
