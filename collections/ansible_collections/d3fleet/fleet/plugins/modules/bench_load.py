#!/usr/bin/python
"""Ansible module: the bench load generator. Runs ON a D3 host (instances may listen on loopback) with the Python
standard library only (threads + http.client): a decision suite's cases once each, timed 2- and 4-question requests,
then closed-loop load at each concurrency."""

from __future__ import annotations

DOCUMENTATION = r"""
module: bench_load
short_description: Send a decision suite and a load to vLLM D3 instances from the host they run on, and time it
description:
  - For each target, one after the other (never two at once, so they do not slow each other down), in four steps.
  - Step 1, C(GET /health) (a target that does not answer 200 is reported with its C(health) and skipped) and
    C(GET /version) (the server's version string; the bench report marks a simulator by it).
  - Step 2, the accuracy pass - every case of the suite once, sequentially, recording the answers as they came.
  - Step 3, the latency pass - each request of O(latency_requests) O(samples) times, sequentially (concurrency 1).
  - Step 4, the throughput pass (only the O(load_targets) when given) - for each entry of O(concurrency), that many
    threads each sending O(load_request) in a closed loop (a new request as soon as the previous answer arrived; the
    threads' starts spread over the first tenth of the level) for O(duration_s) seconds, or until O(max_requests)
    were sent.
  - Step 5, the request-rate pass - for each entry of O(request_rates), O(load_request) sent in an open loop at
    Poisson arrival times (exponential gaps of mean 1/rate, as vLLM's C(benchmarks/benchmark_serving.py)
    C(--request-rate) with burstiness 1; seeded by O(seed)) for O(duration_s) seconds, whatever the answers do.
  - Per level - requests/s, questions/s, input tokens/s (the answers' C(usage.input_tokens)), goodput (answers
    within O(slo_ms) per second), errors, latency percentiles with their n, and the server's C(/metrics)
    (O(metrics_path)) read before, halfway through and after the level.
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
    description: Untimed requests of O(load_request) sent to a target before its latency pass.
    type: int
    default: 2
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
      description: Per label, C({questions, samples_ms, errors, n, mean, min, p50, p95, p99, max}) (ms).
      type: dict
    throughput:
      description: One item per concurrency level, C({concurrency, questions, requests, errors, error_examples,
        elapsed_s, requests_per_s, questions_per_s, goodput_per_s, good, input_tokens_per_s, metrics, n, mean,
        min, p50, p95, p99, max, unsupported}); the percentiles are of the successful requests' latencies at that
        level, C(unsupported) the percentiles their n is too small for; C(metrics) is C({before, during, after}),
        each vLLM metric name -> value (null when the server has none).
      type: list
    rate:
      description: One item per request rate, as O(concurrency)'s items with C(rate), C(scheduled),
        C(offered_per_s), C(not_sent) and C(lag_p99_ms) (how late the sender was) instead of C(concurrency).
      type: list
    records:
      description: Every request sent, C({phase (accuracy, latency, closed, open), case or label or concurrency or
        rate, sent, received (epoch s), ms, status, input_tokens, error, answers (accuracy only)}).
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
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import METRICS, parse_metrics, summary


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


def latency_pass(client: Client, path: str, model: str, requests: list[dict], samples: int, rec: Recorder | None = None) -> dict:
    out = {}
    for req in requests:
        payload = encode(model, req["body"])
        times, errors = [], 0
        for _ in range(samples):
            sent = time.time()
            status, data, ms = client.call("POST", path, payload)
            if rec is not None:
                rec.add("latency", status, data, ms, sent, label=req["label"])
            if status == 200:
                times.append(ms)
            else:
                errors += 1
        out[req["label"]] = {"questions": len(req["body"].get("questions") or {}), "samples_ms": [round(t, 1) for t in times],
                             "errors": errors, **summary(times)}
    return out


def level_figures(recs: list[dict], elapsed: float, questions: int, slo_ms: float) -> dict:
    """requests/s, questions/s, goodput (answers within slo_ms per second, vLLM benchmark_serving.py's
    request_goodput: good completions / duration), input tokens/s of one level's records."""
    ok = [r for r in recs if r["status"] == 200]
    good = [r for r in ok if slo_ms > 0 and r["ms"] <= slo_ms]
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
    reported as an error)."""
    lock = threading.Lock()
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
                if rec is not None:
                    rec.add("closed", status, data, ms, wall, concurrency=concurrency)
                with lock:
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
        errors += [f"load thread still running {timeout:g} s after the deadline"] * stuck
        ok = len(times)
        row = {"requests": ok + len(errors), "errors": len(errors), "error_examples": sorted(set(errors))[:3],
               "elapsed_s": round(elapsed, 3), "requests_per_s": round(ok / elapsed, 2) if elapsed > 0 else 0.0,
               "_ok": ok, **summary(list(times))}
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
    """Open loop: requests sent at Poisson arrival times whatever the answers do (one thread and connection each,
    so a slow server cannot slow the sender: no coordinated omission); latency from the actual send, the lag behind
    the schedule recorded. More than max_inflight unanswered requests: the next ones are not sent and are errors."""
    schedule = arrivals(rate, duration_s, seed)
    recs: list[dict] = []
    lock = threading.Lock()
    begin = time.perf_counter()
    threads: list[threading.Thread] = []
    dropped = 0

    def one(at: float) -> None:
        client = Client(target["url"], timeout, target.get("api_key"))
        wall, start = time.time(), time.perf_counter()
        try:
            status, data, ms = client.call("POST", path, payload)
        except Exception as exc:  # reported: never a silent thread death
            status, data, ms = -1, f"load thread failed: {type(exc).__name__}: {exc}".encode(), 0.0
        finally:
            client.close()
        r = rec.add("open", status, data, ms, wall, rate=rate, scheduled_s=round(at, 6), lag_ms=round((start - begin - at) * 1000, 2))
        with lock:
            recs.append(r)

    for at in schedule:
        time.sleep(max(0.0, begin + at - time.perf_counter()))
        if sum(t.is_alive() for t in threads) >= max_inflight:
            dropped += 1
            continue
        t = threading.Thread(target=one, args=(at,), daemon=True, name=f"d3-bench-open-{len(threads)}")
        t.start()
        threads.append(t)
    for t in threads:
        t.join(max(0.0, begin + duration_s + timeout + 5.0 - time.perf_counter()))
    elapsed = max(duration_s, time.perf_counter() - begin)  # the level lasts its schedule, or until the last answer
    with lock:
        stuck = sum(t.is_alive() for t in threads)
        ok = [r["ms"] for r in recs if r["status"] == 200]
        errors = sorted({r["error"] for r in recs if r["status"] != 200})
        lags = [r["lag_ms"] for r in recs]
        return {"rate": rate, "scheduled": len(schedule), "requests": len(recs) + stuck + dropped,
                "errors": len(recs) - len(ok) + stuck + dropped, "not_sent": dropped,
                "error_examples": (errors + (["still unanswered after the timeout"] if stuck else []))[:3],
                "elapsed_s": round(elapsed, 3), "offered_per_s": round(len(schedule) / duration_s, 2),
                "lag_p99_ms": summary(lags, 2)["p99"], "_recs": list(recs), **summary(ok)}


class Refused(Exception):
    pass


def check_marker(marker: str | None) -> None:
    if marker and os.path.exists(marker):
        raise Refused(f"{marker} exists: a rollout is restarting this host (rollout.yml's marker, d3_state_rollout_marker); "
                      "bench refuses a host mid-rollout. Run it again when the rollout has finished.")


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
    if load is not None:
        for _ in range(p["warmup"]):
            client.call("POST", p["path"], encode(target["model"], load["body"]))
    result["latency"] = latency_pass(client, p["path"], target["model"], p["latency_requests"], p["samples"], rec)
    client.close()
    if load is None or (p["load_targets"] and target["name"] not in p["load_targets"]):
        return result
    questions = len(load["body"].get("questions") or {})
    payload = encode(target["model"], load["body"])
    for level in p["concurrency"]:
        sampler = Sampler(target, p["timeout"], p["metrics_path"], time.perf_counter() + p["duration_s"] / 2)
        first = len(rec.records)
        row = load_level(target, p["path"], payload, level, p["duration_s"], p["max_requests"], p["timeout"], rec)
        row.pop("_ok")
        row.update(level_figures(rec.records[first:], row["elapsed_s"], questions, p["slo_ms"]))
        result["throughput"].append({"concurrency": level, "questions": questions, **row, "metrics": sampler.finish()})
    for rate in p["request_rates"]:
        sampler = Sampler(target, p["timeout"], p["metrics_path"], time.perf_counter() + p["duration_s"] / 2)
        row = rate_level(target, p["path"], payload, rate, p["duration_s"], p["timeout"], p["seed"], rec)
        row.update(level_figures(row.pop("_recs"), row["elapsed_s"], questions, p["slo_ms"]))
        result["rate"].append({"questions": questions, **row, "metrics": sampler.finish()})
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
    if bad or p["samples"] < 0 or p["duration_s"] <= 0 or any(r <= 0 for r in p["request_rates"]) or p["slo_ms"] < 0:
        module.fail_json(msg=f"concurrency levels must be >= 1 (got {p['concurrency']}), request_rates > 0 (got "
                             f"{p['request_rates']}), samples >= 0, duration_s > 0 and slo_ms >= 0")
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
