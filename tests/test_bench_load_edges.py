"""Edge cases of the bench load generator (module d3fleet.fleet.bench_load) that tests/test_bench_loadgen.py leaves
open, made exact: the HTTP client against a local server (headers, keep-alive, a closed connection, errors), the
passes and a whole target with a scripted client, and the throughput pass on a fake clock (requests, errors, rates,
a thread that fails or is still running), so no figure depends on the machine's speed."""

from __future__ import annotations

import http.client
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules import bench_load  # noqa: E402
from testkit import run_module  # noqa: E402

SEEN: list[dict[str, Any]] = []


class Handler(BaseHTTPRequestHandler):
    """Keep-alive; /close answers with Connection: close; /version/<kind> answers odd versions; echoes the rest."""

    protocol_version = "HTTP/1.1"

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        SEEN.append({"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body,
                     "port": self.client_address[1]})
        raw = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(raw)))
        if self.path == "/close":
            self.send_header("Connection", "Close")
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(autouse=True)
def clear() -> None:
    SEEN.clear()


# --------------------------------------------------------------------------------------------- the client
def test_client_parses_the_url() -> None:
    c = bench_load.Client("https://gpu-1.lan", 2.5, None)
    assert (c.https, c.host, c.port, c.timeout, c.conn) == (True, "gpu-1.lan", 443, 2.5, None)
    assert c.headers == {"Content-Type": "application/json", "Accept": "application/json"}
    c = bench_load.Client("http://[::1]:8001", 1.0, "k")
    assert (c.https, c.host, c.port) == (False, "::1", 8001)
    assert c.headers == {"Content-Type": "application/json", "Accept": "application/json", "Authorization": "Bearer k"}
    assert (bench_load.Client("http://h", 1.0, "").port, bench_load.Client("http:", 1.0, "").host) == (80, "127.0.0.1")
    assert "Authorization" not in bench_load.Client("http://h", 1.0, "").headers


def test_client_connection_class_is_cached_and_closed() -> None:
    c = bench_load.Client("https://gpu-1.lan:8443", 3.0, None)
    conn = c._connect()
    assert type(conn) is http.client.HTTPSConnection and (conn.host, conn.port, conn.timeout) == ("gpu-1.lan", 8443, 3.0)
    assert c._connect() is conn and c.conn is conn
    c.close()
    assert c.conn is None
    c.close()  # closing twice is fine
    plain = bench_load.Client("http://h:81", 4.0, None)._connect()
    assert type(plain) is http.client.HTTPConnection and (plain.host, plain.port, plain.timeout) == ("h", 81, 4.0)


def test_client_keeps_the_connection_alive_until_the_server_closes_it(server: str) -> None:
    c = bench_load.Client(server, 5.0, "sek")
    status, data, ms = c.call("POST", "/a", b'{"x": 1}')
    assert (status, json.loads(data)) == (200, {"path": "/a"}) and ms > 0
    first = c.conn
    assert c.call("GET", "/b")[0] == 200 and c.conn is first  # the same keep-alive connection
    assert SEEN[0]["port"] == SEEN[1]["port"]
    assert (SEEN[0]["method"], SEEN[0]["body"], SEEN[1]["method"], SEEN[1]["body"]) == ("POST", b'{"x": 1}', "GET", b"")
    assert SEEN[0]["headers"]["Authorization"] == "Bearer sek" and SEEN[0]["headers"]["Accept"] == "application/json"
    assert SEEN[0]["headers"]["Content-Type"] == "application/json"
    assert c.call("GET", "/close")[0] == 200 and c.conn is None  # "Connection: Close", in any case
    assert c.call("GET", "/c")[0] == 200 and SEEN[-1]["port"] != SEEN[0]["port"]
    c.close()


def test_client_reports_a_failed_request_and_reconnects() -> None:
    c = bench_load.Client("http://127.0.0.1:9", 2.0, None)
    status, data, ms = c.call("GET", "/health")
    assert (status, data) == (-1, b"ConnectionRefusedError: [Errno 111] Connection refused") and ms >= 0
    assert c.conn is None


