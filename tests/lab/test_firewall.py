"""The optional firewall (role d3_firewall, nftables table inet d3_fleet) on lab hosts (privileged podman containers
with their own network namespace, so nft works there as on a host): a client outside d3_allowed_clients cannot
connect to a model port while one inside gets answers; loopback always does; other ports are untouched; a second
run changes nothing; off again removes it. The lab is the STAND-IN fleet: a missing lab part fails, it does not skip.

The client is the lab host itself talking to its own non-loopback address (slirp4netns' tap0), so the packets
come from that address: allowed in one run, not in the other. The instances of the lab listen on every address of
their host (d3_listen_address 0.0.0.0, for the lab's router), so the model port answers on the host's own address and
on 127.0.0.2 (its /v1/models); the port that is not a model port is a stand-in listener (python3 http.server, labelled
in its page) on that address. The rules are the ones for the planned ports."""

from __future__ import annotations

import labkit
import pytest
from labkit import Run

pytestmark = pytest.mark.lab

HOSTS = ["d3-lab-host1", "d3-lab-host2"]  # Debian 13 and Debian 12 (their nftables 1.1 and 1.0)
PLANNED_PORT = 8000  # every lab host plans an instance on d3_port_base (8000)
OTHER_PORT = 18099  # not a model port: never filtered
LISTENERS = f"""
set -eu
addr=$(ip -4 -o addr show scope global | awk '{{print $4}}' | cut -d/ -f1 | head -n1)
mkdir -p /run/d3-fw-test && echo 'd3-fw-test stand-in listener' > /run/d3-fw-test/index.html
setsid python3 -m http.server {OTHER_PORT} --bind "$addr" --directory /run/d3-fw-test >/dev/null 2>&1 < /dev/null &
for _ in $(seq 50); do curl -s -o /dev/null "http://$addr:{OTHER_PORT}/" --max-time 1 && break; sleep 0.1; done
echo "$addr"
"""
STOP = "pkill -f 'http.server .*--directory /run/d3-fw-test' || true; rm -rf /run/d3-fw-test"


def reach(host: str, url: str) -> bool:
    """The stand-in listener's page, or the instance's model list (vLLM's /v1/models: {"object": "list", ...})."""
    out = labkit.on_host(host, f"curl -s --max-time 3 {url} || true", check=False)
    return "d3-fw-test stand-in listener" in out or '"object":"list"' in out.replace(" ", "")


def firewall(clients: list[str] | None, enabled: bool = True) -> Run:
    extra = {"d3_firewall_enabled": enabled, "d3_allowed_clients": clients or []}
    return labkit.run_playbook("site.yml", limit=",".join(HOSTS), extravars=extra, cmdline="--tags firewall")


@pytest.fixture(scope="module")
def addresses(lab_hosts: list[labkit.LabHost], converge_run: Run) -> dict[str, str]:  # converged: the instances answer
    names = {h.name for h in lab_hosts}
    assert set(HOSTS) <= names, f"the lab lacks {set(HOSTS) - names}: run `make lab`"
    out = {h: labkit.on_host(h, LISTENERS).strip().splitlines()[-1] for h in HOSTS}
    yield out
    # the test ends with the firewall off; a failure before that must not leave it on for the later tests
    if any("d3_fleet" in labkit.on_host(h, "nft list tables", check=False) for h in HOSTS):
        firewall(None, enabled=False)
    for h in HOSTS:
        labkit.on_host(h, STOP, check=False)


def test_only_allowed_clients_reach_the_model_ports(addresses: dict[str, str]) -> None:
    # nothing filters before the role runs: every listener answers
    for host, addr in addresses.items():
        assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), host

    denied = firewall(["192.0.2.0/24", "2001:db8::/64"])
    assert denied.rc == 0, denied.failure_text()
    for host, addr in addresses.items():
        table = labkit.on_host(host, "nft list table inet d3_fleet")
        assert f"tcp dport {PLANNED_PORT}" in table or f" {PLANNED_PORT}," in table or f"{{ {PLANNED_PORT}" in table, table
        assert not reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), f"{host}: {addr} reached the model port"
        assert reach(host, f"http://127.0.0.2:{PLANNED_PORT}/v1/models"), f"{host}: loopback refused"
        assert reach(host, f"http://{addr}:{OTHER_PORT}/"), f"{host}: a port that is not a model port was filtered"
        assert labkit.on_host(host, "systemctl is-enabled d3-firewall.service").strip() == "enabled"

    allowed = firewall([f"{addr}/32" for addr in sorted(set(addresses.values()))] + ["192.0.2.0/24"])
    assert allowed.rc == 0, allowed.failure_text()
    for host, addr in addresses.items():
        assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), f"{host}: an allowed client was refused"
        assert any("Enable d3-firewall.service" in t for t in allowed.changed_tasks(host)), host

    again = firewall([f"{addr}/32" for addr in sorted(set(addresses.values()))] + ["192.0.2.0/24"])
    assert again.rc == 0, again.failure_text()
    for host in HOSTS:
        assert again.changed(host) == 0, (host, again.changed_tasks(host))

    # the unit reloads the same rules (what happens at boot): flushed by hand, back after a restart
    for host in HOSTS:
        labkit.on_host(host, "nft delete table inet d3_fleet && systemctl restart d3-firewall.service")
        assert "d3_fleet" in labkit.on_host(host, "nft list tables")

    off = firewall(None, enabled=False)
    assert off.rc == 0, off.failure_text()
    for host, addr in addresses.items():
        assert "d3_fleet" not in labkit.on_host(host, "nft list tables")
        assert labkit.on_host(host, "test -e /etc/systemd/system/d3-firewall.service", check=False) == ""
        assert reach(host, f"http://{addr}:{PLANNED_PORT}/v1/models"), host
