#!/usr/bin/env python3
"""Cost per host of site.yml on the controller and on the wire, measured on the lab and projected to large fleets.

For each fleet size N (default 1, 2, 3: the lab's size; more with `make lab LAB_HOSTS=N` where the machine allows),
on the first N hosts of the inventory group, it runs site.yml twice through ansible-runner (the way AWX / AAP and
ansible-navigator run a job, events included): a converge, then the no-op run that is measured. It prints, per run:

- wall time;
- controller CPU seconds: user + system time of the ansible-playbook process tree (its forks and their ssh
  clients), from getrusage(RUSAGE_CHILDREN) around the run (ansible-runner's own event reading, in this process,
  is not counted);
- remote calls: every ssh / sftp / scp process ansible started, counted by wrappers given as
  ansible_ssh_executable / ansible_sftp_executable / ansible_scp_executable (one exec = one round trip over the
  multiplexed connection: a module run with pipelining, a file transfer, a low-level command). Exact, not sampled;
- remote module runs per host from the runner events (task results and loop items of modules that run on the
  host; set_fact / assert / debug and other controller-side actions excluded), and the tasks that make most of them.

Projection to 100 and 1000 hosts for F forks (ansible.cfg's forks unless --forks), C controller cores:
  CPU(N)   = a + b N     (least squares over the measured no-op runs; b = CPU seconds per host)
  calls(N) = c + d N     (same, remote calls)
  wall(N) >= max( W1 ceil(N / F),  CPU(N) / C )
The first term is latency-bound: ansible's linear strategy runs every task on up to F hosts at once, so a host
batch costs at least what one host's run costs (W1, the 1-host no-op wall time). The second is CPU-bound: the
controller cannot do the work of N hosts faster than its cores allow. Both are lower bounds; the larger one is what
the controller can hope for, and it is the number to compare with a job's time budget (or to divide by the number
of AWX job slices, each on its own execution node).

Usage (lab up; `flock /tmp/d3-lab.lock` around it in this project):
  tools/cost_per_host.py [--hosts 1,2,3] [--forks 20] [--cores 2] [--project-dir DIR] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import ansible_runner

ROOT = Path(__file__).resolve().parents[1]

# actions that run on the controller only (no remote call)
CONTROLLER_ACTIONS = {
    f"{prefix}{name}"
    for prefix in ("", "ansible.builtin.", "ansible.legacy.")
    for name in (
        "set_fact", "assert", "debug", "fail", "meta", "include_role", "include_tasks", "import_role",
        "import_tasks", "validate_argument_spec", "set_stats", "add_host", "group_by", "include_vars",
    )
}  # fmt: skip
RESULT_EVENTS = ("runner_on_ok", "runner_on_failed", "runner_item_on_ok", "runner_item_on_failed")


def group_hosts(inventory: Path, group: str) -> list[str]:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory), "--list"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    data = json.loads(out.stdout)
    hosts = data.get(group, {}).get("hosts", [])
    if not hosts:
        raise SystemExit(f"no host in group {group} of {inventory} (is the lab up? `make lab`)")
    return sorted(hosts)


def wrappers(directory: Path, log: Path) -> dict[str, str]:
    """ssh / sftp / scp wrappers that log one line per process and exec the real tool."""
    variables = {}
    for tool in ("ssh", "sftp", "scp"):
        real = shutil.which(tool)
        if real is None:
            raise SystemExit(f"{tool} not found")
        path = directory / tool
        path.write_text(f'#!/bin/sh\necho {tool} >> "{log}"\nexec {real} "$@"\n')
        path.chmod(0o755)
        variables[f"ansible_{tool}_executable"] = str(path)
    return variables


def module_runs(events: list[dict[str, Any]], hosts: set[str]) -> Counter[tuple[str, str]]:
    """(role, task) -> number of module runs on the hosts (loop items counted one by one)."""
    runs: Counter[tuple[str, str]] = Counter()
    for event in events:
        if event.get("event") not in RESULT_EVENTS:
            continue
        data = event.get("event_data", {})
        res = data.get("res") or {}
        if data.get("host") not in hosts or data.get("task_action") in CONTROLLER_ACTIONS:
            continue
        if event["event"].startswith("runner_on_") and isinstance(res.get("results"), list):
            continue  # a loop's summary: its items were counted
        if (res.get("_ansible_delegated_vars") or {}).get("ansible_delegated_host") == "localhost":
            continue
        runs[(data.get("role") or "", data.get("task", ""))] += 1
    return runs


def run_once(project: Path, inventory: Path, playbook: str, limit: list[str], forks: int | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="d3-cost-") as tmp:
        tmpdir = Path(tmp)
        log = tmpdir / "remote-calls.log"
        log.touch()
        extravars = wrappers(tmpdir, log)
        (tmpdir / "pdd").mkdir()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.monotonic()
        result = ansible_runner.run(
            private_data_dir=str(tmpdir / "pdd"),
            project_dir=str(project),
            playbook=playbook,
            inventory=str(inventory),
            limit=",".join(limit),
            extravars=extravars,
            forks=forks,
            envvars={"ANSIBLE_CONFIG": str(project / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
            quiet=True,
            suppress_env_files=True,
        )
        wall = time.monotonic() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        events = list(result.events)
        stats = result.stats or {}
        calls = Counter(log.read_text().split())
    if result.status != "successful":
        failures = [
            (e["event_data"].get("host"), e["event_data"].get("task"), (e["event_data"].get("res") or {}).get("msg"))
            for e in events
            if e.get("event") == "runner_on_failed"
        ]
        raise SystemExit(f"{playbook} on {limit} ended {result.status} (rc {result.rc}); failed tasks: {failures}")
    runs = module_runs(events, set(limit))
    changed_tasks = sorted(
        {
            f"{e['event_data'].get('host')}: {e['event_data'].get('role') or ''}: {e['event_data'].get('task')}"
            for e in events
            if e.get("event") in RESULT_EVENTS and (e["event_data"].get("res") or {}).get("changed")
        }
    )
    return {
        "changed_tasks": changed_tasks,
        "hosts": len(limit),
        "wall_s": wall,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "remote_calls": sum(calls.values()),
        "remote_calls_by_tool": dict(calls),
        "module_runs": sum(runs.values()),
        "top_tasks": [[role, task, n] for (role, task), n in runs.most_common(15)],
        "changed": sum(stats.get("changed", {}).values()),
        "tasks_ok": sum(stats.get("ok", {}).values()),
    }


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x (b = y/x through 0 for a single point)."""
    if len(xs) == 1:
        return 0.0, ys[0] / xs[0]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def configured_forks(project: Path) -> int:
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(project / "ansible.cfg")
    return cfg.getint("defaults", "forks", fallback=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", default="1,2,3", help="fleet sizes to measure (first N hosts of the group)")
    parser.add_argument("--project-dir", type=Path, default=ROOT, help="the checkout to measure")
    parser.add_argument("--inventory", type=Path, default=ROOT / "inventories" / "lab")
    parser.add_argument("--group", default="l4-nodes")
    parser.add_argument("--playbook", default="site.yml")
    parser.add_argument("--forks", type=int, default=None, help="forks for the projection (default: ansible.cfg)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="controller cores for the projection")
    parser.add_argument("--project", default="100,1000", help="fleet sizes to project to")
    parser.add_argument("--no-converge", action="store_true", help="skip the converge run before each no-op run")
    parser.add_argument("--json", type=Path, help="write every figure as JSON")
    args = parser.parse_args()

    project = args.project_dir.resolve()
    forks = args.forks or configured_forks(project)
    sizes = [int(n) for n in args.hosts.split(",")]
    hosts = group_hosts(args.inventory, args.group)
    if max(sizes) > len(hosts):
        raise SystemExit(f"{args.group} has {len(hosts)} hosts; `make lab LAB_HOSTS={max(sizes)}` for more")
    commit = subprocess.run(["git", "-C", str(project), "describe", "--always", "--dirty"], capture_output=True, text=True)
    snapshot = project / ".snapshot-of"  # a copy of a working tree: the commit it was taken from
    where = commit.stdout.strip() or (f"a copy of {snapshot.read_text().strip()}+changes" if snapshot.exists() else "?")
    print(f"# {args.playbook} at {where} ({project}); forks {forks}; controller cores {args.cores}")

    rows = []
    for n in sizes:
        limit = hosts[:n]
        if not args.no_converge:
            rows.append({"run": "converge", **run_once(project, args.inventory, args.playbook, limit, forks)})
        rows.append({"run": "no-op", **run_once(project, args.inventory, args.playbook, limit, forks)})

    print()
    print("| hosts | run | wall s | controller CPU s | CPU s / host | remote calls | calls / host | module runs / host | changed |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['hosts']} | {r['run']} | {r['wall_s']:.1f} | {r['cpu_s']:.1f} | {r['cpu_s'] / r['hosts']:.1f} | "
            f"{r['remote_calls']} | {r['remote_calls'] / r['hosts']:.1f} | {r['module_runs'] / r['hosts']:.1f} | {r['changed']} |"
        )

    for r in rows:
        if r["changed_tasks"]:
            print(f"  changed in the {r['hosts']}-host {r['run']} run: {'; '.join(r['changed_tasks'])}")
    noop = [r for r in rows if r["run"] == "no-op"]
    xs = [float(r["hosts"]) for r in noop]
    cpu_a, cpu_b = fit(xs, [r["cpu_s"] for r in noop])
    call_a, call_b = fit(xs, [float(r["remote_calls"]) for r in noop])
    w1 = next((r["wall_s"] for r in noop if r["hosts"] == 1), min(r["wall_s"] / r["hosts"] for r in noop))
    print()
    print(
        f"Projection of a no-op run: CPU(N) = {cpu_a:.1f} + {cpu_b:.2f} N s; remote calls(N) = {call_a:.0f} + "
        f"{call_b:.1f} N; wall(N) >= max({w1:.1f} s x ceil(N / {forks}), CPU(N) / {args.cores} cores)"
    )
    print()
    print("| hosts | controller CPU s | remote calls | wall s, latency-bound | wall s, CPU-bound | wall, at least |")
    print("|---:|---:|---:|---:|---:|---:|")
    projection = []
    for n in (int(x) for x in args.project.split(",")):
        cpu = cpu_a + cpu_b * n
        latency = w1 * math.ceil(n / forks)
        cpu_bound = cpu / args.cores
        wall = max(latency, cpu_bound)
        projection.append({"hosts": n, "cpu_s": cpu, "remote_calls": call_a + call_b * n, "wall_s": wall})
        print(f"| {n} | {cpu:.0f} | {call_a + call_b * n:.0f} | {latency:.0f} | {cpu_bound:.0f} | {wall / 60:.1f} min |")

    biggest = max(noop, key=lambda r: r["hosts"])
    print()
    print(f"Remote module runs of the {biggest['hosts']}-host no-op run, per host, by task (the largest sources):")
    for role, task, count in biggest["top_tasks"]:
        print(f"  {count / biggest['hosts']:5.1f}  {role or '(play)'}: {task}")
    print(f"  (remote calls by tool: {biggest['remote_calls_by_tool']})")

    if args.json:
        args.json.write_text(json.dumps({"forks": forks, "cores": args.cores, "runs": rows, "projection": projection}, indent=2))


if __name__ == "__main__":
    main()