class Ticks:
    """time for bench_load: perf_counter steps 0.25 s at each read."""

    def __init__(self) -> None:
        self.t = 100.0

    def perf_counter(self) -> float:
        self.t += 0.25
        return self.t


def test_client_times_each_request_in_ms(server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_load, "time", Ticks())
    c = bench_load.Client(server, 5.0, None)
    assert c.call("GET", "/a")[2] == 250.0
    c.close()
    assert bench_load.Client("http://127.0.0.1:9", 2.0, None).call("GET", "/")[2] == 250.0  # a failed one too


def test_encode_and_short_errors() -> None:
    assert bench_load.encode("m", {"state": "s", "questions": {}}) == b'{"model": "m", "state": "s", "questions": {}}'
    assert bench_load.short_error(500, b"engine dead") == "HTTP 500: engine dead"
    assert bench_load.short_error(502, b"x" * 300) == "HTTP 502: " + "x" * 200
    assert bench_load.short_error(400, b"\xff") == "HTTP 400: \ufffd"
    assert bench_load.short_error(-1, b"TimeoutError: " + b"t" * 300) == ("TimeoutError: " + "t" * 300)[:200]
    assert bench_load.short_error(-1, b"\xfe") == "\ufffd"


# --------------------------------------------------------------------------------------------- scripted client
class Scripted:
    """A Client whose answers are scripted per (method, path): a list of (status, body) used in turn (the last one
    repeats); every call and close recorded in CALLS."""

    SCRIPT: ClassVar[dict[tuple[str, str], list[tuple[int, bytes]]]] = {}
    CALLS: ClassVar[list[tuple[Any, ...]]] = []

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        self.url, self.timeout, self.api_key = url, timeout, api_key
        self.CALLS.append(("new", url, timeout, api_key))

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        self.CALLS.append((method, path, body))
        script = self.SCRIPT[(method, path)]
        status, data = script.pop(0) if len(script) > 1 else script[0]
        return status, data, 12.345

    def close(self) -> None:
        self.CALLS.append(("close", self.url))


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> type[Scripted]:
    Scripted.SCRIPT, Scripted.CALLS = {}, []
    monkeypatch.setattr(bench_load, "Client", Scripted)
    return Scripted


def test_probe_reads_the_version_only_when_healthy(scripted: type[Scripted]) -> None:
    client = scripted("u", 1.0, None)
    for version, expected in ((b'{"version": "0.9+sim"}', "0.9+sim"), (b'{"version": 7}', "7"), (b"{}", ""), (b"[1]", ""),
                              (b"not json", "")):
        scripted.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(200, version)]}
        assert bench_load.probe(client) == (200, expected)
    scripted.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(404, b'{"version": "x"}')]}
    assert bench_load.probe(client) == (200, "")
    scripted.SCRIPT = {("GET", "/health"): [(503, b"")]}
    scripted.CALLS.clear()
    assert bench_load.probe(client) == (503, "") and scripted.CALLS == [("GET", "/health", None)]


def test_accuracy_pass_records_each_case(scripted: type[Scripted]) -> None:
    scripted.SCRIPT = {("POST", "/p"): [(200, b'{"answers": {"a": 1}}'), (200, b"[]"), (200, b"{oops"), (500, b"dead"),
                                        (200, b'{"object": "x"}')]}
    cases = [{"id": n, "body": {"state": n}} for n in ("c1", "c2", "c3", "c4", "c5")]
    out = bench_load.accuracy_pass(scripted("u", 1.0, None), "/p", "m", cases)
    common = {"elapsed_ms": 12.3, "answers": None, "error": None}
    assert out == [
        {**common, "id": "c1", "status": 200, "answers": {"a": 1}},
        {**common, "id": "c2", "status": 200, "error": "the answer is not a JSON object"},
        {**common, "id": "c3", "status": 200, "error": "the answer is not a JSON object"},
        {**common, "id": "c4", "status": 500, "error": "HTTP 500: dead"},
        {**common, "id": "c5", "status": 200},
    ]
    assert scripted.CALLS[1:] == [("POST", "/p", f'{{"model": "m", "state": "{n}"}}'.encode()) for n in ("c1", "c2", "c3", "c4", "c5")]
    rec = bench_load.Recorder()
    scripted.SCRIPT = {("POST", "/p"): [(200, b'{"answers": {"a": 1}}'), (500, b"dead")]}
    bench_load.accuracy_pass(scripted("u", 1.0, None), "/p", "m", cases[:2], rec)
    assert [{k: v for k, v in r.items() if k not in ("sent", "received")} for r in rec.records] == [
        {"phase": "accuracy", "case": "c1", "answers": {"a": 1}, "ms": 12.35, "status": 200, "input_tokens": None},
        {"phase": "accuracy", "case": "c2", "answers": None, "ms": 12.35, "status": 500, "input_tokens": None,
         "error": "HTTP 500: dead"}]


