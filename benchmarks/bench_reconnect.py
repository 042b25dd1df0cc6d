"""N agents against a Redis that restarts: how spread out are their reconnects, and is anything lost?

What runs: a private `redis-server` (AOF, fsync always: a restart keeps what it acknowledged, as a
production Redis with persistence does) and N real agent transports (memq.agent.transport,
one delivery thread and one Redis connection each, default back-off 0.5 s doubling to 30 s) in this
process. The ranks of a job submit together, so the simulation does too, which is what makes
reconnects line up without jitter:

    t=0     every agent sends one stats message (all connected)
    t=0.5   Redis is stopped (SIGTERM)
    t=0.7, 1.2, 1.7   every agent sends one message: each fails or waits out its back-off and spools
    t=2.5   Redis starts again on the same port
    then    agents reconnect when their back-off ends and replay their spools; every agent is stopped
            (flushing what it holds) once all have reconnected, or after --deadline-s

Printed (one JSON object): per 100 ms bucket after the restart, the most reconnects the agents'
back-off scheduled (`max_planned_per_bucket`: when each agent's back-off timed the attempt that got
it back, which is what a fleet of separate hosts does; this process's own lag running a thousand
threads on two cores is left out), the most that happened (`max_reconnects_per_bucket`) and the
most connection attempts, as counts and fractions of N; the times by which 50% / 99% / 100% of the
agents were back; and the messages submitted vs found in the stream (`missing` must be 0).
`reconnected` counts agents that came back through their back-off; an agent whose first send after
the stop came only after the restart is reconnected by redis-py's pool directly and is not counted.
`--no-jitter` runs the same with the old deterministic back-off, for comparison.

    python benchmarks/bench_reconnect.py [--agents 1000] [--no-jitter]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402

from memq import envelope  # noqa: E402
from memq.agent.spool import Spool  # noqa: E402
from memq.agent.transport import Item, Transport  # noqa: E402
from memq.redis_client import make_client  # noqa: E402

STREAM = "memq:ingest"
BUCKET_S = 0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Redis:
    def __init__(self, tmp: Path):
        self.tmp, self.port, self.proc = tmp, _free_port(), None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [shutil.which("redis-server") or "redis-server", "--port", str(self.port), "--bind", "127.0.0.1",
             "--save", "", "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.tmp),
             "--maxclients", "20000"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                if redis.Redis(port=self.port, socket_timeout=0.5).ping():
                    return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(30)
            self.proc = None


class _Recorder:
    """Times of connection attempts and of successful connections, for all agents. While the
    server is down an attempt is refused without building a client: on the fleet each agent pays
    for its own attempts on its own host; here a thousand agents share two cores, and building a
    redis-py client per refused attempt (about 2 ms of CPU) would starve the agents being measured."""

    def __init__(self):
        self.down = threading.Event()
        self.lock = threading.Lock()
        self.attempts: list[float] = []
        self.connects: list[tuple[int, float]] = []

    def factory(self, agent: int, url: str):
        """The agent's own client (make_client: no hidden retries), its PING timed."""

        def make():
            with self.lock:
                self.attempts.append(time.monotonic())
            if self.down.is_set():
                raise redis.ConnectionError("Connection refused (the server is down)")
            client = make_client(url, 2.0)
            ping = client.ping

            def timed_ping(**kw):
                ok = ping(**kw)
                with self.lock:
                    self.connects.append((agent, time.monotonic()))
                return ok

            client.ping = timed_ping
            return client

        return make


