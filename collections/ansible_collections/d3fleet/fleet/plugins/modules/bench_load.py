#!/usr/bin/python
"""Ansible module: the bench load generator. Runs ON a D3 host (instances may listen on loopback) with the Python
standard library only (threads + http.client): a decision suite's cases once each, timed 2- and 4-question requests
(k runs), closed-loop load at each concurrency (k runs, interleaved) and open-loop load at each request rate, timed
from the schedule and from the send."""

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_load
short_description: Send a decision suite and a load to vLLM D3 instances from the host they run on, and time it
description:
  - For each target, one after the other (never two at once, so they do not slow each other down), in four steps.
  - Step 1, C(GET /health) (a target that does not answer 200 is reported with its C(health) and skipped) and
    C(GET /version) (the server's version string; the bench report marks a simulator by it).
  - Step 2, the accuracy pass - every case of the suite once, sequentially, recording the answers as they came.
  - Step 3, the latency pass - each request of O(latency_requests) O(samples) times, sequentially (concurrency 1),
    after O(warmup) untimed requests; O(repeats) runs of it, each run's own median kept (C(runs)).
  - Step 4, the throughput pass (only the O(load_targets) when given) - for each entry of O(concurrency), that many
    threads each sending O(load_request) in a closed loop (a new request as soon as the previous answer arrived; the
    threads' starts spread over the first tenth of the level) for O(duration_s) seconds, or until O(max_requests)
    were sent; O(repeats) runs of every level, interleaved (run 1 of each level, then run 2, ...), each after
    O(warmup) untimed requests. The first fifth of a level is its ramp and answers after its end its drain - both
    outside its window; rates count the answers received inside the window (whenever sent), over the window's
    length; latency is that of the requests sent inside it (answered before or after its end).
  - Step 5, the request-rate pass - for each entry of O(request_rates), after O(warmup) untimed requests,
    O(load_request) due at Poisson arrival times (exponential gaps of mean 1/rate, as vLLM's
    C(benchmarks/benchmark_serving.py) C(--request-rate) with burstiness 1; seeded by O(seed)) for O(duration_s)
    seconds, whatever the answers do, at most O(max_inflight) in flight (one due while that many are out waits, and
    its wait counts; one still waiting when the schedule ends is not sent and is recorded as such). Latency from the
    intended send time (C(from_schedule)) and from the actual send, and the generator's lag; the first tenth of the
    schedule is the ramp, answers after its end the drain. Before the first rate, the generator's own limit is
    measured in the same run (C(generator_limit), against a canned server on 127.0.0.1 for at most 1 s); a level it
    did not drive (sent under 95 % of the offered rate over its sending time, or a 99th percentile lag - the
    dispatcher's start of a request's thread after its intended time - of max(1 ms, 5 % of the mean gap 1/rate) or
    more) is C(driven=false), with the reason. Requests never sent that were due in the window count in the latency
    from the schedule as censored at the window's end, and so do requests that failed (timeouts, errors; no answer
    by then; at the time they spent if longer); a percentile that reaches them is listed in C(lower_bound). The latency
    from the send is that of the answered requests (HTTP 200) alone; failures are counted in C(errors).
  - Per level - requests/s, questions/s, input tokens/s (the answers' C(usage.input_tokens)), goodput (answers
    within O(slo_ms) per second; open loop - from the schedule), errors, latency percentiles with their n and
    distribution-free intervals, and the server's C(/metrics) (O(metrics_path)) read before, halfway through and
    after the level.
  - Every request is recorded (C(records)) with its send and receive times (epoch seconds, the host's clock).
  - Uses only the Python standard library on the host (threads, C(http.client), one keep-alive connection per
    thread), so no package is added to a fleet host.
  - Refuses to start, and stops between targets, while O(refuse_if_exists) exists (the rollout marker, present
    while rollout.yml restarts the host).
  - Never changes anything. API keys are no_log.
options:
  targets:
    description: The endpoints to bench, in order.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Instance name (reported as given).
        type: str
        required: true
      url:
        description: Base URL without a path, e.g. V(http://127.0.0.1:8000).
        type: str
        required: true
      model:
        description: The served model name sent as the request's C(model).
        type: str
        required: true
      api_key:
        description: Bearer token for vLLM's C(--api-key); falls back to O(api_key).
        type: str
  cases:
    description: The accuracy pass, one request each; C(id) names the case, C(body) is the request body without
      C(model) (state, questions, optional instructions).
    type: list
    elements: dict
    default: []
  latency_requests:
    description: Timed requests; C(label) names each (e.g. V(q2), V(q4)), C(body) as for O(cases).
    type: list
    elements: dict
    default: []
  load_request:
    description: The O(latency_requests) label sent by the throughput pass.
    type: str
    default: q4
  samples:
    description: How many times each of O(latency_requests) is sent in the latency pass.
    type: int
    default: 20
  warmup:
    description: Untimed requests of O(load_request) sent to a target before each run of its latency pass and
      before every load level.
    type: int
    default: 2
  repeats:
    description: Runs of the latency pass and of every closed-loop level (interleaved); the run-level figures are
      what bench-compare judges.
    type: int
    default: 1
  max_inflight:
    description: Open loop - at most this many requests in flight at once; one due while that many are out waits.
    type: int
    default: 256
  concurrency:
    description: Concurrency levels of the throughput pass (requests in flight).
    type: list
    elements: int
    default: [1, 4, 16]
  request_rates:
    description: Request rates (requests/s) of the open-loop pass; empty for none.
    type: list
    elements: float
    default: []
  load_targets:
    description: Names of the targets that get the load passes (steps 4 and 5); empty for all.
    type: list
    elements: str
    default: []
  seed:
    description: Seed of the Poisson arrival times (the same seed and rate give the same schedule).
    type: int
    default: 0
  slo_ms:
    description: Latency objective of the goodput (an answer within it is good); 0 for no goodput.
    type: float
    default: 0
  metrics_path:
    description: The server's Prometheus page, read around each level; empty to skip it.
    type: str
    default: /metrics
  duration_s:
    description: Seconds each concurrency level and each request rate runs.
    type: float
    default: 10.0
  max_requests:
    description: Stop a concurrency level after this many requests (0 for no limit; the duration still applies).
    type: int
    default: 0
  timeout:
    description: Seconds before a request counts as an error.
    type: float
    default: 60.0
  api_key:
    description: Bearer token for every target without its own.
    type: str
  path:
    description: The decision endpoint.
    type: str
    default: /v1/systemone
  refuse_if_exists:
    description: A file whose presence stops the bench (rollout.yml's marker, the d3_state role's
      C(d3_state_rollout_marker)); checked before each target and after the last.
    type: path
author: d3-fleet
"""

EXAMPLES = r"""
- name: Bench the planned instances from the host they run on
  d3fleet.fleet.bench_load:
    targets:
      - {name: d3-27b, url: "http://127.0.0.1:8000", model: d3-27b}
    cases:
      - id: double-charge
        body:
          state: {ticket: My card was charged twice for one order.}
          questions:
            team:
              type: choice
              instructions: Which team should handle this ticket?
              criteria: {billing: payments, shipping: deliveries}
    latency_requests:
      - {label: q2, body: {state: "...", questions: {}}}   # two questions
      - {label: q4, body: {state: "...", questions: {}}}   # four questions
    concurrency: [1, 4, 16]
    duration_s: 10
    api_key: "{{ d3_units_api_key | default(omit, true) }}"
    refuse_if_exists: /var/lib/d3/rollout-in-progress
  register: bench
"""

RETURN = r"""
results:
  description: One item per target, in order.
  type: list
  elements: dict
  returned: always
  contains:
    name: {description: The target's name., type: str}
    url: {description: The target's base URL., type: str}
    model: {description: The served model name., type: str}
    health: {description: HTTP status of /health (-1 when the connection failed)., type: int}
    version: {description: The C(version) of GET /version, empty when it has none., type: str}
    cases:
      description: The accuracy pass, one item per case, C({id, status, elapsed_ms, answers, error}); C(answers)
        is the response's C(answers) as received.
      type: list
    latency:
      description: Per label, C({questions, samples_ms, errors, n, mean, min, p50, p95, p99, max, interval,
        unsupported, runs, run_level}) (ms) over every run's samples (C(interval) from their order statistics, which
        assume independent samples); C(runs) one C({run, n, p50, p95, p99, mean, errors}) per run; C(run_level),
        with 2 runs or more, C({k, p50, p95, p99, interval}) - the mean of the runs' percentiles and its 95 % t
        interval over the runs (the run is the unit), null where a run's n is too small for that percentile.
      type: dict
    throughput:
      description: One item per concurrency level, C({concurrency, questions, requests, errors, error_examples,
        elapsed_s, requests_per_s, questions_per_s, goodput_per_s, good, input_tokens_per_s, metrics, n, mean,
        min, p50, p95, p99, max, interval, unsupported, window, runs}); rates over the level's windows, the
        percentiles of the successful requests sent inside them, C(interval) their distribution-free 95 % intervals
        (order statistics, which assume independent samples), C(unsupported) the percentiles their n is too small
        for, C(runs) each run's C({run, requests_per_s, goodput_per_s, p50, p95, p99, n}), C(run_level) as for
        C(latency); C(metrics) is C({before, during, after}) of the last run, each vLLM metric name -> value (null
        when the server has none).
      type: list
    rate:
      description: One item per request rate, as O(concurrency)'s items (from the send) with C(rate), C(scheduled),
        C(offered_per_s), C(sent_per_s), C(not_sent), C(lag) (a summary of how late the dispatcher started each
        request's thread after its intended time), C(lag_p99_ms), C(from_schedule) (the percentiles from the intended
        send time, with C(censored) - the requests never sent, due in the window, and those that failed - and
        C(lower_bound) - the figures
        they make lower bounds), C(driven), C(not_driven) (why not) and C(generator_limit) instead of
        C(concurrency).
      type: list
    generator_limit:
      description: The open-loop generator's own limit measured in this run, C({probe_rate, sent_per_s,
        lag_p50_ms, at_least}); only when O(request_rates) is set.
      type: dict
    records:
      description: Every request, C({phase (accuracy, latency, closed, open), case or label or concurrency or
        rate, run, sent, received (epoch s), ms, status, input_tokens, error, answers (accuracy only), window (ramp,
        in, drain - load levels)}); an open-loop request also C(scheduled_s), C(lag_ms) and C(ms_from_schedule), and
        one never sent C(not_sent) true with C(sent), C(received), C(ms) and C(status) null; one still unanswered
        when the level stopped waiting (its schedule plus one timeout plus 5 s) C(unanswered) true and C(waited_ms)
        (from its intended time), with the same four null (if it is answered later, its own record follows).
      type: list
"""

import http.client
import json
import os
import random
import threading
import time
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import (
    METRICS,
    PERCENTILES,
    min_n,
    parse_metrics,
    run_interval,
    summary,
)


class Client:
    """One keep-alive HTTP connection (per thread); reconnects after an error."""

    def __init__(self, url: str, timeout: float, api_key: str | None) -> None:
        parts = urllib.parse.urlsplit(url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.timeout = timeout
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        self.conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self.conn is None:
            cls = http.client.HTTPSConnection if self.https else http.client.HTTPConnection
            self.conn = cls(self.host, self.port, timeout=self.timeout)
        return self.conn

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def call(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
        """(status, body, elapsed ms); status -1 and the error text as body when the request failed."""
        start = time.perf_counter()
        try:
            conn = self._connect()
            conn.request(method, path, body=body, headers=self.headers)
            resp = conn.getresponse()
            data = resp.read()
            if resp.getheader("connection", "").lower() == "close":
                self.close()
            return resp.status, data, (time.perf_counter() - start) * 1000.0
        except (OSError, http.client.HTTPException) as exc:
            self.close()
            return -1, f"{type(exc).__name__}: {exc}".encode(), (time.perf_counter() - start) * 1000.0


class Recorder:
    """The raw per-request records of one target (thread-safe): what was sent when (wall clock, epoch seconds, from
    the host's clock), when the answer came back, its status, latency and input tokens."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.records: list[dict] = []

    def add(self, phase: str, status: int, data: bytes, ms: float, sent: float, **extra: object) -> dict:
        rec = {"phase": phase, **extra, "sent": round(sent, 6), "received": round(sent + ms / 1000.0, 6),
               "ms": round(ms, 2), "status": status, "input_tokens": input_tokens(data) if status == 200 else None}
        if status != 200:
            rec["error"] = short_error(status, data)
        with self.lock:
            self.records.append(rec)
        return rec


def input_tokens(data: bytes) -> int | None:
    """usage.input_tokens of an answer (tests/contracts/vllm/systemone-response.json), None when it has none."""
    try:
        value = json.loads(data).get("usage", {}).get("input_tokens")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def encode(model: str, body: dict) -> bytes:
    return json.dumps({"model": model, **body}).encode()


def short_error(status: int, data: bytes) -> str:
    return f"HTTP {status}: {data[:200].decode('utf-8', 'replace')}" if status != -1 else data.decode("utf-8", "replace")[:200]


def probe(client: Client) -> tuple[int, str]:
    status, _, _ = client.call("GET", "/health")
    version = ""
    if status == 200:
        vstatus, data, _ = client.call("GET", "/version")
        if vstatus == 200:
            try:
                version = str(json.loads(data).get("version", ""))
            except (ValueError, AttributeError):
                version = ""
    return status, version


def read_metrics(client: Client, path: str) -> dict:
    """The server's own view (d3_bench_stats.METRICS, vLLM's names) from its /metrics page; {} when there is none."""
    if not path:
        return {}
    status, data, _ = client.call("GET", path)
    return parse_metrics(data.decode("utf-8", "replace"), list(METRICS)) if status == 200 else {}


def accuracy_pass(client: Client, path: str, model: str, cases: list[dict], rec: Recorder | None = None) -> list[dict]:
    out = []
    for case in cases:
        sent = time.time()
        status, data, ms = client.call("POST", path, encode(model, case["body"]))
        item = {"id": case["id"], "status": status, "elapsed_ms": round(ms, 1), "answers": None, "error": None}
        if status == 200:
            try:
                item["answers"] = json.loads(data).get("answers")
            except (ValueError, AttributeError):
                item["error"] = "the answer is not a JSON object"
        else:
            item["error"] = short_error(status, data)
        if rec is not None:
            rec.add("accuracy", status, data, ms, sent, case=case["id"], answers=item["answers"])
        out.append(item)
    return out


def latency_pass(client: Client, path: str, model: str, requests: list[dict], samples: int, rec: Recorder | None = None,
                 run: int = 1) -> dict:
    out = {}
    for req in requests:
        payload = encode(model, req["body"])
        times, errors = [], 0
        for _ in range(samples):
            sent = time.time()
            status, data, ms = client.call("POST", path, payload)
            if rec is not None:
                rec.add("latency", status, data, ms, sent, label=req["label"], run=run)
            if status == 200:
                times.append(ms)
            else:
                errors += 1
        out[req["label"]] = {"questions": len(req["body"].get("questions") or {}), "samples_ms": [round(t, 1) for t in times],
                             "errors": errors, **summary(times)}
    return out


def run_level(runs: list[dict]) -> dict | None:
    """The run-level figures of k >= 2 runs (the run is the unit): per percentile the mean of the runs' own
    percentiles and its 95 % t interval over the runs (d3_bench_stats.run_interval), where every run's n supports
    that percentile (min_n: p50 6, p95 72, p99 368 samples a run), else None. Samples inside a run are autocorrelated,
    so the order-statistic interval of the pooled samples is too narrow; runs are close to independent. None for one
    run."""
    if len(runs) < 2:
        return None
    out: dict = {"k": len(runs), "interval": {}}
    for q in PERCENTILES:
        key = f"p{q}"
        values = [r.get(key) for r in runs]
        ok = all(v is not None and int(r.get("n") or 0) >= min_n(q) for r, v in zip(runs, values, strict=True))
        ci = run_interval(values) if ok else None
        out[key] = round(sum(values) / len(values), 1) if ci else None
        out["interval"][key] = [round(ci[0], 1), round(ci[1], 1)] if ci else None
    return out


def pool_runs(runs: list[dict]) -> dict:
    """The latency passes of one target (one per run) as one figure per label: the pooled samples' summary, `runs`,
    each run's own {run, n, p50, p95, p99, mean, errors} - the run-level figures bench-compare judges (the spread
    between runs is measured from them, not assumed) - and `run_level` (run_level(): the mean of the runs'
    percentiles with its t interval over the runs; None for one run)."""
    out: dict = {}
    for n, passes in enumerate(runs, start=1):
        for label, fig in passes.items():
            slot = out.setdefault(label, {"questions": fig["questions"], "samples_ms": [], "errors": 0, "runs": []})
            slot["samples_ms"] += fig["samples_ms"]
            slot["errors"] += fig["errors"]
            slot["runs"].append({"run": n, "n": fig["n"], "p50": fig["p50"], "p95": fig.get("p95"), "p99": fig.get("p99"),
                                 "mean": fig["mean"], "errors": fig["errors"]})
    for slot in out.values():
        slot.update(summary(slot["samples_ms"]))
        slot["run_level"] = run_level(slot["runs"])
    return out


def level_figures(recs: list[dict], elapsed: float, questions: int, slo_ms: float, key: str = "ms") -> dict:
    """requests/s, questions/s, goodput (answers within slo_ms per second, vLLM benchmark_serving.py's
    request_goodput: good completions / duration; `key` names the latency judged against slo_ms: "ms" from the send,
    "ms_from_schedule" from the intended send time), input tokens/s of one level's records."""
    ok = [r for r in recs if r["status"] == 200]
    good = [r for r in ok if slo_ms > 0 and r[key] <= slo_ms]
    tokens = sum(r["input_tokens"] or 0 for r in ok)

    def per_s(x: float) -> float:
        return round(x / elapsed, 2) if elapsed > 0 else 0.0

    return {"requests_per_s": per_s(len(ok)), "questions_per_s": per_s(len(ok) * questions),
            "good": len(good) if slo_ms > 0 else None, "goodput_per_s": per_s(len(good)) if slo_ms > 0 else None,
            "input_tokens_per_s": per_s(tokens) if any(r["input_tokens"] is not None for r in ok) else None}


class Sampler:
    """/metrics read before a level, halfway through it (from its own thread: the level's queue at its height), and
    after it; nothing when there is no metrics path."""

    def __init__(self, target: dict, timeout: float, path: str, halfway: float) -> None:
        self.path, self.timeout, self.out = path, timeout, {}
        if path:
            self.client = Client(target["url"], timeout, target.get("api_key"))
            self.out["before"] = read_metrics(self.client, path)
            self.mid = Client(target["url"], timeout, target.get("api_key"))
            self.thread = threading.Thread(target=self._during, args=(halfway,), daemon=True, name="d3-bench-metrics")
            self.thread.start()

    def _during(self, at: float) -> None:
        time.sleep(max(0.0, at - time.perf_counter()))
        self.out["during"] = read_metrics(self.mid, self.path)
        self.mid.close()

    def finish(self) -> dict:
        if self.path:
            self.thread.join(self.timeout + 5.0)
            self.out["after"] = read_metrics(self.client, self.path)
            self.client.close()
        return self.out


def load_level(target: dict, path: str, payload: bytes, concurrency: int, duration_s: float, max_requests: int,
               timeout: float, rec: Recorder | None = None) -> dict:
    """`concurrency` threads in a closed loop until the deadline (or max_requests sent), their starts spread over the
    first tenth of the level (not in lockstep). A worker never dies silently (whatever it raises is counted as an
    error) and is never waited for longer than the deadline plus one request timeout (one still running then is
    reported as an error). With `rec`, `_recs` is this level's records, those added before it returned: a worker still
    running then adds its record to `rec` (the raw records) but never to another level's figures (before the
    statistician's third review closed_levels took the records added since a level began, so a straggler's record
    landed in the next level's slice)."""
    lock = threading.Lock()
    mine: list[dict] = []
    over = [False]
    times: list[float] = []
    errors: list[str] = []
    sent = [0]
    begin = time.perf_counter()
    deadline = begin + duration_s
    stagger = duration_s / 10.0 / concurrency

    def worker(n: int) -> None:
        client = Client(target["url"], timeout, target.get("api_key"))
        try:
            time.sleep(n * stagger)
            while time.perf_counter() < deadline:
                with lock:
                    if max_requests and sent[0] >= max_requests:
                        return
                    sent[0] += 1
                wall = time.time()
                status, data, ms = client.call("POST", path, payload)
                r = rec.add("closed", status, data, ms, wall, concurrency=concurrency) if rec is not None else None
                with lock:
                    if r is not None and not over[0]:
                        mine.append(r)
                    if status == 200:
                        times.append(ms)
                    else:
                        errors.append(short_error(status, data))
        except Exception as exc:  # reported: never a silent thread death
            with lock:
                errors.append(f"load thread failed: {type(exc).__name__}: {exc}")
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(n,), daemon=True, name=f"d3-bench-{n}") for n in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline + timeout + 5.0 - time.perf_counter()))
    stuck = sum(t.is_alive() for t in threads)
    elapsed = time.perf_counter() - begin
    with lock:
        over[0] = True
        errors += [f"load thread still running {timeout:g} s after the deadline"] * stuck
        ok = len(times)
        row = {"requests": ok + len(errors), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
               "elapsed_s": round(elapsed, 3), "requests_per_s": round(ok / elapsed, 2) if elapsed > 0 else 0.0,
               "_ok": ok, **summary(list(times))}
        if rec is not None:
            row["_recs"] = list(mine)
    return row


