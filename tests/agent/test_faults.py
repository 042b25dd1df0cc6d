"""Faults at every transport step; the training loop never sees an exception and never waits.

Private redis-server processes for kill / restart / full; the shared Redis (unique keys) with a
wrapped real client for injected command failures."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
import redis

from memq.agent.source import ReplaySource
from memq.agent.spool import Spool
from memq.redis_client import make_client

from .conftest import REAL, FaultyClient, blob_of, entries, free_port, make_agent, wait_for


def _loop(a, steps, start=0, snapshot_every=1, budget_s=0.05, pause=0.01):
    """A training loop: every API call must return within its budget and raise nothing. A snapshot
    every step is far more than a real job takes; `pause` stands in for the step's compute, so the
    bounded queue (16 snapshots in flight) is not what the test measures. A snapshot call includes the
    source's own work (here: reading and inflating a fixture file), hence its larger budget."""
    worst_step = worst_snap = 0.0
    for step in range(start, start + steps):
        time.sleep(pause)
        t0 = time.perf_counter()
        a.mark_step(step, 0)
        t1 = time.perf_counter()
        if step % snapshot_every == 0:
            a.snapshot("manual")
        t2 = time.perf_counter()
        worst_step, worst_snap = max(worst_step, t1 - t0), max(worst_snap, t2 - t1)
    assert worst_step < budget_s, f"mark_step took {worst_step * 1000:.1f} ms"
    assert worst_snap < 5 * budget_s, f"snapshot took {worst_snap * 1000:.1f} ms"


def _steps(got):
    """Steps of the loop's own (manual) snapshots, in stream order."""
    return [e.step for e in got if e.kind == "snapshot" and e.trigger == "manual"]


def test_redis_killed_and_restarted_mid_run_loses_nothing_and_keeps_order(private_redis, tmp_path):
    srv = private_redis()
    stream = "memq:ingest"
    a = make_agent(redis_url=srv.url, stream=stream, spool_dir=tmp_path / "spool")
    _loop(a, 10, 0)
    assert a.flush(10)
    srv.kill()
    _loop(a, 10, 10)          # Redis gone: these go to the spool
    assert a.flush(10)
    assert a.counters()["spooled"] >= 1
    srv.start()               # same port, empty server (no persistence): the spool is replayed
    _loop(a, 10, 20, pause=0.03)
    c = a.stop(15)
    got = entries(srv.client(), stream)
    # everything sent before the kill was lost with the server itself (no persistence, by design of
    # this test); everything after the kill must arrive, in order, once Redis is back
    tail = _steps(got)
    assert tail == list(range(tail[0], 30)) and tail[0] <= 10, (tail, c)
    assert c["replayed"] == c["spooled"] and c["dropped"] == 0
    for e in got:
        if e.kind == "snapshot":
            blob_of(srv.client(), e, "memq:")
    assert got[-1].kind == "run_end"


def test_nothing_lost_across_kill_when_server_keeps_data(private_redis, tmp_path):
    """Kill only the connection path (the server keeps its data): the full sequence arrives in order."""
    srv = private_redis()
    real = srv.client()
    port = free_port()
    proxy = _Proxy(port, srv.port)
    proxy.start()
    try:
        a = make_agent(redis_url=f"redis://127.0.0.1:{port}/0", spool_dir=tmp_path / "spool")
        _loop(a, 10, 0)
        assert a.flush(10)
        proxy.cut()
        _loop(a, 15, 10)
        assert a.flush(10)
        proxy.restore()
        _loop(a, 5, 25)
        c = a.stop(15)
    finally:
        proxy.close()
    got = entries(real, "memq:ingest")
    assert _steps(got) == list(range(30)), (c, a.transport.last_error, len(a.transport.spool))
    assert [e.kind for e in got][0] == "run_start" and got[-1].kind == "run_end"
    assert c["spooled"] > 0 and c["replayed"] == c["spooled"] and c["dropped"] == 0


