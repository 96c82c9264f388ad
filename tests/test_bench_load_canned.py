"""bench_load's parts that only real threads, sockets and the real clock show: the generator-limit probe's canned
server answering a real HTTP client (status, headers, body length, keep-alive, a POST without a body) and shut down
after, even while a client still holds a connection; the open loop's in-flight cap freeing a slot at once (the
dispatcher polls every millisecond), its join deadline and its daemon threads; the /metrics sampler's bounded wait
for its halfway read. Every wait here is bounded and the margins are wide (a loaded 2-core host)."""

from __future__ import annotations

import http.client
import socket
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules import bench_load  # noqa: E402

ANSWER = b'{"answers": {}, "usage": {"input_tokens": 412}}'


# --------------------------------------------------------------------------------------------- the canned server
def _ask(conn: http.client.HTTPConnection, body: bytes) -> tuple[int, int, str | None, bytes]:
    conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    return resp.version, resp.status, resp.getheader("Content-Length"), resp.read()


def test_the_canned_server_answers_a_real_client_and_is_shut_down_after(monkeypatch: pytest.MonkeyPatch) -> None:
    """While the probe runs, a real client asks the canned server: HTTP/1.1, 200, Content-Length the body's length,
    two requests with bodies on one keep-alive connection (the first body read whole, not taken for the next
    request), a POST without Content-Length (no body: RFC 9112 section 6.3) answered at once. A client that still
    holds an idle keep-alive connection does not keep generator_limit from returning (daemon handler threads), and
    after it returns the port is closed. The probe itself answered every request, with the run's in-flight cap."""
    real = bench_load.rate_level
    seen: dict[str, Any] = {}
    linger: list[socket.socket] = []

    def probe(target: dict, path: str, payload: bytes, rate: float, duration_s: float, timeout: float, seed: int,
              rec: bench_load.Recorder, max_inflight: int = 256) -> dict:
        url = urllib.parse.urlsplit(target["url"])
        seen["host"], seen["port"] = url.hostname, url.port
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=3.0)
        seen["answers"] = [_ask(conn, b'{"model": "m", "questions": {"a": 1}}')]
        first = conn.sock
        seen["answers"].append(_ask(conn, b"x" * 5000))
        seen["same_socket"] = first is not None and conn.sock is first
        conn.close()
        raw = socket.create_connection((url.hostname, url.port), timeout=3.0)
        raw.sendall(b"POST / HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while not got.endswith(bench_load.CANNED):
            more = raw.recv(4096)
            if not more:
                break
            got += more
        seen["raw"] = got
        linger.append(raw)  # left open, idle: its handler thread waits for a next request
        seen["row"] = real(target, path, payload, rate, duration_s, timeout, seed, rec, max_inflight)
        return seen["row"]

    monkeypatch.setattr(bench_load, "rate_level", probe)
    done: list[dict] = []
    worker = threading.Thread(target=lambda: done.append(bench_load.generator_limit(10.0, 0.5, 3)), daemon=True)
    worker.start()
    worker.join(10.0)
    try:
        assert done, "generator_limit did not return while a client held a connection open"
    finally:
        for s in linger:
            s.close()
    (limit,) = done
    canned = bench_load.CANNED
    assert seen["host"] == "127.0.0.1"
    assert seen["answers"] == [(11, 200, str(len(canned)), canned)] * 2 and seen["same_socket"]
    head, _, body = seen["raw"].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and f"content-length: {len(canned)}".encode() in head.lower() and body == canned
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    assert low <= seen["port"] <= high  # an ephemeral port the kernel chose, never a fixed one
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", seen["port"]), timeout=3.0).close()
    row = seen["row"]
    assert row["errors"] == 0 and row["requests"] == row["scheduled"] > 0 and row["max_inflight"] == 3
    assert limit == {"probe_rate": 10.0, "sent_per_s": row["sent_per_s"], "lag_p50_ms": row["lag"]["p50"],
                     "at_least": row["sent_per_s"] >= 0.95 * row["offered_per_s"]}


def test_the_limit_is_at_least_the_probe_rate_from_95_percent_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    rows = iter([{"sent_per_s": 95.0, "offered_per_s": 100.0, "lag": {"p50": 0.25}},
                 {"sent_per_s": 94.99, "offered_per_s": 100.0, "lag": {"p50": 3.5}}])
    monkeypatch.setattr(bench_load, "rate_level", lambda *a, **k: next(rows))
    assert bench_load.generator_limit(100.0, 0.1, 8) == {"probe_rate": 100.0, "sent_per_s": 95.0, "lag_p50_ms": 0.25,
                                                         "at_least": True}
    assert bench_load.generator_limit(100.0, 0.1, 8)["at_least"] is False


# --------------------------------------------------------------------------------------------- the open loop
class Held:
    """A client whose POSTs answer 200 after HOLDS[i] real seconds (the i-th request sent; 0 when not listed),
    released early by RELEASE."""

    HOLDS: ClassVar[list[float]] = []
    RELEASE = threading.Event()
    lock = threading.Lock()
    sent = 0

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        pass

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        with self.lock:
            n, Held.sent = Held.sent, Held.sent + 1
        hold = self.HOLDS[n] if n < len(self.HOLDS) else 0.0
        start = time.perf_counter()
        if hold:
            self.RELEASE.wait(hold)
        return 200, ANSWER, (time.perf_counter() - start) * 1000.0

    def close(self) -> None:
        pass


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Any:
    Held.HOLDS, Held.sent = [], 0
    Held.RELEASE.clear()
    monkeypatch.setattr(bench_load, "Client", Held)
    yield Held
    Held.RELEASE.set()


def test_a_slot_freed_is_used_at_once_and_a_full_cap_holds_the_next(held: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """One slot. Due at 0, 50 ms, 400 ms, 450 ms; the first answer takes 300 ms, the third 500 ms. The second waits
    for the slot and goes out as soon as the first answer frees it (about 250 ms late: the dispatcher polls every
    millisecond, not every second); the third goes out on time; the fourth finds the slot taken until after the
    schedule's end (600 ms) and is not sent."""
    held.HOLDS = [0.3, 0.0, 0.5]
    monkeypatch.setattr(bench_load, "arrivals", lambda rate, duration_s, seed: [0.0, 0.05, 0.4, 0.45])
    rec = bench_load.Recorder()
    row = bench_load.rate_level({"url": "http://t"}, "/p", b"{}", 7.0, 0.6, 5.0, 0, rec, max_inflight=1)
    assert (row["scheduled"], row["requests"], row["not_sent"], row["errors"]) == (4, 4, 1, 1)
    lags = {r["scheduled_s"]: r["lag_ms"] for r in rec.records if not r.get("not_sent")}
    assert set(lags) == {0.0, 0.05, 0.4}
    assert 200.0 <= lags[0.05] <= 500.0 and lags[0.4] < 250.0  # the third on time (its slot free)
    assert [r["scheduled_s"] for r in rec.records if r.get("not_sent")] == [0.45]


def test_an_open_level_waits_for_its_answers_until_the_schedule_plus_timeout_plus_5_s(held: Any,
                                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """timeout -4 s: the level waits for answers until its schedule's end (0.5 s) + timeout + 5 s = 1.5 s. An answer
    after 0.8 s is waited for (and the level lasts until it); one that takes 3 s is not: the level ends at 1.5 s with
    it counted as unanswered, its thread a daemon (it never holds the module's exit)."""
    monkeypatch.setattr(bench_load, "arrivals", lambda rate, duration_s, seed: [0.01])
    held.HOLDS = [0.8]
    row = bench_load.rate_level({"url": "http://t"}, "/p", b"{}", 2.0, 0.5, -4.0, 0, bench_load.Recorder())
    assert (row["requests"], row["errors"], row["n"]) == (1, 0, 1) and 0.75 <= row["elapsed_s"] < 1.45
    held.HOLDS, held.sent = [3.0], 0
    before = set(threading.enumerate())
    row = bench_load.rate_level({"url": "http://t"}, "/p", b"{}", 2.0, 0.5, -4.0, 0, bench_load.Recorder())
    stuck = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert (row["requests"], row["errors"], row["error_examples"]) == (1, 1, ["still unanswered after the timeout"])
    assert 1.4 <= row["elapsed_s"] < 2.2
    assert stuck and all(t.daemon for t in stuck)


# --------------------------------------------------------------------------------------------- the sampler
class SlowMetrics:
    """/metrics: at once from the main thread, after `DELAY` real seconds (or RELEASE) from any other."""

    DELAY = 0.0
    RELEASE = threading.Event()

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        pass

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        if threading.current_thread() is not threading.main_thread():
            self.RELEASE.wait(self.DELAY)
        return 200, b"vllm:num_requests_waiting 3\n", 1.0

    def close(self) -> None:
        pass


def test_the_halfway_read_is_waited_for_at_most_timeout_plus_5_s(monkeypatch: pytest.MonkeyPatch) -> None:
    """timeout -4.8 s: finish() waits for the halfway read at most timeout + 5 s = 0.2 s. A read due now that takes
    50 ms is in the figures; one that takes 3 s is not, finish() returns after about 0.2 s, and the thread still
    reading is a daemon."""
    monkeypatch.setattr(bench_load, "Client", SlowMetrics)
    SlowMetrics.RELEASE.clear()
    try:
        SlowMetrics.DELAY = 0.05
        out = bench_load.Sampler({"url": "http://t"}, -4.8, "/metrics", time.perf_counter()).finish()
        assert [k for k in out] == ["before", "during", "after"] and out["during"]["vllm:num_requests_waiting"] == 3.0
        SlowMetrics.DELAY = 3.0
        before = set(threading.enumerate())
        start = time.perf_counter()
        sampler = bench_load.Sampler({"url": "http://t"}, -4.8, "/metrics", time.perf_counter())
        out = sampler.finish()
        waited = time.perf_counter() - start
        stuck = [t for t in threading.enumerate() if t not in before and t.is_alive()]
        assert "during" not in out and [k for k in out] == ["before", "after"] and 0.15 <= waited < 0.9
        assert stuck and all(t.daemon for t in stuck)
    finally:
        SlowMetrics.RELEASE.set()
