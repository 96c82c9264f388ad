"""The router's limits and its own answers (filter d3_router_backends, d3_router_key_hashes): connections and buffers
sized from the plan (docs/router.md "Connections and memory"), the TLS profile, the JSON errors in vLLM's shapes, and
the keys the router checks, kept as hashes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from d3_router import BODY_ERRORS, HEALTH_MAXCONN, SPARE_CONNECTIONS, key_hashes, limits, router_backends

ROOT = Path(__file__).resolve().parents[1]


def inst(name: str, port: int, seqs: int | None = None) -> dict[str, Any]:
    return {"name": name, "served_model_name": name, "model": name, "port": port, "bind_address": "0.0.0.0",
            "args": [] if seqs is None else ["--max-num-seqs", str(seqs)]}  # fmt: skip


def fleet(**options: Any) -> dict[str, Any]:
    hosts = {"l4-a": {"plan": {"instances": [inst("a", 8001, 64), inst("b", 8002)]}, "ansible_host": "10.0.0.11", "api_key": True},
             "l4-b": {"plan": {"instances": [inst("a", 8001, 32)]}, "ansible_host": "10.0.0.12", "api_key": True}}  # fmt: skip
    ports = options.pop("ports", {"b": 9100})
    return router_backends(hosts, "router", ports, "0.0.0.0", options)


def test_connections_and_buffers_come_from_the_plan() -> None:
    out = fleet(max_request_kib=256)
    assert out["errors"] == []
    models = {m["served_name"]: m for m in out["models"]}
    # a: 64 + 32, b: vLLM's default 256 (no port of its own for a: no frontend maxconn)
    assert (models["a"]["capacity"], models["a"]["maxconn"], models["b"]["capacity"], models["b"]["maxconn"]) == (96, None, 256, 512)
    got = out["limits"]
    assert got["capacity"] == 352 and got["fleet_maxconn"] == 704
    # the health frontend's 16 (keepalived's check) and the exporter's 64 on top of the frontends'
    assert got["global_maxconn"] == 704 + 512 + 16 + 64 and got["spare"] == 64 and got["health_maxconn"] == 16
    assert got["bufsize"] == 256 * 1024 + 32 * 1024 + 1024 and got["max_body"] == 262144 and got["maxrewrite"] == 1024
    # two buffers per connection at most, rounded up to whole MiB: 1296 x 2 x 295936 B = 731.6 MiB
    assert got["memory_mib"] == 732 and got["header_kib"] == 32


def test_the_endpoint_connections_can_be_chosen_and_the_body_size_changes_the_buffer() -> None:
    got = fleet(maxconn=300, max_request_kib=16)["limits"]
    assert (got["fleet_maxconn"], got["global_maxconn"], got["bufsize"]) == (300, 300 + 512 + 16 + 64, 16 * 1024 + 32 * 1024 + 1024)
    # text from -e is whole numbers too
    assert fleet(maxconn="300", max_request_kib="16")["limits"] == got


@pytest.mark.parametrize(("option", "value", "text"), [
    ("maxconn", -1, "d3_router_maxconn = -1 is not a whole number of connections"),
    ("maxconn", 1_000_001, "d3_router_maxconn = 1000001 is not"),
    ("maxconn", True, "d3_router_maxconn = True is not"),
    ("maxconn", "12a", "d3_router_maxconn = '12a' is not"),
    ("max_request_kib", 15, "d3_router_max_request_kib = 15 is not a whole number of KiB (16-65536)"),
    ("max_request_kib", 65537, "d3_router_max_request_kib = 65537 is not"),
    ("max_request_kib", 2.5, "d3_router_max_request_kib = 2.5 is not"),
    ("max_request_kib", False, "d3_router_max_request_kib = False is not"),
])  # fmt: skip
def test_limits_out_of_range_are_refused_naming_the_variable(option: str, value: Any, text: str) -> None:
    errors = fleet(**{option: value})["errors"]
    assert len(errors) == 1 and errors[0].startswith(text) and errors[0].endswith("Fix the inventory."), errors


@pytest.mark.parametrize(("option", "value"), [("maxconn", 0), ("maxconn", 1_000_000), ("maxconn", 1), ("max_request_kib", 16),
                                               ("max_request_kib", 65536)])  # fmt: skip
def test_limits_at_their_bounds_pass(option: str, value: int) -> None:
    assert fleet(**{option: value})["errors"] == []


def test_a_fleet_without_capacity_still_gets_one_connection() -> None:
    assert limits([], 256)["fleet_maxconn"] == 1 and limits([], 256)["global_maxconn"] == 1 + 16 + 64


def test_tls_is_mozilla_s_intermediate_profile() -> None:
    mozilla = json.loads((ROOT / "tests/contracts/haproxy/mozilla-intermediate-6.0.json").read_text())["intermediate"]
    tls = fleet()["limits"]["tls"]
    assert tls["ciphers"] == ":".join(mozilla["ciphers"]["openssl"])
    assert tls["ciphersuites"] == ":".join(mozilla["ciphersuites"])
    assert tls["curves"] == "X25519:prime256v1:secp384r1"
    assert "AES128-SHA:" not in tls["ciphers"] + ":" and "DHE-RSA" not in tls["ciphers"].replace("ECDHE-RSA", "")


def test_the_router_s_own_answers_are_vllm_s_error_shapes() -> None:
    endpoint = fleet(max_request_kib=64)["endpoint"]
    files = {name: json.loads(text) for name, text in endpoint["files"].items()}
    assert all(text.endswith("}\n") for text in endpoint["files"].values())
    not_found = json.loads((ROOT / "tests/contracts/vllm/model-not-found.json").read_text())["body"]["error"]
    unauthorized = json.loads((ROOT / "tests/contracts/vllm/unauthorized.json").read_text())["body"]
    assert files["unauthorized.json"] == unauthorized
    assert set(files["unknown-model.json"]["error"]) == set(not_found) and files["unknown-model.json"]["error"]["code"] == 404
    assert files["models.json"]["object"] == "list" and [c["id"] for c in files["models.json"]["data"]] == ["a", "b"]
    assert endpoint["body_errors"] == ["not_json", "no_model", "duplicate_model", "model_not_string"] == list(BODY_ERRORS)
    for name, code, words in [("not_json.json", 400, "not a JSON object"), ("no_model.json", 400, "has no `model`"),
                              ("duplicate_model.json", 400, "`model` more than once"),
                              ("model_not_string.json", 400, "`model` is not a string"),
                              ("headers-too-long.json", 400, "header block is over 32 KiB"),
                              ("too-large.json", 413, "over 64 KiB (d3_router_max_request_kib)")]:  # fmt: skip
        error = files[name]["error"]
        assert set(error) == set(not_found) and error["code"] == code and error["type"] == "BadRequestError", name
        assert words in error["message"] and error["param"] is None, name
    assert endpoint["api_keys"] is False and fleet(api_keys=True)["endpoint"]["api_keys"] is True
    assert fleet(api_keys="yes")["endpoint"]["api_keys"] is False  # only a real true turns the check on


def test_key_hashes_are_the_sha256_of_each_key_sorted_once() -> None:
    keys = ["k" * 16, "second-key.with~all+/_chars-0==", "k" * 16, "x" * 512]
    out = key_hashes(keys)
    hashes = sorted({hashlib.sha256(k.encode()).hexdigest() for k in keys})
    assert out == {"hashes": hashes, "file": f"{hashes[0]}\n{hashes[1]}\n{hashes[2]}\n", "errors": []} and len(hashes) == 3
    for empty in (None, "", []):
        assert key_hashes(empty) == {"hashes": [], "file": "", "errors": []}


@pytest.mark.parametrize("bad", ["k" * 15, "x" * 513, "has space 0123456789", "tab\tin-the-key-0123", "é" * 16, "k=" + "k" * 16,
                                 "k" * 16 + "\n", 12345678901234567, None])  # fmt: skip
def test_a_key_that_is_no_bearer_token_is_refused_by_position_never_shown(bad: Any) -> None:
    out = key_hashes(["good-key-0123456789", bad])
    assert out["hashes"] == [hashlib.sha256(b"good-key-0123456789").hexdigest()] and out["file"] == out["hashes"][0] + "\n"
    assert out["errors"] == ["d3_router_api_keys[1] is not a key the router can check: want 16-512 characters of letters, "
                             "digits and . _ ~ + / - (a Bearer token). Fix the inventory (Ansible Vault)."]  # fmt: skip


def test_keys_that_are_not_a_list_are_refused() -> None:
    assert key_hashes("one-key-0123456789") == {"hashes": [], "file": "", "errors": [
        "d3_router_api_keys is not a list of keys. Fix the inventory (Ansible Vault)."]}  # fmt: skip


def test_keepalived_checks_a_health_frontend_of_its_own() -> None:
    """GET /health for keepalived's check on 127.0.0.1:d3_router_health_port, with a maxconn of its own that the global
    one leaves room for: clients holding every connection of the fleet endpoint cannot make the check fail."""
    out = fleet()
    assert out["errors"] == [] and out["health"] == {"port": 8406, "maxconn": 16}
    assert 8406 not in out["client_ports"]  # loopback only: nothing for the firewall to open
    got = out["limits"]
    others = got["fleet_maxconn"] + sum(m["maxconn"] for m in out["models"] if m["maxconn"]) + got["spare"]
    assert got["global_maxconn"] - others == out["health"]["maxconn"]
    assert fleet(health_port=9406)["health"]["port"] == 9406


@pytest.mark.parametrize(("value", "text"), [
    (0, "d3_router_health_port = 0 is not a TCP port (1-65535). Fix the inventory."),
    (65536, "d3_router_health_port = 65536 is not a TCP port"),
    ("x", "d3_router_health_port = 'x' is not a TCP port"),
    (True, "d3_router_health_port = True is not a TCP port"),
    (8000, "d3_router_health_port 8000 is also d3_router_port. Give each its own port."),
    (8405, "d3_router_health_port 8405 is also d3_router_metrics_port. Give each its own port."),
    (9100, "model b: its router port 9100 (d3_router_ports['b']) is also that of d3_router_health_port."),
])  # fmt: skip
def test_a_health_port_that_cannot_be_is_refused_naming_the_variable(value: Any, text: str) -> None:
    errors = fleet(health_port=value)["errors"]
    assert len(errors) == 1 and errors[0].startswith(text), errors


def test_the_health_port_may_not_be_an_instance_port_on_the_router_host() -> None:
    hosts = {"router": {"plan": {"instances": [inst("a", 8406, 64)]}, "ansible_host": "10.0.0.11", "api_key": True}}
    errors = router_backends(hosts, "router", {}, "0.0.0.0", {})["errors"]
    assert errors == ["d3_router_health_port 8406 is also the port of instance a on the router host router. Choose another."]


def test_the_check_passes_through_the_health_frontend_with_the_endpoint_full_on_both_versions() -> None:
    """tests/contracts/haproxy/health-frontend.json: Debian's 2.6.12 and 3.0.11 with the fleet endpoint's maxconn held
    by idle keep-alive clients: keepalived's check fails on the endpoint's /health, passes on the health frontend."""
    contract = json.loads((ROOT / "tests/contracts/haproxy/health-frontend.json").read_text())
    limits_used = contract["limits"]
    assert limits_used["health_maxconn"] == HEALTH_MAXCONN and limits_used["exporter_maxconn"] == SPARE_CONNECTIONS
    assert limits_used["global_maxconn"] == limits_used["fleet_maxconn"] + HEALTH_MAXCONN + SPARE_CONNECTIONS
    assert sorted(contract["captures"]) == ["2.6.12-1+deb12u4", "3.0.11-1+deb13u4"]
    for got in contract["captures"].values():
        assert got["held_keepalive_connections"] == ["HTTP/1.1 200 OK"] * limits_used["fleet_maxconn"]
        assert got["endpoint_full"]["endpoint"]["exit"] == 1 and got["endpoint_full"]["health_frontend"]["exit"] == 0
        assert got["endpoint_and_exporter_full"]["health_frontend"]["exit"] == 0
        assert got["idle"]["endpoint"]["exit"] == got["released"]["endpoint"]["exit"] == 0
