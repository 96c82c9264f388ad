"""Lab tests for the real-stack contracts (issues 8, 11, 16), on the shared converged lab fleet, each restoring it:
API key rotation on Debian 12 (podman 4.3, classic units) and Debian 13 (podman 5.4, Quadlet), two instances on
one GPU (refused above the share cap, started one after the other within it), a driver at R570 refused, then
accepted with d3_cuda_compat, the 27B's official FP8 checkpoint, and the optional firewall: the five in one sequence
of runs on one pair of hosts (each run sets up the next step, so a run serves several contracts); stopping one
instance leaves the others running. (A lab host restarted with an empty /var/run/cdi: test_drills.py, drill 2.)

The lab is a STAND-IN (lab/README.md): GPUs, driver and vLLM are simulated at the interfaces the roles use."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import labkit
import pytest
import yaml
from labkit import on_host, run_playbook, unit_state

pytestmark = pytest.mark.lab

CONTRACTS = Path(__file__).resolve().parents[1] / "contracts" / "vllm"
UNAUTHORIZED = json.loads((CONTRACTS / "unauthorized.json").read_text())
CATALOG = yaml.safe_load((labkit.ROOT / "roles/d3/vars/main.yml").read_text())["d3_catalog"]


# A run that re-renders units and restarts what changed: the read-only head (preflight, plan, every role's input checks:
# tag always), podman and image (the units need their facts), the weights (the FP8 checkpoint), the firewall, the
# units, the smoke test and the record; the toolkit has nothing to change.
UNITS_ONLY = "--tags weights,firewall,units,smoke,state"
# the firewall's stand-in client is the lab host itself, from its own non-loopback address (slirp4netns' tap0): the
# packets come from that address, allowed in one run, not in the other. Every lab host plans an instance on
# d3_port_base (8000) and listens on every address (d3_listen_address 0.0.0.0, for the lab's router); the port that
# is not a model port is a stand-in listener (python3 http.server, labelled in its page) on that address.
PLANNED_PORT = 8000
OTHER_PORT = 18099  # not a model port: never filtered
LISTENERS = f"""
set -eu
addr=$(ip -4 -o addr show scope global | awk '{{print $4}}' | cut -d/ -f1 | head -n1)
mkdir -p /run/d3-fw-test && echo 'd3-fw-test stand-in listener' > /run/d3-fw-test/index.html
setsid python3 -m http.server {OTHER_PORT} --bind "$addr" --directory /run/d3-fw-test >/dev/null 2>&1 < /dev/null &
for _ in $(seq 50); do curl -s -o /dev/null "http://$addr:{OTHER_PORT}/" --max-time 1 && break; sleep 0.1; done
echo "$addr"
"""
STOP_LISTENERS = "pkill -f 'http.server .*--directory /run/d3-fw-test' || true; rm -rf /run/d3-fw-test"


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


def reach(host: str, url: str, key: str | None = None) -> bool:
    """The stand-in listener's page, or the instance's model list (vLLM's /v1/models: {"object": "list", ...})."""
    header = f"-H 'Authorization: Bearer {key}'" if key else ""
    out = on_host(host, f"curl -s --max-time 3 {header} {url} || true", check=False)
    return "d3-fw-test stand-in listener" in out or '"object":"list"' in out.replace(" ", "")


def converge(limit: str, **extravars: Any) -> labkit.Run:
    return run_playbook("site.yml", limit=limit, extravars=extravars, cmdline=UNITS_ONLY)


def _lite(name: str, share: str) -> dict[str, Any]:
    return {"model": "d3-lite", "name": name, "gpus": [0], "extra_args": [f"--gpu-memory-utilization={share}"]}


def per_host(values: dict[str, Any]) -> str:
    """An extra var that differs per host (one run, each host its own value): templated on inventory_hostname."""
    return "{{ " + json.dumps(values) + "[inventory_hostname] }}"


def firewall(clients: list[str]) -> dict[str, Any]:
    """The firewall on, letting `clients` in. With the firewall on and d3-monitors in the inventory, a run whose
    d3_firewall_monitors is empty is refused (d3_fleet_problems: the monitor could not scrape); the same list stands in
    for the monitor's address (the lab's monitor is reached at 127.0.0.1, so the check cannot see its address; these
    runs' tags leave the monitor out)."""
    return {"d3_firewall_enabled": True, "d3_allowed_clients": clients, "d3_firewall_monitors": clients}


def test_one_pair_of_hosts_through_real_stack_contracts_and_back(converged: list[str]) -> None:
    """Five real-stack contracts on one pair of hosts (the trixie and the bookworm host with the fewest instances), in
    one sequence of runs (each run sets up the next step; the last restores both hosts):

    - two instances on one GPU (trixie): refused above the share cap, nothing changed; within it, started one after
      the other (After=, d3-wait-ready), GPU 0 holds both shares, both serve;
    - a driver at R570 (trixie): refused without d3_cuda_compat, nothing changed; with it, every instance runs with
      VLLM_ENABLE_CUDA_COMPATIBILITY=1;
    - the 27B's official FP8 checkpoint (trixie, variant fp8 on two free GPUs, issue 16): vllm-sr/d3-FP8 at its pinned
      revision without --quantization (the simulator detects compressed-tensors from config.json like vLLM), the bytes
      downloaded are the mirror's files of that revision, whose metadata carries the catalog's size; it passes the
      smoke test (the default BF16 27B: test_variants.py, on the converged fleet);
    - the API key rotated on Debian 12 (podman 4.3, classic units) and Debian 13 (podman 5.4, Quadlet): the old key
      refused, the new one accepted on every instance, the key in no output, log, file or process list, a second run
      with the same key changes nothing, and no key left after the restore;
    - the optional firewall (d3_firewall, nftables table inet d3_fleet; nftables 1.1 and 1.0): a client outside
      d3_allowed_clients cannot reach a model port while loopback and a port that is not a model port can; inside
      them it gets answers; a second run changes nothing; the unit reloads the rules (as at boot); off removes it."""
    hosts = labkit.host_per_suite(converged)
    trixie, bookworm = hosts["trixie"], hosts["bookworm"]
    limit = ",".join(sorted(hosts.values()))
    old, new = "lab-key-one-1f2e3d4c", "lab-key-two-9a8b7c6d"
    setup = "/usr/lib/lab-nvidia/lab-nvidia-setup"
    revisions = yaml.safe_load((labkit.LAB_INVENTORY / "group_vars" / labkit.LAB_GROUP / "lab.yml").read_text())["d3_model_revisions"]
    fp8_spec = CATALOG["d3"]["variants"]["fp8"]
    before = unit_state(trixie)
    serving = {host: sorted(labkit.d3_containers(host)) for host in hosts.values()}
    assert "d3-27b" not in serving[trixie], serving

    # every step below is inside the try: whatever fails (even the over-cap run succeeding, the regression it guards
    # against), the finally gives the pair back its driver, its inventory's models and no listener
    try:
        # refused before any change: two shares of 0.5 on one GPU (over d3_gpu_share_cap), then a driver at R570
        over = converge(trixie, d3_models=[_lite("lite-a", "0.5"), _lite("lite-b", "0.5")])
        assert over.status == "failed"
        assert f"host {trixie}: d3_models[1] (lite-b): VRAM over budget on GPU 0" in over.failure_text(trixie)
        assert "d3_gpu_share_cap" in over.failure_text(trixie)
        assert unit_state(trixie) == before
        addresses = {host: on_host(host, LISTENERS).strip().splitlines()[-1] for host in hosts.values()}
        on_host(trixie, f"{setup} --driver-version 570.195.03")
        refused = converge(trixie)
        assert refused.status == "failed"
        text = refused.failure_text(trixie)
        assert f"host {trixie}: NVIDIA driver 570.195.03 is older than R580" in text, text
        assert "d3_cuda_compat: true" in text
        assert unit_state(trixie) == before
        # nothing filters before the firewall role runs: every listener answers
        for host, addr in addresses.items():
            assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), host

        # the trixie host: two d3-lite at 0.45 on GPU 0 and the FP8 27B on GPUs 2-3, in CUDA compatibility mode; both
        # hosts: the old key, and the firewall letting in documentation networks only
        shared = {"d3_models": per_host({trixie: [_lite("lite-a", "0.45"), _lite("lite-b", "0.45"),
                                                  {"model": "d3", "variant": "fp8", "gpus": [2, 3]}],
                                         bookworm: labkit.host_vars(bookworm)["d3_models"]}),
                  "d3_cuda_compat": per_host({trixie: True, bookworm: False})}  # fmt: skip
        first = converge(limit, d3_units_api_key=old, **shared, **firewall(["192.0.2.0/24", "2001:db8::/64"]))
        assert first.status == "successful", first.failure_text()
        for host in hosts.values():
            assert "d3_smoke" in first.roles_run(host), f"{host}: the smoke test did not run"
        # two on one GPU
        assert "After=lite-a.service" in on_host(trixie, "cat /etc/containers/systemd/lite-b.container")
        wait_ready = "ExecStartPost=/usr/local/libexec/d3-fleet/d3-wait-ready"
        assert wait_ready in on_host(trixie, "cat /etc/containers/systemd/lite-a.container")
        smi = on_host(trixie, "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv,noheader,nounits")
        used, total = (int(x) for x in smi.splitlines()[0].split(",")[1:])
        assert used >= 0.9 * total * 0.9, f"GPU 0 should hold both shares: {smi}"
        assert sorted(labkit.d3_containers(trixie)) == ["d3-27b", "lite-a", "lite-b"]
        # R570 in CUDA compatibility mode (the trixie host only)
        for info in labkit.d3_containers(trixie).values():
            assert "VLLM_ENABLE_CUDA_COMPATIBILITY=1" in info["Config"]["Env"]
        for info in labkit.d3_containers(bookworm).values():
            assert "VLLM_ENABLE_CUDA_COMPATIBILITY=1" not in info["Config"]["Env"]
        # the FP8 checkpoint: vllm-sr/d3-FP8 without --quantization, its bytes the variant's
        args = labkit.container_args(trixie, "d3-27b")
        assert args[args.index("--model") + 1] == "vllm-sr/d3-FP8"
        assert args[args.index("--revision") + 1] == revisions["d3-FP8"]
        assert "--quantization" not in args
        log = on_host(trixie, "podman logs d3-27b 2>&1 | head -60")
        assert "quantization compressed-tensors detected from the checkpoint's config.json" in log
        fp8_facts = labkit.snapshot_facts(trixie, "vllm-sr/d3-FP8", revisions["d3-FP8"])
        assert fp8_facts["bytes"] == labkit.tree_bytes("vllm-sr/d3-FP8", revisions["d3-FP8"])
        assert int(fp8_facts["meta"]["d3_lab_simulated_bytes"]) == int(fp8_spec["download_gb"] * 1e9)
        assert fp8_facts["meta"]["d3_model_id"] == "vllm-sr/d3-FP8" and fp8_facts["quant"] == "compressed-tensors"
        # the key (through loopback, which the firewall lets in)
        for host in hosts.values():
            for port in ports(host):
                status, body = http(host, port, "/v1/models")
                assert (status, json.loads(body)) == (UNAUTHORIZED["status"], UNAUTHORIZED["body"]), (host, status, body)
                assert http(host, port, "/v1/models", old)[0] == 200
                assert http(host, port, "/health")[0] == 200  # vLLM guards /v1 only
        # the firewall: only the documentation networks and loopback reach the model ports
        for host, addr in addresses.items():
            table = on_host(host, "nft list table inet d3_fleet")
            assert f"tcp dport {PLANNED_PORT}" in table or f" {PLANNED_PORT}," in table or f"{{ {PLANNED_PORT}" in table, table
            assert not reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models", old), f"{host}: {addr} reached the model port"
            assert reach(host, f"http://127.0.0.2:{PLANNED_PORT}/v1/models", old), f"{host}: loopback refused"
            assert reach(host, f"http://{addr}:{OTHER_PORT}/"), f"{host}: a port that is not a model port was filtered"
            assert on_host(host, "systemctl is-enabled d3-firewall.service").strip() == "enabled"

        allowed = firewall([f"{addr}/32" for addr in sorted(set(addresses.values()))] + ["192.0.2.0/24"])
        rotated = run_playbook("site.yml", limit=limit, extravars={"d3_units_api_key": new, **shared, **allowed},
                               cmdline=f"{UNITS_ONLY} -vvv")  # fmt: skip
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
        # an allowed client gets answers
        for host, addr in addresses.items():
            assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models", new), f"{host}: an allowed client was refused"
            assert any("Enable d3-firewall.service" in t for t in rotated.changed_tasks(host)), host

        again = converge(limit, d3_units_api_key=new, **shared, **allowed)
        assert again.status == "successful", again.failure_text()
        for host in hosts.values():
            assert again.changed(host) == 0, (host, again.changed_tasks(host))
        # the firewall unit reloads the same rules (what happens at boot): flushed by hand, back after a restart
        for host in hosts.values():
            on_host(host, "nft delete table inet d3_fleet && systemctl restart d3-firewall.service")
            assert "d3_fleet" in on_host(host, "nft list tables")
    finally:
        on_host(trixie, f"{setup} --driver-version default", check=False)  # checked below: no compat environment left
        try:
            restored = converge(limit)  # the inventory's models, no key, no compat, the firewall off (its default)
        finally:
            for host in hosts.values():
                on_host(host, STOP_LISTENERS, check=False)
    assert restored.status == "successful", restored.failure_text()
    for host, addr in addresses.items():
        assert sorted(labkit.d3_containers(host)) == serving[host], host
        assert on_host(host, "podman secret ls --format '{{.Name}}'").strip() == ""
        assert http(host, ports(host)[0], "/v1/models")[0] == 200
        for info in labkit.d3_containers(host).values():
            assert "VLLM_ENABLE_CUDA_COMPATIBILITY=1" not in info["Config"]["Env"]
        assert "d3_fleet" not in on_host(host, "nft list tables")
        assert on_host(host, "test -e /etc/systemd/system/d3-firewall.service", check=False) == ""
        assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), host


@pytest.mark.parametrize("suite", ["bookworm", "trixie"])
def test_stopping_one_instance_leaves_the_others_running(converged: list[str], suite: str) -> None:
    """On a real host each container has its own cgroups: stopping one instance (a rollout's restart, a prune, an
    operator's systemctl stop) must not touch the others. The nested lab once broke this on Debian 12 (one shared v1
    cgroup: crun's delete killed every instance of the host; lab/images/containers-cgroupfs.conf)."""
    host = labkit.host_per_suite(converged, fewest=False)[suite]
    before = labkit.d3_containers(host)
    assert len(before) >= 2, f"{host}: the test needs two instances, found {sorted(before)}"
    # the victim: the smallest model (the shortest cold start to wait for at the end); the others keep serving
    sizes = {spec["hf_repo"]: spec["download_gb"] for spec in CATALOG.values()}

    def size(name: str) -> float:
        args = before[name]["Config"]["Cmd"] or before[name]["Args"]
        return sizes[args[args.index("--model") + 1]]

    victim = min(sorted(before), key=size)
    others = sorted(set(before) - {victim})
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