def test_latency_pass_counts_errors_and_questions(scripted: type[Scripted]) -> None:
    scripted.SCRIPT = {("POST", "/p"): [(200, b""), (500, b""), (200, b""), (-1, b""), (200, b"")]}
    reqs = [{"label": "q2", "body": {"questions": {"a": 1, "b": 2}}}, {"label": "none", "body": {"state": "s"}}]
    out = bench_load.latency_pass(scripted("u", 1.0, None), "/p", "m", reqs, 2)
    assert out == {
        "q2": {"questions": 2, "samples_ms": [12.3], "errors": 1, "n": 1, "mean": 12.3, "min": 12.3, "p50": 12.3,
               "p95": 12.3, "p99": 12.3, "max": 12.3, "interval": NONE, "unsupported": ["p50", "p95", "p99"]},
        "none": {"questions": 0, "samples_ms": [12.3], "errors": 1, "n": 1, "mean": 12.3, "min": 12.3, "p50": 12.3,
                 "p95": 12.3, "p99": 12.3, "max": 12.3, "interval": NONE, "unsupported": ["p50", "p95", "p99"]},
    }
    assert bench_load.latency_pass(scripted("u", 1.0, None), "/p", "m", reqs[:1], 0)["q2"]["n"] == 0
    rec = bench_load.Recorder()
    scripted.SCRIPT = {("POST", "/p"): [(200, b""), (503, b"busy")]}
    bench_load.latency_pass(scripted("u", 1.0, None), "/p", "m", reqs[:1], 2, rec, run=3)
    assert [(r["phase"], r["label"], r["run"], r["status"], r.get("error")) for r in rec.records] == [
        ("latency", "q2", 3, 200, None), ("latency", "q2", 3, 503, "HTTP 503: busy")]
    bench_load.latency_pass(scripted("u", 1.0, None), "/p", "m", reqs[:1], 1, rec)
    assert rec.records[-1]["run"] == 1  # one run unless told


# --------------------------------------------------------------------------------------------- the throughput pass
class Clock:
    """time for bench_load: perf_counter is `now`, moved by the scripted calls; when `main_now` is set, the main
    thread reads it after its first read (the level's start), i.e. when it waits for the threads and times the level."""

    def __init__(self) -> None:
        self.now = 0.0
        self.main_now: float | None = None
        self.main_reads = 0
        self.slept: list[float] = []

    def time(self) -> float:  # the wall clock: epoch seconds, 1.7e9 at the fake clock's start
        return 1.7e9 + self.now

    def sleep(self, seconds: float) -> None:  # the level's threads start at once on the fake clock
        self.slept.append(round(seconds, 6))

    def perf_counter(self) -> float:
        if threading.current_thread() is threading.main_thread():
            self.main_reads += 1
            if self.main_now is not None and self.main_reads > 1:
                return self.main_now
        return self.now


class Timed(Scripted):
    """Each call takes `STEP` seconds of the fake clock and `MS` ms; a status -9 raises, -8 blocks until released."""

    CLOCK = Clock()
    STEP = 0.25
    HOLD = 10.0
    RELEASE = threading.Event()
    seen_threads: ClassVar[set[tuple[str, bool]]] = set()

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        status, data, _ = super().call(method, path, body)
        self.seen_threads.add((threading.current_thread().name, threading.current_thread().daemon))
        if status == -9:
            raise RuntimeError("boom")
        if status == -8:
            self.RELEASE.wait(self.HOLD)
        self.CLOCK.now += self.STEP
        return status, data, 10.0 * len(self.CALLS)


