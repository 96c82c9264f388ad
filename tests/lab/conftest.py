"""Shared fixtures for the lab's own tests (tests/lab/, all @pytest.mark.lab).

The lab is a STAND-IN for a real L4 fleet; these fixtures read what `make lab` generated
(inventories/lab/) and talk to the lab hosts the way a fleet is reached: SSH as `fleet`.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "inventories" / "lab"
LAB_GROUP = "l4-nodes"


@dataclass(frozen=True)
class LabHost:
    name: str
    port: int
    user: str
    key: str


@pytest.fixture(scope="session")
def lab_inventory() -> dict:
    hosts_file = LAB_INVENTORY / "hosts.yml"
    if not hosts_file.is_file():
        pytest.skip("no lab inventory: run `make lab` first")
    return yaml.safe_load(hosts_file.read_text())


@pytest.fixture(scope="session")
def lab_hosts(lab_inventory: dict) -> list[LabHost]:
    group = lab_inventory["all"]["children"][LAB_GROUP]
    gvars = group["vars"]
    return [
        LabHost(name, int(hvars["ansible_port"]), gvars["ansible_user"], gvars["ansible_ssh_private_key_file"])
        for name, hvars in group["hosts"].items()
    ]


SshRunner = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture(scope="session")
def lab_ssh() -> SshRunner:
    """Run a shell command on a lab host over SSH as the fleet user: lab_ssh(host, "cmd")."""

    def run(host: LabHost, command: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        argv = [
            "ssh", "-i", host.key, "-p", str(host.port),
            "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
            "-o", "LogLevel=ERROR", "-o", "ConnectTimeout=5",
            f"{host.user}@127.0.0.1", command,
        ]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, check=check, timeout=timeout)

    return run