def arrivals(rate: float, duration_s: float, seed: int) -> list[float]:
    """Poisson arrivals: exponential gaps of mean 1/rate (vLLM benchmark_serving.py's get_request with burstiness 1),
    from a seeded generator so that a run can be repeated, until duration_s."""
    rng = random.Random(f"{seed}:{rate}")
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def rate_level(target: dict, path: str, payload: bytes, rate: float, duration_s: float, timeout: float, seed: int,
               rec: Recorder, max_inflight: int = 256) -> dict:
    """Open loop: requests due at Poisson arrival times (one thread and connection each), whatever the answers do.
    At most max_inflight unanswered at once: a request due while that many are in flight waits for one to finish and
    goes out late (the generator's limit); one still waiting when the schedule ends is not sent (recorded, counted).
    Each record carries its intended time (`scheduled_s`), how late it went out (`lag_ms`), its latency from the send
    (`ms`) and from the schedule (`ms_from_schedule` = lag + ms: what a client arriving on schedule waited, free of
    coordinated omission). The row's percentiles are from the send, `from_schedule` holds the same from the
    schedule, `lag` the sender's lateness, `sent_per_s` the rate the generator reached."""
    schedule = arrivals(rate, duration_s, seed)
    recs: list[dict] = []
    lock = threading.Lock()
    begin = time.perf_counter()
    threads: list[threading.Thread] = []
    inflight = [0]
    unsent: list[float] = []
    sent: list[float] = []  # the intended times of the requests sent, in order
    done: set[int] = set()  # which of them have their record
    over = [False]

    def one(i: int, at: float, start: float) -> None:
        client = Client(target["url"], timeout, target.get("api_key"))
        wall = time.time()
        try:
            status, data, ms = client.call("POST", path, payload)
        except Exception as exc:  # reported: never a silent thread death
            status, data, ms = -1, f"load thread failed: {type(exc).__name__}: {exc}".encode(), 0.0
        finally:
            client.close()
            with lock:
                inflight[0] -= 1
        lag = (start - begin - at) * 1000.0
        r = rec.add("open", status, data, ms, wall, rate=rate, scheduled_s=round(at, 6), lag_ms=round(lag, 2),
                    ms_from_schedule=round(lag + ms, 2))
        with lock:
            if not over[0]:  # a straggler answering after the level ended: in the raw records only
                recs.append(r)
                done.add(i)

    last = begin
    for at in schedule:
        time.sleep(max(0.0, begin + at - time.perf_counter()))
        while inflight[0] >= max_inflight and time.perf_counter() < begin + duration_s:
            time.sleep(0.001)  # wait for a slot: the request goes out late, its lag counts
        if inflight[0] >= max_inflight:
            unsent.append(at)
            continue
        with lock:
            inflight[0] += 1
        last = time.perf_counter()
        t = threading.Thread(target=one, args=(len(sent), at, last), daemon=True, name=f"d3-bench-open-{len(threads)}")
        sent.append(at)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, begin + duration_s + timeout + JOIN_GRACE_S - time.perf_counter()))
    elapsed = max(duration_s, time.perf_counter() - begin)  # the level lasts its schedule, or until the last answer
    never = [{"phase": "open", "rate": rate, "scheduled_s": round(at, 6), "sent": None, "received": None, "ms": None,
              "status": None, "input_tokens": None, "not_sent": True,
              "error": f"not sent: {max_inflight} requests were in flight until the schedule ended"} for at in unsent]
    with lock:
        over[0] = True
        # still running at the join deadline: no answer, like a timeout; censored from the schedule at what it has
        # waited (at least the schedule's end - its intended time), a record of its own (the statistician's fourth
        # review item 3: before, only counted as an error, so the latency from the schedule left it out)
        waiting = [{"phase": "open", "rate": rate, "scheduled_s": round(at, 6), "sent": None, "received": None,
                    "ms": None, "status": None, "input_tokens": None, "unanswered": True,
                    "waited_ms": round((elapsed - at) * 1000.0, 2),
                    "error": f"still unanswered {timeout + JOIN_GRACE_S:g} s after the schedule's end"}
                   for i, at in enumerate(sent) if i not in done]
        stuck = len(waiting)
        never += waiting
        rec.records.extend(never)
        ok = [r for r in recs if r["status"] == 200]
        errors = sorted({r["error"] for r in recs if r["status"] != 200})
        lags = [r["lag_ms"] for r in recs]
        return {"rate": rate, "scheduled": len(schedule), "requests": len(recs) + stuck + len(unsent),
                "errors": len(recs) - len(ok) + stuck + len(unsent), "not_sent": len(unsent),
                "error_examples": (errors + (["still unanswered after the timeout"] if stuck else [])
                                   + ([f"{len(unsent)} not sent"] if unsent else []))[:3],
                "elapsed_s": round(elapsed, 3), "offered_per_s": round(len(schedule) / duration_s, 2),
                "sent_per_s": round(len(threads) / max(duration_s, last - begin), 2), "max_inflight": max_inflight,
                "lag": summary(lags, 2), "lag_p99_ms": summary(lags, 2)["p99"],
                "from_schedule": summary([r["ms_from_schedule"] for r in ok],  # failed: censored (window_figures)
                                         censored=[max(0.0, (duration_s - at) * 1000.0) for at in unsent]
                                         + [r["waited_ms"] for r in waiting]
                                         + [max(r["ms_from_schedule"], (duration_s - r["scheduled_s"]) * 1000.0)
                                            for r in recs if r["status"] != 200]),
                "_recs": list(recs) + never,
                **summary([r["ms"] for r in ok])}


