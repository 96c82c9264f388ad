#!/usr/bin/env python3
"""Send decision requests through a router at a steady rate for the whole of a rollout, and report what clients saw.

It starts a load generator (POST <router>/v1/systemone with a 2-question decision, R requests per second, each from
its own thread so a slow answer never delays the next send), measures a quiet period before the rollout, runs
playbooks/rollout.yml through ansible-runner (the way AWX runs a job: events with timestamps), keeps sending until
the rollout has ended, and prints:

- failed requests (any answer other than 200, or no answer), before and during the rollout, with examples;
- latency percentiles (p50 / p95 / p99 / max, ms) before and during the rollout;
- the per-instance timeline of the rollout: when each router server was drained, when its instance was stopped and
  started (systemd's monotonic timestamps, from the rollout's output), when it was ready, when the router took it
  back, seconds from the rollout's start.

Usage (a real fleet or the lab; the lab: `flock /tmp/d3-lab.lock`):
  tools/rollout_under_load.py --url http://ROUTER:8000 --model d3-lite [--rate 10] [--warmup 10]
      [--api-key-file FILE] [-i INVENTORY] [-l LIMIT] [-e KEY=VALUE ...] [--json out.json]
The rollout's own variables (d3_image_name, d3_rollout_serial, ...) go in -e. Exit status 0 when no request failed
and the rollout succeeded, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ansible_runner

ROOT = Path(__file__).resolve().parents[1]
STATE = {"ticket": "My card was charged twice for one order."}
QUESTIONS = {
    "team": {
        "type": "choice",
        "instructions": "Which team should handle this ticket?",
        "criteria": {"billing": "payments and refunds", "shipping": "deliveries", "security": "account access"},
    },
    "urgent": {"type": "noul", "instructions": "Does the customer need a reply within the hour?"},
}
# the rollout's router tasks (playbooks/rollout.yml and playbooks/tasks/rollout_give_back.yml, module haproxy_runtime:
# set, then wait until drained or UP) whose ok events give the timeline; each loop result returns the state it set
ROUTER_TASKS = ("Drain this host's instances in every router and wait (no new request; the current ones finish)",
                "Give back this host's drained instances in every router and wait until each is UP")


class Load:
    """R requests per second from separate threads; every result is kept: (sent at, ms or None, status or error)."""

    def __init__(self, url: str, model: str, rate: float, api_key: str | None, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/v1/systemone"
        self.body = json.dumps({"model": model, "state": STATE, "questions": QUESTIONS}).encode()
        self.rate, self.api_key, self.timeout = rate, api_key, timeout
        self.results: list[tuple[float, float | None, str]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []

    def one(self, sent: float) -> None:
        request = urllib.request.Request(self.url, data=self.body, method="POST")
        request.add_header("Content-Type", "application/json")
        if self.api_key:
            request.add_header("Authorization", f"Bearer {self.api_key}")
        start = time.perf_counter()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                answer.read()
                outcome = str(answer.status)
        except urllib.error.HTTPError as exc:
            outcome = str(exc.code)
        except (urllib.error.URLError, OSError) as exc:
            outcome = type(getattr(exc, "reason", exc)).__name__
        ms = (time.perf_counter() - start) * 1000
        with self.lock:
            self.results.append((sent, ms if outcome == "200" else None, outcome))

    def run(self) -> None:
        period = 1.0 / self.rate
        next_at = time.time()
        while not self.stop.is_set():
            thread = threading.Thread(target=self.one, args=(next_at,), daemon=True)
            thread.start()
            self.threads.append(thread)
            next_at += period
            self.stop.wait(max(0.0, next_at - time.time()))

    def start(self) -> None:
        self.runner = threading.Thread(target=self.run, daemon=True)
        self.runner.start()

    def finish(self) -> None:
        self.stop.set()
        self.runner.join()
        for thread in self.threads:
            thread.join(self.timeout + 5)


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))], 1)


def summary(results: list[tuple[float, float | None, str]]) -> dict[str, Any]:
    ok = [ms for _, ms, outcome in results if outcome == "200" and ms is not None]
    failed = [outcome for _, _, outcome in results if outcome != "200"]
    return {
        "requests": len(results),
        "failed": len(failed),
        "failed_examples": sorted(set(failed))[:5],
        "p50_ms": percentile(ok, 50),
        "p95_ms": percentile(ok, 95),
        "p99_ms": percentile(ok, 99),
        "max_ms": round(max(ok), 1) if ok else None,
    }


def timeline(events: list[dict[str, Any]], t0: float) -> list[dict[str, Any]]:
    """Per host: when its servers were drained and taken back (the router tasks' end, from the runner events) and the
    restarts the rollout printed ('<unit>: down N s ...')."""
    rows: dict[str, dict[str, Any]] = {}
    for event in events:
        data = event.get("event_data", {})
        if event.get("event") != "runner_on_ok":
            continue
        host, task = data.get("host"), data.get("task")
        ended = data.get("end")
        at = round(_epoch(ended) - t0, 1) if ended else None
        row = rows.setdefault(host, {"host": host, "drained_s": None, "back_s": None, "restarts": []})
        states = {r.get("state") for r in data.get("res", {}).get("results", [])} if task in ROUTER_TASKS else set()
        if "drain" in states and row["drained_s"] is None:
            row["drained_s"] = at
        elif "ready" in states:
            row["back_s"] = at
        elif (task or "").startswith("Print each restarted instance's downtime"):
            for item in data.get("res", {}).get("results", []):
                row["restarts"].append(item.get("msg"))
    kept = [row for row in rows.values() if row["drained_s"] is not None or row["restarts"]]
    return sorted(kept, key=lambda row: (row["drained_s"] is None, row["drained_s"] or 0.0))


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso).timestamp()


def run_rollout(inventory: str, limit: str | None, extravars: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
    with tempfile.TemporaryDirectory(prefix="d3-rollout-load-") as pdd:
        result = ansible_runner.run(
            private_data_dir=pdd,
            project_dir=str(ROOT),
            playbook="playbooks/rollout.yml",
            inventory=inventory,
            limit=limit,
            extravars=extravars,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
            quiet=True,
            suppress_env_files=True,
        )
        return result, list(result.events)


class Window:
    """The load around a rollout: t0 and t1 (epoch seconds) bracket the rollout; results are every request's."""

    def __init__(self) -> None:
        self.t0 = self.t1 = 0.0
        self.results: list[tuple[float, float | None, str]] = []


@contextmanager
def load_during(url: str, model: str, rate: float, warmup: float, api_key: str | None) -> Iterator[Window]:
    """Send the load for warmup seconds, then run the body (the rollout), then 2 s more; the window's figures are
    whatever the body was (any way of running rollout.yml: this tool's run_rollout, or a test's own runner)."""
    load = Load(url, model, rate, api_key)
    window = Window()
    load.start()
    try:
        time.sleep(warmup)
        window.t0 = time.time()
        yield window
        window.t1 = time.time()
        time.sleep(2.0)  # a little after the end: requests sent while the last server came back
    finally:
        load.finish()
        window.results = list(load.results)


def figures_of(window: Window, rate: float, status: str, rc: int, events: list[dict[str, Any]]) -> dict[str, Any]:
    """What clients saw before and during the rollout, and its per-host timeline (from the rollout's runner events)."""
    before = [r for r in window.results if r[0] < window.t0]
    during = [r for r in window.results if r[0] >= window.t0]
    return {
        "rollout": {"status": status, "rc": rc, "seconds": round(window.t1 - window.t0, 1)},
        "rate_per_s": rate,
        "before": summary(before),
        "during": summary(during),
        "timeline": timeline(events, window.t0),
        "failed_requests": [(round(sent - window.t0, 2), outcome) for sent, _, outcome in window.results if outcome != "200"][:50],
    }


def measure(url: str, model: str, rate: float, warmup: float, api_key: str | None, inventory: str, limit: str | None,
            extravars: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    with load_during(url, model, rate, warmup, api_key) as window:
        result, events = run_rollout(inventory, limit, extravars)
    return figures_of(window, rate, result.status, result.rc, events)


def report(figures: dict[str, Any]) -> str:
    lines = [
        f"rollout: {figures['rollout']['status']} (rc {figures['rollout']['rc']}) in {figures['rollout']['seconds']} s, "
        f"load {figures['rate_per_s']} requests/s through the router",
        "",
        "| period | requests | failed | p50 ms | p95 ms | p99 ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for period in ("before", "during"):
        s = figures[period]
        cells = [f"{period} the rollout", s["requests"], s["failed"], s["p50_ms"], s["p95_ms"], s["p99_ms"], s["max_ms"]]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if figures["during"]["failed"]:
        lines.append(f"failed during: {figures['during']['failed_examples']}; first: {figures['failed_requests'][:10]}")
    lines += ["", "| host | drained at s | taken back at s | restarts (rollout's own figures) |", "|---|---:|---:|---|"]
    for row in figures["timeline"]:
        lines.append(f"| {row['host']} | {row['drained_s']} | {row['back_s']} | {'; '.join(row['restarts']) or '-'} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="the router's fleet endpoint (d3_router_port), e.g. http://router:8000")
    parser.add_argument("--model", required=True, help="the served model name clients send")
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second (default 10)")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of load measured before the rollout")
    parser.add_argument("--api-key-file", help="a file holding the API key (never given on the command line)")
    parser.add_argument("-i", "--inventory", default=str(ROOT / "inventories" / "lab"))
    parser.add_argument("-l", "--limit")
    parser.add_argument("-e", "--extra", action="append", default=[], help="KEY=VALUE or a JSON object, as ansible-playbook -e")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    extravars: dict[str, Any] = {}
    for item in args.extra:
        extravars.update(json.loads(item) if item.lstrip().startswith("{") else dict([item.split("=", 1)]))
    api_key = Path(args.api_key_file).read_text().strip() if args.api_key_file else None
    figures = measure(args.url, args.model, args.rate, args.warmup, api_key, args.inventory, args.limit, extravars)
    print(report(figures))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if figures["rollout"]["status"] == "successful" and figures["during"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