class _Agent(Transport):
    """The real transport, keeping the times its back-off schedules reconnects for."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.schedule: list[float] = []

    def _down(self, exc: BaseException) -> None:
        super()._down(exc)
        self.schedule.append(self._next_try)


def _buckets(times: list[float], t0: float) -> Counter:
    return Counter(int((t - t0) / BUCKET_S) for t in times if t >= t0)


def simulate(agents: int = 1000, jitter: bool = True, deadline_s: float = 60.0,
             backoff_s: tuple[float, float] = (0.5, 30.0)) -> dict:
    tmp = Path(tempfile.mkdtemp(prefix="memq-reconnect-"))
    srv = _Redis(tmp)
    srv.start()
    url = f"redis://127.0.0.1:{srv.port}/0"
    rec = _Recorder()
    transports = []
    t_setup = time.monotonic()
    try:
        for i in range(agents):
            t = _Agent(identity={"run": f"agent-{i}", "cluster": "bench", "rank": 0, "host": "h"},
                          spool=Spool(tmp / "spool" / str(i), 64 << 20, fsync=False), redis_url=url,
                          stream=STREAM, backoff_s=backoff_s, client_factory=rec.factory(i, url), jitter=jitter)
            t.start()
            transports.append(t)
        submitted = 0
        start = time.monotonic()

        def round_(seq: int) -> None:
            nonlocal submitted
            for t in transports:
                if t.submit(Item("stats",
                                 payload={"seq": seq, "samples": [{"t": time.time(), "allocated_bytes": seq}]})):
                    submitted += 1

        def at(s: float) -> None:
            time.sleep(max(0.0, start + s - time.monotonic()))

        setup_s = time.monotonic() - t_setup
        round_(0)
        for t in transports:
            t.flush(30)
        at(0.5)
        rec.down.set()
        srv.stop()
        for k, s in enumerate((0.7, 1.2, 1.7), start=1):
            at(s)
            round_(k)
        at(2.5)
        restarted = time.monotonic()  # from here on, a successful connect is a reconnect
        rec.down.clear()
        srv.start()
        back: dict[int, float] = {}
        while time.monotonic() - restarted < deadline_s and len(back) < agents:
            time.sleep(0.1)
            with rec.lock:
                for agent, when in rec.connects:
                    if when >= restarted:
                        back.setdefault(agent, when)
        waited_s = time.monotonic() - restarted
        t_stop = time.monotonic()
        stopped = [t.stop(10) for t in transports]
        stop_s = time.monotonic() - t_stop
        client = redis.Redis(port=srv.port, socket_timeout=10)
        found = Counter()
        for _id, fields in client.xrange(STREAM):
            env = envelope.parse(fields)
            found[(env.run, env.payload.get("seq"))] += 1
        expected = {(f"agent-{i}", k) for i in range(agents) for k in range(4)}
        with rec.lock:
            attempts = _buckets(rec.attempts, restarted)
        came_back = sorted(w - restarted for w in back.values())
        reconnects = _buckets(list(back.values()), restarted)
        # when each agent's back-off scheduled the attempt that reconnected it: what a fleet of
        # separate hosts would do, apart from how late this process ran a thousand threads
        planned = [max([s for s in t.schedule if s <= back[i]] or [restarted]) for i, t in enumerate(transports)
                   if i in back]
        plan = Counter(int((p - min(planned)) / BUCKET_S) for p in planned) if planned else Counter()
        sent = sum(t.counters.snapshot()["sent"] + t.counters.snapshot()["replayed"] for t in transports)
        dropped = sum(t.counters.snapshot()["dropped"] for t in transports)

        def pct(p: float) -> float | None:
            if not came_back:
                return None
            return round(came_back[min(len(came_back) - 1, int(p * len(came_back)))], 3)

        return {
            "agents": agents, "jitter": jitter, "backoff_s": list(backoff_s), "bucket_s": BUCKET_S,
            "max_planned_per_bucket": max(plan.values(), default=0),
            "max_planned_per_bucket_fraction": round(max(plan.values(), default=0) / agents, 4),
            "planned_span_s": round(max(planned) - min(planned), 3) if planned else None,
            "reconnected": len(back), "max_reconnects_per_bucket": max(reconnects.values(), default=0),
            "max_reconnects_per_bucket_fraction": round(max(reconnects.values(), default=0) / agents, 4),
            "max_attempts_per_bucket": max(attempts.values(), default=0),
            "buckets_with_reconnects": len(reconnects),
            "back_s": {"p50": pct(0.5), "p99": pct(0.99), "all": round(came_back[-1], 3) if came_back else None},
            "submitted": submitted, "delivered_or_replayed": sent, "dropped": dropped,
            "found": sum(found.values()), "missing": len(expected - set(found)),
            "duplicates": sum(n - 1 for n in found.values() if n > 1), "all_stopped": all(stopped),
            "phases_s": {"setup": round(setup_s, 2), "after_restart": round(waited_s, 2), "stop": round(stop_s, 2)},
        }
    finally:
        for t in transports:
            t.stop(0)
        srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--no-jitter", action="store_true", help="the deterministic back-off, for comparison")
    ap.add_argument("--deadline-s", type=float, default=60.0)
    ap.add_argument("--switch-interval", type=float, default=0.05,
                    help="sys.setswitchinterval: the fleet's agents are one thread per process, here N "
                         "threads share one GIL, and its default 5 ms hand-offs cost more CPU than the agents")
    args = ap.parse_args()
    sys.setswitchinterval(args.switch_interval)
    out = simulate(args.agents, jitter=not args.no_jitter, deadline_s=args.deadline_s)
    out["machine"] = f"{platform.node()} {os.cpu_count()} CPUs, Python {platform.python_version()}"
    out["switch_interval_s"] = args.switch_interval
    print(json.dumps(out, indent=1))
    return 0 if out["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
