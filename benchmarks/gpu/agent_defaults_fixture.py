"""Turn the Redis dump(s) that agent_defaults.py brings back into tests/fixtures/agent_defaults/.

    python benchmarks/gpu/agent_defaults_fixture.py --dump D.rdb --meta M.json [--meta M2.json ...]
        --keep RUN[@SINCE_MS] ... --out tests/fixtures/agent_defaults

Only the stream entries of the runs named in --keep (from SINCE_MS on, when a run name was reused on a
warm machine whose redis-server reloaded the earlier dump) and the blobs they reference are copied, in
stream order with their original ids, into a fresh private redis-server; blobs lose their TTL (the
agent sets 7 days: a fixture must not expire). The result is SAVEd, gzipped and split into parts of
at most 15 MiB; meta.json merges the scenario entries of the given meta files (later files win).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time

import redis

STREAM = "memq:ingest"
BLOB = "memq:blob:"


def _server(d: str, dbfile: str | None = None):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", d,
            "--dbfilename", dbfile or "dump.rdb", "--save", "", "--appendonly", "no"]
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    r = redis.Redis(port=port, socket_timeout=30)
    for _ in range(200):
        try:
            if r.ping():
                return p, r
        except redis.RedisError:
            time.sleep(0.05)
    raise RuntimeError("redis-server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dump", required=True)
    ap.add_argument("--meta", action="append", required=True)
    ap.add_argument("--keep", nargs="+", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    keep = {}
    for k in args.keep:
        run, _, since = k.partition("@")
        keep[run] = int(since or 0)
    with tempfile.TemporaryDirectory() as src_dir, tempfile.TemporaryDirectory() as dst_dir:
        shutil.copy(args.dump, os.path.join(src_dir, "dump.rdb"))
        p1, src = _server(src_dir)
        p2, dst = _server(dst_dir)
        try:
            n = blobs = 0
            for eid, fields in src.xrange(STREAM):
                run = fields[b"run"].decode()
                if run not in keep or int(eid.split(b"-")[0]) < keep[run]:
                    continue
                sha = fields.get(b"sha256")
                if sha:  # agents since 2026-12-01 add a nonce: <BLOB><sha256>:<nonce> (envelope.blob_key)
                    key = BLOB + sha.decode() + (":" + fields[b"nonce"].decode() if fields.get(b"nonce") else "")
                    if not dst.exists(key):
                        data = src.get(key)
                        if data is None:
                            raise SystemExit(f"blob {key} of {run} missing")
                        dst.set(key, data)  # no TTL
                        blobs += 1
                dst.xadd(STREAM, fields, id=eid)
                n += 1
            dst.save()
            print(f"{n} entries, {blobs} blobs")
        finally:
            for p in (p1, p2):
                p.terminate()
                p.wait(10)
        os.makedirs(args.out, exist_ok=True)
        for old in os.listdir(args.out):
            if old.startswith("dump.rdb.gz.part"):
                os.remove(os.path.join(args.out, old))
        raw = open(os.path.join(dst_dir, "dump.rdb"), "rb").read()
        gz = gzip.compress(raw, 9, mtime=0)
        for i in range(0, len(gz), 15 << 20):
            with open(os.path.join(args.out, f"dump.rdb.gz.part{i // (15 << 20)}"), "wb") as fh:
                fh.write(gz[i:i + (15 << 20)])
        print(f"dump {len(raw)} bytes, gzip {len(gz)}")
    meta: dict = {"scenarios": {}}
    for path in args.meta:
        m = json.load(open(path))
        for key, sc in m.get("scenarios", {}).items():
            if sc.get("run") in keep or key == "dyn_probe":
                meta["scenarios"][key] = sc
        for k, v in m.items():
            if k != "scenarios":
                meta.setdefault("runs_of_the_script", []).append({"argv": m.get("argv"), "started": m.get("started")}) \
                    if k == "argv" else meta.__setitem__(k, v)
    meta["kept_runs"] = sorted(keep)
    with open(os.path.join(args.out, "meta.json"), "w") as fh:
        json.dump(meta, fh, indent=1, sort_keys=True)


if __name__ == "__main__":
    main()
