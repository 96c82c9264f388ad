"""The router (role d3_router, HAProxy from Debian on the lab router host) in front of the lab fleet: the fleet
endpoint (port 8000) routing by the body's model, one backend per model with every planned instance as a server
(d3-lite as three replicas: d3-lab-host3, and two on d3-lab-host2 in one backend), the per-model ports the lab inventory names
(d3_router_ports), the paths that do not pass, the Prometheus exporter on its own port, and HAProxy's own check of the
configuration, each on both lab routers (Debian 13's HAProxy 3.0 and Debian 12's 2.6, each at its own address). TLS
and a reload that keeps a drain: test_router_tls.py (last: it turns TLS on). The rollouts through the routers, under
load, and a router failover in a rollout are in test_rollout.py (they move the fleet's tag).

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
from routerkit import MODEL, PAIR_HOST, REPLICAS, ROUTERS, ask, router_url, server_states, vip

pytestmark = pytest.mark.lab

ENDPOINT = 8000  # d3_router_port (role default)
EXPORTER = 8405  # d3_router_metrics_port (role default)


@pytest.fixture(params=ROUTERS)
def router(request: pytest.FixtureRequest) -> str:
    """Each lab router: d3-lab-router1 (Debian 13, HAProxy 3.0) and d3-lab-router2 (Debian 12, HAProxy 2.6), each
    asked at its own address: every request must route the same through both versions."""
    return request.param


@pytest.fixture(scope="module")
def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    return routerkit.routed(converge_run, host_names)


def fetch(url: str, body: dict[str, Any] | bytes | None = None, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """(status, parsed JSON or the raw text) of a GET, or a POST of ``body`` (JSON, or raw bytes)."""
    data = body if body is None or isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            status, raw = answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read().decode()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def test_the_router_serves_every_model_with_every_replica(routed: dict[str, Any], router: str) -> None:
    """One backend per served model, its servers every planned instance (three for d3-lite: two of them on one host,
    as `spread: false` places them, one backend with two servers there), all UP in HAProxy, and a decision through
    each model's own port (d3_router_ports) from this machine."""
    lite = routed[MODEL]
    assert sorted((s["host"], s["instance"]) for s in lite["servers"]) == [
        (PAIR_HOST, MODEL), (PAIR_HOST, f"{MODEL}-2"), *[(h, MODEL) for h in REPLICAS if h != PAIR_HOST]], lite["servers"]
    names = {s["name"] for s in lite["servers"]}
    assert len(names) == 3 and set(server_states(lite["backend"], router)) == names
    for served, model in routed.items():
        assert set(server_states(model["backend"], router).values()) == {"UP"}, (served, server_states(model["backend"], router))
        answer = ask(router_url(router, model["port"]), served)
        assert answer["object"] == "structured_decision" and answer["model"] == served, answer


