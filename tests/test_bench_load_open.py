"""bench_load's issue-24 parts, exact and machine-independent: the per-request records (send and receive times,
input tokens, errors), Poisson arrivals (seeded, mean gap 1/rate), the open-loop level on a fake clock with a
scripted client (sent on schedule whatever the answers do, the lag, a request still unanswered, the in-flight cap),
the level figures (goodput against the objective, input tokens/s) and the /metrics sampler."""

from __future__ import annotations

import itertools
import statistics
import sys
import threading
from pathlib import Path
from typing import Any, ClassVar

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules import bench_load  # noqa: E402

ANSWER = b'{"answers": {}, "usage": {"input_tokens": 412, "output_tokens": 3}}'


class Clock:
    """perf_counter and time: `now` (+1.7e9 for the wall clock); sleep moves it (the dispatcher's schedule)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.lock = threading.Lock()

    def perf_counter(self) -> float:
        return self.now

    def time(self) -> float:
        return 1.7e9 + self.now

    def sleep(self, s: float) -> None:
        with self.lock:
            self.slept.append(round(s, 6))
            self.now += s


class Fake:
    """A client: POST answers (status, body, ms) from SCRIPT in turn (the last repeats); GET /metrics from PAGES."""

    SCRIPT: ClassVar[list[tuple[int, bytes, float]]] = []
    PAGES: ClassVar[list[str]] = []
    CALLS: ClassVar[list[tuple[Any, ...]]] = []
    HOLD: ClassVar[threading.Event | None] = None
    lock = threading.Lock()

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        self.timeout = timeout
        with self.lock:
            self.CALLS.append(("new", url, timeout, api_key))

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        with self.lock:
            self.CALLS.append((method, path))
            if path == "/metrics":
                return (200, self.PAGES.pop(0).encode(), 1.0) if self.PAGES else (404, b"", 1.0)
            status, data, ms = self.SCRIPT.pop(0) if len(self.SCRIPT) > 1 else self.SCRIPT[0]
        if status == -8 and self.HOLD is not None:
            self.HOLD.wait(2.0)
        if status == -9:
            raise RuntimeError("boom")
        return status, data, ms

    def close(self) -> None:
        with self.lock:
            self.CALLS.append(("close",))


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> tuple[type[Fake], Clock]:
    clock = Clock()
    Fake.SCRIPT, Fake.PAGES, Fake.CALLS, Fake.HOLD = [(200, ANSWER, 50.0)], [], [], None
    monkeypatch.setattr(bench_load, "Client", Fake)
    monkeypatch.setattr(bench_load, "time", clock)
    return Fake, clock


TARGET = {"name": "t", "url": "http://t", "model": "m", "api_key": "k"}


def test_input_tokens_of_an_answer() -> None:
    assert bench_load.input_tokens(ANSWER) == 412
    for bad in (b"not json", b"[]", b'{"usage": {"input_tokens": "412"}}', b'{"usage": {"input_tokens": true}}', b"{}"):
        assert bench_load.input_tokens(bad) is None, bad


def test_records_carry_send_and_receive_times(fake: tuple[type[Fake], Clock]) -> None:
    rec = bench_load.Recorder()
    ok = rec.add("latency", 200, ANSWER, 25.5, 1.7e9 + 1.25, label="q4")
    bad = rec.add("open", 500, b"engine dead", 3.0, 1.7e9, rate=8.0)
    assert ok == {"phase": "latency", "label": "q4", "sent": 1.7e9 + 1.25, "received": 1.7e9 + 1.2755, "ms": 25.5,
                  "status": 200, "input_tokens": 412}
    assert bad["error"] == "HTTP 500: engine dead" and bad["input_tokens"] is None and rec.records == [ok, bad]


def test_poisson_arrivals_are_seeded_and_average_the_rate() -> None:
    a = bench_load.arrivals(20.0, 50.0, 7)
    assert a == bench_load.arrivals(20.0, 50.0, 7) and a != bench_load.arrivals(20.0, 50.0, 8)
    assert a == sorted(a) and a[0] > 0 and a[-1] < 50.0
    gaps = [y - x for x, y in itertools.pairwise(a)]
    assert len(a) == pytest.approx(1000, rel=0.1) and statistics.mean(gaps) == pytest.approx(0.05, rel=0.1)
    assert statistics.stdev(gaps) == pytest.approx(0.05, rel=0.15)  # exponential: the spread equals the mean
    assert bench_load.arrivals(1.0, 0.0, 0) == []


def test_an_open_level_sends_on_schedule_whatever_the_answers(fake: tuple[type[Fake], Clock]) -> None:
    fk, clock = fake
    fk.SCRIPT = [(200, ANSWER, 40.0), (500, b"busy", 5.0), (200, ANSWER, 900.0)]
    rec = bench_load.Recorder()
    schedule = bench_load.arrivals(4.0, 2.0, 0)
    row = bench_load.rate_level(TARGET, "/p", b"{}", 4.0, 2.0, 60.0, 0, rec)
    assert [round(s, 6) for s in clock.slept] == [round(b - a, 6) for a, b in zip([0.0, *schedule], schedule, strict=False)]
    assert row["scheduled"] == len(schedule) == row["requests"] and row["offered_per_s"] == round(len(schedule) / 2.0, 2)
    assert row["errors"] == 1 and row["not_sent"] == 0 and row["error_examples"] == ["HTTP 500: busy"]
    assert row["rate"] == 4.0 and row["elapsed_s"] == 2.0 and row["lag_p99_ms"] == 0.0  # the level lasts its schedule
    assert row["n"] == len(schedule) - 1 and row["max"] == 900.0
    assert [r["phase"] for r in rec.records] == ["open"] * len(schedule)
    assert all(r["scheduled_s"] == pytest.approx(s, abs=1e-6) for r, s in zip(sorted(rec.records, key=lambda r: r["scheduled_s"]),
                                                                           schedule, strict=True))
    assert sorted(r["ms"] for r in row.pop("_recs") if r["status"] == 200)[-1] == 900.0
    assert next(c for c in fk.CALLS if c[0] == "new") == ("new", "http://t", 60.0, "k")


def test_an_open_level_counts_a_thread_failure_and_what_the_cap_did_not_send(fake: tuple[type[Fake], Clock]) -> None:
    fk, _ = fake
    fk.SCRIPT, fk.HOLD = [(-8, b"", 1.0)], threading.Event()
    rec = bench_load.Recorder()
    try:
        row = bench_load.rate_level(TARGET, "/p", b"{}", 50.0, 0.2, -6.0, 1, rec, max_inflight=2)  # no wait at all
    finally:
        fk.HOLD.set()
    assert row["not_sent"] == row["scheduled"] - 2 and row["errors"] == row["scheduled"] == row["requests"]
    assert "still unanswered after the timeout" in row["error_examples"]
    fk.SCRIPT, fk.HOLD = [(-9, b"", 1.0)], None
    row = bench_load.rate_level(TARGET, "/p", b"{}", 10.0, 0.5, 1.0, 2, bench_load.Recorder())
    assert row["errors"] == row["scheduled"] and row["error_examples"] == ["load thread failed: RuntimeError: boom"]


def test_level_figures_goodput_and_tokens() -> None:
    recs = [{"status": 200, "ms": 100.0, "input_tokens": 400}, {"status": 200, "ms": 300.0, "input_tokens": 412},
            {"status": 500, "ms": 1.0, "input_tokens": None}, {"status": 200, "ms": 250.0, "input_tokens": None}]
    assert bench_load.level_figures(recs, 2.0, 4, 250.0) == {
        "requests_per_s": 1.5, "questions_per_s": 6.0, "good": 2, "goodput_per_s": 1.0, "input_tokens_per_s": 406.0}
    assert bench_load.level_figures(recs, 3.0, 1, 0.0) == {
        "requests_per_s": 1.0, "questions_per_s": 1.0, "good": None, "goodput_per_s": None, "input_tokens_per_s": 270.67}
    none = bench_load.level_figures([{"status": 200, "ms": 1.0, "input_tokens": None}], 0.0, 4, 10.0)
    assert none == {"requests_per_s": 0.0, "questions_per_s": 0.0, "good": 1, "goodput_per_s": 0.0, "input_tokens_per_s": None}


def test_metrics_read_before_during_and_after(fake: tuple[type[Fake], Clock]) -> None:
    fk, clock = fake
    fk.PAGES = ["vllm:num_requests_waiting 0", "vllm:num_requests_waiting 7\nvllm:kv_cache_usage_perc 0.5", "x 1"]
    sampler = bench_load.Sampler(TARGET, 3.0, "/metrics", 5.0)
    out = sampler.finish()
    assert out["before"]["vllm:num_requests_waiting"] == 0.0
    assert out["during"]["vllm:num_requests_waiting"] == 7.0 and out["during"]["vllm:kv_cache_usage_perc"] == 0.5
    assert out["after"]["vllm:num_requests_waiting"] is None and clock.slept == [5.0]
    assert [c for c in fk.CALLS if c[0] == "GET"] == [("GET", "/metrics")] * 3
    assert bench_load.Sampler(TARGET, 3.0, "", 5.0).finish() == {} and bench_load.read_metrics(fk("u", 1, None), "/metrics") == {}  # 404
    assert bench_load.read_metrics(fk("u", 1, None), "") == {}


def test_a_target_runs_the_rates_on_the_load_targets_only(fake: tuple[type[Fake], Clock]) -> None:
    fk, _ = fake
    fk.SCRIPT = [(200, ANSWER, 10.0)]
    p = {"api_key": None, "timeout": 7.0, "path": "/p", "cases": [], "warmup": 0, "samples": 1, "load_request": "q4",
         "latency_requests": [{"label": "q4", "body": {"questions": {"a": 1, "b": 1, "c": 1, "d": 1}}}],
         "concurrency": [], "duration_s": 0.5, "max_requests": 0, "request_rates": [6.0], "load_targets": ["t"],
         "seed": 3, "slo_ms": 20.0, "metrics_path": ""}
    fk.SCRIPT = [(200, b"", 1.0), (200, b'{"version": "v"}', 1.0), (200, ANSWER, 10.0)]
    out = bench_load.bench_target(p, {"name": "t", "url": "u", "model": "m"})
    (rate,) = out["rate"]
    assert rate["rate"] == 6.0 and rate["questions"] == 4 and rate["metrics"] == {} and rate["good"] == rate["n"]
    assert rate["input_tokens_per_s"] == round(412 * rate["n"] / rate["elapsed_s"], 2)
    assert {r["phase"] for r in out["records"]} == {"latency", "open"}
    other = bench_load.bench_target({**p, "load_targets": ["x"]}, {"name": "t", "url": "u", "model": "m"})
    assert other["rate"] == [] and other["throughput"] == []