JOIN_GRACE_S = 5.0  # how long past its schedule plus one timeout a level waits for its last answers


LAG_FLOOR_MS = 1.0  # the lag bound's floor: below it, the host's thread scheduling, not the generator
LAG_SHARE = 0.05  # the lag bound: 5 % of the intended mean gap between requests (1 / rate)


def lag_bound_ms(rate: float) -> float:
    """The most a driven level's p99 lag may be: max(1 ms, 5 % of the mean gap 1000 / rate ms). Why: a request sent
    late by under 5 % of the mean gap leaves the arrival process the server sees within 5 % of the Poisson schedule
    (nearly every gap as intended, the offered rate as offered); its lag is in its latency from the schedule anyway.
    The 1 ms floor: one thread start plus one sleep's overshoot on a loaded Linux host is of that order, so a tighter
    bound would judge the operating system's scheduler at high rates (at 1000/s, 5 % is 50 us) rather than the
    generator. 8/s: 6.25 ms; 20/s: 2.5 ms; 50/s and above: 1 ms."""
    return max(LAG_FLOOR_MS, LAG_SHARE * 1000.0 / rate)


def driven(row: dict, limit: dict | None) -> tuple[bool, str]:
    """Did the generator drive this open-loop level? Not when it sent fewer than 95 % of the scheduled requests per
    second of its sending time (late sends stretch that time, unsent requests are missing from it), nor when the 99th
    percentile of its lag - how late the dispatcher started a request's thread after its intended time - reaches
    lag_bound_ms(rate) (max(1 ms, 5 % of the mean gap)): then the server did not see the offered arrivals. The reason
    names the generator's own limit measured in this run."""
    lag99 = (row.get("lag") or {}).get("p99")
    known = f"; the generator's own limit, measured in this run: {limit['sent_per_s']:g}/s" if limit else ""
    if row["sent_per_s"] < 0.95 * row["offered_per_s"]:
        return False, f"the generator sent {row['sent_per_s']:g}/s of {row['offered_per_s']:g}/s offered{known}"
    bound = lag_bound_ms(row["rate"])
    if lag99 is not None and lag99 >= bound:
        return False, (f"the generator's p99 lag {lag99:g} ms is not under max(1 ms, 5 % of the mean gap) = {bound:g} ms"
                       f"{known}")
    return True, ""


