"""Helpers of the worker tests (tests/workers/conftest.py has the fixtures).

Worker tests talk to the real thing: Redis, PostgreSQL, `memq dispatcher` and a Celery worker
started as subprocesses (`memq worker`, Celery's own worker; never eager mode).

- End-to-end tests use the shared Redis (6379) with a unique key prefix per test (stream, dead
  letters, blobs, and the Celery broker's keys and channels through MEMQ_BROKER_KEY_PREFIX) and the
  session's own database on the shared PostgreSQL; they delete only their own keys.
- Fault tests start PRIVATE `redis-server` and PostgreSQL instances on free ports (they get killed,
  restarted and stopped), never the shared ones.
Timeouts are short (lease 12 s, reaper every 2 s, claim after 3 s idle) so recovery paths run in
seconds; every wait is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from memq import codec

ROOT = Path(__file__).resolve().parents[2]
REAL = ROOT / "tests" / "fixtures" / "real"
BIG = ROOT / "benchmarks" / "data" / "big.pickle.gz"
SHARED_REDIS = os.environ.get("MEMQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")

FAST = {
    "MEMQ_TASK_SOFT_TIME_LIMIT_S": "8", "MEMQ_TASK_TIME_LIMIT_S": "10", "MEMQ_ANALYSIS_LEASE_S": "12",
    "MEMQ_VISIBILITY_TIMEOUT_S": "40", "MEMQ_RETRY_BACKOFF_MAX_S": "3", "MEMQ_TASK_MAX_RETRIES": "40",
    "MEMQ_REAPER_INTERVAL_S": "2", "MEMQ_PENDING_REQUEUE_S": "6", "MEMQ_CLAIM_IDLE_S": "3",
    "MEMQ_RUN_DIAGNOSIS_DELAY_MS": "300", "MEMQ_HEARTBEAT_S": "1", "MEMQ_MAX_DELIVERIES": "5",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(pred, timeout: float, step: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


# ------------------------------------------------------------------------------ private servers


class PrivateRedis:
    """`redis-server --port P --save "" --dir TMP` (plus AOF with fsync always when asked, so a
    restart keeps the data, as a production broker with AOF does)."""

    def __init__(self, tmp: Path, aof: bool = True):
        self.tmp, self.port, self.aof = tmp, free_port(), aof
        self.proc: subprocess.Popen | None = None
        tmp.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> PrivateRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            pytest.fail("redis-server is not installed; the fault tests need it")
        aof = ["--appendonly", "yes", "--appendfsync", "always"] if self.aof else ["--appendonly", "no"]
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--dir", str(self.tmp), *aof], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        wait_for(self._ping, 15, 0.05, "private redis-server")
        return self

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None


class PrivatePostgres:
    """initdb + pg_ctl start on a free port, as ARCHITECTURE.md says (runuser postgres)."""

    def __init__(self, tmp: Path):
        self.tmp, self.port = tmp, free_port()
        versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
        if not versions:
            pytest.fail("PostgreSQL server binaries not found (/etc/postgresql)")
        self.bin = Path("/usr/lib/postgresql") / versions[-1] / "bin"
        self.data = tmp / "data"

    @property
    def admin_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _as_pg(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        cmd = ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else list(args)
        return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=120)

    def init(self) -> PrivatePostgres:
        self.tmp.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.tmp, "postgres")
        self._as_pg(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                    "--no-sync")
        with open(self.data / "postgresql.conf", "a") as fh:
            fh.write("fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n")
        return self

    def start(self) -> PrivatePostgres:
        self._as_pg(str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", f"-p {self.port} -k {self.tmp}",
                    "-l", str(self.tmp / "log"), "-w", "start")
        return self

    def stop(self) -> None:
        self._as_pg(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop", check=False)

    def create_database(self) -> str:
        import psycopg
        from psycopg import sql

        name = f"memq_fault_{secrets.token_hex(4)}"
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"


# ------------------------------------------------------------------------------ the stack


class Stack:
    """Environment and processes of one memq deployment under test: `memq dispatcher`, Celery workers
    (`memq worker`) and their one beat (for the reaper), logs in the test's tmp dir. The beat runs as
    its own process, as every deployment runs it (deploy/compose.yaml): a worker with an embedded beat
    (`-B`) can stop consuming after a Redis restart (kombu's redis transport, benchmarks/RESULTS.md
    "Faults under load"), which is not the product's failure to test."""

    def __init__(self, tmp: Path, redis_url: str, database_url: str, **extra: str):
        self.tmp = tmp
        self.prefix = f"memqtest:wk:{secrets.token_hex(6)}:"
        self.env = dict(os.environ)
        for k in [k for k in self.env if k.startswith("MEMQ_")]:
            del self.env[k]
        self.env.update(FAST)
        self.env.update({
            "MEMQ_REDIS_URL": redis_url, "MEMQ_KEY_PREFIX": self.prefix, "MEMQ_STREAM": self.prefix + "ingest",
            "MEMQ_DEAD_STREAM": self.prefix + "dead", "MEMQ_DATABASE_URL": database_url,
            "MEMQ_DATA_DIR": str(tmp / "data"), "MEMQ_BLOB_DIR": str(tmp / "blobs"),
            "MEMQ_SPOOL_DIR": str(tmp / "spool"), "MEMQ_CONFIG": str(tmp / "none.toml"),
            "PYTHONUNBUFFERED": "1",
        })
        self.env.update(extra)
        self.procs: dict[str, subprocess.Popen] = {}
        self.n = 0
        self.beat: subprocess.Popen | None = None

    # settings and clients as the processes see them
    @property
    def settings(self):
        from memq.config import load_settings

        return load_settings(self.env)

    @property
    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(self.env["MEMQ_REDIS_URL"], socket_timeout=5)

    @property
    def stream(self) -> str:
        return self.env["MEMQ_STREAM"]

    def engine(self):
        from memq.store.db import make_engine

        return make_engine(self.env["MEMQ_DATABASE_URL"])

    def upgrade(self) -> None:
        self.memq("db", "upgrade")

    def memq(self, *args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
        p = subprocess.run([sys.executable, "-m", "memq", *args], env=self.env, capture_output=True,
                           text=True, timeout=timeout, cwd=ROOT)
        if check and p.returncode != 0:
            raise AssertionError(f"memq {' '.join(args)} exited {p.returncode}: {p.stderr[-2000:]}")
        return p

    def memq_json(self, *args: str) -> dict:
        return json.loads(self.memq(*args, "--json").stdout)

    # long-running processes
    def _spawn(self, name: str, args: list[str], env: dict | None = None, module: str = "memq") -> subprocess.Popen:
        self.n += 1
        log = open(self.tmp / f"{name}-{self.n}.log", "wb")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen([sys.executable, "-m", module, *args], env=env or self.env, stdout=log,
                             stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True)
        p._memq_log = log  # type: ignore[attr-defined]
        self.procs[f"{name}-{self.n}"] = p
        return p

    def beat_schedule_file(self) -> Path:
        """The schedule file of this stack's beat (started by the first `start_worker(beat=True)`)."""
        return self.tmp / "beat-schedule"

    def start_beat(self) -> subprocess.Popen:
        """The stack's one beat, as the deployments start it (`celery -A memq.workers.app beat`); a
        beat already running is kept (a second one would send every periodic task twice)."""
        if self.beat is not None and self.beat.poll() is None:
            return self.beat
        self.beat = self._spawn("beat", ["-A", "memq.workers.app", "beat", "-l", "INFO",
                                         "-s", str(self.beat_schedule_file()), "--pidfile="], module="celery")
        return self.beat

    def start_worker(self, concurrency: int = 1, beat: bool = True, wait: bool = True) -> subprocess.Popen:
        """A worker; with `beat`, the stack's beat too, when it has none running."""
        args = ["worker", "-c", str(concurrency), "-l", "INFO", "--without-mingle", "--without-gossip"]
        if beat:
            self.start_beat()
        p = self._spawn("worker", args)
        if wait:
            wait_for(lambda: self.heartbeats("worker") or p.poll() is not None, 60, 0.2, "worker heartbeat")
            assert p.poll() is None, self.log_tail("worker")
        return p

    def start_dispatcher(self, consumer: str | None = None, fault: str | None = None,
                         wait: bool = False, harness: bool = True) -> subprocess.Popen:
        """`fault`: a kill point (MEMQ_TEST_FAULT), armed by this harness's marker (workers/faults.py)
        unless `harness=False` (then the dispatcher must ignore it)."""
        env = dict(self.env)
        if fault:
            env["MEMQ_TEST_FAULT"] = fault
            if harness:
                from memq.workers.faults import HARNESS_ENV, write_marker

                env[HARNESS_ENV] = str(write_marker(self.tmp / "test-harness.marker"))
        args = ["dispatcher", "--block-ms", "200", *(["--consumer", consumer] if consumer else [])]
        p = self._spawn("dispatcher", args, env)
        if wait:
            wait_for(lambda: any(h.get("pid") == p.pid for h in self.heartbeats("dispatcher")) or p.poll() is not None,
                     60, 0.1, "dispatcher heartbeat")
            assert p.poll() is None, self.log_tail("dispatcher")
        return p

    def heartbeats(self, kind: str) -> list[dict]:
        r = self.redis
        try:
            keys = list(r.scan_iter(match=f"{self.prefix}heartbeat:{kind}:*"))
            return [json.loads(v) for v in r.mget(keys) if v] if keys else []
        except redis.RedisError:
            return []

    def log_tail(self, name: str, n: int = 4000) -> str:
        out = []
        for p in sorted(self.tmp.glob(f"{name}-*.log")):
            out.append(f"--- {p.name}\n" + p.read_text(errors="replace")[-n:])
        return "\n".join(out)

    def stop(self, p: subprocess.Popen, timeout: float = 20) -> int:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                kill_group(p)
        p._memq_log.close()  # type: ignore[attr-defined]
        return p.returncode

    def close(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                kill_group(p)
            with contextlib.suppress(Exception):
                p._memq_log.close()  # type: ignore[attr-defined]
        try:
            r = self.redis
            for key in r.scan_iter(match=self.prefix + "*", count=1000):
                r.delete(key)
        except redis.RedisError:
            pass

    # what the database holds
    def rows(self, sql: str, **params) -> list:
        from sqlalchemy import text

        eng = self.engine()
        try:
            with eng.connect() as c:
                return list(c.execute(text(sql), params))
        finally:
            eng.dispose()

    def states(self) -> dict[str, int]:
        return {r[0]: int(r[1]) for r in self.rows("SELECT state, count(*) FROM snapshots GROUP BY state")}

    def dead(self) -> list[dict]:
        return [{k.decode(): v.decode("utf-8", "replace") for k, v in f.items()}
                for _id, f in self.redis.xrange(self.env["MEMQ_DEAD_STREAM"])]

    def samples_sent(self) -> int:
        """Stat samples in the stream's `stats` entries (what the dispatcher must store)."""
        n = 0
        for _id, f in self.redis.xrange(self.stream):
            if f.get(b"kind") == b"stats":
                n += sum(1 for x in json.loads(f[b"payload"])["samples"] if "device_metadata" not in x)
        return n

    def assert_samples_stored(self, timeout: float = 30) -> int:
        want = self.samples_sent()
        assert want > 0
        wait_for(lambda: self.rows("SELECT count(*) FROM stat_samples")[0][0] == want, timeout, 0.2,
                 f"{want} stat samples stored")
        return want

    def assert_exactly_once(self, expected_shas: set[str]) -> None:
        """One snapshot row per expected (run, rank, sha256), each done with one analysis result
        of its bytes, and nothing else."""
        snaps = self.rows("SELECT s.sha256, s.state, s.analysis_id, s.last_error, r.name FROM snapshots s "
                          "JOIN runs r ON r.id = s.run_id")
        got = [s.sha256 for s in snaps]
        assert sorted(got) == sorted(expected_shas), (len(got), len(expected_shas))
        bad = [(s.name, s.sha256[:12], s.state, s.last_error) for s in snaps if s.state != "done" or not s.analysis_id]
        assert not bad, bad
        per_sha = self.rows("SELECT sha256, count(*) AS n FROM analysis_results GROUP BY sha256")
        assert {r.sha256 for r in per_sha} == set(expected_shas)
        assert all(r.n == 1 for r in per_sha), per_sha


def kill_group(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(10)


def children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        with contextlib.suppress(OSError):
            out += [int(x) for x in task.read_text().split()]
    return out


# ------------------------------------------------------------------------------ snapshots


def fixture_bytes(folder: str, name: str) -> bytes:
    return codec.decompress((REAL / folder / name).read_bytes())


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def variant(data: bytes, tag: str) -> bytes:
    """Distinct bytes of the same snapshot: a harmless extra key in the pickled dict (our own data,
    decoded with the restricted decoder and pickled again here)."""
    import pickle

    obj = codec.decode_plain(data)
    obj["memq_test_variant"] = tag
    return pickle.dumps(obj, protocol=4)


class VaryingSource:
    """A ReplaySource whose snapshots are distinct bytes (a counter key in the dict), so a long
    run does not collapse into the fixture's few sha256s."""

    def __init__(self, folder: str):
        from memq.agent.source import ReplaySource

        self.inner = ReplaySource(REAL / folder)
        self.objs = [codec.decode_plain(self.inner.read(e)) for e in self.inner.entries]
        self.i = 0
        self.taken: list[bytes] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def snapshot(self):
        import pickle

        obj = dict(self.objs[self.i % len(self.objs)], memq_test_seq=self.i)
        self.i += 1
        data = pickle.dumps(obj, protocol=4)
        self.taken.append(data)
        return data


def make_agent(stack: Stack, run: str, source, **kw):
    from memq.agent import Agent

    st = stack.settings
    kw.setdefault("backoff_s", (0.05, 0.5))
    kw.setdefault("fsync", False)
    kw.setdefault("signal", None)
    kw.setdefault("stats_interval_s", 3600)
    kw.setdefault("snapshot_every_s", 0)
    kw.setdefault("history", "off")  # no recording-policy snapshots: the tests choose every snapshot
    kw.setdefault("send_timeout_s", 1.0)
    return Agent(run, kw.pop("cluster", "test-cluster"), source=source, settings=st, redis_url=st.redis_url,
                 stream=st.stream_key, key_prefix=st.key_prefix, spool_dir=st.spool_dir, **kw).start()


@contextlib.contextmanager
def spools_stack(tmp: Path, shared_redis, db_name: str, spools: dict[str, Path]):
    """A Stack on its own PostgreSQL database with a worker and a dispatcher running, and each agent
    spool in `spools` (name -> folder) replayed into its stream: real H200 spools end to end. Replay
    removes what it sent, so it reads a copy and the fixture stays as it is."""
    from memq.agent.replay import replay_dir
    from tests.conftest import temp_pg_database

    with temp_pg_database(db_name) as url:
        s = Stack(tmp, shared_redis, url)
        try:
            s.upgrade()
            s.start_worker(concurrency=2, beat=False)
            s.start_dispatcher()
            st = s.settings
            for name, src in spools.items():
                dst = tmp / "spools" / name
                shutil.copytree(src, dst)
                assert replay_dir(dst, s.redis, stream=st.stream_key, key_prefix=st.key_prefix) > 0, name
            yield s
        finally:
            s.close()


@contextlib.contextmanager
def keyring_stack(tmp: Path, memq_url: str, keyring: Path, db_name: str, *, worker: bool, **env):
    """A Stack on a private ACL Redis (tests/ops/acl_redis) under the deployment's key names, which
    the ACL grants, with the agents' keyring and its own PostgreSQL database; the dispatcher running,
    and a worker when `worker`."""
    from tests.conftest import temp_pg_database

    with temp_pg_database(db_name) as url:
        s = Stack(tmp, memq_url, url, MEMQ_KEY_PREFIX="memq:", MEMQ_STREAM="memq:ingest",
                  MEMQ_DEAD_STREAM="memq:dead", MEMQ_AGENT_KEYRING_FILE=str(keyring), **env)
        s.prefix = "memq:"
        try:
            s.upgrade()
            if worker:
                s.start_worker(concurrency=1)
            s.start_dispatcher(wait=True)
            yield s
        finally:
            s.close()


@contextlib.contextmanager
def as_training_job(stack: Stack, agent_url: str, key_file: Path | None):
    """The stack's CLI as a training job runs it: the agent's Redis user and, when given, its own key
    (none: a job without a key)."""
    env = dict(stack.env)
    stack.env.pop("MEMQ_AGENT_KEY_FILE", None)
    stack.env["MEMQ_REDIS_URL"] = agent_url
    if key_file is not None:
        stack.env["MEMQ_AGENT_KEY_FILE"] = str(key_file)
    try:
        yield stack
    finally:
        stack.env = env
