"""`memq key new --principal P`: a signing key for the agents of one principal (a team) and its entry in
the dispatcher's keyring (the formats of memq.identity), so keys are made, never typed by hand."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
from pathlib import Path

import click

from memq.errors import BadInput
from memq.identity import parse_key, parse_keyring

# 32 random bytes: the HMAC-SHA256 key length identity.MIN_SECRET_BYTES asks for (RFC 2104).
SECRET_BYTES = 32


def new_key(principal: str, clusters: tuple[str, ...], jobs: tuple[str, ...]) -> tuple[dict, dict]:
    """The agent's key file and the keyring entry of one new key (pure, but for the random secret)."""
    base = re.sub(r"[^A-Za-z0-9_.:-]", "-", principal)[:40] or "key"
    kid = f"{base}-{dt.datetime.now(dt.UTC):%Y%m%d}-{secrets.token_hex(3)}"
    secret = secrets.token_hex(SECRET_BYTES)
    entry = {"kid": kid, "principal": principal, "secret": secret, "clusters": list(clusters or ("*",)),
             "jobs": list(jobs or ("*",))}
    return {"kid": kid, "secret": secret}, entry


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


@click.group()
def key():
    """Signing keys of the agents and the dispatcher's keyring."""


@key.command("new")
@click.option("--principal", required=True, help="Who the key writes for (a team); its runs belong to it.")
@click.option("--key-file", type=click.Path(dir_okay=False), help="The agent's key file (default ./<kid>.key.json).")
@click.option("--keyring", type=click.Path(dir_okay=False), default="keyring.json", show_default=True,
              help="The dispatcher's keyring: created, or the entry is added to it.")
@click.option("--cluster", "clusters", multiple=True, metavar="PATTERN", help="Clusters it may write (default *).")
@click.option("--job", "jobs", multiple=True, metavar="PATTERN", help="Jobs it may write (default *).")
def new(principal, key_file, keyring, clusters, jobs):
    """Make a key for PRINCIPAL: the agent's key file and its entry in the keyring."""
    if not principal or "/" in principal or len(principal) > 200:
        raise BadInput("--principal must be a name of 1-200 characters without '/'")
    agent, entry = new_key(principal, clusters, jobs)
    ring_path = Path(keyring)
    doc = {"keys": []}
    if ring_path.exists():
        parse_keyring(ring_path.read_text())  # refuse to add to a keyring the dispatcher would refuse
        doc = json.loads(ring_path.read_text())
    doc["keys"].append(entry)
    parse_keyring(json.dumps(doc))
    key_path = Path(key_file or f"{agent['kid']}.key.json")
    if key_path.exists():
        raise BadInput(f"{key_path} exists: a key file is never overwritten", hint="name another with --key-file")
    parse_key(json.dumps(agent))
    _write_private(key_path, json.dumps(agent) + "\n")
    _write_private(ring_path, json.dumps(doc, indent=1) + "\n")
    click.echo(f"key {agent['kid']} for principal {principal}")
    click.echo(f"  agent key file: {key_path} (training jobs: MEMQ_AGENT_KEY_FILE={key_path})")
    click.echo(f"  keyring: {ring_path}, now {len(doc['keys'])} key(s) (dispatchers: MEMQ_AGENT_KEYRING_FILE; "
               "restart them to load it)")
