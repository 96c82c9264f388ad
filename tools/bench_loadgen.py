#!/usr/bin/env python3
"""How fast is the bench's load generator itself? (a benchmark, not a test)

Runs the load generator of playbooks/bench.yml (the collection module d3fleet.fleet.bench_load, its closed-loop
`load_level`) against a minimal local HTTP server (asyncio, in its own process, a canned 200 answer shaped like a
4-question decision) at the same concurrency levels, and compares the highest rate it sustains with the highest
throughput the generator reported for the lab's simulator: from a bench JSON report (--report FILE, e.g. one
written by `make bench` in the lab), or else measured here against the LAB STAND-IN simulator (lab/simulator/
vllm_sim.py, in-process) serving its fastest size, d3-edge. If the generator sustains at least ten times that, the
simulator's figures are not the generator's limit.

    .venv/bin/python tools/bench_loadgen.py [--report bench/report.json] [--duration 3] [--concurrency 1 4 16]

Exit status 1 when the margin is below --min-ratio (10).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import multiprocessing
import os
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections"))

from ansible_collections.d3fleet.fleet.plugins.modules.bench_load import load_level  # noqa: E402

ANSWER = json.dumps({"object": "structured_decision", "answers": {
    q: {"type": "noul", "noul": 0.5, "probabilities": {"yes": 0.5, "no": 0.5}} for q in "abcd"}}).encode()
RESPONSE = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
QUESTIONS = {q: {"type": "noul", "instructions": f"Question {q}?"} for q in "abcd"}
PAYLOAD = json.dumps({"model": "m", "state": {"ticket": "My card was charged twice for one order."},
                      "questions": QUESTIONS}).encode()


class Canned(asyncio.Protocol):
    """Reads requests (headers + content-length body) and answers each with RESPONSE; keep-alive."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buf = b""

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[:end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if len(self.buf) < end + 4 + length:
                return
            self.buf = self.buf[end + 4 + length:]
            self.transport.write(RESPONSE)  # type: ignore[attr-defined]


def serve_canned(port: int) -> None:
    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Canned, "127.0.0.1", port, backlog=2048)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise SystemExit(f"the server on port {port} did not start")


def stand_in_simulator(repo: str, size: int, served: str, env: dict[str, str] | None = None) -> tuple[ThreadingHTTPServer, str]:
    """The LAB STAND-IN simulator (lab/simulator/vllm_sim.py) serving `repo` in this process, its serving state built
    under `env` (D3_SIM_* settings read when the state is made; D3_SIM_MS_PER_QUESTION cleared): (server, its URL).
    Shut it down with server.shutdown()."""
    spec = importlib.util.spec_from_file_location(f"vllm_sim_loadgen_{len(sys.modules)}", ROOT / "lab/simulator/vllm_sim.py")
    assert spec and spec.loader
    sim = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = sim
    spec.loader.exec_module(sim)
    args = sim.parse_args(["--model", repo, "--served-model-name", served, "--enforce-eager"])
    args.uvicorn_log_level = "warning"
    model = sim.Model(repo, Path("/nonexistent"), {}, size)
    saved = dict(os.environ)
    try:
        os.environ.pop("D3_SIM_MS_PER_QUESTION", None)
        os.environ.update(env or {})
        state = sim.make_state(args, sim.Plan(8192, 100_000, 0.65, 4.0), model)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    httpd: ThreadingHTTPServer = sim.SimHTTPServer(("127.0.0.1", 0), sim.make_handler(state))
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def simulator_max(levels: list[int], duration: float) -> tuple[float, str]:
    """The generator's best rate against the in-process LAB STAND-IN simulator serving d3-edge (the fastest size)."""
    httpd, url = stand_in_simulator("vllm-sr/d3-edge", int(1.4e9), "m")
    target = {"name": "sim", "url": url, "api_key": None}
    best = 0.0
    for c in levels:
        row = load_level(target, "/v1/systemone", PAYLOAD, c, duration, 0, 30.0)
        print(f"  simulator d3-edge (in-process)  concurrency {c:>3}: {row['requests_per_s']:8.1f} req/s  errors {row['errors']}")
        best = max(best, row["requests_per_s"])
    httpd.shutdown()
    return best, "the in-process simulator serving d3-edge (its fastest size)"


def report_max(path: Path) -> tuple[float, str]:
    report = json.loads(path.read_text())
    rows = [(t["requests_per_s"], f"{i['host']}/{i['name']} at concurrency {t['concurrency']}")
            for i in report["instances"] for t in i["throughput"]]
    if not rows:
        raise SystemExit(f"{path}: no throughput in the report")
    best, where = max(rows)
    return best, f"{path} ({where})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--report", type=Path, help="a bench JSON report (bench.yml -e d3_bench_output=FILE)")
    ap.add_argument("--duration", type=float, default=3.0, help="seconds per concurrency level")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--min-ratio", type=float, default=10.0)
    opts = ap.parse_args()

    print("Highest throughput the load generator reports for the simulator:")
    sim_best, source = report_max(opts.report) if opts.report else simulator_max(opts.concurrency, opts.duration)
    print(f"  {sim_best:.1f} req/s, from {source}")

    port = free_port()
    proc = multiprocessing.Process(target=serve_canned, args=(port,), daemon=True)
    proc.start()
    try:
        wait_port(port)
        target = {"name": "canned", "url": f"http://127.0.0.1:{port}", "api_key": None}
        print("The same load generator against a minimal local HTTP server (asyncio, canned answer, own process):")
        gen_best = 0.0
        for c in opts.concurrency:
            row = load_level(target, "/v1/systemone", PAYLOAD, c, opts.duration, 0, 30.0)
            print(f"  concurrency {c:>3}: {row['requests_per_s']:8.1f} req/s  p50 {row['p50']} ms  p99 {row['p99']} ms  "
                  f"errors {row['errors']}")
            gen_best = max(gen_best, row["requests_per_s"])
    finally:
        proc.terminate()
        proc.join()
    ratio = gen_best / sim_best if sim_best else float("inf")
    verdict = "OK" if ratio >= opts.min_ratio else "TOO CLOSE"
    print(f"{verdict}: the load generator sustains {gen_best:.0f} req/s, {ratio:.1f}x the highest it reports for the "
          f"simulator ({sim_best:.1f} req/s); wanted >= {opts.min_ratio:g}x (on {os.cpu_count()} CPUs)")
    return 0 if ratio >= opts.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
