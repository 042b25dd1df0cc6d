"""`memq serve` against hostile clients, over real sockets to a real served process:

- slow request heads (one header byte every half second) are closed after MEMQ_SERVE_HEADER_TIMEOUT_S,
  so they cannot hold every file descriptor (the server here runs under a 96-fd limit and is
  offered more slow connections than that: a normal client is served again once they are cut);
- the access log never records `?token=`;
- a Host outside MEMQ_SERVE_HOSTS gets 421 (DNS rebinding), /healthz answers any Host;
- the token redirect never leaves the site, whatever a percent-decoded path holds;
- the session cookie is `Secure` when the browser came over TLS (X-Forwarded-Proto from the
  trusted local proxy)."""

from __future__ import annotations

import resource
import socket
import threading
import time
import urllib.parse

import pytest

from tests.web.conftest import TOKEN, _start, _stop

HEAD_TIMEOUT = 2
FD_LIMIT = 96


def _low_fd_limit():
    resource.setrlimit(resource.RLIMIT_NOFILE, (FD_LIMIT, FD_LIMIT))


@pytest.fixture(scope="module")
def guarded(web_history, tmp_path_factory):
    s = _start(web_history, tmp_path_factory.mktemp("serve_guard"), TOKEN, log_level="info",
               env_extra={"MEMQ_SERVE_HEADER_TIMEOUT_S": str(HEAD_TIMEOUT)}, preexec_fn=_low_fd_limit)
    yield s
    _stop(s)


def _port(server) -> int:
    return urllib.parse.urlsplit(server.url).port


def test_slow_heads_are_closed_and_cannot_lock_out_other_clients(guarded):
    port = _port(guarded)
    socks: list[socket.socket] = []
    for _ in range(FD_LIMIT + 20):  # more than the server has descriptors for
        try:
            c = socket.create_connection(("127.0.0.1", port), timeout=2)
            c.sendall(b"GET /runs HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
            socks.append(c)
        except OSError:
            break
    stop = threading.Event()

    def dribble():  # one byte per connection every 0.5 s: never a whole head
        while not stop.is_set():
            for c in socks:
                try:
                    c.sendall(b"a")
                except OSError:
                    pass
            time.sleep(0.5)

    t = threading.Thread(target=dribble, daemon=True)
    t.start()
    try:
        # those past the fd limit wait in the listen backlog until the first ones are cut, then
        # get their own deadline: all are closed within a few timeouts
        open_ = list(socks)
        deadline = time.monotonic() + 3 * HEAD_TIMEOUT + 4
        while open_ and time.monotonic() < deadline:
            time.sleep(0.5)
            for c in list(open_):
                c.settimeout(0.05)
                try:
                    if c.recv(1) == b"":
                        open_.remove(c)
                except TimeoutError:
                    pass
                except OSError:
                    open_.remove(c)
        assert not open_, f"{len(open_)} of {len(socks)} slow connections still open"
        code, _, _ = guarded.get("/healthz", {"Authorization": f"Bearer {TOKEN}"})
        assert code == 200
    finally:
        stop.set()
        t.join(5)
        for c in socks:
            c.close()


def test_a_head_just_inside_the_timeout_is_served(guarded):
    c = socket.create_connection(("127.0.0.1", _port(guarded)), timeout=10)
    c.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    time.sleep(HEAD_TIMEOUT - 1)
    c.sendall(f"Authorization: Bearer {TOKEN}\r\n\r\n".encode())
    assert c.recv(64).startswith(b"HTTP/1.1 200")
    c.close()


def test_the_access_log_never_records_the_token(guarded):
    code, headers, _ = guarded.get(f"/runs?cluster=b&token={TOKEN}")
    assert code == 303
    time.sleep(0.3)
    log = guarded.log.read_text()
    assert "/runs?cluster=b&token=[redacted]" in log, log[-2000:]
    assert TOKEN not in log


@pytest.mark.parametrize("host,code", [
    ("evil.example", 421), ("evil.example:8080", 421), ("127.0.0.1.evil.example", 421), ("", 421),
    ("localhost", 200), ("LOCALHOST:8080", 200), ("127.0.0.1:1", 200), ("[::1]:8080", 200),
])
def test_only_the_listed_hosts_are_answered(guarded, host, code):
    got, _, body = guarded.get("/api/runs", {"Host": host, "Authorization": f"Bearer {TOKEN}"})
    assert got == code, body[:200]


def test_healthz_answers_any_host(guarded):
    assert guarded.get("/healthz", {"Host": "10.1.2.3:8080", "Authorization": f"Bearer {TOKEN}"})[0] == 200


def test_a_configured_host_list(web_history, tmp_path):
    s = _start(web_history, tmp_path, None, env_extra={"MEMQ_SERVE_HOSTS": "memq.example.org"})
    try:
        assert s.get("/api/runs", {"Host": "memq.example.org"})[0] == 200
        assert s.get("/api/runs", {"Host": "127.0.0.1"})[0] == 421
    finally:
        _stop(s)


@pytest.mark.parametrize("path", ["/%09/evil.example", "/%0a/evil.example", "/%0d%0a/evil.example",
                                  "/%20/evil.example", "/%5c/evil.example", "/%2f/evil.example",
                                  "/%E3%80%80/evil.example", "/%00/evil.example"])
def test_the_token_redirect_stays_on_the_site_after_decoding(guarded, path):
    code, headers, _ = guarded.get(f"{path}?token={TOKEN}")
    assert code == 303
    loc = headers["location"]
    # what a browser makes of it: tabs and newlines dropped, backslashes read as slashes
    seen = loc.replace("\t", "").replace("\n", "").replace("\r", "").replace("\\", "/").strip()
    assert seen.startswith("/") and not seen.startswith("//"), loc
    assert urllib.parse.urlsplit(seen).netloc == ""


def test_an_ordinary_path_keeps_its_place_in_the_redirect(guarded):
    code, headers, _ = guarded.get(f"/runs/a%20b?rank=1&token={TOKEN}")
    assert code == 303 and headers["location"] == "/runs/a%20b?rank=1"


@pytest.mark.parametrize("proto,secure", [("https", True), ("http", False)])
def test_the_cookie_is_secure_over_tls(guarded, proto, secure):
    code, headers, _ = guarded.get(f"/runs?token={TOKEN}", {"X-Forwarded-Proto": proto})
    assert code == 303
    assert ("; Secure" in headers["set-cookie"]) is secure, headers["set-cookie"]
