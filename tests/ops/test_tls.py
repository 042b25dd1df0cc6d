"""Redis over TLS (SECURITY.md, threat 6): a private redis-server with a TLS port only and a CA of our
own (openssl), the ACL users of deploy/make-secrets.sh; `memq doctor` and `memq push` (as the agent
user) through `rediss://...?ssl_cert_reqs=required&ssl_ca_certs=CA`, and the certificate is verified."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from memq import redis_functions
from tests.ops.stackfile import make_secrets
from tests.workers.stack import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "real" / "capacity" / "oom.pickle.gz"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: apt-get install -y openssl (tests/run.sh does)")
    tmp = tmp_path_factory.mktemp("tls")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
             "-subj", "/CN=memq-test-ca", cwd=tmp)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1", cwd=tmp)
    (tmp / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "ext", cwd=tmp)
    port = free_port()
    sec = make_secrets(tmp, "127.0.0.1", port, "postgresql://unused@127.0.0.1:1/unused")
    proc = subprocess.Popen([shutil.which("redis-server"), "--port", "0", "--tls-port", str(port), "--bind",
                             "127.0.0.1",
                             "--tls-cert-file", str(tmp / "server.crt"), "--tls-key-file", str(tmp / "server.key"),
                             "--tls-ca-cert-file", str(tmp / "ca.crt"), "--tls-auth-clients", "no",
                             "--aclfile", str(sec / "users.acl"), "--save", "", "--dir", str(tmp)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    q = f"?ssl_cert_reqs=required&ssl_ca_certs={tmp / 'ca.crt'}"

    def url(name: str) -> str:
        return (sec / name).read_text().strip().replace("redis://", "rediss://") + q

    def up():
        try:
            return redis.Redis.from_url(url("memq_redis_url"), socket_timeout=1).ping()
        except redis.RedisError:
            return False

    try:
        wait_for(up, 15, 0.1, "redis-server with TLS")
        yield {"tmp": tmp, "port": port, "admin": url("memq_redis_url"), "agent": url("agent_redis_url"),
               "secrets": sec}
    finally:
        proc.kill()
        proc.wait(10)


def _env(tls, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update({"MEMQ_DATA_DIR": str(tls["tmp"] / "data"), "MEMQ_CONFIG": str(tls["tmp"] / "none.toml"),
                "MEMQ_BLOB_DIR": str(tls["tmp"] / "blobs")})
    env.update(extra)
    return env


def _memq(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memq", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_doctor_over_tls_and_the_certificate_is_verified(tls):
    url_file = tls["tmp"] / "redis_url"
    url_file.write_text(tls["admin"] + "\n")
    p = _memq(_env(tls, MEMQ_REDIS_URL_FILE=str(url_file)), "doctor", "--json")
    checks = {c["name"]: c for c in json.loads(p.stdout)["checks"]}
    assert checks["redis"]["status"] == "ok", p.stdout
    assert checks["redis"]["data"]["url"].startswith("rediss://memq:***@")
    # without the CA the server's certificate is refused; plain redis:// to the TLS port fails too
    no_ca = tls["admin"].split("?")[0] + "?ssl_cert_reqs=required"
    for bad in (no_ca, tls["admin"].split("?")[0].replace("rediss://", "redis://")):
        p = _memq(_env(tls, MEMQ_REDIS_URL=bad), "doctor", "--json")
        checks = {c["name"]: c for c in json.loads(p.stdout)["checks"]}
        assert p.returncode == 1 and checks["redis"]["status"] == "error", p.stdout


def test_agent_push_over_tls(tls):
    p = _memq(_env(tls, MEMQ_REDIS_URL=tls["agent"]), "push", str(FIXTURE), "--run", "tls-run", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    admin = redis.Redis.from_url(tls["admin"], socket_timeout=5)
    # the agent user has no XADD: push appended to the inbox, which the dispatcher's relay moves
    relay = redis_functions.Relay(admin, stream="memq:ingest", key_prefix="memq:", maxlen=1000, blob_ttl_s=3600)
    assert relay.step() >= 3
    kinds = [f[b"kind"] for _, f in admin.xrange("memq:ingest")]
    assert kinds[0] == b"run_start" and b"snapshot" in kinds
    assert list(admin.scan_iter(match="memq:blob:*"))
