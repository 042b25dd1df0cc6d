"""`memq push FILE... --run R [--cluster C] [--rank N]`: send existing snapshot files through Redis.

For snapshots dumped by hand or by other tools. Each file goes exactly as the agent sends one: the
uncompressed pickle bytes are hashed (so `memq ingest` and `memq push` of one file are one snapshot),
compressed and envelope-built by the agent's own `Transport.serialize`, then
`SET <prefix>blob:<sha256> EX ttl` and `XADD <stream> MAXLEN ~ N`. A `run_start` goes first and a
`run_end` with `--status` last (`--status running` sends none, for a run that is still going).
The dispatcher and the workers (`memq dispatcher`, `memq worker`) take it from there.
Files are checked with the restricted decoder first (`--no-check` skips that); nothing is written
to Redis when any file is refused.
"""

from __future__ import annotations

import os
import socket

import click

from memq import codec, envelope
from memq.agent.spool import Spool
from memq.agent.transport import Item, Transport, append_fields
from memq.cli import SIZE
from memq.cli._listing import write_json
from memq.config import load_settings, redact_url
from memq.errors import BadInput, BrokerUnavailable
from memq.identity import IdentityError, parse_key, parse_keyring, sign, verify
from memq.load import decode_snapshot_bytes, read_bytes
from memq.model import RUN_STATUSES, TRIGGERS
from memq.names import check_name
from memq.pipeline.ingest import infer_from_name
from memq.redis_client import make_client
from memq.render.words import plural


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--run", "run_name", required=True, help="Run id: snapshots of one run share it.")
@click.option("--cluster", default="default", show_default=True)
@click.option("--job", default="")
@click.option("--rank", type=click.IntRange(0), default=0, show_default=True)
@click.option("--host", default=None, help="Host that took the snapshots (default: this one).")
@click.option("--trigger", type=click.Choice(TRIGGERS),
              help="Why they were taken (default: from the file name, as `memq ingest` does, else manual).")
@click.option("--step", type=int, help="Training step (one file only; else from names like step0040).")
@click.option("--epoch", type=int, help="Epoch (one file only; else from names like epoch2).")
@click.option("--limit", type=SIZE, help="What the allocator could reserve (per-process cap).")
@click.option("--device-total", type=SIZE, help="Device memory.")
@click.option("--oom-message", metavar="TEXT", help="The 'CUDA out of memory' text (sent with the last file).")
@click.option("--status", type=click.Choice(RUN_STATUSES), default="completed",
              show_default=True, help="Status sent in run_end after the files; running sends no run_end.")
@click.option("--check/--no-check", default=True, show_default=True,
              help="Decode each file with the restricted decoder before sending.")
