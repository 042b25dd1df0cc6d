"""The processes deploy/compose.yaml names, started as plain processes on this machine.

`ComposeStack` reads the compose file and runs each service's own `command` (nothing retyped here, so
the tests fail when the file drifts): `redis` (with a private port, bind and data dir appended), then
`migrate`, `dispatcher`, `worker` and `beat`, with the environment of the `x-memq-env` block. Paths
of the containers are mapped into a tmp dir: `/run/secrets/<name>` -> the secrets written by
deploy/make-secrets.sh (run on a copy of deploy/), `/var/lib/memq` -> tmp/lib, `/etc/memq` -> tmp/etc.
`memq` runs as `python -m memq`, `celery` as `python -m celery` (this interpreter, this checkout).
PostgreSQL is the shared server, with a database of our own (the compose `postgres` service is the
stock image: nothing of ours to test there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import redis
import yaml

from tests.workers.stack import PrivateRedis, free_port, wait_for  # noqa: F401 - re-exported to ops tests

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"


def load_compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def make_secrets(tmp: Path, host: str, redis_port: int, database_url: str) -> Path:
    """Run deploy/make-secrets.sh on a copy of deploy/, then point the URLs at this machine."""
    copy = tmp / "deploy"
    shutil.copytree(DEPLOY, copy, ignore=shutil.ignore_patterns("secrets"))
    subprocess.run(["sh", str(copy / "make-secrets.sh")], check=True, capture_output=True, timeout=60)
    sec = copy / "secrets"
    for name in ("memq_redis_url", "agent_redis_url"):
        url = (sec / name).read_text().strip()
        here = f"@{host}:{redis_port}/"
        url = url.replace("@redis:6379/", here).replace("@127.0.0.1:6379/", here)
        (sec / name).write_text(url + "\n")
    (sec / "memq_database_url").write_text(database_url + "\n")
    return sec


class ComposeStack:
    def __init__(self, tmp: Path, database_url: str, extra_env: dict | None = None):
        self.tmp = tmp
        self.compose = load_compose()
        self.services = self.compose["services"]
        self.redis_port = free_port()
        self.secrets = make_secrets(tmp, "127.0.0.1", self.redis_port, database_url)
        (tmp / "lib").mkdir(exist_ok=True)
        (tmp / "etc").mkdir(exist_ok=True)
        (tmp / "etc" / "memq.toml").write_text("")
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        self.env.update({k: self.path(str(v)) for k, v in self.compose["x-memq-env"].items()})
        self.env.update(extra_env or {})
        self.env["PYTHONUNBUFFERED"] = "1"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs: dict[str, Path] = {}

    # ------------------------------------------------------------------ mapping
    def path(self, value: str) -> str:
        value = value.replace("/run/secrets/redis_users_acl", str(self.secrets / "users.acl"))
        for name in ("memq_redis_url", "memq_database_url", "postgres_password"):
            value = value.replace(f"/run/secrets/{name}", str(self.secrets / name))
        return value.replace("/var/lib/memq", str(self.tmp / "lib")).replace("/etc/memq", str(self.tmp / "etc"))

    def argv(self, service: str) -> list[str]:
        cmd = [self.path(str(a)) for a in self.services[service]["command"]]
        if cmd[0] == "memq":
            return [sys.executable, "-m", "memq", *cmd[1:]]
        if cmd[0] == "celery":
            return [sys.executable, "-m", "celery", *cmd[1:]]
        if cmd[0] == "redis-server":
            exe = shutil.which("redis-server")
            assert exe, "redis-server is not installed"
            return [exe, *cmd[1:], "--port", str(self.redis_port), "--bind", "127.0.0.1",
                    "--dir", str(self.tmp / "redis")]
        raise AssertionError(f"service {service}: unknown program {cmd[0]!r}")

    def url(self, name: str = "memq_redis_url") -> str:
        return (self.secrets / name).read_text().strip()

    # ------------------------------------------------------------------ processes
    def run(self, service: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(service), env=self.env, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout)

    def start(self, service: str, env: dict | None = None) -> subprocess.Popen:
        if service == "redis":
            (self.tmp / "redis").mkdir(exist_ok=True)
        log = self.tmp / f"{service}.log"
        fh = open(log, "wb")  # noqa: SIM115 - closed in stop()
        p = subprocess.Popen(self.argv(service), env=env or self.env, cwd=ROOT, stdout=fh,
                             stderr=subprocess.STDOUT, start_new_session=True)
        p._log = fh  # type: ignore[attr-defined]
        self.procs[service], self.logs[service] = p, log
        return p

    def memq(self, *args: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "memq", *args], env=env or self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    def log(self, service: str, n: int = 3000) -> str:
        p = self.logs.get(service)
        return p.read_text(errors="replace")[-n:] if p and p.exists() else ""

    def stop(self, service: str, timeout: float = 30) -> int | None:
        p = self.procs.get(service)
        if p is None:
            return None
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
        with contextlib.suppress(Exception):
            p._log.close()  # type: ignore[attr-defined]
        return p.returncode

    def close(self) -> None:
        for service in ("beat", "worker", "dispatcher"):
            self.stop(service)
        self.stop("redis")


class Server(PrivateRedis):
    """A private redis-server on a free port with the given extra arguments (and a password)."""

    def __init__(self, tmp: Path, *extra: str, password: str | None = None):
        super().__init__(tmp, aof=False)
        self.extra = (*extra, *(("--requirepass", password) if password else ()))
        self.password = password

    def _ping(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, password=self.password, socket_timeout=0.5).ping())
        except redis.RedisError:
            return False

    def start(self):
        self.proc = subprocess.Popen([shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1",
                                      "--dir", str(self.tmp), *self.extra],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._ping, 15, 0.05, "private redis-server")
        return self
