"""The simulated L4 lab hosts (a STAND-IN for a real fleet) as `make lab` leaves them.

Assumes `make lab` ran. Every check goes through the real path: SSH as fleet + sudo, the lab
services over the hosts' own network, the generated inventory through ansible itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import ansible.module_utils
import pytest
import yaml
from labkit import (
    ANSIBLE_ENV,
    LAB_GROUP,
    LAB_INVENTORY,
    LAB_SERVICES,
    LAB_STATE,
    ROOT,
    LabHost,
    Run,
    ansible_playbook,
    podman,
    podman_json,
    port_open,
    venv_tool,
)

pytestmark = pytest.mark.lab

SshRunner = Callable[..., subprocess.CompletedProcess[str]]
LAB_VARS = yaml.safe_load((ROOT / "lab/vars/lab.yml").read_text())


def expected_gpus(host: str) -> dict:
    """GPU description the lab was configured with: role default merged with lab/vars/lab.yml."""
    defaults = yaml.safe_load((ROOT / "lab/roles/lab_hosts/defaults/main.yml").read_text())
    overrides = yaml.safe_load((ROOT / "lab/vars/lab.yml").read_text()).get("lab_hosts_gpus") or {}
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
    assert port_open(port), f"{service} (127.0.0.1:{port}) is not running on this machine: run `make lab`"
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
    for host in lab_hosts:
        hv = hostvars[host.name]
        assert hv["ansible_become"] is True
        assert Path(hv["ansible_ssh_private_key_file"]).is_file()
        want_models = LAB_VARS["lab_hosts_models"].get(host.name, LAB_VARS["lab_hosts_models_default"])
        assert want_models, host
        assert hv["d3_models"] == want_models, host
        for key, value in LAB_VARS["lab_hosts_inventory_group_vars"].items():
            assert hv[key] == value, (host.name, key)
        assert hv["d3_weights_hf_endpoint"] == "http://lab-hf:8090"
        assert hv["d3_image_registry_mirrors"] == [{"prefix": "docker.io", "location": "lab-registry:5000", "insecure": True}]
        # the toolkit repository and its key over the lab apt server's https port (lab CA), the key pinned by fingerprint
        assert hv["nvidia_toolkit_repo_url"].startswith("https://lab-apt:8443/")
        assert hv["nvidia_toolkit_key_url"] == "https://lab-apt:8443/gpgkey"
        assert re.fullmatch(r"[0-9A-F]{40}", hv["nvidia_toolkit_key_fingerprint"]), hv.get("nvidia_toolkit_key_fingerprint")
    assert [m["model"] for m in hostvars[lab_hosts[0].name]["d3_models"]] == ["d3", "d3-mini", "d3-edge"]
    revisions_file = LAB_STATE / "hf-revisions.json"
    assert revisions_file.is_file(), f"{revisions_file} is missing: run `make lab`"
    repos = json.loads(revisions_file.read_text())
    want_revisions = {repo.split("/")[-1]: sha for repo, sha in repos.items()}
    assert all(re.fullmatch(r"[0-9a-f]{40}", sha) for sha in want_revisions.values()), want_revisions
    for host in lab_hosts:
        assert hostvars[host.name]["d3_model_revisions"] == want_revisions, host.name


def test_ansible_reaches_every_host_with_become(lab_hosts: list[LabHost], lab_ssh: SshRunner) -> None:
    result = subprocess.run(
        [venv_tool("ansible"), "-i", str(LAB_INVENTORY), LAB_GROUP, "-b", "-m", "ansible.builtin.command",
         "-a", "id -u", "-o"],
        capture_output=True, text=True, env=ANSIBLE_ENV, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    for host in lab_hosts:
        assert re.search(rf"^{host.name} \| CHANGED \| rc=0 \| \(stdout\) 0$", result.stdout, re.M), result.stdout
    # the lab's AnsiballZ bytecode cache (LAB SPEED AID, lab_hosts' provisioning; tests/test_lab_ansiballz_cache.py):
    # after a module call root's cache holds the controller's ansible.module_utils.basic, source byte for byte, and
    # the next call reads that entry instead of compiling and writing a new one (its inode stays)
    basic = hashlib.sha256((Path(ansible.module_utils.__file__).parent / "basic.py").read_bytes()).hexdigest()
    read = (
        "sudo python3 -c 'import glob, hashlib, marshal, os; "
        'p, = glob.glob("/root/.cache/d3-lab-ansiballz/*.opt-0/ansible%module_utils%basic.py.code"); '
        'print(hashlib.sha256(marshal.load(open(p, "rb"))[1]).hexdigest(), os.stat(p).st_ino)\''
    )
    entries = {host.name: lab_ssh(host, read).stdout.split() for host in lab_hosts}
    for host in lab_hosts:
        assert entries[host.name][0] == basic, f"{host.name}: no AnsiballZ cache entry for this ansible-core"
    ping = subprocess.run(
        [venv_tool("ansible"), "-i", str(LAB_INVENTORY), LAB_GROUP, "-m", "ansible.builtin.ping", "-b", "-o"],
        capture_output=True, text=True, env=ANSIBLE_ENV, cwd=ROOT, timeout=120,
    )  # fmt: skip
    assert ping.returncode == 0, ping.stdout + ping.stderr
    for host in lab_hosts:
        assert re.search(rf"^{host.name} \| SUCCESS => .*pong", ping.stdout, re.M), ping.stdout
        assert lab_ssh(host, read).stdout.split() == entries[host.name], f"{host.name}: the cache entry was rewritten"


def test_make_lab_recreates_a_host_whose_processes_were_killed(
    lab_hosts: list[LabHost], lab_ssh: SshRunner
) -> None:
    """What a stopped session leaves behind (and broke CI once): podman still lists the host as running, but its
    processes are gone, so exec fails and it can be neither started nor restarted. The lab playbook must notice,
    re-create and provision it: a host whose systemd is `running` (not degraded) with the same simulated GPUs. The
    host comes back fresh (not converged): the next test checks that the session's converge, which follows, turns its
    GPUs into a CDI spec naming each of them."""
    host = lab_hosts[-1]
    gpus = expected_gpus(host.name)
    smi_before = lab_ssh(host, "nvidia-smi -L").stdout
    assert len(smi_before.splitlines()) == gpus["count"], smi_before
    others = {h.name: podman_json("inspect", h.name)[0]["State"]["StartedAt"] for h in lab_hosts[:-1]}
    before = podman_json("inspect", host.name)[0]
    for pid in (before["State"]["ConmonPid"], before["State"]["Pid"]):  # conmon first: nobody records the exit
        os.kill(pid, 9)
    assert podman_json("inspect", host.name)[0]["State"]["Status"] == "running"
    assert podman("exec", host.name, "true").returncode != 0

    # as `make lab LAB_SKIP_IMAGES=1`: the images are the session's `make lab`'s, and what is under test is the hosts
    lab = ansible_playbook("lab/lab.yml", "-e", f"lab_hosts_count={len(lab_hosts)}", "--skip-tags", "images")
    assert lab.returncode == 0, lab.stdout[-3000:] + lab.stderr[-2000:]
    after = podman_json("inspect", host.name)[0]
    assert after["Id"] != before["Id"]
    assert after["State"]["Status"] == "running"
    state = lab_ssh(host, "sudo -n systemctl is-system-running --wait", check=False, timeout=120).stdout.strip()
    failed = lab_ssh(host, "systemctl --failed --no-legend --plain", check=False).stdout
    assert state == "running", f"{host.name}: {state}; failed units: {failed}"
    # the same simulated GPUs (names and UUIDs), as device nodes and through nvidia-smi
    assert lab_ssh(host, "nvidia-smi -L").stdout == smi_before
    assert json.loads(lab_ssh(host, "cat /etc/lab-nvidia/gpus.json").stdout) == gpus
    # the healthy hosts are kept as they were (not restarted)
    assert {name: podman_json("inspect", name)[0]["State"]["StartedAt"] for name in others} == others


def test_the_converge_finds_every_gpu_of_the_re_created_host(lab_hosts: list[LabHost], lab_ssh: SshRunner, converge_run: Run) -> None:
    """The host the previous test re-created (it runs first: conftest.FIRST_MODULES, before the session's one converge)
    converged like the others: the NVIDIA toolkit role's CDI spec names every simulated GPU by index and maps its
    device node."""
    host = lab_hosts[-1]
    gpus = expected_gpus(host.name)
    listed = lab_ssh(host, "nvidia-ctk cdi list").stdout.split()
    want = [f"nvidia.com/gpu={i}" for i in range(gpus["count"])]
    assert set(want) <= set(listed), listed
    spec_text = lab_ssh(host, "sudo -n cat /var/run/cdi/nvidia.yaml 2>/dev/null || sudo -n cat /etc/cdi/nvidia.yaml").stdout
    spec = yaml.safe_load(spec_text)
    by_name = {d["name"]: d for d in spec["devices"]}
    for i in range(gpus["count"]):
        nodes = [n["path"] for n in by_name[str(i)]["containerEdits"]["deviceNodes"]]
        assert f"/dev/nvidia{i}" in nodes, (i, nodes)
    # that spec is the session converge's: its toolkit role ran on the host and changed it (the host came back fresh)
    assert "nvidia_toolkit" in converge_run.roles_run(host.name)
    assert converge_run.changed(host.name) > 0, host.name