@pytest.fixture
def timed(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[Timed]]:
    Timed.SCRIPT, Timed.CALLS, Timed.CLOCK, Timed.STEP, Timed.HOLD, Timed.seen_threads = {}, [], Clock(), 0.25, 10.0, set()
    Timed.RELEASE.clear()
    monkeypatch.setattr(bench_load, "Client", Timed)
    monkeypatch.setattr(bench_load, "time", Timed.CLOCK)
    yield Timed
    Timed.RELEASE.set()
    for thread in threading.enumerate():  # a blocked load thread ends before the next test
        if thread.name.startswith("d3-bench-"):
            thread.join(5)


TARGET = {"name": "t", "url": "http://t", "model": "m", "api_key": "k"}
NONE = {"p50": None, "p95": None, "p99": None}  # no percentile interval: n too small


def test_a_level_runs_until_the_deadline(timed: type[Timed]) -> None:
    timed.SCRIPT = {("POST", "/p"): [(200, b""), (500, b"dead"), (200, b""), (-1, b"ConnectionResetError: x")]}
    timed.CLOCK.main_now = 1.30016  # when the main thread times the level
    row = bench_load.load_level(TARGET, "/p", b"{}", 1, 1.0, 0, 60.0)
    # calls at 0, .25, .5, .75 (each .25 s): the 4th ends at the deadline; the latencies are 20 and 40 ms
    assert row == {"requests": 4, "errors": 2, "error_examples": ["ConnectionResetError: x", "HTTP 500: dead"],
                   "elapsed_s": 1.3, "requests_per_s": 1.54, "_ok": 2, "n": 2, "mean": 30.0, "min": 20.0, "p50": 30.0,
                   "p95": 39.0, "p99": 39.8, "max": 40.0, "interval": NONE,
                   "unsupported": ["p50", "p95", "p99"]}
    assert timed.CALLS[0] == ("new", "http://t", 60.0, "k") and timed.CALLS[-1] == ("close", "http://t")
    assert timed.seen_threads == {("d3-bench-0", True)}


def test_a_level_stops_at_max_requests_and_keeps_three_error_examples(timed: type[Timed]) -> None:
    timed.STEP = 0.0  # the clock stands still: only max_requests ends the level
    timed.SCRIPT = {("POST", "/p"): [(500, b"e"), (501, b"d"), (500, b"e"), (502, b"c"), (503, b"b"), (200, b"")]}
    row = bench_load.load_level(TARGET, "/p", b"{}", 2, 1.0, 5, 60.0)
    assert sorted(timed.CLOCK.slept) == [0.0, 0.05]  # the starts spread over the level's first tenth
    assert (row["requests"], row["errors"], row["_ok"]) == (5, 5, 0)
    assert row["error_examples"] == ["HTTP 500: e", "HTTP 501: d", "HTTP 502: c"]
    assert (row["elapsed_s"], row["requests_per_s"], row["n"], row["p50"]) == (0.0, 0.0, 0, None)
    assert [c[0] for c in timed.CALLS].count("new") == 2 and [c[0] for c in timed.CALLS].count("close") == 2


def test_a_level_records_each_request_and_its_rate_under_a_second(timed: type[Timed]) -> None:
    timed.SCRIPT = {("POST", "/p"): [(200, b""), (500, b"dead")]}
    timed.CLOCK.main_now = 0.5  # the level took half a second
    rec = bench_load.Recorder()
    row = bench_load.load_level(TARGET, "/p", b"{}", 1, 0.5, 0, 60.0, rec)
    assert (row["requests"], row["_ok"], row["requests_per_s"]) == (2, 1, 2.0)
    assert [(r["phase"], r["concurrency"], r["status"]) for r in rec.records] == [("closed", 1, 200), ("closed", 1, 500)]