CANNED = b'{"object": "stand-in", "answers": {}}'


def generator_limit(rate: float, duration_s: float, max_inflight: int) -> dict:
    """The open-loop generator's own limit, measured in the same run on the same host: rate_level at `rate` for
    duration_s against a canned local server (127.0.0.1, an ephemeral port, this process, the time of one level at
    most 1 s; it answers every POST at once and is shut down after). {probe_rate, sent_per_s, lag_p50_ms, at_least}:
    at_least when it sent 95 % of the probe's rate (the limit is higher still). The server shares the process, so the
    figure is a lower bound of what the generator does alone."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Canned(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", str(len(CANNED)))
            self.end_headers()
            self.wfile.write(CANNED)

        def log_message(self, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Canned)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True, name="d3-bench-canned").start()
    try:
        target = {"url": f"http://127.0.0.1:{server.server_address[1]}", "api_key": None}
        row = rate_level(target, "/", b"{}", rate, duration_s, 5.0, 0, Recorder(), max_inflight)
    finally:
        server.shutdown()
        server.server_close()
    return {"probe_rate": rate, "sent_per_s": row["sent_per_s"], "lag_p50_ms": row["lag"]["p50"],
            "at_least": row["sent_per_s"] >= 0.95 * row["offered_per_s"]}


def completed(recs: list[dict], start: float, end: float) -> list[dict]:
    """The requests answered (or failed) inside [start, end] (epoch s), whenever they were sent: what a level's rates
    count. A rate is completions per second of the window: counting only the requests both sent and answered inside
    it, as before the statistician's second review, misses those sent before it and answered inside, about one
    latency's worth of the window (a closed loop of 16 at 1 s latency over an 8 s window reported 13.9/s of 16/s)."""
    return [r for r in recs if r.get("sent") is not None and start <= r["received"] <= end]


