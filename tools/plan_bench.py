#!/usr/bin/env python3
"""Benchmark playbooks/plan.yml at fleet scale: generated inventories of 100, 300 and 1,000 hosts (four L4s each,
three models each: d3-flash, d3-mini, d3-edge; GPUs declared, so no host is contacted), one plan.yml run each,
printing the wall and CPU seconds and the seconds per 100 hosts (issue 33 item 5: 1,000 hosts under 60 s, cost
linear or better). Changes nothing; writes only into a temporary directory.

    .venv/bin/python tools/plan_bench.py [--hosts 100,300,1000] [--models 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["d3-flash", "d3-mini", "d3-edge", "d3-lite"]


def inventory(count: int, models: int) -> dict:
    """``count`` hosts with four L4s and ``models`` small models each, at addresses nothing answers on."""
    hosts = {f"l4-{i:05d}": {"ansible_host": "192.0.2.1", "ansible_port": 1, "d3_gpu_count": 4,
                             "d3_models": [{"model": m} for m in MODELS[:models]]} for i in range(count)}  # fmt: skip
    return {"all": {"children": {"l4-nodes": {"hosts": hosts}}}}


def run(count: int, models: int, workdir: Path) -> tuple[float, float, int, str]:
    inv = workdir / f"hosts-{count}.yml"
    inv.write_text(yaml.safe_dump(inventory(count, models)))
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.builtin.default"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    proc = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/plan.yml", "-i", str(inv)],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.monotonic() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    summary = next((line.strip(" -'") for line in proc.stdout.splitlines() if "fleet:" in line), "no summary")
    return wall, cpu, proc.returncode, summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="100,300,1000", help="comma-separated fleet sizes")
    parser.add_argument("--models", type=int, default=3, choices=range(1, len(MODELS) + 1))
    args = parser.parse_args()
    sizes = [int(n) for n in args.hosts.split(",")]
    print(f"plan.yml on generated fleets ({args.models} models per host, 4 L4 each); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"{'hosts':>6}  {'wall s':>7}  {'cpu s':>7}  {'wall s/100 hosts':>16}  rc  summary")
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for count in sizes:
            wall, cpu, rc, summary = run(count, args.models, Path(tmp))
            failed += rc != 0
            print(f"{count:>6}  {wall:>7.1f}  {cpu:>7.1f}  {wall * 100 / count:>16.2f}  {rc:>2}  {summary}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
