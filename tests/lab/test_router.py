"""The router (role d3_router, HAProxy from Debian on the lab router host) in front of the lab fleet: the fleet
endpoint (port 8000) routing by the body's model, one backend per model with every planned instance as a server
(d3-lite as three replicas: d3-lab-host3, and two on d3-lab-host2 in one backend), the per-model ports the lab inventory names
(d3_router_ports), the paths that do not pass, the Prometheus exporter on its own port, and HAProxy's own check of the
configuration. TLS and a reload that keeps a drain: test_router_tls.py (last: it turns TLS on). The rollouts through
the router, under load, are in test_rollout.py (they move the fleet's tag).

The lab is a STAND-IN (lab/README.md): the routers reach the hosts through this machine's loopback (published ports)."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from typing import Any

import pytest
import routerkit
from labkit import Run, on_host
from routerkit import MODEL, PAIR_HOST, REPLICAS, ROUTER, ask, machine_url, server_states

pytestmark = pytest.mark.lab

ENDPOINT = 8000  # d3_router_port (role default)
EXPORTER = 8405  # d3_router_metrics_port (role default)


@pytest.fixture(scope="module")
def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    return routerkit.routed(converge_run, host_names)


def fetch(url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or the raw text) of a GET, or a POST of ``body``."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, raw = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read().decode()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def test_the_router_serves_every_model_with_every_replica(routed: dict[str, Any]) -> None:
    """One backend per served model, its servers every planned instance (three for d3-lite: two of them on one host,
    as `spread: false` places them, one backend with two servers there), all UP in HAProxy, and a decision through
    each model's own port (d3_router_ports) from this machine."""
    lite = routed[MODEL]
    assert sorted((s["host"], s["instance"]) for s in lite["servers"]) == [
        (PAIR_HOST, MODEL), (PAIR_HOST, f"{MODEL}-2"), *[(h, MODEL) for h in REPLICAS if h != PAIR_HOST]], lite["servers"]
    assert len({s["name"] for s in lite["servers"]}) == 3 and set(server_states(lite["backend"])) == {s["name"] for s in lite["servers"]}
    for served, model in routed.items():
        assert set(server_states(model["backend"]).values()) == {"UP"}, (served, server_states(model["backend"]))
        answer = ask(machine_url(model["port"]), served)
        assert answer["object"] == "structured_decision" and answer["model"] == served, answer


def test_the_fleet_endpoint_routes_by_model_lists_the_fleet_and_404s_an_unknown_model(routed: dict[str, Any]) -> None:
    """One base URL for every model: each model's decision comes from that model; GET /v1/models lists the fleet in
    vLLM's shape; an unknown model gets vLLM's 404 error naming the served models; /metrics and /pause (open on vLLM
    without a key) are not reachable, on the endpoint nor on a model's own port."""
    endpoint = machine_url(ENDPOINT)
    for served in routed:
        answer = ask(endpoint, served)
        assert answer["object"] == "structured_decision" and answer["model"] == served, answer
    status, listing = fetch(f"{endpoint}/v1/models")
    assert status == 200 and listing["object"] == "list", listing
    assert sorted(card["id"] for card in listing["data"]) == sorted(routed)
    status, error = fetch(f"{endpoint}/v1/systemone", {"model": "d3-huge", "state": {}, "questions": {}})
    assert status == 404 and error["error"]["type"] == "NotFoundError", error
    assert error["error"]["message"].endswith(f"Served models: {', '.join(sorted(routed))}.")
    assert fetch(f"{endpoint}/health")[0] == 200
    own_port = machine_url(routed[MODEL]["port"])
    for base in (endpoint, own_port):
        for path in ("/metrics", "/pause", "/tokenize", "/version"):
            assert fetch(f"{base}{path}")[0] == 404, (base, path)
    # the same paths on an instance directly answer (what the router keeps clients from)
    server = routed[MODEL]["servers"][0]
    assert on_host(ROUTER, f"curl -s -o /dev/null -w '%{{http_code}}' http://{server['address']}:{server['port']}/metrics") == "200"


def test_the_exporter_answers_on_its_own_port_for_loopback_only(routed: dict[str, Any]) -> None:
    """HAProxy's Prometheus exporter (compiled into Debian's HAProxy: `haproxy -vv`) on d3_router_metrics_port, with
    each model's backend; a client outside loopback and d3_router_metrics_allowed gets 403."""
    assert "prometheus-exporter" in on_host(ROUTER, "haproxy -vv | grep -i 'available services'")
    text = on_host(ROUTER, f"curl -s http://127.0.0.1:{EXPORTER}/metrics")
    for served, model in routed.items():
        assert f'haproxy_backend_active_servers{{proxy="{model["backend"]}"}}' in text, served
    assert on_host(ROUTER, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{EXPORTER}/other") == "404"
    # from this machine, through the lab's port forward: the router sees the forward's address, not its own loopback
    assert fetch(f"{machine_url(EXPORTER)}/metrics")[0] == 403


def test_haproxy_config_is_checked_by_haproxy_itself(routed: dict[str, Any]) -> None:
    out = subprocess.run(["podman", "exec", ROUTER, "haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