def window_figures(recs: list[dict], start: float, end: float, questions: int, slo_ms: float, key: str = "ms",
                   due: float | None = None) -> dict:
    """A level's figures over its measurement window [start, end] (epoch s): latency over the requests sent inside it
    (their answers counted even after the window, so no slow answer is cut off), rates over the answers received
    inside it (completed(): whenever those requests were sent). Each record is marked `window` ramp (sent before
    `start`), in, or drain (sent inside, answered after `end`). `due`: the open loop's start (epoch s):
    a request belongs to the window by its intended time (due + scheduled_s), not by when it went out. Latency from
    the schedule (`key` "ms_from_schedule") counts the requests never sent that were due inside the window as
    censored at its end - each waited at least end - intended time (d3_bench_stats.summary's `censored`): a figure
    that reaches them is a lower bound (`lower_bound`), not left biased low by their absence. So are the requests
    sent inside the window that failed (a timeout, an error, a refusal): no answer came, by the window's end nor
    after, so the time to one is at least end - intended time, or what was spent if longer (a request that timed out
    after 60 s waited at least 60 s plus its lag). The latency from the schedule is the time to an answer of every
    request due; the latency from the send is that of the served requests (HTTP 200) alone, failures counted as
    errors. Before the statistician's second review failures were dropped, biasing the tail low exactly in overload;
    before the third they were censored at what they spent, so fast errors pulled the figure down (40 answers at 200
    ms and 60 HTTP 503s at 3 ms: p50 from the schedule ">= 3" ms, below the 200 ms from the send)."""
    inside, censored = [], []
    for r in recs:
        if r.get("sent") is None:
            if due is not None and (r.get("not_sent") or r.get("unanswered")):  # never sent, or still unanswered
                at = due + r["scheduled_s"]  # when the level ended: in the window by its intended time, censored
                r["window"] = "ramp" if at < start else "in"
                if at >= start:
                    censored.append(max(0.0, (end - at) * 1000.0, r.get("waited_ms") or 0.0))
            continue
        at = r["sent"] if due is None else due + r["scheduled_s"]
        r["window"] = "ramp" if at < start else "in" if r["received"] <= end else "drain"
        if at >= start:
            inside.append(r)
    length = max(0.0, end - start)
    counted = completed(recs, start, end)
    ok = [r[key] for r in inside if r["status"] == 200]
    if key == "ms_from_schedule":  # failed: no answer by the window's end (or in what it spent, if longer)
        censored += [max(r[key], (end - (r["sent"] if due is None else due + r["scheduled_s"])) * 1000.0)
                     for r in inside if r["status"] != 200 and r.get(key) is not None]
        figures = summary(ok, censored=censored)
    else:
        figures = summary(ok)
    return {**level_figures(counted, length, questions, slo_ms, key), "window_s": round(length, 3), **figures}


