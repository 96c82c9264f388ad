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
    BODIES: ClassVar[list[bytes | None]] = []  # the POSTs' bodies, in turn
    HOLD: ClassVar[threading.Event | None] = None
    lock = threading.Lock()

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        self.timeout = timeout
        with self.lock:
            self.CALLS.append(("new", url, timeout, api_key))

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        with self.lock:
            self.CALLS.append((method, path))
            if method == "POST":
                self.BODIES.append(body)
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
    Fake.SCRIPT, Fake.PAGES, Fake.CALLS, Fake.BODIES, Fake.HOLD = [(200, ANSWER, 50.0)], [], [], [], None
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
    # sent and received to the microsecond, ms to 0.01; an error's body is not an answer: no tokens counted
    fine = rec.add("open", 503, ANSWER, 25.5678, 1.7e9 + 1.2345678)
    assert (fine["sent"], fine["received"], fine["ms"], fine["input_tokens"]) == (1700000001.234568, 1700000001.260136,
                                                                                  25.57, None)


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
    assert row["max_inflight"] == 256  # the module's default cap
    assert row["n"] == len(schedule) - 1 and row["max"] == 900.0
    assert [r["phase"] for r in rec.records] == ["open"] * len(schedule) and {r["rate"] for r in rec.records} == {4.0}
    assert sorted(r["scheduled_s"] for r in rec.records) == [round(s, 6) for s in schedule]
    assert [c for c in fk.CALLS if c[0] not in ("new", "close")] == [("POST", "/p")] * len(schedule)
    assert len(fk.BODIES) == len(schedule) and set(fk.BODIES) == {b"{}"}
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
    assert all(r["ms"] == 0.0 and r["ms_from_schedule"] == r["lag_ms"] for r in row["_recs"])  # no latency of its own


def test_level_figures_goodput_and_tokens() -> None:
    recs = [{"status": 200, "ms": 100.0, "input_tokens": 400}, {"status": 200, "ms": 300.0, "input_tokens": 412},
            {"status": 500, "ms": 1.0, "input_tokens": None}, {"status": 200, "ms": 250.0, "input_tokens": None}]
    assert bench_load.level_figures(recs, 2.0, 4, 250.0) == {
        "requests_per_s": 1.5, "questions_per_s": 6.0, "good": 2, "goodput_per_s": 1.0, "input_tokens_per_s": 406.0}
    assert bench_load.level_figures(recs, 3.0, 1, 0.0) == {
        "requests_per_s": 1.0, "questions_per_s": 1.0, "good": None, "goodput_per_s": None, "input_tokens_per_s": 270.67}
    none = bench_load.level_figures([{"status": 200, "ms": 1.0, "input_tokens": None}], 0.0, 4, 10.0)
    assert none == {"requests_per_s": 0.0, "questions_per_s": 0.0, "good": 1, "goodput_per_s": 0.0, "input_tokens_per_s": None}
    sub_ms = [{"status": 200, "ms": 0.4, "input_tokens": None}, {"status": 200, "ms": 0.6, "input_tokens": None}]
    assert bench_load.level_figures(sub_ms, 1.0, 1, 0.5)["good"] == 1  # an objective under 1 ms is an objective
    assert bench_load.level_figures(sub_ms, 1.0, 1, 0.5)["goodput_per_s"] == 1.0


def test_metrics_read_before_during_and_after(fake: tuple[type[Fake], Clock]) -> None:
    fk, clock = fake
    fk.PAGES = ["vllm:num_requests_waiting 0", "vllm:num_requests_waiting 7\nvllm:kv_cache_usage_perc 0.5", "x 1"]
    sampler = bench_load.Sampler(TARGET, 3.0, "/metrics", 5.0)
    out = sampler.finish()
    assert out["before"]["vllm:num_requests_waiting"] == 0.0
    assert out["during"]["vllm:num_requests_waiting"] == 7.0 and out["during"]["vllm:kv_cache_usage_perc"] == 0.5
    assert out["after"]["vllm:num_requests_waiting"] is None and clock.slept == [5.0]
    assert [c for c in fk.CALLS if c[0] == "GET"] == [("GET", "/metrics")] * 3
    # two connections (before/after, halfway), each with the target's URL, the request timeout and its API key
    assert [c for c in fk.CALLS if c[0] == "new"] == [("new", "http://t", 3.0, "k")] * 2
    assert bench_load.Sampler(TARGET, 3.0, "", 5.0).finish() == {} and bench_load.read_metrics(fk("u", 1, None), "/metrics") == {}  # 404
    assert bench_load.read_metrics(fk("u", 1, None), "") == {}