def test_full_spool_drops_oldest_and_counts(private_redis, tmp_path):
    port = free_port()  # nothing listens yet
    src = ReplaySource(REAL / "kept_loss_no_leak")
    src.signals = [(1 << 30, 1 << 30, 1 << 30, 1 << 30, 0)]  # steady steps: no growth snapshots of the agent's own
    a = make_agent(redis_url=f"redis://127.0.0.1:{port}/0", spool_dir=tmp_path / "spool", source=src)
    a.snapshot("manual")
    assert a.flush(10)
    one = a.transport.spool.bytes  # run_start + one snapshot
    a.transport.spool.max_bytes = int(one * 3.5)  # room for about 3 snapshot messages
    for step in range(1, 11):
        a.mark_step(step, 0)
        a.snapshot("manual")
    assert a.flush(10)
    c = a.counters()
    big = [f for f in a.spool_path.rglob("*.mqs") if f.stat().st_size > one // 4]
    # about 3 snapshot messages fit; the small stats message carrying the step figures fits beside them
    assert c["dropped"] >= 7 and len(big) <= 3 and len(a.transport.spool) <= 4
    srv = private_redis(port=port)
    assert wait_for(lambda: len(a.transport.spool) == 0, 10)
    a.stop(10)
    got = entries(srv.client(), "memq:ingest")
    kept = _steps(got)
    assert kept == sorted(kept) and kept[-1] == 10 and len(kept) <= 3
    final = a.counters()
    assert final["spooled"] - final["replayed"] <= final["dropped"]


def test_full_redis_spools_then_replays(private_redis, tmp_path):
    srv = private_redis(extra=("--maxmemory-policy", "noeviction"))
    admin = srv.client()
    admin.config_set("maxmemory", "1")  # full: every write is refused with OOM
    a = make_agent(redis_url=srv.url, spool_dir=tmp_path / "spool",
                   source=ReplaySource(REAL / "kept_loss_no_leak"))
    _loop(a, 5, 0)
    assert a.flush(10)
    assert a.counters()["spooled"] > 0 and "maxmemory" in (a.transport.last_error or "")
    admin.config_set("maxmemory", "64mb")
    c = a.stop(15)
    assert c["replayed"] == c["spooled"] and c["dropped"] == 0
    assert _steps(entries(srv.client(), "memq:ingest")) == list(range(5))


@pytest.mark.parametrize("step", ["ping", "set", "xadd"])
def test_injected_command_failures(shared, tmp_path, step):
    r, prefix, stream = shared
    fail = {step: 3}

    def factory():
        return FaultyClient(make_client("redis://127.0.0.1:6379/0", 2.0), fail)

    a = make_agent(client_factory=factory, stream=stream, key_prefix=prefix, spool_dir=tmp_path / "spool")
    _loop(a, 12, 0)
    assert wait_for(lambda: a.flush(0.1) and len(a.transport.spool) == 0, 10)  # the outage ends
    c = a.stop(15)
    assert fail[step] == 0 and c["errors"] >= 1, (c, a.transport.last_error)
    got = entries(r, stream)
    assert _steps(got) == list(range(12)), (c, a.transport.last_error, [e.kind for e in got])
    assert c["dropped"] == 0
    for e in got:
        if e.kind == "snapshot":
            blob_of(r, e, prefix)


def test_connect_failure_in_factory(shared, tmp_path):
    r, prefix, stream = shared
    calls = {"n": 0}

    def factory():
        calls["n"] += 1
        if calls["n"] <= 2:
            raise OSError("injected: cannot build a client")
        return make_client("redis://127.0.0.1:6379/0", 2.0)

    a = make_agent(client_factory=factory, stream=stream, key_prefix=prefix, spool_dir=tmp_path / "spool")
    _loop(a, 6, 0)
    assert wait_for(lambda: a.flush(0.1) and len(a.transport.spool) == 0, 10)
    c = a.stop(15)
    assert calls["n"] >= 3 and c["errors"] >= 2
    assert _steps(entries(r, stream)) == list(range(6))


class _Unpicklable:
    def __reduce__(self):
        raise TypeError("injected: cannot pickle")


class _FaultySource(ReplaySource):
    """A real replay source whose methods fail on demand (a broken torch build, a bad snapshot)."""

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.bad_snapshot = self.raise_snapshot = self.raise_stats = False

    def snapshot(self):
        if self.raise_snapshot:
            raise RuntimeError("injected: _snapshot failed")
        if self.bad_snapshot:
            return {"segments": [_Unpicklable()]}
        return super().snapshot()

    def stats(self):
        if self.raise_stats:
            raise RuntimeError("injected: memory_stats failed")
        return super().stats()


def test_serialization_and_source_failures(shared, tmp_path):
    r, prefix, stream = shared
    src = _FaultySource(REAL / "seed_adamw")
    a = make_agent(source=src, stream=stream, key_prefix=prefix, stats_interval_s=0)
    src.bad_snapshot = True
    _loop(a, 3, 0)
    src.bad_snapshot, src.raise_snapshot, src.raise_stats = False, True, True
    _loop(a, 3, 3)
    src.raise_snapshot = src.raise_stats = False
    _loop(a, 3, 6)
    c = a.stop(15)
    assert _steps(entries(r, stream)) == [6, 7, 8]
    # four unpicklable snapshots: steps 0-2 and the warm-up snapshot at step 2
    assert c["errors"] >= 4 + 3 and c["dropped"] == 4


def test_spool_write_failure_is_counted(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the spool folder should be")
    a = make_agent(redis_url=f"redis://127.0.0.1:{free_port()}/0", spool_dir=blocker)
    _loop(a, 5, 0)
    c = a.stop(10)
    assert c["spooled"] == 0 and c["dropped"] >= 5 and c["errors"] >= 5


def test_stop_is_bounded_when_redis_hangs(tmp_path):
    """A server that accepts connections and never answers: every call times out; stop() still
    returns within its bound and what could not be sent is in the spool."""
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    port = hang.getsockname()[1]
    try:
        a = make_agent(redis_url=f"redis://127.0.0.1:{port}/0", send_timeout_s=0.5, spool_dir=tmp_path / "s")
        _loop(a, 20, 0)
        t0 = time.monotonic()
        a.stop(2.0)
        took = time.monotonic() - t0
    finally:
        hang.close()
    assert took < 3.0, took
    c = a.counters()
    assert c["sent"] == 0 and c["spooled"] + c["dropped"] + c["queued"] >= 1


def test_no_redis_every_call_is_fast(tmp_path):
    t0 = time.perf_counter()
    a = make_agent(redis_url=f"redis://127.0.0.1:{free_port()}/0", spool_dir=tmp_path / "s")
    assert time.perf_counter() - t0 < 0.5
    _loop(a, 50, 0, budget_s=0.05)
    t0 = time.perf_counter()
    c = a.stop(5)
    assert time.perf_counter() - t0 < 5.5
    assert c["sent"] == 0 and c["spooled"] >= 50


def test_no_cuda_no_torch_every_call_is_fast_and_silent(shared, tmp_path):
    """The production source in a process without torch: nothing is recorded, nothing raises."""
    r, prefix, stream = shared
    code = f"""
import sys, time
sys.modules['torch'] = None  # torch absent (as on this CPU machine)
from memq import agent
t0 = time.perf_counter()
h = agent.start(run='nocuda', cluster='c', stream={stream!r}, key_prefix={prefix!r}, signal=None,
                spool_dir={str(tmp_path)!r}, announce='on_ready')
for i in range(100):
    agent.mark_step(i, 0)
assert agent.snapshot() is False
agent.mark_epoch(0)
c = agent.stop(5)
took = time.perf_counter() - t0
assert took < 2.0, took
assert c['sent'] == 0 and c['errors'] == 0, c
print('ok', took)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert r.xlen(stream) == 0


def test_without_redis_py_and_zstandard_spools_gzip(tmp_path):
    code = f"""
import sys
sys.modules['redis'] = None; sys.modules['zstandard'] = None
from memq import agent
from memq.agent.source import ReplaySource
a = agent.start(run='noredis', cluster='c', source=ReplaySource({str(REAL / 'seed_adamw')!r}), signal=None,
                spool_dir={str(tmp_path)!r})
agent.mark_step(0, 0); agent.mark_epoch(0)
c = agent.stop(5)
assert c['spooled'] == 5 and c['sent'] == 0, c
print(a.transport.codec)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "gzip"
    from memq.agent.spool import iter_spool_dirs

    (d,) = list(iter_spool_dirs(tmp_path))
    msgs = [m for _, m in Spool(d, 1 << 30)]
    # the second stats message is the rank's exit figures, flushed before run_end
    assert [m.fields["kind"] for m in msgs] == ["run_start", "snapshot", "stats", "stats", "run_end"]
    assert "rank_figures" in msgs[3].fields["payload"]
    assert msgs[1].fields["codec"] == "gzip" and msgs[1].blob[:2] == b"\x1f\x8b"


def test_queue_overflow_drops_instead_of_blocking(tmp_path):
    hang = socket.socket()
    hang.bind(("127.0.0.1", 0))
    hang.listen(64)
    try:
        a = make_agent(redis_url=f"redis://127.0.0.1:{hang.getsockname()[1]}/0", send_timeout_s=1.0,
                       queue_size=4, spool_dir=tmp_path / "s")
        t0 = time.perf_counter()
        for i in range(60):
            a.mark_step(i, 0)
            a.snapshot("manual")
        assert time.perf_counter() - t0 < 2.0  # mostly the replay source reading its files
        assert a.counters()["dropped"] > 0
        a.stop(1.0)
    finally:
        hang.close()


class _Proxy:
    """A TCP proxy in front of a private redis-server that the test can cut and restore."""

    def __init__(self, port: int, target: int):
        self.port, self.target = port, target
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.up = True
        self.conns: list[socket.socket] = []
        self.closed = False
        self.lock = threading.Lock()

    def start(self):
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while not self.closed:
            try:
                c, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            if not self.up:
                c.close()
                continue
            try:
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            with self.lock:
                self.conns += [c, u]
            for x, y in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(x, y):
        try:
            while True:
                data = x.recv(65536)
                if not data:
                    break
                y.sendall(data)
        except OSError:
            pass
        for s in (x, y):
            try:
                s.close()
            except OSError:
                pass

    def cut(self):
        self.up = False
        with self.lock:
            for c in self.conns:
                try:
                    c.shutdown(socket.SHUT_RDWR)
                    c.close()
                except OSError:
                    pass
            self.conns = []

    def restore(self):
        self.up = True

    def close(self):
        self.closed = True
        self.cut()
        self.sock.close()


def test_rediss_and_password_urls_are_accepted(private_redis, tmp_path):
    """A password-protected server: the URL's credentials are used (TLS needs certificates this
    machine does not have; `rediss://` is checked to build a TLS client and fail over to the spool)."""
    srv = private_redis(extra=("--requirepass", "s3cret"))
    a = make_agent(redis_url=f"redis://:s3cret@127.0.0.1:{srv.port}/0", spool_dir=tmp_path / "a")
    a.snapshot("manual")
    c = a.stop(10)
    assert c["sent"] >= 2 and c["spooled"] == 0
    authed = redis.Redis(port=srv.port, password="s3cret")
    assert authed.xlen("memq:ingest") >= 2
    bad = make_agent(redis_url=f"redis://:wrong@127.0.0.1:{srv.port}/0", spool_dir=tmp_path / "b")
    bad.snapshot("manual")
    c = bad.stop(5)
    assert c["sent"] == 0 and c["spooled"] >= 2
    tls = make_agent(redis_url=f"rediss://:s3cret@127.0.0.1:{srv.port}/0", spool_dir=tmp_path / "c")
    tls.snapshot("manual")
    c = tls.stop(5)
    assert c["sent"] == 0 and c["spooled"] >= 2  # plain server, TLS client: handshake fails -> spool


def test_tls_redis_with_password(tmp_path):
    """A real TLS server (redis-server --tls-port, a self-signed certificate made here)."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: apt-get install -y openssl (tests/run.sh does)")
    cert, key = tmp_path / "c.pem", tmp_path / "k.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    proc = subprocess.Popen(["redis-server", "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
                             "--tls-key-file", str(key), "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no",
                             "--requirepass", "s3cret", "--save", "", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"rediss://:s3cret@127.0.0.1:{port}/0?ssl_ca_certs={cert}"
        assert wait_for(lambda: _pings(url), 10), "TLS redis-server did not start"
        a = make_agent(redis_url=url, spool_dir=tmp_path / "s")
        a.mark_step(0, 0)
        a.snapshot("manual")
        c = a.stop(10)
        assert c["sent"] >= 2 and c["spooled"] == 0, (c, a.transport.last_error)
        got = entries(make_client(url, 5.0), "memq:ingest")
        assert [e.trigger for e in got if e.kind == "snapshot"] == ["manual"]
        blob_of(make_client(url, 5.0), [e for e in got if e.kind == "snapshot"][0], "memq:")
    finally:
        proc.kill()
        proc.wait(10)


def _pings(url: str) -> bool:
    try:
        return bool(make_client(url, 1.0).ping())
    except redis.RedisError:
        return False


def test_next_process_delivers_a_dead_process_spool(shared, tmp_path):
    """A process that ended while Redis was unreachable left its spool; the next agent of the same
    run on the same host claims it (atomic rename) and delivers it."""
    r, prefix, stream = shared
    code = f"""
from memq.agent import Agent
from memq.agent.source import ReplaySource
a = Agent('adopt-run', 'c', source=ReplaySource({str(REAL / 'seed_sgd')!r}), redis_url='redis://127.0.0.1:1/0',
          spool_dir={str(tmp_path / 'spool')!r}, stream={stream!r}, key_prefix={prefix!r}, signal=None,
          fsync=False).start()
a.mark_step(0, 0); a.mark_epoch(0)
print(a.stop(3))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (left,) = list((tmp_path / "spool" / "adopt-run").iterdir())
    n_left = len(list(left.glob("*.mqs")))
    assert n_left >= 3
    live = tmp_path / "spool" / "adopt-run" / f"rank0-{socket.gethostname()}-{os.getppid()}"
    live.mkdir()  # a live process's spool (our parent): never taken
    (live / "000000000000.mqs").write_bytes(b"MQS1")
    b = make_agent(run="adopt-run", stream=stream, key_prefix=prefix, spool_dir=tmp_path / "spool")
    assert wait_for(lambda: b.counters()["replayed"] >= n_left, 10)
    b.stop(10)
    got = entries(r, stream)
    pids = {e.payload["pid"] for e in got if e.kind == "run_start"}
    assert len(pids) == 2 and os.getpid() in pids  # the dead process's run_start and ours
    assert not left.exists() and live.exists()
    for e in got:
        if e.kind == "snapshot":
            blob_of(r, e, prefix)