class Refused(Exception):
    pass


def check_marker(marker: str | None) -> None:
    if marker and os.path.exists(marker):
        raise Refused(f"{marker} exists: a rollout is restarting this host (rollout.yml's marker, d3_state_rollout_marker); "
                      "bench refuses a host mid-rollout. Run it again when the rollout has finished.")


def warm(p: dict, target: dict, payload: bytes) -> None:
    """p["warmup"] untimed requests, one at a time, before a pass or a load level (none recorded)."""
    client = Client(target["url"], p["timeout"], target.get("api_key"))
    for _ in range(p["warmup"]):
        client.call("POST", p["path"], payload)
    client.close()


def closed_levels(p: dict, target: dict, payload: bytes, questions: int, rec: Recorder) -> list[dict]:
    """Every concurrency level p["repeats"] times, interleaved (run 1 of every level, then run 2, ...), each after
    its warm-up; the figures of a level over its window - the first fifth of the level (the threads' staggered
    starts and their first answers) is its ramp, answers after its end its drain; rates count the answers inside - pooled
    over the runs, with each run's own figures in `runs`."""
    by: dict[int, list[tuple[dict, dict, float, list[dict]]]] = {}
    for _ in range(p["repeats"]):
        for level in p["concurrency"]:
            warm(p, target, payload)
            sampler = Sampler(target, p["timeout"], p["metrics_path"], time.perf_counter() + p["duration_s"] / 2)
            wall = time.time()
            row = load_level(target, p["path"], payload, level, p["duration_s"], p["max_requests"], p["timeout"], rec)
            row.pop("_ok")
            recs = row.pop("_recs")  # its own records only: not a straggler's from the level before
            for r in recs:
                r["run"] = len(by.get(level, [])) + 1
            by.setdefault(level, []).append((row, sampler.finish(), wall, recs))
    ramp = p["duration_s"] / 5.0
    out = []
    for level, runs in by.items():
        figs = [window_figures(recs, wall + ramp, wall + p["duration_s"], questions, p["slo_ms"]) for _, _, wall, recs in runs]
        kept = [r for *_, recs in runs for r in recs if r.get("window") in ("in", "drain")]
        counted = [r for _, _, wall, recs in runs for r in completed(recs, wall + ramp, wall + p["duration_s"])]
        out.append({"concurrency": level, "questions": questions,
                    "requests": sum(r[0]["requests"] for r in runs), "errors": sum(r[0]["errors"] for r in runs),
                    "error_examples": sorted({e for r in runs for e in r[0].get("error_examples", [])})[:3],
                    "elapsed_s": round(sum(r[0]["elapsed_s"] for r in runs), 3),
                    **level_figures(counted, (p["duration_s"] - ramp) * len(runs), questions, p["slo_ms"]),
                    **summary([r["ms"] for r in kept if r["status"] == 200]),
                    "window": {"ramp_s": round(ramp, 3), "length_s": round(p["duration_s"] - ramp, 3)},
                    "runs": [{"run": n, "requests_per_s": f["requests_per_s"], "goodput_per_s": f["goodput_per_s"],
                              "p50": f["p50"], "p95": f["p95"], "p99": f["p99"], "n": f["n"]} for n, f in enumerate(figs, start=1)],
                    "run_level": run_level(figs),
                    "metrics": runs[-1][1]})
    return out