def test_a_target_runs_the_rates_on_the_load_targets_only(fake: tuple[type[Fake], Clock]) -> None:
    fk, _ = fake
    fk.SCRIPT = [(200, ANSWER, 10.0)]
    p = {"api_key": None, "timeout": 7.0, "path": "/p", "cases": [], "warmup": 0, "samples": 1, "load_request": "q4",
         "latency_requests": [{"label": "q4", "body": {"questions": {"a": 1, "b": 1, "c": 1, "d": 1}}}],
         "concurrency": [], "duration_s": 0.5, "max_requests": 0, "request_rates": [6.0], "load_targets": ["t"],
         "seed": 3, "slo_ms": 20.0, "metrics_path": "", "repeats": 1, "max_inflight": 256}
    fk.SCRIPT = [(200, b"", 1.0), (200, b'{"version": "v"}', 1.0), (200, ANSWER, 10.0)]
    out = bench_load.bench_target(p, {"name": "t", "url": "u", "model": "m"})
    (rate,) = out["rate"]
    assert rate["rate"] == 6.0 and rate["questions"] == 4 and rate["metrics"] == {} and rate["good"] == rate["n"]
    counted = [r for r in out["records"] if r.get("window") == "in"]  # scheduled after the ramp, answered in time
    assert rate["window"] == {"ramp_s": 0.05, "length_s": 0.45} and counted
    assert rate["input_tokens_per_s"] == round(412 * len(counted) / 0.45, 2)
    assert {r["phase"] for r in out["records"]} == {"latency", "open"}
    other = bench_load.bench_target({**p, "load_targets": ["x"]}, {"name": "t", "url": "u", "model": "m"})
    assert other["rate"] == [] and other["throughput"] == []


# --------------------------------------------------------------------------------------------- issue 34: the schedule
def test_a_full_cap_makes_requests_late_and_the_lag_counts_from_the_schedule(fake: tuple[type[Fake], Clock]) -> None:
    """One slot, every answer held: the first goes out on time, the next ones wait (their lag grows) until the
    schedule ends, then the rest are not sent - recorded with their intended time and no send time."""
    fk, clock = fake
    fk.SCRIPT, fk.HOLD = [(-8, b"", 1.0)], threading.Event()
    rec = bench_load.Recorder()
    schedule = bench_load.arrivals(20.0, 0.5, 4)
    try:
        row = bench_load.rate_level(TARGET, "/p", b"{}", 20.0, 0.5, 0.0, 4, rec, max_inflight=1)
    finally:
        fk.HOLD.set()
    unsent = [r for r in rec.records if r.get("not_sent")]
    assert row["not_sent"] == len(unsent) == len(schedule) - 1 and row["sent_per_s"] == 2.0 and row["max_inflight"] == 1
    assert [r["scheduled_s"] for r in unsent] == [round(s, 6) for s in schedule[1:]]
    assert unsent[0] == {"phase": "open", "rate": 20.0, "scheduled_s": round(schedule[1], 6), "sent": None, "received": None,
                         "ms": None, "status": None, "input_tokens": None, "not_sent": True,
                         "error": "not sent: 1 requests were in flight until the schedule ended"}
    assert all(r["sent"] is None and r["status"] is None and r["ms"] is None for r in unsent)
    assert unsent[0]["error"] == "not sent: 1 requests were in flight until the schedule ended"
    assert f"{len(unsent)} not sent" in row["error_examples"]
    assert clock.now >= 0.5  # the dispatcher waited for a slot until the schedule's end


def test_latency_from_the_schedule_adds_the_lag(fake: tuple[type[Fake], Clock], monkeypatch: pytest.MonkeyPatch) -> None:
    fk, clock = fake
    fk.SCRIPT = [(200, ANSWER, 50.0)]
    real_sleep = clock.sleep

    def late(s: float) -> None:  # the dispatcher wakes 30 ms after each due time (a busy generator)
        real_sleep(s + 0.03)

    monkeypatch.setattr(clock, "sleep", late)
    rec = bench_load.Recorder()
    row = bench_load.rate_level(TARGET, "/p", b"{}", 5.0, 2.0, 60.0, 0, rec)
    lags = [r["lag_ms"] for r in sorted(rec.records, key=lambda r: r["scheduled_s"])]
    assert lags[0] == pytest.approx(30.0) and min(lags) >= 30.0 - 1e-6  # never earlier than due + 30 ms
    assert all(r["ms_from_schedule"] == pytest.approx(r["lag_ms"] + 50.0) for r in rec.records)
    assert row["p50"] == 50.0 and row["from_schedule"]["p50"] > 50.0 and row["lag"]["n"] == len(lags)
    assert row["sent_per_s"] == row["offered_per_s"] == 3.0  # all sent within the schedule's 2 s


