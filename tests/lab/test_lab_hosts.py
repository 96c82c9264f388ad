"""The simulated L4 lab hosts (a STAND-IN for a real fleet) as `make lab` leaves them.

Assumes `make lab` ran. Every check goes through the real path: SSH as fleet + sudo, the lab
services over the hosts' own network, the generated inventory through ansible itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]
LAB_INVENTORY = ROOT / "inventories" / "lab"
LAB_GROUP = "l4-nodes"
# lab services on the machine's loopback (docs/design.md), by the names lab hosts know them by
LAB_SERVICES = {"lab-registry": 5000, "lab-apt": 8081, "lab-hf": 8090}
LabHost = Any  # conftest.LabHost (name, port, user, key)
SshRunner = Callable[..., subprocess.CompletedProcess[str]]

ANSIBLE_ENV = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def venv_tool(name: str) -> str:
    local = ROOT / ".venv" / "bin" / name
    return str(local) if local.exists() else (shutil.which(name) or name)


def expected_gpus(host: str) -> dict:
    """GPU description the lab was configured with: role default merged with playbooks/vars/lab.yml."""
    defaults = yaml.safe_load((ROOT / "lab/roles/lab_hosts/defaults/main.yml").read_text())
    overrides = yaml.safe_load((ROOT / "playbooks/vars/lab.yml").read_text()).get("lab_hosts_gpus") or {}
    return {**defaults["lab_hosts_gpus_default"], **overrides.get(host, {})}


def test_hosts_are_numbered_with_ssh_ports(lab_hosts: list[LabHost]) -> None:
    assert lab_hosts, "the lab inventory lists no host"
    for index, host in enumerate(lab_hosts, start=1):
        assert host.name == f"d3-lab-host{index}"
        assert host.port == 2200 + index


def test_fleet_logs_in_and_has_passwordless_sudo(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    for host in lab_hosts:
        out = lab_ssh(host, "id -un; hostname; sudo -n id -u").stdout.split()
        assert out == ["fleet", host.name, "0"], host


def test_password_login_is_refused(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    for host in lab_hosts:
        config = lab_ssh(host, "sudo -n sshd -T").stdout
        assert "passwordauthentication no" in config
        assert "permitrootlogin no" in config


def test_odd_hosts_run_trixie_even_hosts_bookworm(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    for index, host in enumerate(lab_hosts, start=1):
        codename = lab_ssh(host, ". /etc/os-release; echo $VERSION_CODENAME").stdout.strip()
        assert codename == ("trixie" if index % 2 else "bookworm"), host


def test_systemd_is_running(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    for host in lab_hosts:
        state = lab_ssh(host, "systemctl is-system-running --wait", check=False).stdout.strip()
        failed = lab_ssh(host, "systemctl --failed --no-legend --plain", check=False).stdout
        assert state == "running", f"{host.name}: {state}; failed units: {failed}"
        assert lab_ssh(host, "systemctl is-active ssh").stdout.strip() == "active"


def test_each_host_has_its_own_ssh_host_key(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    keys = {lab_ssh(host, "cat /etc/ssh/ssh_host_ed25519_key.pub").stdout.split()[1] for host in lab_hosts}
    assert len(keys) == len(lab_hosts)


def test_simulated_gpus_match_the_lab_configuration(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    for host in lab_hosts:
        want = expected_gpus(host.name)
        assert json.loads(lab_ssh(host, "cat /etc/lab-nvidia/gpus.json").stdout) == want
        nodes = lab_ssh(host, "stat -c '%n %F %t:%T' /dev/nvidia[0-9]* /dev/nvidiactl").stdout.splitlines()
        expected_nodes = [f"/dev/nvidia{i} character special file c3:{i:x}" for i in range(want["count"])]
        assert sorted(nodes) == sorted([*expected_nodes, "/dev/nvidiactl character special file c3:ff"])
        assert lab_ssh(host, "test -c /dev/nvidia-uvm", check=False).returncode == 0
        query = lab_ssh(
            host, "nvidia-smi --query-gpu=index,name,memory.total,compute_cap --format=csv,noheader,nounits"
        ).stdout.strip().splitlines()
        assert [[f.strip() for f in line.split(",")] for line in query] == [
            [str(i), want["name"], str(want["memory_mib"]), str(want["compute_cap"])] for i in range(want["count"])
        ]
        assert len(lab_ssh(host, "nvidia-smi -L").stdout.strip().splitlines()) == want["count"]


def test_driver_is_preinstalled_without_leaving_the_lab_repo_configured(
    lab_hosts: list[LabHost], lab_ssh: SshRunner
) -> None:
    for host in lab_hosts:
        status = lab_ssh(host, "dpkg-query -W -f '${db:Status-Status}' lab-nvidia-driver", check=False).stdout
        assert status == "installed", host
        # the lab's temporary driver source is gone; the only apt source that may name the lab is the one the
        # production toolkit role writes once site.yml has run on the host
        leftovers = lab_ssh(host, "grep -rl lab-apt /etc/apt/sources.list /etc/apt/sources.list.d", check=False).stdout.split()
        assert [f for f in leftovers if not f.endswith("/nvidia-container-toolkit.sources")] == [], leftovers
        assert lab_ssh(host, "test -e /etc/apt/keyrings/d3-lab-preprovision.asc", check=False).returncode != 0
        # the toolkit is never preinstalled by the lab: if nvidia-ctk is there, the production role put it there
        if lab_ssh(host, "command -v nvidia-ctk", check=False).returncode == 0:
            assert "/etc/apt/sources.list.d/nvidia-container-toolkit.sources" in leftovers, "toolkit present without the role's repo"


@pytest.mark.parametrize("service", sorted(LAB_SERVICES))
def test_hosts_reach_the_lab_services(service: str, lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    port = LAB_SERVICES[service]
    if not port_open(port):
        pytest.skip(f"{service} (127.0.0.1:{port}) is not running on this machine")
    path = {"lab-registry": "/v2/", "lab-apt": "/gpgkey", "lab-hf": "/api/models/vllm-sr/d3-edge/revision/main"}
    for host in lab_hosts:
        code = lab_ssh(host, f"curl -s -o /dev/null -w '%{{http_code}}' http://{service}:{port}{path[service]}")
        assert code.stdout == "200", f"{host.name} -> {service}:{port}: HTTP {code.stdout}"


def test_inventory_is_valid_and_carries_the_fleet_variables(lab_hosts: list[LabHost]) -> None:
    result = subprocess.run(
        [venv_tool("ansible-inventory"), "-i", str(LAB_INVENTORY), "--list"],
        capture_output=True, text=True, check=True, env=ANSIBLE_ENV, cwd=ROOT,
    )  # fmt: skip
    inventory = json.loads(result.stdout)
    assert inventory[LAB_GROUP]["hosts"] == [h.name for h in lab_hosts]
    hostvars = inventory["_meta"]["hostvars"]
    for index, host in enumerate(lab_hosts, start=1):
        hv = hostvars[host.name]
        assert hv["ansible_become"] is True
        assert Path(hv["ansible_ssh_private_key_file"]).is_file()
        assert hv["d3_models"], host
        if index == 1:
            assert [m["model"] for m in hv["d3_models"]] == ["d3", "d3-mini", "d3-edge"]
        assert hv["d3_weights_hf_endpoint"] == "http://lab-hf:8090"
        assert hv["d3_image_registry_mirrors"] == [{"prefix": "docker.io", "location": "lab-registry:5000", "insecure": True}]
        assert "lab-apt:8081" in hv["nvidia_toolkit_repo_url"]
    revisions_file = Path("/var/lib/d3-lab/hf-revisions.json")
    if revisions_file.is_file():
        repos = json.loads(revisions_file.read_text())
        revisions = hostvars[lab_hosts[0].name]["d3_model_revisions"]
        assert revisions == {repo.split("/")[-1]: sha for repo, sha in repos.items()}
        assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in revisions.values())


def test_ansible_reaches_every_host_with_become(lab_hosts: list[LabHost]) -> None:
    result = subprocess.run(
        [venv_tool("ansible"), "-i", str(LAB_INVENTORY), LAB_GROUP, "-b", "-m", "ansible.builtin.command",
         "-a", "id -u", "-o"],
        capture_output=True, text=True, env=ANSIBLE_ENV, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for host in lab_hosts:
        assert re.search(rf"^{host.name} \| CHANGED \| rc=0 \| \(stdout\) 0$", result.stdout, re.M), result.stdout
    ping = subprocess.run(
        [venv_tool("ansible"), "-i", str(LAB_INVENTORY), LAB_GROUP, "-m", "ansible.builtin.ping", "-b", "-o"],
        capture_output=True, text=True, env=ANSIBLE_ENV, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert ping.returncode == 0, ping.stdout + ping.stderr
    for host in lab_hosts:
        assert re.search(rf"^{host.name} \| SUCCESS => .*pong", ping.stdout, re.M), ping.stdout


def podman_json(*args: str) -> Any:
    return json.loads(subprocess.run(["podman", *args], capture_output=True, text=True, check=True).stdout)


def test_make_lab_recreates_a_host_whose_processes_were_killed(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    """What a stopped session leaves behind (and broke CI once): podman still lists the host as running, but its
    processes are gone, so exec fails and it can be neither started nor restarted. The lab playbook must notice,
    re-create and provision it. Runs last in this file: the host comes back fresh (not converged)."""
    host = lab_hosts[-1]
    others = {h.name: podman_json("inspect", h.name)[0]["State"]["StartedAt"] for h in lab_hosts[:-1]}
    before = podman_json("inspect", host.name)[0]
    for pid in (before["State"]["ConmonPid"], before["State"]["Pid"]):  # conmon first: nobody records the exit
        os.kill(pid, 9)
    assert podman_json("inspect", host.name)[0]["State"]["Status"] == "running"
    assert subprocess.run(["podman", "exec", host.name, "true"], capture_output=True, check=False).returncode != 0

    env = {**ANSIBLE_ENV, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    lab = subprocess.run(
        [venv_tool("ansible-playbook"), "playbooks/lab.yml", "-e", f"lab_hosts_count={len(lab_hosts)}"],
        capture_output=True, text=True, env=env, cwd=ROOT, timeout=900, check=False,
    )  # fmt: skip
    assert lab.returncode == 0, lab.stdout[-3000:] + lab.stderr[-2000:]
    after = podman_json("inspect", host.name)[0]
    assert after["Id"] != before["Id"]
    assert after["State"]["Status"] == "running"
    assert lab_ssh(host, "sudo -n systemctl is-system-running --wait", check=False).stdout.strip() in ("running", "degraded")
    # the healthy hosts are kept as they were (not restarted)
    assert {name: podman_json("inspect", name)[0]["State"]["StartedAt"] for name in others} == others