def test_a_failing_thread_is_an_error_not_a_silent_death(timed: type[Timed]) -> None:
    timed.SCRIPT = {("POST", "/p"): [(200, b""), (-9, b"")]}
    row = bench_load.load_level(TARGET, "/p", b"{}", 1, 1.0, 0, 60.0)
    assert (row["requests"], row["errors"], row["error_examples"]) == (2, 1, ["load thread failed: RuntimeError: boom"])
    assert timed.CALLS[-1] == ("close", "http://t")  # its connection closed all the same


def test_a_thread_still_running_after_the_deadline_is_an_error(timed: type[Timed]) -> None:
    timed.SCRIPT = {("POST", "/p"): [(-8, b"")]}
    timed.HOLD, timed.STEP = 0.3, 5.0  # each thread's one request takes 0.3 s (real), then its level is over
    timed.CLOCK.main_now = 1.0 + 2.5 + 5.0  # the main thread's clock: the deadline plus timeout plus 5 s have passed
    row = bench_load.load_level(TARGET, "/p", b"{}", 2, 1.0, 0, 2.5)
    assert (row["requests"], row["errors"], row["_ok"]) == (2, 2, 0)
    assert row["error_examples"] == ["load thread still running 2.5 s after the deadline"]
    assert (row["elapsed_s"], row["requests_per_s"]) == (8.5, 0.0)
    assert timed.seen_threads == {("d3-bench-0", True), ("d3-bench-1", True)}  # daemons: they never hold the exit


def test_threads_are_waited_for_until_the_deadline_plus_timeout_plus_5_s(timed: type[Timed]) -> None:
    timed.SCRIPT = {("POST", "/p"): [(-8, b"late")]}
    timed.HOLD, timed.STEP = 0.3, 5.0
    timed.CLOCK.main_now = 1.0 + 2.5 + 5.0 - 3.0  # 3 s (real) left to wait: the threads end within them
    row = bench_load.load_level(TARGET, "/p", b"{}", 2, 1.0, 0, 2.5)
    assert (row["requests"], row["errors"], row["error_examples"], row["elapsed_s"]) == (2, 2, ["HTTP -8: late"], 5.5)


# --------------------------------------------------------------------------------------------- a whole target
def params(**over: Any) -> dict[str, Any]:
    base = {"api_key": None, "timeout": 7.0, "path": "/p", "cases": [{"id": "c", "body": {"state": "s"}}],
            "latency_requests": [{"label": "q2", "body": {"questions": {"a": 1, "b": 1}}},
                                 {"label": "q4", "body": {"questions": {"a": 1, "b": 1, "c": 1, "d": 1}}}],
            "load_request": "q4", "warmup": 2, "samples": 1, "concurrency": [1, 2], "duration_s": 1.0, "max_requests": 0,
            "request_rates": [], "load_targets": [], "seed": 0, "slo_ms": 0.0, "metrics_path": "", "repeats": 1,
            "max_inflight": 256}
    return {**base, **over}


def test_a_target_in_four_steps(timed: type[Timed]) -> None:
    timed.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(200, b'{"version": "v"}')],
                    ("POST", "/p"): [(200, b'{"answers": {}}')]}
    out = bench_load.bench_target(params(api_key="global"), {"name": "n", "url": "http://u", "model": "m"})
    assert (out["name"], out["url"], out["model"], out["health"], out["version"]) == ("n", "http://u", "m", 200, "v")
    assert [c["status"] for c in out["cases"]] == [200] and list(out["latency"]) == ["q2", "q4"]
    q4 = b'{"model": "m", "questions": {"a": 1, "b": 1, "c": 1, "d": 1}}'
    calls = [c for c in timed.CALLS if c[0] != "new"]
    # health, version, the case, 2 warm-ups of q4, q2 and q4 once each, the client closed before the load
    assert calls[:8] == [("GET", "/health", None), ("GET", "/version", None), ("POST", "/p", b'{"model": "m", "state": "s"}'),
                         ("POST", "/p", q4), ("POST", "/p", q4), ("POST", "/p", b'{"model": "m", "questions": {"a": 1, "b": 1}}'),
                         ("POST", "/p", q4), ("close", "http://u")]
    assert all(c == ("POST", "/p", q4) or c[0] == "close" for c in calls[8:])
    # the target's client, then per level its warm-up's and one per load thread (1 + 1, 1 + 2), all with the global key
    assert [c for c in timed.CALLS if c[0] == "new"] == [("new", "http://u", 7.0, "global")] * 6
    one, two = out["throughput"]
    assert (one["concurrency"], one["questions"], two["concurrency"], two["questions"]) == (1, 4, 2, 4)
    assert "_ok" not in one and one["questions_per_s"] == round(one["requests_per_s"] * 4, 2) > 0