@click.option("--redis-url", envvar="MEMQ_REDIS_URL", help="Default: MEMQ_REDIS_URL.")
@click.option("--json", "as_json", is_flag=True, help="Print what was sent as one JSON document.")
def push(files, run_name, cluster, job, rank, host, trigger, step, epoch, limit, device_total, oom_message, status,
         check, redis_url, as_json):
    """Send snapshot FILEs of one run (in time order) to the ingest stream, as the agent does."""
    if len(files) > 1 and (step is not None or epoch is not None):
        raise click.UsageError("--step/--epoch describe one snapshot; give one file, or name files "
                               "like step0040.pickle.gz / epoch2.pickle.gz")
    st = load_settings()
    url = redis_url or st.redis_url
    identity = {"run": run_name, "cluster": cluster, "job": job, "rank": rank, "host": host or socket.gethostname()}
    for field in ("run", "cluster", "job", "host"):  # refused here rather than dead-lettered later
        check_name(field, identity[field], required=field in ("run", "cluster"))
    # The agent's transport builds the messages; push sends them itself so that an unreachable Redis
    # is an error here, not a silent spool.
    transport = Transport(identity=identity, spool=Spool(os.path.join(st.spool_dir, "push-unused"), 0), redis_url=None,
                          stream=st.stream_key, key_prefix=st.key_prefix, maxlen=st.stream_maxlen,
                          blob_ttl_s=st.blob_ttl_s, signing_key=_key(st.agent_key), max_blob_bytes=st.max_blob_bytes,
                          keep_oversize=False)
    ts = envelope.now_ms()
    messages, sent = [], []
    for i, path in enumerate(files):
        raw = codec.decompress(read_bytes(path, st.decode_max_bytes), st.decode_max_bytes)
        if check:
            try:
                decode_snapshot_bytes(raw, st.decode_max_bytes, name=str(path))
            except BadInput as exc:
                raise type(exc)(f"{path}: {exc.message}", hint=exc.hint) from exc
        guessed = infer_from_name(path)
        payload = {"source": "memq push", "file": os.path.basename(path)}
        last = i == len(files) - 1
        if oom_message and last:
            payload["oom"] = {"alloc": None, "device_alloc": limit, "device_free": None,
                              "device_total": device_total, "message": oom_message}
        item = Item("snapshot", payload=payload, obj=raw, trigger=trigger or guessed.get("trigger") or "manual",
                    step=step if step is not None else guessed.get("step"),
                    epoch=epoch if epoch is not None else guessed.get("epoch"), ts=ts + 1 + i)
        try:
            messages.append(transport.serialize(item))
        except BadInput as exc:  # too big for one Redis value: refused before anything is sent
            raise type(exc)(f"{path}: {exc.message}; analyse it here with `memq analyze`", hint=exc.hint) from exc
        sent.append({"file": path, "sha256": messages[-1].fields["sha256"], "trigger": item.trigger,
                     "step": item.step, "epoch": item.epoch})
    start_md = {"source": "memq push", "files": len(files)}
    if limit:
        start_md["limit_bytes"] = int(limit)
    if device_total:
        start_md["device_total"] = int(device_total)
    head = transport.serialize(Item("run_start", payload=start_md, ts=ts))
    tail = None if status == "running" else transport.serialize(
        Item("run_end", payload={"status": status, "source": "memq push"}, ts=ts + len(files) + 1))
    client = make_client(url, 10.0)
    path = "stream"  # or the relay inbox, where the agent user's ACL refuses XADD
    try:
        for msg in [head, *messages, *([tail] if tail else [])]:
            if msg.blob_key is not None:
                client.set(msg.blob_key, msg.blob, ex=st.blob_ttl_s)
            path = append_fields(client, msg.fields, stream=st.stream_key, maxlen=st.stream_maxlen, path=path)
    except Exception as exc:  # noqa: BLE001 - redis-py errors: one line, password hidden
        raise BrokerUnavailable(f"cannot send to Redis {redact_url(url)}: {type(exc).__name__}: {exc}",
                                hint="check MEMQ_REDIS_URL and that Redis is running") from exc
    finally:
        client.close()
    doc = {"run": run_name, "cluster": cluster, "rank": rank, "stream": st.stream_key, "snapshots": sent,
           "run_end": None if tail is None else status,
           "warning": signing_note(st.agent_key, st.agent_keyring, cluster, job)}
    if as_json:
        write_json(doc)
        return
    note = signing_note(st.agent_key, st.agent_keyring, cluster, job)
    if note:
        click.echo(f"memq: warning: {note}", err=True)
    for s in sent:
        click.echo(f"{'sent' if note else 'pushed'} {s['file']} ({s['sha256'][:12]}, {s['trigger']})")
    click.echo(f"{plural(len(sent), 'snapshot')} of run {run_name} sent to {st.stream_key} at {redact_url(url)}; "
               f"`memq status` shows the backlog, `memq history --run {run_name}` the results")


def signing_note(key_text: str, keyring_text: str, cluster: str, job: str | None) -> str | None:
    """What the pusher can know of how a dispatcher will take its envelopes: unsigned ones are
    dead-lettered wherever a keyring is held, and a key the local keyring lacks (or whose clusters or
    jobs leave this one out) is refused at the door. None when nothing speaks against them."""
    check = "check `memq status` (dead letters) once they are read"
    if not key_text:
        return ("these envelopes are unsigned: a dispatcher that holds a keyring dead-letters them; give the "
                f"agent key (MEMQ_AGENT_KEY_FILE, made by `memq key new`) where one is in use, and {check}")
    if not keyring_text:
        return None
    key = parse_key(key_text)
    try:
        verify(sign({"type": "run_start", "cluster": cluster, "job": job or ""}, key), parse_keyring(keyring_text))
    except IdentityError as exc:
        return (f"the keyring configured here refuses this key ({exc.message}): the dispatcher dead-letters "
                f"them; {check}")
    return None


def _key(text: str):
    """MEMQ_AGENT_KEY(_FILE), the key envelopes are signed with; a bad key file is an error here."""
    if not text:
        return None
    try:
        return parse_key(text)
    except BadInput as exc:
        raise BadInput(f"MEMQ_AGENT_KEY: {exc.message}", hint="a JSON object with kid and secret") from exc
