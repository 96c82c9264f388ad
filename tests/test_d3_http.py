"""The collection's timed HTTP request (plugins/module_utils/d3_http.py, shared by the decision and smoke modules),
called directly: its defaults and the method it sends (the decision module's tests cover the rest through the
module)."""

from __future__ import annotations

import json
import ssl
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
from ansible_collections.d3fleet.fleet.plugins.module_utils import d3_http
from local_http import QuietHandler, serve


class Echo(QuietHandler):
    def answer(self, body: bytes) -> tuple[int, bytes]:
        return 200, json.dumps({"method": self.command, "body": body.decode() or None}).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve(Echo) as url:
        yield url


def test_by_default_a_post_of_the_json_body(server: str) -> None:
    out = d3_http.send(f"{server}/v1/systemone", body={"q": 1})
    assert (out["status"], out["json"]) == (200, {"method": "POST", "body": '{"q": 1}'})


def test_another_method_is_sent_as_named_without_a_body(server: str) -> None:
    out = d3_http.send(f"{server}/x", method="PUT", body={"ignored": True})
    assert (out["status"], out["json"]) == (200, {"method": "PUT", "body": None})


def test_the_default_timeout_is_120_s(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def urlopen(request: Any, timeout: float, context: Any = None) -> Any:
        seen.update(method=request.get_method(), timeout=timeout)
        raise OSError("no network in this test")

    monkeypatch.setattr(d3_http.urllib.request, "urlopen", urlopen)
    assert d3_http.send("http://127.0.0.1:9/x")["status"] == -1
    assert seen == {"method": "POST", "timeout": 120}


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Echo server behind TLS, its certificate self-signed for the name "router" (not 127.0.0.1): what a router
    asking itself over loopback meets."""
    tmp = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=router",
                    "-addext", "subjectAltName=DNS:router", "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "cert.pem")],
                   check=True, capture_output=True)  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    with serve(Echo, context) as url:
        yield url.replace("http://", "https://")


def test_an_https_certificate_is_checked_unless_told_not_to(tls_server: str) -> None:
    checked = d3_http.send(f"{tls_server}/v1/systemone", body={"q": 1})
    assert checked["status"] == -1 and "CERTIFICATE_VERIFY_FAILED" in checked["content"], checked
    out = d3_http.send(f"{tls_server}/v1/systemone", body={"q": 1}, validate_certs=False)
    assert (out["status"], out["json"]) == (200, {"method": "POST", "body": '{"q": 1}'})
