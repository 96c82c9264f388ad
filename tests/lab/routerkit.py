"""Helpers for the lab tests of the router (test_router.py) and of the rollouts through it (test_rollout.py): the
lab router host, the model with two replicas (d3-lite on d3-lab-host2 and d3-lab-host3, playbooks/vars/lab.yml),
the router's models as the converge published them, and HAProxy's server states.

The lab is a STAND-IN (lab/README.md): the routers reach the hosts through this machine's loopback (published ports)."""

from __future__ import annotations

import json
import sys
import urllib.request
from typing import Any

import labkit
import yaml
from labkit import ROOT, Run, on_host

sys.path.insert(0, str(ROOT / "tools"))
import rollout_under_load as load_tool

ROUTER = "d3-lab-router1"
MODEL = "d3-lite"
REPLICAS = ["d3-lab-host2", "d3-lab-host3"]
RATE = 10.0
WARMUP_S = 8.0
# the role default (the lab router sets no other)
SOCKET = yaml.safe_load((ROOT / "roles/d3_router/defaults/main.yml").read_text())["d3_router_stats_socket"]

__all__ = ["MODEL", "RATE", "REPLICAS", "ROUTER", "WARMUP_S", "ask", "load_tool", "machine_url", "routed", "server_states"]


def router_models(run: Run) -> list[dict[str, Any]]:
    """The router's models (fact d3_router_models) as the converge published them."""
    for event in run.events:
        data = event.get("event_data", {})
        facts = (data.get("res") or {}).get("ansible_facts") or {}
        if event.get("event") == "runner_on_ok" and data.get("host") == ROUTER and "d3_router_models" in facts:
            return facts["d3_router_models"]
    raise AssertionError(f"the converge did not run the d3_router role on {ROUTER} (is it in the lab inventory's d3-routers?)")


def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    """served name -> the router's model (frontend port, backend, servers), checked to hold the two d3-lite replicas."""
    assert set(REPLICAS) <= set(host_names), f"the router tests need {REPLICAS}: make lab LAB_HOSTS=3"
    models = {m["served_name"]: m for m in router_models(converge_run)}
    assert MODEL in models, sorted(models)
    return models


def machine_url(port: int) -> str:
    """The router's frontend port as this machine reaches it (the lab publishes the router's ports on loopback)."""
    out = labkit.podman("port", ROUTER, f"{port}/tcp").stdout.strip()
    assert out, f"{ROUTER} does not publish port {port}: re-create the lab (make lab-down && make lab)"
    return "http://" + out.splitlines()[0].replace("0.0.0.0", "127.0.0.1")


def ask(url: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "state": {"ticket": "x"}, "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    request = urllib.request.Request(f"{url}/v1/systemone", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def server_states(backend: str) -> dict[str, str]:
    text = on_host(ROUTER, f"echo 'show stat' | socat stdio {SOCKET}")
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
    return {r[1]: r[17] for r in rows if r[0] == backend and r[1] not in ("FRONTEND", "BACKEND")}
