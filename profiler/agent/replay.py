"""Send spooled messages to Redis: `python -m memq.agent.replay SPOOL_DIR [--redis-url URL]`.

For spools written where no Redis was reachable (an air-gapped GPU node, a job that ended while Redis
was down). Every folder under SPOOL_DIR that holds spool files is sent in name (= send) order; sent
files are removed unless --keep. Each entry is checked with memq.envelope.parse first."""

from __future__ import annotations

import argparse
import sys

from memq.agent.spool import Spool, iter_spool_dirs
from memq.agent.transport import replay_spool
from memq.config import load_settings
from memq.redis_client import make_client


def replay_dir(root, client, *, stream: str, maxlen: int = 1_000_000, blob_ttl_s: int = 7 * 24 * 3600,
               remove: bool = True, key_prefix: str | None = None) -> int:
    n = 0
    for d in sorted(iter_spool_dirs(root)):
        n += replay_spool(Spool(d, max_bytes=1 << 62), client, stream=stream, maxlen=maxlen,
                          blob_ttl_s=blob_ttl_s, remove=remove, key_prefix=key_prefix)
    return n


def main(argv: list[str] | None = None) -> int:
    st = load_settings()
    ap = argparse.ArgumentParser(prog="python -m memq.agent.replay")
    ap.add_argument("spool_dir")
    ap.add_argument("--redis-url", default=st.redis_url)
    ap.add_argument("--stream", default=st.stream_key)
    ap.add_argument("--key-prefix", default=st.key_prefix, help="prefix of the blob keys (memq:)")
    ap.add_argument("--keep", action="store_true", help="do not delete files once sent")
    args = ap.parse_args(argv)
    client = make_client(args.redis_url, 10.0)
    n = replay_dir(args.spool_dir, client, stream=args.stream, maxlen=st.stream_maxlen, blob_ttl_s=st.blob_ttl_s,
                   remove=not args.keep, key_prefix=args.key_prefix)
    print(f"replayed {n} messages into {args.stream}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