def open_levels(p: dict, target: dict, payload: bytes, questions: int, rec: Recorder, limit: dict | None) -> list[dict]:
    """Every request rate once, after its warm-up; the first tenth of its schedule is its ramp and answers after the
    schedule's end its drain; rates count the answers inside the window (completed()); latency from the send and
    from the schedule; a level the generator could not drive is marked `driven: false` with the reason (driven())."""
    out = []
    for rate in p["request_rates"]:
        warm(p, target, payload)
        sampler = Sampler(target, p["timeout"], p["metrics_path"], time.perf_counter() + p["duration_s"] / 2)
        wall = time.time()
        row = rate_level(target, p["path"], payload, rate, p["duration_s"], p["timeout"], p["seed"], rec, p["max_inflight"])
        recs = row.pop("_recs")
        ramp = p["duration_s"] / 10.0
        sched = window_figures(recs, wall + ramp, wall + p["duration_s"], questions, p["slo_ms"], "ms_from_schedule", due=wall)
        send = window_figures(recs, wall + ramp, wall + p["duration_s"], questions, p["slo_ms"], "ms", due=wall)
        ok, why = driven(row, limit)
        row.update({k: v for k, v in send.items() if k not in ("good", "goodput_per_s")})
        row.update({"good": sched["good"], "goodput_per_s": sched["goodput_per_s"],
                    "from_schedule": {k: sched[k] for k in ("n", "mean", "min", "p50", "p95", "p99", "max", "interval",
                                                             "unsupported", "censored", "lower_bound")},
                    "window": {"ramp_s": ramp, "length_s": round(p["duration_s"] - ramp, 3)},
                    "driven": ok, "not_driven": why, "generator_limit": limit})
        out.append({"questions": questions, **row, "metrics": sampler.finish()})
    return out