def test_a_target_key_wins_and_a_missing_load_request_skips_the_load(timed: type[Timed]) -> None:
    timed.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(200, b"{}")], ("POST", "/p"): [(200, b"{}")]}
    out = bench_load.bench_target(params(api_key="global", load_request="q8", warmup=3),
                                  {"name": "n", "url": "http://u", "model": "m", "api_key": "own"})
    assert out["throughput"] == [] and list(out["latency"]) == ["q2", "q4"]
    assert [c for c in timed.CALLS if c[0] == "new"] == [("new", "http://u", 7.0, "own")]
    assert len([c for c in timed.CALLS if c[0] == "POST"]) == 3 and timed.CALLS[-1] == ("close", "http://u")  # no warm-up


def test_questions_per_s_of_a_level_without_elapsed_time(timed: type[Timed]) -> None:
    timed.STEP = 0.0
    timed.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(200, b"{}")], ("POST", "/p"): [(200, b"{}")]}
    out = bench_load.bench_target(params(concurrency=[1], max_requests=3, warmup=0), {"name": "n", "url": "u", "model": "m"})
    assert [(t["requests"], t["elapsed_s"], t["requests_per_s"], t["questions_per_s"]) for t in out["throughput"]] == [(3, 0.0, 0.0, 0.0)]


def test_questions_per_s_is_rounded_to_2_places(timed: type[Timed], monkeypatch: pytest.MonkeyPatch) -> None:
    timed.SCRIPT = {("GET", "/health"): [(200, b"")], ("GET", "/version"): [(200, b"{}")], ("POST", "/p"): [(200, b"{}")]}
    monkeypatch.setattr(bench_load, "load_level", lambda *a: {"requests": 3, "errors": 1, "elapsed_s": 1.3, "_ok": 2,
                                                          "_recs": []})
    out = bench_load.bench_target(params(concurrency=[5]), {"name": "n", "url": "u", "model": "m"})
    # the level's own row counts what was sent; its rates come from the records inside its window (none here)
    assert out["throughput"] == [{"concurrency": 5, "questions": 4, "requests": 3, "errors": 1, "error_examples": [],
                                  "elapsed_s": 1.3, "requests_per_s": 0.0, "questions_per_s": 0.0, "good": None,
                                  "goodput_per_s": None, "input_tokens_per_s": None, "n": 0, "mean": None, "min": None,
                                  "p50": None, "p95": None, "p99": None, "max": None, "interval": NONE,
                                  "unsupported": ["p50", "p95", "p99"], "window": {"ramp_s": 0.2, "length_s": 0.8},
                                  "runs": [{"run": 1, "requests_per_s": 0.0, "goodput_per_s": None, "p50": None, "p95": None,
                                            "p99": None, "n": 0}], "run_level": None,
                                  "metrics": {}}]


def test_an_unhealthy_target_is_closed_and_skipped(timed: type[Timed]) -> None:
    timed.SCRIPT = {("GET", "/health"): [(-1, b"refused")]}
    out = bench_load.bench_target(params(), {"name": "n", "url": "http://u", "model": "m"})
    assert out == {"name": "n", "url": "http://u", "model": "m", "health": -1, "version": "", "cases": [], "latency": {},
                   "throughput": [], "rate": [], "records": []}
    assert timed.CALLS == [("new", "http://u", 7.0, None), ("GET", "/health", None), ("close", "http://u")]


