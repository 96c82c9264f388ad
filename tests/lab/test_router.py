"""The router (role d3_router, HAProxy from Debian on the lab router host) in front of the lab fleet: one frontend per
model with every planned instance as a server (d3-lite as two replicas, d3-lab-host2 and d3-lab-host3), a decision
through each frontend, and HAProxy's own check of the configuration. The rollouts through the router, under load,
are in test_rollout.py (they move the fleet's tag).

The lab is a STAND-IN (lab/README.md): the routers reach the hosts through this machine's loopback (published ports)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import routerkit
from labkit import Run
from routerkit import MODEL, REPLICAS, ROUTER, ask, machine_url, server_states

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    return routerkit.routed(converge_run, host_names)


def test_the_router_serves_every_model_with_every_replica(routed: dict[str, Any]) -> None:
    """One frontend per served model, its servers every planned instance (two for d3-lite), all UP in HAProxy, and a
    decision through each frontend from this machine."""
    lite = routed[MODEL]
    assert sorted(s["host"] for s in lite["servers"]) == REPLICAS
    for served, model in routed.items():
        assert set(server_states(model["backend"]).values()) == {"UP"}, (served, server_states(model["backend"]))
        answer = ask(machine_url(model["port"]), served)
        assert answer["object"] == "structured_decision" and answer["model"] == served, answer


def test_haproxy_config_is_checked_by_haproxy_itself(routed: dict[str, Any]) -> None:
    out = subprocess.run(["podman", "exec", ROUTER, "haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
