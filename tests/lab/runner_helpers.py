"""Drive the project's playbooks against the lab with ansible-runner, and read lab hosts from the outside."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ansible_runner
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "inventories" / "lab"
# ansible-runner starts ansible-playbook from PATH: use the one next to this Python (the project's .venv)
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@dataclass
class Run:
    status: str
    rc: int
    stats: dict[str, Any]
    events: list[dict[str, Any]]
    stdout: str

    def failures(self, host: str | None = None) -> list[dict[str, Any]]:
        return [
            e["event_data"]
            for e in self.events
            if e.get("event") == "runner_on_failed" and (host is None or e["event_data"].get("host") == host)
        ]

    def failure_text(self, host: str | None = None) -> str:
        return "\n".join(json.dumps(f.get("res", {}).get("msg", f.get("res"))) for f in self.failures(host))

    def tasks_run(self, host: str) -> list[str]:
        """Names of tasks that ran (ok, changed or failed, not skipped) on the host."""
        kinds = {"runner_on_ok", "runner_on_failed"}
        return [e["event_data"]["task"] for e in self.events if e.get("event") in kinds and e["event_data"].get("host") == host]

    def changed(self, host: str) -> int:
        return int(self.stats.get("changed", {}).get(host, 0))

    def failed(self, host: str) -> int:
        return int(self.stats.get("failures", {}).get(host, 0))


def run_playbook(
    playbook: str,
    limit: str | None = None,
    extravars: dict[str, Any] | None = None,
    cmdline: str | None = None,
    inventory: Path = LAB_INVENTORY,
    timeout: int = 1800,
) -> Run:
    with tempfile.TemporaryDirectory(prefix="d3-runner-") as pdd:
        result = ansible_runner.run(
            private_data_dir=pdd,
            project_dir=str(ROOT),
            playbook=playbook,
            inventory=str(inventory),
            limit=limit,
            extravars=extravars or {},
            cmdline=cmdline,
            envvars={"ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1"},
            quiet=True,
            timeout=timeout,
            suppress_env_files=True,
        )
        events = list(result.events)
        return Run(result.status, result.rc, result.stats or {}, events, result.stdout.read())


def lab_hosts() -> list[str]:
    data = yaml.safe_load((LAB_INVENTORY / "hosts.yml").read_text())
    return sorted(data["all"]["children"]["l4-nodes"]["hosts"])


def on_host(host: str, script: str, check: bool = True) -> str:
    """Run a shell script inside a lab host container (the lab's own access, not the roles')."""
    proc = subprocess.run(["podman", "exec", host, "sh", "-c", script], capture_output=True, text=True, timeout=120, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"{host}: {script!r} failed: {proc.stderr}")
    return proc.stdout


def unit_state(host: str) -> dict[str, str]:
    """What a unit change would alter: D3 unit files (path -> mtime) and containers (name -> start time, image)."""
    files = on_host(
        host,
        "for f in /etc/containers/systemd/*.container /etc/systemd/system/*.service; do"
        ' grep -qs io.d3-fleet.instance= "$f" && echo "$f $(stat -c %Y "$f")"; done; true',
    )
    containers = on_host(host, "podman ps --format '{{.Names}} {{.StartedAt}} {{.ImageName}}' 2>/dev/null || true")
    state = {line.split()[0]: line for line in files.splitlines() if line}
    state.update({f"ctr:{line.split()[0]}": line for line in containers.splitlines() if line})
    return state


def host_vars(host: str) -> dict[str, Any]:
    return yaml.safe_load((LAB_INVENTORY / "host_vars" / f"{host}.yml").read_text()) or {}
