"""Unit tests of the bench load generator (module d3fleet.fleet.bench_load) against a local HTTP server: what it
sends (model, body, bearer key), what it records (answers, latencies, errors per concurrency level), how it
refuses a host mid-rollout, and that an API key never shows in its output."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules import bench_load  # noqa: E402
from testkit import run_module  # noqa: E402

SECRET = "bench-s3cret-key"
SEEN: list[dict[str, Any]] = []
LOCK = threading.Lock()
STATE = {"in_flight": 0, "max_in_flight": 0}


class Handler(BaseHTTPRequestHandler):
    """A D3-shaped server: answers every question `noul` 0.75 after `delay` ms (from the state), 500 for the
    model "broken", 401 without the key when the path is /keyed/..."""

    protocol_version = "HTTP/1.1"

    def _send(self, status: int, obj: Any) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(raw)))
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._send(200, {})
        elif self.path == "/version":
            self._send(200, {"version": "9.9.9+test"})
        else:
            self._send(404, {})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with LOCK:
            SEEN.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            STATE["in_flight"] += 1
            STATE["max_in_flight"] = max(STATE["max_in_flight"], STATE["in_flight"])
        try:
            time.sleep(float(body["state"].get("delay_ms", 0)) / 1000 if isinstance(body["state"], dict) else 0)
            if body["model"] == "broken":
                self._send(500, {"error": {"message": "engine dead"}})
            elif self.path.startswith("/keyed") and self.headers.get("Authorization") != f"Bearer {SECRET}":
                self._send(401, {"error": "Unauthorized"})
            else:
                self._send(200, {"object": "structured_decision", "answers": {
                    q: {"type": "noul", "noul": 0.75, "probabilities": {"yes": 0.75, "no": 0.25}} for q in body["questions"]}})
        finally:
            with LOCK:
                STATE["in_flight"] -= 1

    def log_message(self, *args: Any) -> None:
        pass


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def reset() -> None:
    SEEN.clear()
    STATE["max_in_flight"] = 0


Q = {"type": "noul", "instructions": "Yes?"}


def args(url: str, **over: Any) -> dict[str, Any]:
    base = {
        "targets": [{"name": "inst", "url": url, "model": "m"}],
        "cases": [{"id": "c1", "body": {"state": {"t": "x"}, "questions": {"a": Q}}},
                  {"id": "c2", "body": {"state": "y", "questions": {"a": Q, "b": Q}, "instructions": "be brief"}}],
        "latency_requests": [{"label": "q2", "body": {"state": {"delay_ms": 5}, "questions": {"a": Q, "b": Q}}},
                             {"label": "q4", "body": {"state": {"delay_ms": 20}, "questions": {k: Q for k in "abcd"}}}],
        "samples": 4, "warmup": 1, "concurrency": [1, 4], "duration_s": 0.4,
    }
    return {**base, **over}


def run(capsys: pytest.CaptureFixture[str], **module_args: Any) -> dict[str, Any]:
    return run_module(bench_load, capsys, **module_args)


def test_records_answers_latencies_and_throughput(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server))
    assert out["changed"] is False
    (res,) = out["results"]
    assert (res["name"], res["health"], res["version"]) == ("inst", 200, "9.9.9+test")
    assert [c["id"] for c in res["cases"]] == ["c1", "c2"] and all(c["status"] == 200 for c in res["cases"])
    assert set(res["cases"][1]["answers"]) == {"a", "b"} and res["cases"][1]["answers"]["a"]["noul"] == 0.75
    bodies = [s["body"] for s in SEEN if "instructions" in s["body"]]
    assert bodies == [{"model": "m", "state": "y", "questions": {"a": Q, "b": Q}, "instructions": "be brief"}]
    for label, floor in (("q2", 5), ("q4", 20)):
        lat = res["latency"][label]
        assert lat["n"] == 4 and len(lat["samples_ms"]) == 4 and lat["errors"] == 0
        assert floor <= lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["max"]
    assert res["latency"]["q4"]["questions"] == 4
    levels = res["throughput"]
    assert [t["concurrency"] for t in levels] == [1, 4]
    one, four = levels
    assert one["errors"] == four["errors"] == 0 and one["requests"] >= 5
    assert four["requests_per_s"] > 2.5 * one["requests_per_s"]  # 4 in flight: ~4x the requests of 1
    assert four["questions_per_s"] == pytest.approx(four["requests_per_s"] * 4, rel=0.01)
    assert STATE["max_in_flight"] == 4
    assert all(s["auth"] is None for s in SEEN)


def test_max_requests_caps_a_level(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server, samples=0, warmup=0, concurrency=[4], duration_s=5.0, max_requests=6, cases=[]))
    (level,) = out["results"][0]["throughput"]
    assert level["requests"] == 6 and level["elapsed_s"] < 2


def test_errors_are_counted_per_level(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server, targets=[{"name": "b", "url": server, "model": "broken"}], samples=2))
    res = out["results"][0]
    assert res["cases"][0]["status"] == 500 and "engine dead" in res["cases"][0]["error"] and res["cases"][0]["answers"] is None
    assert res["latency"]["q2"]["errors"] == 2 and res["latency"]["q2"]["p50"] is None
    for level in res["throughput"]:
        assert level["errors"] == level["requests"] > 0 and level["requests_per_s"] == 0
        assert level["error_examples"] and level["error_examples"][0].startswith("HTTP 500")


def test_unhealthy_target_is_reported_and_skipped(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server, targets=[{"name": "gone", "url": "http://127.0.0.1:9", "model": "m"},
                                              {"name": "inst", "url": server, "model": "m"}]))
    gone, ok = out["results"]
    assert (gone["health"], gone["cases"], gone["throughput"]) == (-1, [], [])
    assert ok["health"] == 200 and ok["throughput"]


def test_api_key_is_sent_and_never_shown(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server + "/keyed", api_key=SECRET, path="/keyed/v1/systemone", concurrency=[2], samples=1))
    res = out["results"][0]
    assert all(c["status"] == 200 for c in res["cases"]) and res["throughput"][0]["errors"] == 0
    assert SEEN and all(s["auth"] == f"Bearer {SECRET}" for s in SEEN)
    assert SECRET not in json.dumps(out)
    # a target's own key wins over the global one
    SEEN.clear()
    own = [{"name": "inst", "url": server, "model": "m", "api_key": SECRET}]
    out = run(capsys, **args(server, targets=own, api_key="other", path="/keyed/v1/systemone", concurrency=[1], samples=1))
    assert out["results"][0]["throughput"][0]["errors"] == 0 and SECRET not in json.dumps(out)


def test_refuses_a_host_mid_rollout_naming_the_marker(capsys: pytest.CaptureFixture[str], server: str, tmp_path: Path) -> None:
    marker = tmp_path / "rollout-in-progress"
    marker.write_text("")
    out = run(capsys, **args(server, refuse_if_exists=str(marker)))
    assert out["failed"] is True and str(marker) in out["msg"] and "mid-rollout" in out["msg"]
    assert SEEN == []
    marker.unlink()
    assert run(capsys, **args(server, refuse_if_exists=str(marker), concurrency=[1], samples=1)).get("failed") is None


def test_bad_settings_are_refused(capsys: pytest.CaptureFixture[str], server: str) -> None:
    out = run(capsys, **args(server, concurrency=[0]))
    assert out["failed"] is True and "concurrency levels must be >= 1" in out["msg"]
