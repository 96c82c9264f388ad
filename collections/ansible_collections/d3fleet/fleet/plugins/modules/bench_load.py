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
  - Step 4, the throughput pass - for each entry of O(concurrency), that many threads each sending O(load_request)
    in a closed loop (a new request as soon as the previous answer arrived) for O(duration_s) seconds, or until
    O(max_requests) were sent; requests/s, questions/s, errors and latency percentiles per level.
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
  duration_s:
    description: Seconds each concurrency level runs.
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
        elapsed_s, requests_per_s, questions_per_s, n, mean, min, p50, p95, p99, max}); the percentiles are of the
        successful requests' latencies at that level.
      type: list
"""

import http.client
import json
import os
import threading
import time
import urllib.parse

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_bench_stats import summary


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


def accuracy_pass(client: Client, path: str, model: str, cases: list[dict]) -> list[dict]:
    out = []
    for case in cases:
        status, data, ms = client.call("POST", path, encode(model, case["body"]))
        item = {"id": case["id"], "status": status, "elapsed_ms": round(ms, 1), "answers": None, "error": None}
        if status == 200:
            try:
                item["answers"] = json.loads(data).get("answers")
            except (ValueError, AttributeError):
                item["error"] = "the answer is not a JSON object"
        else:
            item["error"] = short_error(status, data)
        out.append(item)
    return out


def latency_pass(client: Client, path: str, model: str, requests: list[dict], samples: int) -> dict:
    out = {}
    for req in requests:
        payload = encode(model, req["body"])
        times, errors = [], 0
        for _ in range(samples):
            status, _, ms = client.call("POST", path, payload)
            if status == 200:
                times.append(ms)
            else:
                errors += 1
        out[req["label"]] = {"questions": len(req["body"].get("questions") or {}), "samples_ms": [round(t, 1) for t in times],
                             "errors": errors, **summary(times)}
    return out


def load_level(target: dict, path: str, payload: bytes, concurrency: int, duration_s: float, max_requests: int,
               timeout: float) -> dict:
    """`concurrency` threads in a closed loop until the deadline (or max_requests sent). A worker never dies
    silently (whatever it raises is counted as an error) and is never waited for longer than the deadline plus one
    request timeout (one still running then is reported as an error)."""
    lock = threading.Lock()
    times: list[float] = []
    errors: list[str] = []
    sent = [0]
    begin = time.perf_counter()
    deadline = begin + duration_s

    def worker() -> None:
        client = Client(target["url"], timeout, target.get("api_key"))
        try:
            while time.perf_counter() < deadline:
                with lock:
                    if max_requests and sent[0] >= max_requests:
                        return
                    sent[0] += 1
                status, data, ms = client.call("POST", path, payload)
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

    threads = [threading.Thread(target=worker, daemon=True, name=f"d3-bench-{n}") for n in range(concurrency)]
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
    result = {"name": target["name"], "url": target["url"], "model": target["model"], "health": health,
              "version": version, "cases": [], "latency": {}, "throughput": []}
    if health != 200:
        client.close()
        return result
    result["cases"] = accuracy_pass(client, p["path"], target["model"], p["cases"])
    by_label = {r["label"]: r for r in p["latency_requests"]}
    load = by_label.get(p["load_request"])
    if load is not None:
        for _ in range(p["warmup"]):
            client.call("POST", p["path"], encode(target["model"], load["body"]))
    result["latency"] = latency_pass(client, p["path"], target["model"], p["latency_requests"], p["samples"])
    client.close()
    if load is None:
        return result
    questions = len(load["body"].get("questions") or {})
    payload = encode(target["model"], load["body"])
    for level in p["concurrency"]:
        row = load_level(target, p["path"], payload, level, p["duration_s"], p["max_requests"], p["timeout"])
        ok = row.pop("_ok")
        row["questions_per_s"] = round(ok * questions / row["elapsed_s"], 2) if row["elapsed_s"] > 0 else 0.0
        result["throughput"].append({"concurrency": level, "questions": questions, **row})
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
    if bad or p["samples"] < 0 or p["duration_s"] <= 0:
        module.fail_json(msg=f"concurrency levels must be >= 1 (got {p['concurrency']}), samples >= 0 and duration_s > 0")
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
