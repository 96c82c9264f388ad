"""Lab tests for the real-stack contracts (issue 8), each on the shared converged lab fleet, each restoring it:
API key rotation on Debian 12 (podman 4.3, classic units) and Debian 13 (podman 5.4, Quadlet), two instances on
one GPU (refused above the share cap, started one after the other within it), and a driver at R570 refused, then
accepted with d3_cuda_compat. (A lab host restarted with an empty /var/run/cdi: test_drills.py, drill 2.)

The lab is a STAND-IN (lab/README.md): GPUs, driver and vLLM are simulated at the interfaces the roles use."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import labkit
import pytest
from labkit import on_host, run_playbook, unit_state

pytestmark = pytest.mark.lab

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts" / "vllm"
UNAUTHORIZED = json.loads((CONTRACTS / "unauthorized.json").read_text())


# A run that only re-renders units and restarts what changed: the read-only head (preflight, plan, every role's input
# checks: tag always), podman and image (the units need their facts), the units, the smoke test and the record.
UNITS_ONLY = "--tags units,smoke,state"


def ports(host: str) -> list[int]:
    """The ports of the D3 instances on a host, from its deployed units (podman inspect labels + args)."""
    found = []
    for info in labkit.d3_containers(host).values():
        args = info["Config"]["Cmd"] or info["Args"]
        found.append(int(args[args.index("--port") + 1]))
    assert found, f"{host}: no D3 container"
    return sorted(found)


def http(host: str, port: int, path: str, key: str | None = None) -> tuple[int, str]:
    """(status, body) of a GET from inside the lab host (where vLLM listens on 127.0.0.1)."""
    header = f"-H 'Authorization: Bearer {key}'" if key else ""
    out = on_host(host, f"curl -s -o /tmp/body -w '%{{http_code}}' {header} http://127.0.0.1:{port}{path}; echo; cat /tmp/body")
    status, _, body = out.partition("\n")
    return int(status), body


def converge(limit: str, **extravars: Any) -> labkit.Run:
    return run_playbook("site.yml", limit=limit, extravars=extravars, cmdline=UNITS_ONLY)


def test_api_key_rotates_on_both_podman_generations(converged: list[str]) -> None:
    hosts = labkit.host_per_suite(converged)
    limit = ",".join(sorted(hosts.values()))
    old, new = "lab-key-one-1f2e3d4c", "lab-key-two-9a8b7c6d"
    try:
        first = converge(limit, d3_units_api_key=old)
        assert first.status == "successful", first.failure_text()
        for host in hosts.values():
            port = ports(host)[0]
            status, body = http(host, port, "/v1/models")
            assert (status, json.loads(body)) == (UNAUTHORIZED["status"], UNAUTHORIZED["body"]), (host, status, body)
            assert http(host, port, "/v1/models", old)[0] == 200
            assert http(host, port, "/health")[0] == 200  # vLLM guards /v1 only
        rotated = run_playbook("site.yml", limit=limit, extravars={"d3_units_api_key": new}, cmdline=f"{UNITS_ONLY} -vvv")
        assert rotated.status == "successful", rotated.failure_text()
        # the key appears nowhere: the -vvv runner output and events, the journal, unit files and everything under
        # /etc and /var/lib/d3, ps (issue 11)
        assert new not in rotated.stdout and new not in json.dumps(rotated.events), "the key is in the -vvv output"
        for host in hosts.values():
            where = on_host(host, f"grep -rIl -- '{new}' /etc /var/lib/d3 2>/dev/null; "
                                  f"journalctl --no-pager -o cat | grep -c -- '{new}'; ps auxww | grep -v grep | grep -c -- '{new}'",
                            check=False).split()  # fmt: skip
            assert where == ["0", "0"], f"{host}: the key is in {where}"
        for host in hosts.values():
            for port in ports(host):
                assert http(host, port, "/v1/models", old)[0] == 401, (host, port)
                assert http(host, port, "/v1/models", new)[0] == 200, (host, port)
            assert on_host(host, "stat -c '%a %U' /var/lib/d3/api-key.sha256").split() == ["600", "root"]
            leaked = on_host(host, f"grep -rl -- '{new}' /etc/systemd/system /etc/containers /var/lib/d3 || true")
            assert leaked.strip() == "", f"{host}: the key is in {leaked}"
        again = converge(limit, d3_units_api_key=new)
        assert again.status == "successful", again.failure_text()
        for host in hosts.values():
            assert again.changed(host) == 0, (host, again.changed_tasks(host))
    finally:
        restored = converge(limit)
    assert restored.status == "successful", restored.failure_text()
    for host in hosts.values():
        assert on_host(host, "podman secret ls --format '{{.Name}}'").strip() == ""
        assert http(host, ports(host)[0], "/v1/models")[0] == 200


def _lite(name: str, share: str) -> dict[str, Any]:
    return {"model": "d3-lite", "name": name, "gpus": [0], "extra_args": [f"--gpu-memory-utilization={share}"]}


def test_two_instances_on_one_gpu(converged: list[str]) -> None:
    host = labkit.host_per_suite(converged)["trixie"]
    before = unit_state(host)
    over = converge(host, d3_models=[_lite("lite-a", "0.5"), _lite("lite-b", "0.5")])
    assert over.status == "failed"
    assert f"host {host}: d3_models[1] (lite-b): VRAM over budget on GPU 0" in over.failure_text(host)
    assert "d3_gpu_share_cap" in over.failure_text(host)
    assert unit_state(host) == before
    try:
        shared = converge(host, d3_models=[_lite("lite-a", "0.45"), _lite("lite-b", "0.45")])
        assert shared.status == "successful", shared.failure_text()
        unit_b = on_host(host, "cat /etc/containers/systemd/lite-b.container")
        assert "After=lite-a.service" in unit_b
        assert "ExecStartPost=/usr/local/libexec/d3-fleet/d3-wait-ready" in on_host(host, "cat /etc/containers/systemd/lite-a.container")
        smi = on_host(host, "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits")
        used, total = (int(x) for x in smi.splitlines()[0].split(",")[1:])
        assert used >= 0.9 * total * 0.9, f"GPU 0 should hold both shares: {smi}"
        for port in ports(host):
            assert http(host, port, "/health")[0] == 200
    finally:
        restored = converge(host)
    assert restored.status == "successful", restored.failure_text()


def test_driver_r570_refused_then_run_in_cuda_compat(converged: list[str]) -> None:
    host = labkit.host_per_suite(converged)["trixie"]
    on_host(host, "/usr/lib/lab-nvidia/lab-nvidia-setup --driver-version 570.195.03")
    try:
        before = unit_state(host)
        refused = converge(host)
        assert refused.status == "failed"
        text = refused.failure_text(host)
        assert f"host {host}: NVIDIA driver 570.195.03 is older than R580" in text, text
        assert "d3_cuda_compat: true" in text
        assert unit_state(host) == before
        compat = converge(host, d3_cuda_compat=True)
        assert compat.status == "successful", compat.failure_text()
        for info in labkit.d3_containers(host).values():
            assert "VLLM_ENABLE_CUDA_COMPATIBILITY=1" in info["Config"]["Env"]
    finally:
        on_host(host, "/usr/lib/lab-nvidia/lab-nvidia-setup --driver-version default")
        restored = converge(host)
    assert restored.status == "successful", restored.failure_text()


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_stopping_one_instance_leaves_the_others_running(converged: list[str], suite: str) -> None:
    """On a real host each container has its own cgroups: stopping one instance (a rollout's restart, a prune, an
    operator's systemctl stop) must not touch the others. The nested lab once broke this on Debian 12 (one shared v1
    cgroup: crun's delete killed every instance of the host; lab/images/containers-cgroupfs.conf)."""
    host = labkit.host_per_suite(converged, fewest=False)[suite]
    before = labkit.d3_containers(host)
    assert len(before) >= 2, f"{host}: the test needs two instances, found {sorted(before)}"
    victim, *others = sorted(before)
    restarts = {n: on_host(host, f"systemctl show -p NRestarts --value {n}.service").strip() for n in others}
    on_host(host, f"systemctl stop {victim}.service")
    try:
        assert on_host(host, f"systemctl is-active {victim}.service", check=False).strip() == "inactive"
        # a killed instance is restarted by systemd RestartSec later (d3_units_restart_sec; the lab's is short): look
        # past that
        deadline = time.monotonic() + labkit.restart_sec(host, victim) + 2
        while time.monotonic() < deadline:
            now = labkit.d3_containers(host)
            for name in others:
                assert name in now and now[name]["State"]["Status"] == "running", (name, now.get(name, {}).get("State"))
                assert now[name]["State"]["Pid"] == before[name]["State"]["Pid"], f"{host}: {name} was restarted"
            time.sleep(1)
        after = {n: on_host(host, f"systemctl show -p NRestarts --value {n}.service").strip() for n in others}
        assert after == restarts, f"{host}: systemd restarted {after} (before {restarts})"
    finally:
        on_host(host, f"systemctl start --no-block {victim}.service")
    port = int(before[victim]["Config"]["Cmd"][before[victim]["Config"]["Cmd"].index("--port") + 1])

    def serving() -> bool:
        try:
            return http(host, port, "/health")[0] == 200
        except AssertionError:
            return False

    labkit.wait_until(f"{host}: {victim} serving again", serving, timeout=120, poll=0.5)
