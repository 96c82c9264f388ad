"""The router with TLS on, and a drain that survives the reload turning it on (role d3_router, lab router host).

One run of the d3_router role alone (tests/lab/router_role.yml, from the l4 hosts' plans of the session's converge:
no probe, no plan) with a certificate for the router signed by the lab CA (a LAB STAND-IN, made here: a real router's
certificate and key come from the inventory, the key from Ansible Vault). Before it, a d3-lite server is drained by
hand; the run changes the configuration, so the role saves the servers' state and reloads. Then: the server is still
drained; a client trusting the lab CA gets its decision over https through the fleet endpoint and a model's own port;
plain HTTP gets no answer; /metrics and /pause are not reachable.

Runs after test_rollout (tests/lab/conftest.py LAST_MODULES) and leaves TLS on: the next session's converge, from
the lab inventory (no certificate), turns it off again."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import labkit
import pytest
import routerkit
from labkit import Run, on_host
from routerkit import MODEL, ROUTER, SOCKET, machine_url, server_states

pytestmark = pytest.mark.lab

LAB_CA = Path("/var/lib/d3-lab/tls")  # the lab CA (lab_nvidia_repo's make-tls.sh): LAB STAND-IN
ENDPOINT = 8000
# the key the router checks in this run (d3_router_api_keys; a real one comes from Ansible Vault): LAB STAND-IN
ROUTER_KEY = "lab-router-key-0123456789"


@pytest.fixture(scope="module")
def tls_run(converge_run: Run, host_names: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    routed = routerkit.routed(converge_run, host_names)
    tmp = tmp_path_factory.mktemp("router-tls")
    # LAB STAND-IN: a router certificate for the names this machine reaches the router by, from the lab CA
    (tmp / "ext").write_text("subjectAltName=DNS:localhost,DNS:d3-lab-router1,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    subprocess.run(["openssl", "req", "-newkey", "rsa:2048", "-nodes", "-subj", "/O=d3-fleet lab/CN=d3-lab-router1 (LAB STAND-IN)",
                    "-keyout", str(tmp / "key.pem"), "-out", str(tmp / "csr.pem")], check=True, capture_output=True)  # fmt: skip
    subprocess.run(["openssl", "x509", "-req", "-sha256", "-days", "2", "-in", str(tmp / "csr.pem"), "-CA", str(LAB_CA / "ca.crt"),
                    "-CAkey", str(LAB_CA / "ca.key"), "-CAcreateserial", "-CAserial", str(tmp / "ca.srl"),
                    "-extfile", str(tmp / "ext"), "-out", str(tmp / "cert.pem")], check=True, capture_output=True)  # fmt: skip
    backend = routed[MODEL]["backend"]
    drained = routed[MODEL]["servers"][0]["name"]
    on_host(ROUTER, f"echo 'set server {backend}/{drained} state drain' | socat stdio {SOCKET}")
    assert server_states(backend)[drained] == "DRAIN"
    run = labkit.run_playbook("tests/lab/router_role.yml", limit=f"{labkit.LAB_GROUP}:{labkit.ROUTER_GROUP}",
                              extravars={"d3_router_test_plans": plans(converge_run), "d3_router_api_keys": [ROUTER_KEY],
                                         "d3_router_check_api_key": ROUTER_KEY,
                                         "d3_router_tls_certificate": (tmp / "cert.pem").read_text(),
                                         "d3_router_tls_key": (tmp / "key.pem").read_text()})  # fmt: skip
    states = server_states(backend)
    on_host(ROUTER, f"echo 'set server {backend}/{drained} state ready' | socat stdio {SOCKET}")
    assert run.status == "successful", run.failure_text()
    return {"run": run, "routed": routed, "backend": backend, "drained": drained, "states": states,
            "key": (tmp / "key.pem").read_text()}  # fmt: skip


def plans(run: Run) -> dict[str, Any]:
    """Each l4 host's d3_host_plan as the converge set it (the d3 role's set_fact)."""
    out = {}
    for event in run.events:
        data = event.get("event_data", {})
        facts = (data.get("res") or {}).get("ansible_facts") or {}
        if event.get("event") == "runner_on_ok" and "d3_host_plan" in facts:
            out[data["host"]] = facts["d3_host_plan"]
    assert out, "the converge published no d3_host_plan"
    return out


def https(base: str) -> str:
    return base.replace("http://127.0.0.1", "https://localhost")


def post(url: str, body: dict[str, Any], context: ssl.SSLContext, key: str = ROUTER_KEY) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_a_drain_survives_the_reload_of_a_configuration_change(tls_run: dict[str, Any]) -> None:
    run = tls_run["run"]
    reloaded = [r for r in run.results(ROUTER) if r.get("task") == "Reload HAProxy (in-flight requests finish on the old worker)"]
    assert reloaded and reloaded[0]["res"].get("changed"), "the TLS change did not reload HAProxy"
    assert tls_run["states"][tls_run["drained"]] == "DRAIN", tls_run["states"]
    assert set(tls_run["states"].values()) == {"UP", "DRAIN"}, tls_run["states"]


def test_with_tls_a_client_trusting_the_lab_ca_gets_its_decision_and_plain_http_none(tls_run: dict[str, Any]) -> None:
    context = ssl.create_default_context(cafile=str(LAB_CA / "ca.crt"))
    question = {"state": {"ticket": "x"}, "questions": {"q": {"type": "noul", "instructions": "ok?"}}}
    for base in (machine_url(ENDPOINT), machine_url(tls_run["routed"][MODEL]["port"])):
        status, answer = post(f"{https(base)}/v1/systemone", {"model": MODEL, **question}, context)
        assert status == 200 and answer["model"] == MODEL and answer["object"] == "structured_decision", answer
        for path in ("/metrics", "/pause"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(f"{https(base)}{path}", timeout=30, context=context)
            assert refused.value.code == 404, path
        # plain HTTP on the same port: no listener speaks it (the TLS handshake fails, no answer)
        host, port = base.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        with pytest.raises((http.client.HTTPException, ConnectionError, OSError)):
            conn.request("GET", "/v1/models")
            conn.getresponse()
    # a client that does not trust the lab CA is refused by its own TLS check
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"{https(machine_url(ENDPOINT))}/v1/models", timeout=30)
    # Mozilla's intermediate profile (tests/contracts/haproxy/mozilla-intermediate-6.0.json): TLS 1.2 without forward
    # secrecy (AES128-SHA) or below 1.2 gets no handshake; its ECDHE AEAD ciphers and TLS 1.3 do
    host, port = https(machine_url(ENDPOINT)).removeprefix("https://").split(":")
    # (TLS 1.1: openssl s_client on loopback, the contract; Python's OpenSSL here may not offer it at all)
    for ciphers, version, taken in [("AES128-SHA:@SECLEVEL=0", ssl.TLSVersion.TLSv1_2, False),
                                    ("ECDHE-RSA-AES128-SHA:@SECLEVEL=0", ssl.TLSVersion.TLSv1_2, False),
                                    ("ECDHE-RSA-AES128-GCM-SHA256", ssl.TLSVersion.TLSv1_2, True),
                                    (None, ssl.TLSVersion.TLSv1_3, True)]:  # fmt: skip
        client = ssl.create_default_context(cafile=str(LAB_CA / "ca.crt"))
        client.minimum_version = client.maximum_version = version
        if ciphers:
            client.set_ciphers(ciphers)
        try:
            with socket.create_connection((host, int(port)), timeout=10) as raw, client.wrap_socket(raw, server_hostname=host):
                handshake = True
        except (ssl.SSLError, ConnectionError):
            handshake = False
        assert handshake == taken, (ciphers, version)


def test_the_router_checks_its_key_before_it_names_any_model(tls_run: dict[str, Any]) -> None:
    """d3_router_api_keys: GET /v1/models and the unknown model's 404 name the served models, so without a key they
    get vLLM's 401; with it, the list and the decisions pass (the instances, keyless in the lab, take the header)."""
    context = ssl.create_default_context(cafile=str(LAB_CA / "ca.crt"))
    base = https(machine_url(ENDPOINT))
    unauthorized = json.loads((labkit.ROOT / "tests/contracts/vllm/unauthorized.json").read_text())["body"]
    for key in ("", "a-wrong-key-0123456789"):
        status, answer = post(f"{base}/v1/systemone", {"model": "d3-huge"}, context, key)
        assert (status, json.loads(answer)) == (401, unauthorized), key
        request = urllib.request.Request(f"{base}/v1/models", headers={"Authorization": f"Bearer {key}"} if key else {})
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=30, context=context)
        assert refused.value.code == 401 and json.loads(refused.value.read()) == unauthorized, key
    request = urllib.request.Request(f"{base}/v1/models", headers={"Authorization": f"Bearer {ROUTER_KEY}"})
    with urllib.request.urlopen(request, timeout=30, context=context) as answer:
        assert MODEL in [card["id"] for card in json.loads(answer.read())["data"]]
    # /health needs no key (an upstream balancer's check); only the keys' SHA-256 is on the router
    with urllib.request.urlopen(f"{base}/health", timeout=30, context=context) as answer:
        assert answer.status == 200
    assert ROUTER_KEY not in on_host(ROUTER, "cat /etc/haproxy/haproxy.cfg /etc/haproxy/d3-router/api-keys.sha256")
    assert ROUTER_KEY not in tls_run["run"].stdout


def test_the_tls_key_is_in_no_log_and_only_root_and_haproxy_read_it(tls_run: dict[str, Any]) -> None:
    key_line = tls_run["key"].strip().splitlines()[1]
    assert key_line not in tls_run["run"].stdout
    assert on_host(ROUTER, "stat -c '%U:%G %a' /etc/haproxy/d3-router/tls.pem").strip() == "root:haproxy 640"
    assert key_line not in on_host(ROUTER, "journalctl -u haproxy --no-pager -n 500 2>/dev/null; cat /etc/haproxy/haproxy.cfg")