def test_the_fleet_endpoint_routes_by_model_lists_the_fleet_and_404s_an_unknown_model(routed: dict[str, Any], router: str) -> None:
    """One base URL for every model: each model's decision comes from that model; GET /v1/models lists the fleet in
    vLLM's shape; an unknown model gets vLLM's 404 error naming the served models; /metrics and /pause (open on vLLM
    without a key) are not reachable, on the endpoint nor on a model's own port."""
    endpoint = router_url(router, ENDPOINT)
    for served in routed:
        answer = ask(endpoint, served)
        assert answer["object"] == "structured_decision" and answer["model"] == served, answer
    status, listing = fetch(f"{endpoint}/v1/models")
    assert status == 200 and listing["object"] == "list", listing
    assert sorted(card["id"] for card in listing["data"]) == sorted(routed)
    status, error = fetch(f"{endpoint}/v1/systemone", {"model": "d3-huge", "state": {}, "questions": {}})
    assert status == 404 and error["error"]["type"] == "NotFoundError", error
    assert error["error"]["message"].endswith(f"Served models: {', '.join(sorted(routed))}.")
    # /health is the router's (it can serve), /health/MODEL one model's readiness; a model whose every server is
    # drained is not ready while the router still is (an upstream balancer keeps the other models)
    assert fetch(f"{endpoint}/health")[0] == 200 and fetch(f"{endpoint}/health/{MODEL}")[0] == 200
    assert fetch(f"{endpoint}/health/d3-huge") == (404, "")
    single = next(m for m in routed.values() if len(m["servers"]) == 1)
    routerkit.set_state(single["backend"], single["servers"][0]["name"], "drain", router)
    try:
        assert fetch(f"{endpoint}/health/{single['served_name']}")[0] == 503 and fetch(f"{endpoint}/health")[0] == 200
    finally:
        routerkit.set_state(single["backend"], single["servers"][0]["name"], "ready", router)
    # bodies the router cannot route as vLLM would read them get 400 with vLLM's error shape, never a misleading 404
    # (tests/contracts/haproxy/loopback-2.6.12-3.0.11.json, what Debian's 2.6 and 3.0 answered on loopback)
    question = {"state": {"model": "a car"}, "questions": {"model": {"type": "noul", "instructions": "ok?"}}}
    refused = {
        "duplicate_model": json.dumps({"model": MODEL, **question})[:-1].encode() + b', "mod\\u0065l": "d3-huge"}',
        "not_json": b"model=" + MODEL.encode(),
        "no_model": json.dumps(question).encode(),
        "model_not_string": b'{"model": 5}',
    }
    for verdict, body in refused.items():
        status, error = fetch(f"{endpoint}/v1/systemone", body)
        assert status == 400 and error["error"]["code"] == 400 and error["error"]["type"] == "BadRequestError", (verdict, error)
        assert error == json.loads(on_host(router, f"cat /etc/haproxy/d3-router/{verdict}.json")), verdict
    padded = {"model": MODEL, **question, "pad": "x" * 250 * 1024}
    assert fetch(f"{endpoint}/v1/systemone", padded)[1]["model"] == MODEL  # 250 KiB: under d3_router_max_request_kib
    status, error = fetch(f"{endpoint}/v1/systemone", padded, {f"X-Pad-{i}": "y" * 1000 for i in range(40)})
    assert status == 400 and "header block is over 32 KiB" in error["error"]["message"], error
    status, error = fetch(f"{endpoint}/v1/systemone", {**padded, "pad": "x" * 300 * 1024})
    assert status == 413 and "d3_router_max_request_kib" in error["error"]["message"], error
    own_port = router_url(router, routed[MODEL]["port"])
    for base in (endpoint, own_port):
        for path in ("/metrics", "/pause", "/tokenize", "/version"):
            assert fetch(f"{base}{path}")[0] == 404, (base, path)
    # the same paths on an instance directly answer (what the router keeps clients from)
    server = routed[MODEL]["servers"][0]
    assert on_host(router, f"curl -s -o /dev/null -w '%{{http_code}}' http://{server['address']}:{server['port']}/metrics") == "200"


def test_the_exporter_answers_on_its_own_port_for_loopback_only(routed: dict[str, Any], router: str) -> None:
    """HAProxy's Prometheus exporter (compiled into Debian's HAProxy: `haproxy -vv`) on d3_router_metrics_port, with
    each model's backend; a client outside loopback and d3_router_metrics_allowed gets 403."""
    assert "prometheus-exporter" in on_host(router, "haproxy -vv | grep -i 'available services'")
    text = on_host(router, f"curl -s http://127.0.0.1:{EXPORTER}/metrics")
    for served, model in routed.items():
        assert f'haproxy_backend_active_servers{{proxy="{model["backend"]}"}}' in text, served
    assert on_host(router, f"curl -s -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{EXPORTER}/other") == "404"
    # a client outside loopback and d3_router_metrics_allowed: the router's own address on the lab's podman network
    # (the lab's inventory allows the VRRP network, where the monitor scrapes the other router: 10.79.0.0/24)
    own = [a for a in on_host(router, "hostname -I").split() if ":" not in a and not a.startswith(("127.", "10.79."))]
    assert own, on_host(router, "hostname -I")
    code = f"curl -s -o /dev/null -w '%{{http_code}}' --interface {own[0]} http://{own[0]}:{EXPORTER}/metrics"
    assert on_host(router, code) == "403"
    # from this machine, on the VRRP network the lab allows (the pair's; without it, the port forward: refused)
    assert fetch(f"{router_url(router, EXPORTER)}/metrics")[0] == (200 if vip() else 403)


def test_haproxy_config_is_checked_by_haproxy_itself(routed: dict[str, Any], router: str) -> None:
    out = subprocess.run(["podman", "exec", router, "haproxy", "-c", "-f", "/etc/haproxy/haproxy.cfg"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