# --------------------------------------------------------------------------------------------- the module
def test_module_defaults_and_the_marker_checked_after_the_last_target(capsys: pytest.CaptureFixture[str],
                                                                      timed: type[Timed], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    timed.SCRIPT = {("GET", "/health"): [(503, b"")]}
    marker = tmp_path / "marker"
    seen: list[dict[str, Any]] = []

    def bench(p: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
        seen.append(p)
        marker.write_text("")  # a rollout starts during the first target
        return {"name": target["name"]}

    monkeypatch.setattr(bench_load, "bench_target", bench)
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], refuse_if_exists=str(marker))
    assert out["failed"] is True and out["results"] == [{"name": "a"}]
    assert out["msg"] == (f"{marker} exists: a rollout is restarting this host (rollout.yml's marker, d3_state_rollout_marker); "
                          "bench refuses a host mid-rollout. Run it again when the rollout has finished.")
    (p,) = seen
    assert {k: p[k] for k in ("cases", "latency_requests", "load_request", "samples", "warmup", "concurrency", "duration_s",
                              "max_requests", "timeout", "api_key", "path")} == {
        "cases": [], "latency_requests": [], "load_request": "q4", "samples": 20, "warmup": 2, "concurrency": [1, 4, 16],
        "duration_s": 10.0, "max_requests": 0, "timeout": 60.0, "api_key": None, "path": "/v1/systemone"}


def test_module_stops_between_targets(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "marker"
    done: list[str] = []

    def bench(p: dict[str, Any], target: dict[str, Any]) -> dict[str, Any]:
        done.append(target["name"])
        marker.write_text("")
        return {"name": target["name"]}

    monkeypatch.setattr(bench_load, "bench_target", bench)
    targets = [{"name": n, "url": "u", "model": "m"} for n in ("a", "b")]
    out = run_module(bench_load, capsys, targets=targets, refuse_if_exists=str(marker))
    assert out["failed"] is True and done == ["a"] and out["results"] == [{"name": "a"}]
    marker.unlink()
    out = run_module(bench_load, capsys, targets=targets)  # no marker given: nothing checked
    assert out == {"changed": False, "results": [{"name": "a"}, {"name": "b"}], "invocation": out["invocation"]}


@pytest.mark.parametrize(
    "bad",
    [{"concurrency": [1, 0]}, {"samples": -1}, {"duration_s": 0}, {"duration_s": -1.0}, {"repeats": 0}, {"max_inflight": 0}],
)
def test_module_refuses_bad_settings(capsys: pytest.CaptureFixture[str], bad: dict[str, Any]) -> None:
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], **bad)
    conc = bad.get("concurrency", [1, 4, 16])
    assert out["failed"] is True
    assert out["msg"] == (f"concurrency levels must be >= 1 (got {conc}), request_rates > 0 (got []), samples >= 0, "
                          f"duration_s > 0, slo_ms >= 0, repeats >= 1 (got {bad.get('repeats', 1)}) and max_inflight >= 1 "
                          f"(got {bad.get('max_inflight', 256)})")


def test_module_accepts_the_edges_of_the_settings(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_load, "bench_target", lambda p, t: {"name": t["name"], "samples": p["samples"]})
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], concurrency=[1], samples=0,
                     duration_s=0.01, request_rates=[0.5], max_inflight=1)
    assert out["results"] == [{"name": "a", "samples": 0}] and "failed" not in out


def test_module_converts_its_numbers(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(bench_load, "bench_target", lambda p, t: seen.append(p) or {"name": t["name"]})
    run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], concurrency=["2", 3], samples="5",
               warmup="1", duration_s="2", max_requests="7", timeout="9", load_request="q2", path="/x", api_key="k",
               cases=[{"id": "c"}], latency_requests=[{"label": "q2"}])
    (p,) = seen
    got = {k: p[k] for k in ("concurrency", "samples", "warmup", "duration_s", "max_requests", "timeout", "load_request",
                             "path", "api_key", "cases", "latency_requests")}
    assert got == {"concurrency": [2, 3], "samples": 5, "warmup": 1, "duration_s": 2.0, "max_requests": 7, "timeout": 9.0,
                   "load_request": "q2", "path": "/x", "api_key": "k", "cases": [{"id": "c"}], "latency_requests": [{"label": "q2"}]}
    assert [type(p[k]) for k in ("samples", "duration_s", "timeout")] == [int, float, float]


