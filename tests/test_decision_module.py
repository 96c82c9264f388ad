"""Unit tests of the collection's decision module (collections/.../plugins/modules/decision.py) against a local
HTTP server: what it sends, what it returns, how it fails, and that the API key never shows."""

from __future__ import annotations

import importlib
import json
import ssl
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from local_http import QuietHandler, serve
from testkit import run_module

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/modules"))
sys.path.insert(0, str(ROOT / "collections"))  # the module's module_utils import (as Ansible ships it to the host)
decision = importlib.import_module("decision")
d3_http = importlib.import_module("ansible_collections.d3fleet.fleet.plugins.module_utils.d3_http")

SECRET = "s3cret-token-123"


class Handler(QuietHandler):
    """Echoes the request as JSON; a few paths answer otherwise."""

    def answer(self, body: bytes) -> tuple[int, bytes]:
        if self.path == "/denied":
            return 401, b'{"error": "Unauthorized"}'
        if self.path == "/empty":
            return 200, b""
        if self.path == "/notjson":
            return 200, b"ok \xff" + b"x" * 2500
        return 200, json.dumps({"method": self.command, "body": body.decode() if body else None,
                                "type": self.headers.get("Content-Type"), "auth": self.headers.get("Authorization")}).encode()


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    with serve(Handler) as url:
        yield url


def run(capsys: pytest.CaptureFixture[str], **args: Any) -> dict[str, Any]:
    return run_module(decision, capsys, **args)


class Clock:
    """time.perf_counter for the module: 10.0 when sending, 10.2345678 when the answer is read."""

    def __init__(self) -> None:
        self.ticks = iter([10.0, 10.2345678])

    def perf_counter(self) -> float:
        return next(self.ticks)


def test_post_sends_the_json_body_and_returns_the_answer(capsys: pytest.CaptureFixture[str], server: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d3_http, "time", Clock())
    out = run(capsys, url=f"{server}/v1/systemone", body={"questions": {"q": 1}})
    assert out["json"] == {"method": "POST", "body": '{"questions": {"q": 1}}', "type": "application/json", "auth": None}
    assert (out["status"], out["changed"], out["elapsed_ms"]) == (200, False, 234.6)
    assert out["content"] == json.dumps(out["json"])
    assert out["invocation"]["module_args"] == {"url": f"{server}/v1/systemone", "method": "POST", "body": {"questions": {"q": 1}},
                                                "api_key": None, "timeout": 120, "validate_certs": True}


def test_get_sends_no_body(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, url=f"{server}/health", method="GET", body={"ignored": True}, timeout="5")
    assert (out["json"]["method"], out["json"]["body"]) == ("GET", None)
    assert out["invocation"]["module_args"]["timeout"] == 5


def test_api_key_is_sent_as_bearer_and_never_shown(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, url=f"{server}/v1/models", method="GET", api_key=SECRET)
    assert SECRET not in json.dumps(out)
    assert out["json"]["auth"] == "Bearer ********"
    assert out["invocation"]["module_args"]["api_key"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_http_error_returns_its_status_and_answer(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, url=f"{server}/denied", method="GET")
    assert (out["status"], out["json"], out["content"]) == (401, {"error": "Unauthorized"}, '{"error": "Unauthorized"}')


def test_answers_that_are_not_json(capsys: pytest.CaptureFixture[str], server: str) -> None:
    empty = run(capsys, url=f"{server}/empty", method="GET")
    assert (empty["status"], empty["json"], empty["content"]) == (200, None, "")
    text = run(capsys, url=f"{server}/notjson", method="GET")
    assert text["json"] is None
    assert text["content"] == "ok \ufffd" + "x" * 1996


def test_connection_failure_is_status_minus_one(capsys: pytest.CaptureFixture[str]) -> None:
    out = run(capsys, url="http://127.0.0.1:9/v1/systemone", body={})
    assert (out["status"], out["json"], out["elapsed_ms"], out["changed"]) == (-1, None, None, False)
    assert "Connection refused" in out["content"]


def test_timeout_is_passed_to_the_request(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def urlopen(request: Any, timeout: float, context: Any = None) -> Any:
        seen.update(url=request.full_url, timeout=timeout, context=context)
        raise OSError("timed out")

    monkeypatch.setattr(d3_http.urllib.request, "urlopen", urlopen)
    out = run(capsys, url="http://127.0.0.1:9/x", method="GET", timeout=3)
    # certificates checked by default (urllib's default context)
    assert seen == {"url": "http://127.0.0.1:9/x", "timeout": 3, "context": None}
    assert (out["status"], out["content"]) == (-1, "timed out")
    run(capsys, url="https://127.0.0.1:9/x", validate_certs=False)
    assert seen["context"].verify_mode == ssl.CERT_NONE and seen["context"].check_hostname is False


def test_argument_checks(capsys: pytest.CaptureFixture[str]) -> None:
    missing = run(capsys)
    assert missing["failed"] is True
    assert missing["msg"] == "missing required arguments: url"
    wrong = run(capsys, url="http://127.0.0.1:9/", method="PUT")
    assert wrong["msg"] == "value of method must be one of: GET, POST, got: PUT"


def test_check_mode_still_sends_the_request(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, url=f"{server}/health", method="GET", _ansible_check_mode=True)
    assert (out["status"], out["json"]["method"]) == (200, "GET")
    assert "skipped" not in out