def test_a_generator_too_slow_for_its_schedule_reaches_less_than_offered(fake: tuple[type[Fake], Clock],
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each dispatch costs 100 ms of the clock (a slow generator) against gaps of 10 ms: every request goes out, but
    over about ten times the schedule's length - the rate sent is over the sending time, the level not driven."""
    fk, clock = fake
    fk.SCRIPT = [(200, ANSWER, 5.0)]
    real_sleep = clock.sleep
    monkeypatch.setattr(clock, "sleep", lambda s: real_sleep(s + 0.1))
    row = bench_load.rate_level(TARGET, "/p", b"{}", 100.0, 0.5, 60.0, 0, bench_load.Recorder())
    assert row["not_sent"] == 0 and row["sent_per_s"] == pytest.approx(10.0, rel=0.05) and row["offered_per_s"] > 80
    assert bench_load.driven(row, None)[0] is False


def test_driven_or_not() -> None:
    """Driven: 95 % of the offered rate sent, and the p99 lag under max(1 ms, 5 % of the mean gap): 5 ms at 10/s,
    6.25 ms at 8/s, the 1 ms floor from 50/s (0.5 ms would be 5 % at 100/s). Both sides of each bound."""
    base = {"rate": 10.0, "offered_per_s": 10.0, "sent_per_s": 10.0, "lag": {"p50": 1.0, "p99": 4.99}, "p50": 100.0}
    assert bench_load.driven(base, None) == (True, "")
    assert bench_load.driven({**base, "lag": {"p99": None}}, None) == (True, "")  # nothing sent: the rate decides
    assert bench_load.driven({**base, "sent_per_s": 9.5}, None) == (True, "")  # 95 % is enough
    assert bench_load.driven({**base, "sent_per_s": 9.4}, None) == (False, "the generator sent 9.4/s of 10/s offered")
    limit = {"sent_per_s": 800.0}
    assert bench_load.driven({**base, "sent_per_s": 9.4}, limit) == (
        False, "the generator sent 9.4/s of 10/s offered; the generator's own limit, measured in this run: 800/s")
    assert bench_load.driven({**base, "lag": {"p99": 5.0}}, limit) == (
        False, "the generator's p99 lag 5 ms is not under max(1 ms, 5 % of the mean gap) = 5 ms; the generator's own "
               "limit, measured in this run: 800/s")
    # a median lag far below the latency no longer makes a level driven: the old rule let 99 ms of lag pass here
    assert bench_load.driven({**base, "lag": {"p50": 99.0, "p99": 99.0}}, None)[0] is False
    fast = {**base, "rate": 100.0, "offered_per_s": 100.0, "sent_per_s": 100.0}
    assert bench_load.driven({**fast, "lag": {"p99": 0.99}}, None) == (True, "")
    assert bench_load.driven({**fast, "lag": {"p99": 1.0}}, None)[0] is False
    assert [bench_load.lag_bound_ms(r) for r in (8.0, 10.0, 20.0, 50.0, 100.0, 1000.0)] == [6.25, 5.0, 2.5, 1.0, 1.0, 1.0]


def test_requests_never_sent_are_censored_in_the_latency_from_the_schedule() -> None:
    """The window [10, 20] s of an open loop due at 10: eight answers from the schedule (100..800 ms) and two requests
    never sent, due at 19 and 19.5 s, so they waited at least 1000 and 500 ms by the window's end. n = 10; p50
    (ranks 5 and 6: 500 observed, 500 censored) and p99 (ranks 9 and 10: 800, 1000 censored: 982) reach them and are
    lower bounds; without the censoring p99 would be 793 ms, below a request still waiting at 1000."""
    recs = [{"sent": 10.0 + i, "received": 10.0 + i + 0.1 * i, "status": 200, "ms": 50.0, "ms_from_schedule": 100.0 * i,
             "scheduled_s": float(i), "input_tokens": None} for i in range(1, 9)]
    recs += [{"sent": None, "received": None, "status": None, "ms": None, "scheduled_s": at, "not_sent": True}
             for at in (9.0, 9.5)]
    recs += [{"sent": None, "received": None, "status": None, "ms": None, "scheduled_s": 0.5, "not_sent": True}]  # ramp
    out = bench_load.window_figures(recs, 11.0, 20.0, 4, 300.0, "ms_from_schedule", due=10.0)
    assert (out["n"], out["censored"], out["p50"], out["p99"]) == (10, 2, 500.0, 982.0)
    assert out["lower_bound"] == ["mean", "p50", "p95", "p99", "max"] and out["min"] == 100.0
    assert [r["window"] for r in recs[-3:]] == ["in", "in", "ramp"]
    assert (out["requests_per_s"], out["good"]) == (round(8 / 9.0, 2), 3)  # the rates: answers only
    assert bench_load.summary([100.0 * i for i in range(1, 9)])["p99"] == 793.0  # what leaving them out said
    send = bench_load.window_figures(recs, 11.0, 20.0, 4, 300.0, "ms", due=10.0)
    assert send["n"] == 8 and "censored" not in send  # latency from the send: of what was sent


def test_an_open_level_s_schedule_figures_carry_the_censored(fake: tuple[type[Fake], Clock]) -> None:
    """One slot held for the whole level: the first request out, the rest never sent; from the schedule they are
    censored at the schedule's end and every percentile is a lower bound, in rate_level's and open_levels' figures."""
    fk, _ = fake
    fk.SCRIPT, fk.HOLD = [(-8, b"", 1.0)], threading.Event()
    try:
        row = bench_load.rate_level(TARGET, "/p", b"{}", 20.0, 0.5, 0.0, 4, bench_load.Recorder(), max_inflight=1)
    finally:
        fk.HOLD.set()
    schedule = bench_load.arrivals(20.0, 0.5, 4)
    # the never sent, and the one sent that failed (censored at the schedule's end like them, or its time spent if
    # longer: the third review's item 5; the second's item 8 censored it at its time spent alone)
    assert row["from_schedule"]["censored"] == row["not_sent"] + 1 == len(schedule)
    failed = next(r for r in row["_recs"] if r.get("status") == -8)
    assert failed["scheduled_s"] == round(schedule[0], 6) and failed["ms_from_schedule"] < (0.5 - schedule[1]) * 1000.0
    assert row["from_schedule"]["max"] == round((0.5 - failed["scheduled_s"]) * 1000.0, 1)
    assert row["from_schedule"]["n"] == len(schedule) and "p50" in row["from_schedule"]["lower_bound"]
    assert sum(1 for r in row["_recs"] if r.get("not_sent")) == row["not_sent"]


def test_the_generator_limit_is_measured_against_a_canned_local_server() -> None:
    # real threads and sockets on 127.0.0.1, a rate any machine keeps up with (a gap of 100 ms)
    limit = bench_load.generator_limit(10.0, 0.5, 256)
    assert limit["probe_rate"] == 10.0 and limit["at_least"] is True and limit["sent_per_s"] > 0
    assert limit["lag_p50_ms"] is not None and limit["lag_p50_ms"] < 100.0
    busy = bench_load.generator_limit(5000.0, 0.2, 1)  # one in flight: far below 5000/s
    assert busy["at_least"] is False and 0 < busy["sent_per_s"] < 0.95 * 5000.0


def test_window_marks_ramp_in_and_drain() -> None:
    recs = [{"sent": 0.5, "received": 0.6, "status": 200, "ms": 100.0, "input_tokens": 4},  # ramp
            {"sent": 1.0, "received": 1.2, "status": 200, "ms": 200.0, "input_tokens": 4},  # in
            {"sent": 2.5, "received": 3.5, "status": 200, "ms": 1000.0, "input_tokens": 4},  # drain: latency only
            {"sent": 2.0, "received": 2.1, "status": 500, "ms": 1.0, "input_tokens": None},  # an error inside
            {"sent": None, "received": None, "status": None, "ms": None, "not_sent": True}]  # never sent
    out = bench_load.window_figures(recs, 1.0, 3.0, 4, 300.0)  # no schedule (due): a never-sent record has no window
    assert [r.get("window") for r in recs] == ["ramp", "in", "drain", "in", None]
    assert (out["window_s"], out["requests_per_s"], out["good"], out["input_tokens_per_s"]) == (2.0, 0.5, 1, 2.0)
    assert (out["n"], out["min"], out["max"]) == (2, 200.0, 1000.0)  # the drained answer's latency counts
    # by intended time: the open loop's request belongs to the window it was due in, however late it went out
    late = [{"sent": 1.5, "received": 1.6, "status": 200, "ms": 5.0, "ms_from_schedule": 900.0, "scheduled_s": 0.2,
             "input_tokens": None}]
    out = bench_load.window_figures(late, 1.0, 3.0, 4, 300.0, "ms_from_schedule", due=0.5)
    assert late[0]["window"] == "ramp" and out["n"] == 0
    out = bench_load.window_figures(late, 0.6, 3.0, 4, 300.0, "ms_from_schedule", due=0.5)
    assert late[0]["window"] == "in" and out["max"] == 900.0 and out["good"] == 0


def test_runs_are_pooled_and_kept() -> None:
    one = {"q4": {"questions": 4, "samples_ms": [10.0, 12.0], "errors": 2, "n": 2, "p50": 11.0, "p95": 11.9, "p99": 12.0,
                  "mean": 11.0}}
    two = {"q4": {"questions": 4, "samples_ms": [20.0], "errors": 1, "n": 1, "p50": 20.0, "mean": 20.0}}
    out = bench_load.pool_runs([one, two])["q4"]
    assert out["samples_ms"] == [10.0, 12.0, 20.0] and out["errors"] == 3 and out["n"] == 3 and out["p50"] == 12.0
    assert out["runs"] == [{"run": 1, "n": 2, "p50": 11.0, "p95": 11.9, "p99": 12.0, "mean": 11.0, "errors": 2},
                           {"run": 2, "n": 1, "p50": 20.0, "p95": None, "p99": None, "mean": 20.0, "errors": 1}]
    # 2 and 1 samples a run: too few for any percentile's run-level interval (p50 needs 6 a run)
    assert out["run_level"] == {"k": 2, "p50": None, "p95": None, "p99": None, "interval": {"p50": None, "p95": None, "p99": None}}
    assert bench_load.pool_runs([]) == {} and bench_load.pool_runs([one])["q4"]["run_level"] is None


def test_run_level_interval_over_the_runs() -> None:
    """Three runs of 72 samples: p50 and p95 have every run's n they need (6, 72), p99 (368) does not; each gets the
    mean of the runs' percentiles and its t interval over the 3 runs (scipy.stats.t.interval(0.95, 2, loc=mean,
    scale=sd / sqrt(3))); the table prints it 'over 3 runs' instead of the pooled order-statistic interval."""
    runs = [{"n": 72, "p50": 100.0, "p95": 150.0, "p99": 170.0}, {"n": 72, "p50": 110.0, "p95": 160.0, "p99": 180.0},
            {"n": 80, "p50": 105.0, "p95": 155.0, "p99": 175.0}]
    out = bench_load.run_level(runs)
    half = 4.302652729749464 * 5.0 / 3**0.5  # t(0.975, 2) x sd 5 / sqrt(3)
    assert out == {"k": 3, "p50": 105.0, "p95": 155.0, "p99": None,
                   "interval": {"p50": [round(105 - half, 1), round(105 + half, 1)],
                                "p95": [round(155 - half, 1), round(155 + half, 1)], "p99": None}}
    assert bench_load.run_level(runs[:1]) is None
    odd = bench_load.run_level([{**runs[0], "p50": 100.0}, {**runs[1], "p50": 110.0}, {**runs[2], "p50": 105.4}])
    assert odd["p50"] == 105.1 and odd["interval"]["p50"][0] == round(odd["interval"]["p50"][0], 1)  # 0.1 ms
    assert bench_load.run_level([{**runs[0], "p50": None}, runs[1]])["interval"]["p50"] is None
    from ansible_collections.d3fleet.fleet.plugins.filter import d3_bench

    fig = {"n": 216, "p50": 104.0, "p95": 157.0, "p99": 178.0, "interval": {"p50": [101.0, 108.0], "p95": [152.0, 162.0]},
           "run_level": out}
    assert d3_bench._pct(fig, "p50") == "105 [93-117 over 3 runs]" and d3_bench._pct(fig, "p95") == "155 [143-167 over 3 runs]"
    assert d3_bench._pct(fig, "p99") == "(n too small)" and d3_bench._pct({**fig, "run_level": None}, "p50") == "104 [101-108]"
    assert d3_bench._pct({"n": 6, "p50": 5.0}, "p50") == "5" and d3_bench._pct({"n": 5, "p50": 5.0}, "p50") == "(n too small)"


def test_repeats_interleave_the_levels_and_keep_each_run(fake: tuple[type[Fake], Clock], monkeypatch: pytest.MonkeyPatch) -> None:
    fk, _ = fake
    order: list[int] = []

    def level(target: dict, path: str, payload: bytes, c: int, *rest: Any) -> dict:
        order.append(c)
        return {"requests": 1, "errors": 0, "error_examples": [], "elapsed_s": 1.0, "_ok": 1, "_recs": []}

    monkeypatch.setattr(bench_load, "load_level", level)
    fk.SCRIPT = [(200, b"", 1.0), (200, b'{"version": "v"}', 1.0), (200, ANSWER, 10.0)]
    p = {"api_key": None, "timeout": 7.0, "path": "/p", "cases": [], "warmup": 1, "samples": 3, "load_request": "q4",
         "latency_requests": [{"label": "q4", "body": {"questions": {"a": 1, "b": 1, "c": 1, "d": 1}}}],
         "concurrency": [1, 4], "duration_s": 1.0, "max_requests": 0, "request_rates": [], "load_targets": [],
         "seed": 0, "slo_ms": 0.0, "metrics_path": "", "repeats": 3, "max_inflight": 256}
    out = bench_load.bench_target(p, {"name": "t", "url": "u", "model": "m"})
    assert order == [1, 4, 1, 4, 1, 4]  # run 1 of every level, then run 2, ...
    assert [len(t["runs"]) for t in out["throughput"]] == [3, 3] and [t["concurrency"] for t in out["throughput"]] == [1, 4]
    q4 = out["latency"]["q4"]
    assert [r["run"] for r in q4["runs"]] == [1, 2, 3] and q4["n"] == 9
    assert sorted({r["run"] for r in out["records"] if r["phase"] == "latency"}) == [1, 2, 3]
    # a warm-up before each latency run and each level: 3 + 6 untimed requests, not recorded
    posts = [c for c in fk.CALLS if c[0] == "POST"]
    assert len(posts) == 3 * (1 + 3) + 6 and len([r for r in out["records"] if r["phase"] == "latency"]) == 9


def test_open_levels_report_the_censored_schedule_figures_and_the_verdict(fake: tuple[type[Fake], Clock]) -> None:
    """open_levels over a level whose one slot is held: its from_schedule figures carry the never-sent requests
    (censored, lower_bound), its window, the verdict with its reason and the generator's limit it was given."""
    fk, _ = fake
    fk.SCRIPT, fk.HOLD = [(-8, b"", 1.0)], threading.Event()
    p = {"timeout": 0.0, "path": "/p", "warmup": 0, "duration_s": 0.5, "request_rates": [20.0], "seed": 4,
         "max_inflight": 1, "slo_ms": 100.0, "metrics_path": ""}
    limit = {"sent_per_s": 700.0}
    try:
        (row,) = bench_load.open_levels(p, TARGET, b"{}", 4, bench_load.Recorder(), limit)
    finally:
        fk.HOLD.set()
    sched = row["from_schedule"]
    assert set(sched) == {"n", "mean", "min", "p50", "p95", "p99", "max", "interval", "unsupported", "censored", "lower_bound"}
    assert sched["censored"] == row["not_sent"] > 0 and "p50" in sched["lower_bound"] and sched["n"] == sched["censored"]
    assert row["window"] == {"ramp_s": 0.05, "length_s": 0.45} and row["questions"] == 4 and row["metrics"] == {}
    assert row["driven"] is False and row["not_driven"].startswith("the generator sent 2/s of ")
    assert row["not_driven"].endswith("; the generator's own limit, measured in this run: 700/s")
    assert row["generator_limit"] is limit and row["good"] == 0 and row["goodput_per_s"] == 0.0


# --------------------------------------------------------------------------------------------- figures, exactly
def test_an_open_level_s_figures_are_rounded_as_recorded(fake: tuple[type[Fake], Clock], monkeypatch: pytest.MonkeyPatch) -> None:
    """3 requests due in 1.2375 s (seed 0), the dispatcher waking 12.3456 ms after each due time: elapsed to the ms,
    the rates to 0.01/s, the lag's figures to 0.01 ms."""
    _, clock = fake
    real_sleep = clock.sleep
    monkeypatch.setattr(clock, "sleep", lambda s: real_sleep(s + 0.0123456))
    row = bench_load.rate_level(TARGET, "/p", b"{}", 4.0, 1.2375, 60.0, 0, bench_load.Recorder())
    assert (row["scheduled"], row["elapsed_s"], row["offered_per_s"], row["sent_per_s"]) == (3, 1.238, 2.42, 2.42)
    assert (row["lag"]["n"], row["lag"]["p50"], row["lag"]["max"], row["lag_p99_ms"]) == (3, 12.35, 12.35, 12.35)


def test_an_open_level_with_nothing_scheduled(fake: tuple[type[Fake], Clock]) -> None:
    fk, _ = fake
    row = bench_load.rate_level(TARGET, "/p", b"{}", 0.1, 0.5, 60.0, 0, bench_load.Recorder())  # first gap ~10 s
    assert (row["scheduled"], row["requests"], row["errors"], row["sent_per_s"], row["offered_per_s"], row["n"]) == (0, 0, 0, 0.0, 0.0, 0)
    assert row["error_examples"] == [] and row["_recs"] == [] and fk.BODIES == []


def test_an_open_level_keeps_three_error_examples(fake: tuple[type[Fake], Clock]) -> None:
    fk, _ = fake
    fk.SCRIPT = [(500, b"a", 1.0), (501, b"b", 1.0), (502, b"c", 1.0), (503, b"d", 1.0)]
    row = bench_load.rate_level(TARGET, "/p", b"{}", 4.0, 2.0, 60.0, 0, bench_load.Recorder())
    assert row["errors"] == row["scheduled"] >= 4
    assert row["error_examples"] == ["HTTP 500: a", "HTTP 501: b", "HTTP 502: c"]


def test_a_target_measures_the_generator_limit_before_its_rates(fake: tuple[type[Fake], Clock],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The probe: at 10 times the highest rate but at least 500/s, for the level's duration but at most 1 s, with
    the run's in-flight cap; its figure is in the result and in every rate's row; the accuracy pass is recorded."""
    fk, _ = fake
    probes: list[tuple[Any, ...]] = []
    limit = {"probe_rate": 0.0, "sent_per_s": 900.0, "lag_p50_ms": 0.1, "at_least": True}
    monkeypatch.setattr(bench_load, "generator_limit", lambda *a: probes.append(a) or limit)
    p = {"api_key": None, "timeout": 7.0, "path": "/p", "cases": [{"id": "c1", "body": {"state": "s"}}], "warmup": 0,
         "samples": 1, "load_request": "q4", "latency_requests": [{"label": "q4", "body": {"questions": {"a": 1}}}],
         "concurrency": [], "duration_s": 0.5, "max_requests": 0, "request_rates": [6.0, 80.0], "load_targets": [],
         "seed": 3, "slo_ms": 0.0, "metrics_path": "", "repeats": 1, "max_inflight": 7}
    fk.SCRIPT = [(200, b"", 1.0), (200, b'{"version": "v"}', 1.0), (200, ANSWER, 10.0)]
    out = bench_load.bench_target(p, {"name": "t", "url": "u", "model": "m"})
    assert probes == [(800.0, 0.5, 7)] and out["generator_limit"] is limit
    assert [r["generator_limit"] for r in out["rate"]] == [limit, limit]
    assert [r["phase"] for r in out["records"]][:2] == ["accuracy", "latency"]
    assert set(fk.BODIES) == {b'{"model": "m", "state": "s"}', b'{"model": "m", "questions": {"a": 1}}'}
    fk.SCRIPT, fk.BODIES = [(200, b"", 1.0), (200, b'{"version": "v"}', 1.0), (200, ANSWER, 10.0)], []
    bench_load.bench_target({**p, "request_rates": [6.0], "duration_s": 2.0}, {"name": "t", "url": "u", "model": "m"})
    assert probes[1] == (500.0, 1.0, 7)


def test_the_window_is_closed_at_both_ends() -> None:
    """[start, end]: a request due exactly at the start is in it (sent or not: one never sent, censored), an answer
    received exactly at the end is in it; one never sent due exactly at the end waited 0 ms by then. The window's
    length to the ms."""
    recs = [{"sent": 11.2, "received": 12.0, "status": 200, "ms": 800.0, "ms_from_schedule": 1000.0, "scheduled_s": 1.0,
             "input_tokens": None},
            {"sent": 12.0, "received": 13.12345, "status": 200, "ms": 1123.45, "ms_from_schedule": 1123.45, "scheduled_s": 2.0,
             "input_tokens": None},
            {"sent": None, "received": None, "status": None, "ms": None, "scheduled_s": 1.0, "not_sent": True},
            {"sent": None, "received": None, "status": None, "ms": None, "scheduled_s": 3.12345, "not_sent": True}]
    out = bench_load.window_figures(recs, 11.0, 13.12345, 1, 0.0, "ms_from_schedule", due=10.0)
    assert [r["window"] for r in recs] == ["in", "in", "in", "in"]
    assert (out["n"], out["censored"], out["min"], out["window_s"]) == (4, 2, 0.0, 2.123)
    assert out["requests_per_s"] == round(2 / 2.12345, 2)


def test_a_metrics_page_with_a_byte_that_is_not_utf8_is_still_read(fake: tuple[type[Fake], Clock]) -> None:
    class Page:
        def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
            return 200, b"# \xff\xfe a comment\nvllm:num_requests_waiting 2\n", 1.0

    assert bench_load.read_metrics(Page(), "/metrics")["vllm:num_requests_waiting"] == 2.0  # type: ignore[arg-type]


class Still:
    """A clock that stands still (perf_counter 0, the wall clock 1.7e9); sleep only records: the sampler's thread
    cannot move a level's start."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def perf_counter(self) -> float:
        return 0.0

    def time(self) -> float:
        return 1.7e9

    def sleep(self, s: float) -> None:
        self.slept.append(round(s, 6))


def test_closed_levels_whole_row_over_two_runs(fake: tuple[type[Fake], Clock], monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runs of one level of 1.23456 s (ramp 0.246912 s): per run an answer in the ramp, two inside, an error
    inside and one drained (sent inside, answered after the end). Rates over the windows' 2 x 0.987648 s of the
    answers inside them; latency over every successful request sent inside (the drained one too), never an error's;
    each record marked with its run; /metrics read before, halfway (0.61728 s) and after each run, the last run's
    kept; the error examples of both runs, three of them."""
    fk, _ = fake
    clock = Still()
    monkeypatch.setattr(bench_load, "time", clock)
    fk.PAGES = [f"vllm:num_requests_waiting {n}" for n in range(6)]
    plan = [(0.1, 40.0, 200), (0.3, 50.0, 200), (0.5, 80.0, 200), (0.6, 5.0, 500), (1.0, 400.0, 200)]

    def level(target: dict, path: str, payload: bytes, c: int, duration_s: float, max_requests: int, timeout: float,
              rec: bench_load.Recorder) -> dict:
        run = sum(1 for r in rec.records if r["phase"] == "closed") // len(plan)
        mine = [rec.add("closed", status, ANSWER if status == 200 else b"e", ms, 1.7e9 + sent, concurrency=c)
                for sent, ms, status in plan]
        return {"requests": 5, "errors": 1, "error_examples": [f"HTTP 50{run}: e", f"HTTP 51{run}: e"], "elapsed_s": 1.23755,
                "_ok": 4, "_recs": mine}

    monkeypatch.setattr(bench_load, "load_level", level)
    p = {"repeats": 2, "concurrency": [3], "warmup": 0, "timeout": 7.0, "path": "/p", "metrics_path": "/metrics",
         "duration_s": 1.23456, "max_requests": 0, "slo_ms": 60.0}
    rec = bench_load.Recorder()
    (row,) = bench_load.closed_levels(p, TARGET, b"{}", 4, rec)
    assert [r["run"] for r in rec.records] == [1] * 5 + [2] * 5
    assert [r["window"] for r in rec.records[:5]] == ["ramp", "in", "in", "in", "drain"]
    assert (row["concurrency"], row["requests"], row["errors"], row["elapsed_s"]) == (3, 10, 2, 2.475)
    assert row["error_examples"] == ["HTTP 500: e", "HTTP 501: e", "HTTP 510: e"]
    assert row["window"] == {"ramp_s": 0.247, "length_s": 0.988}
    assert (row["requests_per_s"], row["questions_per_s"], row["good"], row["goodput_per_s"]) == (2.03, 8.1, 2, 1.01)
    assert (row["n"], row["min"], row["max"], row["p50"]) == (6, 50.0, 400.0, 80.0)
    assert [(r["run"], r["n"], r["requests_per_s"]) for r in row["runs"]] == [(1, 3, 2.03), (2, 3, 2.03)]
    assert {k: v["vllm:num_requests_waiting"] for k, v in row["metrics"].items()} == {"before": 3.0, "during": 4.0, "after": 5.0}
    assert clock.slept == [0.61728, 0.61728]  # the halfway reads, each half a level after its start
    assert [c for c in fk.CALLS if c[0] == "new"] == [("new", "http://t", 7.0, "k")] * 6  # per run: warm-up, sampler's two


def test_open_levels_read_metrics_halfway_and_run_each_rate_with_the_run_s_settings(fake: tuple[type[Fake], Clock],
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    fk, _ = fake
    clock = Still()
    monkeypatch.setattr(bench_load, "time", clock)
    fk.PAGES = ["vllm:num_requests_waiting 1", "vllm:num_requests_waiting 2", "vllm:num_requests_waiting 3"]
    levels: list[tuple[Any, ...]] = []

    def level(*args: Any) -> dict:
        levels.append(args)
        return {"rate": args[3], "sent_per_s": 5.0, "offered_per_s": 5.0, "lag": {"p99": 0.1}, "_recs": []}

    monkeypatch.setattr(bench_load, "rate_level", level)
    p = {"timeout": 7.0, "path": "/p", "warmup": 1, "duration_s": 3.12345, "request_rates": [5.0], "seed": 9,
         "max_inflight": 4, "slo_ms": 0.0, "metrics_path": "/metrics"}
    rec = bench_load.Recorder()
    (row,) = bench_load.open_levels(p, TARGET, b'{"q": 1}', 4, rec, None)
    assert levels == [(TARGET, "/p", b'{"q": 1}', 5.0, 3.12345, 7.0, 9, rec, 4)]
    assert fk.BODIES == [b'{"q": 1}']  # the warm-up sends the level's request
    assert {k: v["vllm:num_requests_waiting"] for k, v in row["metrics"].items()} == {"before": 1.0, "during": 2.0, "after": 3.0}
    assert clock.slept == [1.561725] and row["driven"] is True and row["not_driven"] == ""
    # the window's figures from the schedule (none here), its length to the ms
    assert row["from_schedule"]["n"] == 0 and row["window"] == {"ramp_s": 0.312345, "length_s": 2.811}
    assert [c for c in fk.CALLS if c[0] == "new"] == [("new", "http://t", 7.0, "k")] * 3  # warm-up, sampler's two