def test_module_does_not_run_in_check_mode(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_load, "bench_target", lambda p, t: pytest.fail("benched in check mode"))
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], _ansible_check_mode=True)
    assert out["skipped"] is True and out["msg"] == "remote module (basic.py) does not support check mode"


def test_module_marker_is_a_path(capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "marker").write_text("")
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], refuse_if_exists="~/marker")
    assert out["failed"] is True and out["msg"].startswith(f"{tmp_path}/marker exists: ")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "missing required arguments: targets"),
        ({"targets": [{"name": "a", "url": "u", "model": "m"}], "cases": ["c1"]},
         "Elements value for option 'cases' is of type str and we were unable to convert to dict"),
        ({"targets": [{"name": "a", "url": "u", "model": "m"}], "latency_requests": ["q2"]},
         "Elements value for option 'latency_requests' is of type str and we were unable to convert to dict"),
    ],
)
def test_module_refuses_a_missing_target_list_and_requests_that_are_not_mappings(
    capsys: pytest.CaptureFixture[str], args: dict[str, Any], message: str
) -> None:
    out = run_module(bench_load, capsys, **args)
    assert out["failed"] is True and message in out["msg"], out["msg"]


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"url": "u", "model": "m"}, "missing required arguments: name found in targets"),
        ({"name": "a", "model": "m"}, "missing required arguments: url found in targets"),
        ({"name": "a", "url": "u"}, "missing required arguments: model found in targets"),
    ],
)
def test_module_targets_need_name_url_and_model(capsys: pytest.CaptureFixture[str], target: dict[str, Any], message: str) -> None:
    out = run_module(bench_load, capsys, targets=[target])
    assert out["failed"] is True and out["msg"] == message


def test_module_hides_both_api_keys(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench_load, "bench_target", lambda p, t: {"name": t["name"]})
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m", "api_key": "own-s3cret"}],
                     api_key="global-s3cret")
    text = json.dumps(out)
    assert "own-s3cret" not in text and "global-s3cret" not in text
    assert out["invocation"]["module_args"]["api_key"] == "VALUE_SPECIFIED_IN_NO_LOG_PARAMETER"


def test_module_defaults_and_conversions_of_the_load_options(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(bench_load, "bench_target", lambda p, t: seen.append(p) or {"name": t["name"]})
    target = [{"name": "a", "url": "u", "model": "m"}]
    run_module(bench_load, capsys, targets=target)
    run_module(bench_load, capsys, targets=target, request_rates=["8", 2], load_targets=[5, "b"], seed="3", slo_ms="250",
               metrics_path="")
    default, given = seen
    keys = ("request_rates", "load_targets", "seed", "slo_ms", "metrics_path")
    assert {k: default[k] for k in keys} == {"request_rates": [], "load_targets": [], "seed": 0, "slo_ms": 0.0,
                                             "metrics_path": "/metrics"}
    assert {k: given[k] for k in keys} == {"request_rates": [8.0, 2.0], "load_targets": ["5", "b"], "seed": 3, "slo_ms": 250.0,
                                           "metrics_path": ""}
    assert [type(x) for x in given["request_rates"]] == [float, float] and type(given["slo_ms"]) is float


@pytest.mark.parametrize("bad", [{"request_rates": [0]}, {"request_rates": [2, -1]}, {"slo_ms": -1}])
def test_module_refuses_bad_load_options(capsys: pytest.CaptureFixture[str], bad: dict[str, Any]) -> None:
    out = run_module(bench_load, capsys, targets=[{"name": "a", "url": "u", "model": "m"}], **bad)
    assert out["failed"] is True and out["msg"].startswith("concurrency levels must be >= 1")
    assert f"request_rates > 0 (got {[float(r) for r in bad.get('request_rates', [])]})" in out["msg"]
