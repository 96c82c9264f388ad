"""keepalived's check of a router (roles/d3_router/files/d3-router-check), run as keepalived runs it (the script with
its URL and a timeout of 2 s; its shebang's -IS) against local servers: 0 for HAProxy's 200 and 503 of /health, 1 for
any other status, a closed port, a server that never answers within the timeout, an answer that is not HTTP, and a
URL that is not http(s). Its answers against real HAProxy 2.6 and 3.0 are the loopback contract's
(tests/contracts/haproxy/loopback/health_frontend.py)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import ClassVar

import pytest
from local_http import QuietHandler, serve

CHECK = Path(__file__).resolve().parents[1] / "roles/d3_router/files/d3-router-check"


@pytest.fixture(scope="module", autouse=True)
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The check installed as the role does (mode 0755, run through its own shebang: /usr/bin/python3 -IS, the
    interpreter argument the kernel passes as one word), in a directory of its own: nothing written beside the role's
    file."""
    path = tmp_path_factory.mktemp("libexec") / "d3-router-check"
    shutil.copy(CHECK, path)
    path.chmod(0o755)
    INSTALLED.append(path)
    yield
    INSTALLED.clear()


INSTALLED: list[Path] = []


def check(url: str, timeout: str | None = "2", *, limit: float = 10) -> int:
    """The check's exit status; it says nothing (keepalived logs only the status), whatever it met."""
    argv = [str(INSTALLED[0]), url] + ([timeout] if timeout is not None else [])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=limit, check=False)
    assert proc.stdout == proc.stderr == "", proc.stderr
    return proc.returncode


class Health(QuietHandler):
    """Answers ``status`` and records each request's path and Host header."""

    status = 200
    seen: ClassVar[list[tuple[str, str]]] = []

    def answer(self, body: bytes) -> tuple[int, bytes]:
        self.seen.append((self.path, self.headers.get("Host", "")))
        return self.status, b"ok"


@pytest.mark.parametrize(("status", "code"), [(200, 0), (503, 0), (500, 1), (404, 1), (302, 1)])
def test_haproxys_own_answers_pass_and_others_fail(status: int, code: int) -> None:
    Health.status, Health.seen = status, []
    with serve(Health) as url:
        assert check(f"{url}/health") == code
        port = url.rsplit(":", 1)[1]
    assert Health.seen == [("/health", f"127.0.0.1:{port}")]


def test_the_path_defaults_to_the_root_and_keeps_its_query() -> None:
    Health.status, Health.seen = 200, []
    with serve(Health) as url:
        assert check(url) == 0
        assert check(f"{url}/health?x=1") == 0
    assert [path for path, _ in Health.seen] == ["/", "/health?x=1"]


@contextmanager
def raw_server(talk: Callable[[socket.socket, threading.Event], None], host: str = "127.0.0.1") -> Iterator[int]:
    """A TCP server on a free port of ``host`` for one connection: it reads the request, then ``talk(conn, done)``
    answers (``done`` is set when the test is over); yields the port."""
    listener = socket.create_server((host, 0), family=socket.AF_INET6 if ":" in host else socket.AF_INET)
    done = threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        with conn:
            talk(conn, done)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(timeout=10)
        listener.close()


def replying(reply: bytes) -> Callable[[socket.socket, threading.Event], None]:
    def talk(conn: socket.socket, _done: threading.Event) -> None:
        conn.recv(4096)
        conn.sendall(reply)

    return talk


@pytest.mark.parametrize("reply", [b"", b"SSH-2.0-OpenSSH_9.2\r\n", b"HTTP/1.1 0200 OK\r\n\r\n", b"HTTP/1.1\r\n\r\n",
                                   b"hello 200\r\n\r\n"])  # fmt: skip
def test_an_answer_that_is_not_an_http_status_fails(reply: bytes) -> None:
    with raw_server(replying(reply)) as port:
        assert check(f"http://127.0.0.1:{port}/health") == 1


def test_a_status_line_split_over_two_packets_passes() -> None:
    def talk(conn: socket.socket, _done: threading.Event) -> None:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.0 5")
        conn.sendall(b"03 Service Unavailable\r\n\r\n")

    with raw_server(talk) as port:
        assert check(f"http://127.0.0.1:{port}/health") == 0