def bench_target(p: dict, target: dict) -> dict:
    key = target.get("api_key") or p["api_key"]
    target = {**target, "api_key": key}
    client = Client(target["url"], p["timeout"], key)
    health, version = probe(client)
    rec = Recorder()
    result = {"name": target["name"], "url": target["url"], "model": target["model"], "health": health,
              "version": version, "cases": [], "latency": {}, "throughput": [], "rate": [], "records": rec.records}
    if health != 200:
        client.close()
        return result
    result["cases"] = accuracy_pass(client, p["path"], target["model"], p["cases"], rec)
    by_label = {r["label"]: r for r in p["latency_requests"]}
    load = by_label.get(p["load_request"])
    passes = []
    for run in range(1, p["repeats"] + 1):
        if load is not None:
            for _ in range(p["warmup"]):
                client.call("POST", p["path"], encode(target["model"], load["body"]))
        passes.append(latency_pass(client, p["path"], target["model"], p["latency_requests"], p["samples"], rec, run))
    result["latency"] = pool_runs(passes)
    client.close()
    if load is None or (p["load_targets"] and target["name"] not in p["load_targets"]):
        return result
    questions = len(load["body"].get("questions") or {})
    payload = encode(target["model"], load["body"])
    result["throughput"] = closed_levels(p, target, payload, questions, rec)
    if p["request_rates"]:
        limit = generator_limit(max(10.0 * max(p["request_rates"]), 500.0), min(1.0, p["duration_s"]), p["max_inflight"])
        result["generator_limit"] = limit
        result["rate"] = open_levels(p, target, payload, questions, rec, limit)
    return result


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "targets": {"type": "list", "elements": "dict", "required": True, "options": {
                "name": {"type": "str", "required": True},
                "url": {"type": "str", "required": True},
                "model": {"type": "str", "required": True},
                "api_key": {"type": "str", "no_log": True},
            }},
            "cases": {"type": "list", "elements": "dict", "default": []},
            "latency_requests": {"type": "list", "elements": "dict", "default": []},
            "load_request": {"type": "str", "default": "q4"},
            "samples": {"type": "int", "default": 20},
            "warmup": {"type": "int", "default": 2},
            "repeats": {"type": "int", "default": 1},
            "max_inflight": {"type": "int", "default": 256},
            "concurrency": {"type": "list", "elements": "int", "default": [1, 4, 16]},
            "request_rates": {"type": "list", "elements": "float", "default": []},
            "load_targets": {"type": "list", "elements": "str", "default": []},
            "seed": {"type": "int", "default": 0},
            "slo_ms": {"type": "float", "default": 0.0},
            "metrics_path": {"type": "str", "default": "/metrics"},
            "duration_s": {"type": "float", "default": 10.0},
            "max_requests": {"type": "int", "default": 0},
            "timeout": {"type": "float", "default": 60.0},
            "api_key": {"type": "str", "no_log": True},
            "path": {"type": "str", "default": "/v1/systemone"},
            "refuse_if_exists": {"type": "path"},
        },
        supports_check_mode=False,
    )
    p = module.params
    bad = [c for c in p["concurrency"] if c < 1]
    if (bad or p["samples"] < 0 or p["duration_s"] <= 0 or any(r <= 0 for r in p["request_rates"]) or p["slo_ms"] < 0
            or p["repeats"] < 1 or p["max_inflight"] < 1):
        module.fail_json(msg=f"concurrency levels must be >= 1 (got {p['concurrency']}), request_rates > 0 (got "
                             f"{p['request_rates']}), samples >= 0, duration_s > 0, slo_ms >= 0, repeats >= 1 (got "
                             f"{p['repeats']}) and max_inflight >= 1 (got {p['max_inflight']})")
    results = []
    try:
        for target in p["targets"]:
            check_marker(p["refuse_if_exists"])
            results.append(bench_target(p, target))
        check_marker(p["refuse_if_exists"])
    except Refused as exc:
        module.fail_json(msg=str(exc), results=results)
    module.exit_json(changed=False, results=results)


if __name__ == "__main__":
    main()
