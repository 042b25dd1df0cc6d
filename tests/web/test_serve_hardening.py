"""`memq serve` against round 4's attacks (attack 8), on a real served process over its own SQLite
history: slow request heads are cut at MEMQ_SERVE_HEADER_TIMEOUT_S (while a normal client is served),
the access log never holds a `?token=`, a Host outside the allow-list is refused on the token-less
default (DNS rebinding), the token redirect stays on the site whatever the path, and the cookie is
`Secure` over TLS (a TLS proxy's X-Forwarded-Proto)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import memq_environ
from tests.web.conftest import ROOT, History, Server
from tests.workers.stack import free_port, wait_for

LEAK = Path(__file__).resolve().parents[1] / "fixtures" / "captured" / "leak_epochs"
TOKEN = "s3cret-token-value"


def _serve(h: History, tmp: Path, **env: str) -> Server:
    port = free_port()
    log = tmp / f"serve-{port}.log"
    fh = open(log, "wb")
    proc = subprocess.Popen([sys.executable, "-m", "memq", "serve", "--port", str(port), "--log-level", "info"],
                            cwd=ROOT, env={**os.environ, **h.env, **env}, stdout=fh, stderr=subprocess.STDOUT,
                            start_new_session=True)
    s = Server(f"http://127.0.0.1:{port}", proc, log)
    auth = {"Authorization": f"Bearer {env['MEMQ_SERVE_TOKEN']}"} if env.get("MEMQ_SERVE_TOKEN") else None
    wait_for(lambda: _answers(s, auth), 90, 0.2, "memq serve to answer")
    return s


def _answers(s: Server, auth) -> bool:
    if s.proc.poll() is not None:
        raise AssertionError(s.log.read_text()[-2000:])
    try:
        return s.get("/healthz", auth)[0] == 200
    except OSError:
        return False


def _stop(s: Server) -> None:
    s.proc.send_signal(signal.SIGTERM)
    try:
        s.proc.wait(20)
    except subprocess.TimeoutExpired:
        s.proc.kill()


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    h = History(memq_environ(f"sqlite:///{root / 'memq.db'}", root), root)
    h.cli("ingest", str(LEAK / "epoch0.pickle.gz"), "--run", "r1", "--json")
    return h


@pytest.fixture(scope="module")
def open_server(history, tmp_path_factory):
    s = _serve(history, tmp_path_factory.mktemp("open"), MEMQ_SERVE_TOKEN="", MEMQ_SERVE_HEADER_TIMEOUT_S="1")
    yield s
    _stop(s)


@pytest.fixture(scope="module")
def token_server(history, tmp_path_factory):
    s = _serve(history, tmp_path_factory.mktemp("tok"), MEMQ_SERVE_TOKEN=TOKEN)
    yield s
    _stop(s)


def _port(s: Server) -> int:
    return int(s.url.rsplit(":", 1)[1])


def test_slow_heads_are_cut_and_a_normal_client_is_served(open_server):
    slow = []
    for _ in range(50):
        c = socket.create_connection(("127.0.0.1", _port(open_server)))
        c.sendall(b"GET /runs HTTP/1.1\r\nHost: localhost\r\n")  # never ends its head
        slow.append(c)
    silent = socket.create_connection(("127.0.0.1", _port(open_server)))  # sends nothing at all
    assert open_server.get("/runs", {"Host": "localhost"})[0] == 200  # served meanwhile
    time.sleep(2.5)
    for c in [*slow, silent]:
        c.settimeout(5)
        try:
            assert c.recv(100) == b""  # closed by the server
        except ConnectionResetError:
            pass
        c.close()
    assert open_server.get("/runs", {"Host": "localhost"})[0] == 200


def test_a_head_just_inside_the_deadline_is_served(open_server):
    c = socket.create_connection(("127.0.0.1", _port(open_server)))
    c.sendall(b"GET /healthz HTTP/1.1\r\n")
    time.sleep(0.5)
    c.sendall(b"Host: localhost\r\nConnection: close\r\n\r\n")
    c.settimeout(5)
    assert c.recv(100).startswith(b"HTTP/1.1 200")
    c.close()


@pytest.mark.parametrize("host,code", [("localhost", 200), ("127.0.0.1", 200), ("[::1]", 200),
                                       ("evil.example", 421), ("localhost.evil.example", 421)])
def test_the_token_less_default_answers_loopback_names_only(open_server, host, code):
    port = _port(open_server)
    assert open_server.get("/runs", {"Host": f"{host}:{port}"})[0] == code


def test_the_token_redirect_stays_on_the_site_and_the_log_keeps_no_token(token_server):
    for path, where in (("/%09/evil.example", "/evil.example"), ("//evil.example/x", "/evil.example/x"),
                        ("/%5C%5Cevil.example", "/evil.example"), ("/runs/r1", "/runs/r1")):
        code, headers, _ = token_server.get(f"{path}?token={TOKEN}")
        assert code == 303 and headers["location"] == where, (path, headers.get("location"))
        assert not headers["location"].startswith("//")
        assert "Secure" not in headers["set-cookie"]
    code, headers, _ = token_server.get(f"/runs?token={TOKEN}", {"X-Forwarded-Proto": "https"})
    assert code == 303 and "; Secure" in headers["set-cookie"] and "HttpOnly" in headers["set-cookie"]
    time.sleep(0.3)
    log = token_server.log.read_text()
    assert "token=[redacted]" in log and TOKEN not in log
    # with a token, any Host is answered (the token is the gate)
    assert token_server.get("/runs", {"Authorization": f"Bearer {TOKEN}", "Host": "memq.internal"})[0] == 200


@pytest.fixture(scope="module")
def capped_server(history, tmp_path_factory):
    s = _serve(history, tmp_path_factory.mktemp("capped"), MEMQ_SERVE_TOKEN="", MEMQ_SERVE_MAX_CONNECTIONS="20",
               MEMQ_SERVE_HEADER_TIMEOUT_S="60")
    yield s
    _stop(s)


def test_idle_connections_at_the_limit_cannot_lock_out_a_real_client(capped_server):
    """Round 5 (the connection limit turned against everyone else): MEMQ_SERVE_MAX_CONNECTIONS answers 503
    beyond it, so 20 connections that send nothing (re-opened each time the head timeout closes them)
    locked every other client out with far fewer sockets than the file limit took. Now a new connection at
    the limit closes the connection that has waited longest without a request in progress; a client that
    sends its request is served."""
    port = _port(capped_server)
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(25)]
    try:
        time.sleep(0.5)
        for _ in range(3):
            assert capped_server.get("/runs", {"Host": "localhost"})[0] == 200
        closed = 0
        for c in idle:
            c.settimeout(0.2)
            try:
                closed += c.recv(10) == b""
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed += 1
        assert closed >= 5  # the oldest idle ones went, the newest are still open
    finally:
        for c in idle:
            c.close()


def test_pages_asked_for_at_once_while_a_decode_caps_the_process_are_all_served(history):
    """Eight snapshot pages opened at once, one decoding under the process-wide address-space cap while the
    server had to start a thread for another request: "can't start new thread", a 500, and later requests
    hung. The server's threads are all made at its start and static files need none, so
    six pages asked for at once with 4 MiB of address space left (less than one thread's stack) are
    all served."""
    import json

    res = subprocess.run([sys.executable, "-m", "tests.web.cap_probe", str(4 * 1024**2)], cwd=ROOT,
                         env={**os.environ, **history.env}, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) == [200] * 6, res.stderr[-3000:]


def test_the_server_starts_all_its_threads_at_once():
    from memq.web.threads import BlockingPool

    pool = BlockingPool(5)
    assert not pool.idents
    pool.start()
    try:
        assert len(pool.idents) == 5
        import asyncio

        # Ten tasks later, still the same five threads: none started, none let go.
        async def idents():
            return {await pool.run(threading.get_ident) for _ in range(10)}

        assert asyncio.run(idents()) <= pool.idents
    finally:
        pool.close()


def test_static_files_come_from_memory_with_an_etag(open_server):
    code, headers, body = open_server.get("/static/memq.js")
    assert code == 200 and len(body) > 1000
    assert headers["content-type"].startswith("text/javascript") and headers["etag"]
    assert open_server.get("/static/memq.js", {"If-None-Match": headers["etag"]})[0] == 304
    assert open_server.get("/static/memq.js", {"If-None-Match": '"other"'})[0] == 200
    code, h2, body2 = open_server.get("/static/memq.css", method="HEAD")
    assert code == 200 and body2 == b"" and int(h2["content-length"]) > 100
    assert h2["content-type"].startswith("text/css")
    for missing in ("/static/nope.js", "/static/..", "/static/%2e%2e%2fapp.py", "/static/"):
        assert open_server.get(missing)[0] == 404, missing