def test_no_answer_within_the_timeout_fails() -> None:
    def silent(conn: socket.socket, done: threading.Event) -> None:
        conn.recv(4096)
        done.wait(60)

    with raw_server(silent) as port:
        assert check(f"http://127.0.0.1:{port}/health", "0.5") == 1


def test_a_closed_port_fails() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
    assert check(f"http://127.0.0.1:{port}/health") == 1


@pytest.mark.parametrize("url", ["ftp://127.0.0.1/health", "127.0.0.1:8406/health", "http://:8406/health",
                                 "http://127.0.0.1:84x6/health", "http://[::1/health", "http://127.0.0.1:-1/health",
                                 "http://127.0.0.1:0/health", "http://127.0.0.1:65536/health"])  # fmt: skip
def test_a_url_that_is_not_http_fails(url: str) -> None:
    assert check(url) == 1


def test_the_url_without_a_port_or_a_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ beside the installed copy
    loader = importlib.machinery.SourceFileLoader("d3_router_check", str(INSTALLED[0]))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    assert module.target("http://router") == ("http", "router", 80, "/")
    assert module.target("https://router/health") == ("https", "router", 443, "/health")
    assert module.target("http://[::1]:8406/health") == ("http", "::1", 8406, "/health")
    assert module.target("http://[::1]/health") == ("http", "::1", 80, "/health")
    for bad in ("http://[::1/health", "http://[::1]x/health", "http://[::1]:x/health"):
        with pytest.raises(ValueError):
            module.target(bad)


def test_an_ipv6_loopback_url_is_asked_at_its_address() -> None:
    got: list[bytes] = []

    def talk(conn: socket.socket, _done: threading.Event) -> None:
        got.append(conn.recv(4096))
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")

    try:
        socket.create_server(("::1", 0), family=socket.AF_INET6).close()
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with raw_server(talk, "::1") as port:
        assert check(f"http://[::1]:{port}/health") == 0
    assert got and got[0].startswith(b"GET /health HTTP/1.0\r\n") and f"Host: [::1]:{port}\r\n".encode() in got[0]


def test_https_is_asked_without_checking_the_certificate(tmp_path: Path) -> None:
    """The certificate names the router's public name, not 127.0.0.1: the check over loopback does not verify it."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=router",
                    "-addext", "subjectAltName=DNS:router", "-keyout", str(tmp_path / "key.pem"), "-out", str(tmp_path / "cert.pem")],
                   check=True, capture_output=True)  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    names: list[str | None] = []
    context.sni_callback = lambda _sock, name, _ctx: names.append(name)
    Health.status, Health.seen = 503, []
    with serve(Health, tls=context) as url:
        assert check(url.replace("http://", "https://") + "/health") == 0
        assert check(url + "/health") == 1  # plain http to a TLS port: no status line
        assert check(url.replace("http://127.0.0.1", "https://localhost") + "/health") == 0
    assert [path for path, _ in Health.seen] == ["/health", "/health"]
    assert names == [None, "localhost"]  # the server's name when the URL has one (SNI: a router's certificate by name)


def test_a_server_that_dribbles_is_given_up_at_the_timeout_in_all() -> None:
    """One byte every 0.3 s and never a line end: each read gets an answer within its own timeout, so only one
    deadline for the whole check ends it (keepalived kills a check after its own 3 s: a timed-out line in its log)."""

    def dribble(conn: socket.socket, done: threading.Event) -> None:
        conn.recv(4096)
        while not done.wait(0.3):
            try:
                conn.sendall(b"H")
            except OSError:
                return

    with raw_server(dribble) as port:
        assert check(f"http://127.0.0.1:{port}/health", "1", limit=5) == 1


@pytest.mark.parametrize(("timeout", "code"), [("x", 1), ("", 1), ("nan", 1), ("inf", 0), ("1e300", 0)])
def test_a_bad_timeout_fails_quietly_and_a_huge_one_is_capped(timeout: str, code: int) -> None:
    Health.status = 200
    with serve(Health) as url:
        assert check(f"{url}/health", timeout) == code


def test_no_url_fails_quietly() -> None:
    proc = subprocess.run([str(INSTALLED[0])], capture_output=True, text=True, timeout=10, check=False)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "", "")
