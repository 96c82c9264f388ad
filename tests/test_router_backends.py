"""The router's view of the fleet (filter d3_router_backends, role d3_router): one frontend and backend per served
model, its servers every planned instance of it, ports, names the rollout drains by, and the refusals (loopback-only
instances, hosts the run did not plan, port collisions, values that must not reach haproxy.cfg)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from d3_planner import d3_plan
from d3_router import FilterModule, router_backends, server_name
from l4 import l4_gpus

ROOT = Path(__file__).resolve().parents[1]
SHA = "0123456789abcdef0123456789abcdef01234567"


def plan(catalog_vars: dict[str, Any], models: list[Any], host: str, gpus: int = 4, **options: Any) -> dict[str, Any]:
    """A real plan from the planner (the keys the router reads are the planner's), listening on every address."""
    options.setdefault("api_key_set", True)
    options.setdefault("listen_address", "0.0.0.0")
    result = d3_plan(models, catalog_vars["d3_catalog"], catalog_vars["d3_catalog_common"], l4_gpus(gpus), host=host,
                     options=options)  # fmt: skip
    assert result["errors"] == []
    return result


@pytest.fixture
def fleet(catalog_vars: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Two hosts: d3-flash on both (two replicas), d3-mini on l4-a, d3-edge under the name triage on l4-b."""
    return {
        "l4-b": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-edge", "name": "triage"}], "l4-b"),
                 "backend_address": None, "ansible_host": "10.0.0.12", "api_key": True},
        "l4-a": {"plan": plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-mini"}], "l4-a"),
                 "backend_address": None, "ansible_host": "10.0.0.11", "api_key": True},
    }  # fmt: skip


def test_one_frontend_and_backend_per_served_name_with_every_replica(fleet: dict[str, Any]) -> None:
    out = router_backends(fleet, "router", {"d3-flash": 9000, "triage": 9002})
    assert out["errors"] == []
    # a port and a frontend of its own only for a model d3_router_ports names; every model is on the fleet endpoint
    assert [(m["served_name"], m["model"], m["frontend"], m["backend"], m["port"]) for m in out["models"]] == [
        ("d3-flash", "d3-flash", "fe_d3-flash", "be_d3-flash", 9000),
        ("d3-mini", "d3-mini", None, "be_d3-mini", None),
        ("triage", "d3-edge", "fe_triage", "be_triage", 9002),
    ]
    flash = out["models"][0]["servers"]
    ports = {h: {i["name"]: i["port"] for i in fleet[h]["plan"]["instances"]} for h in fleet}
    assert flash == [
        {"name": "l4-a-d3-flash", "address": "10.0.0.11", "port": ports["l4-a"]["d3-flash"], "host": "l4-a", "instance": "d3-flash",
         "maxconn": 256},
        {"name": "l4-b-d3-flash", "address": "10.0.0.12", "port": ports["l4-b"]["d3-flash"], "host": "l4-b", "instance": "d3-flash",
         "maxconn": 256},
    ]
    assert out["models"][2]["servers"][0]["instance"] == "triage"


def test_the_rollout_s_names_per_host_and_instance(fleet: dict[str, Any]) -> None:
    servers = router_backends(fleet, "router")["servers"]
    assert servers == {
        "l4-a": {"d3-flash": {"backend": "be_d3-flash", "server": "l4-a-d3-flash", "frontend": "fe_d3-flash"},
                 "d3-mini": {"backend": "be_d3-mini", "server": "l4-a-d3-mini", "frontend": "fe_d3-mini"}},
        "l4-b": {"d3-flash": {"backend": "be_d3-flash", "server": "l4-b-d3-flash", "frontend": "fe_d3-flash"},
                 "triage": {"backend": "be_triage", "server": "l4-b-triage", "frontend": "fe_triage"}},
    }  # fmt: skip
    assert server_name("gpu.example.com", "d3") == "gpu.example.com-d3"
    assert server_name("a b/c", "d3") == "a_b_c-d3"


def test_the_order_does_not_depend_on_the_inventory_s(fleet: dict[str, Any]) -> None:
    reversed_fleet = {h: fleet[h] for h in sorted(fleet, reverse=True)}
    assert router_backends(reversed_fleet, "router") == router_backends(dict(sorted(fleet.items())), "router")
    assert FilterModule().filters()["d3_router_backends"] is router_backends


def test_ports_by_served_name_by_model_and_none_unless_given(fleet: dict[str, Any]) -> None:
    out = router_backends(fleet, "router", {"triage": 9500, "d3-mini": 9400})
    assert out["errors"] == []
    assert {m["served_name"]: m["port"] for m in out["models"]} == {"d3-flash": None, "d3-mini": 9400, "triage": 9500}
    # a catalog model name keys its one served name
    out = router_backends(fleet, "router", {"d3-edge": 9600})
    assert {m["served_name"]: m["port"] for m in out["models"]}["triage"] == 9600


def test_port_collisions_and_ranges_are_refused(fleet: dict[str, Any]) -> None:
    errors = router_backends(fleet, "router", {"d3-mini": 9000, "d3-flash": 9000})["errors"]
    assert errors == ["model d3-mini: its router port 9000 (d3_router_ports['d3-mini']) is also that of model d3-flash. "
                      "Give each model its own port in d3_router_ports."]  # fmt: skip
    for bad in (0, 65536, "9000", True, None):
        errors = router_backends(fleet, "router", {"d3-mini": bad})["errors"]
        assert any("d3_router_ports['d3-mini']" in e and "is not a TCP port" in e for e in errors), bad
    # a router that is also an l4 host: its ports must not be an instance's
    errors = router_backends(fleet, "l4-a", {"d3-flash": fleet["l4-a"]["plan"]["instances"][0]["port"]})["errors"]
    assert any("is also the port of instance d3-flash on the router host l4-a" in e for e in errors), errors


def test_unknown_or_ambiguous_port_keys_are_refused(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    errors = router_backends(fleet, "router", {"d3-flsh": 9100})["errors"]
    assert errors == ["d3_router_ports['d3-flsh'] names no model served in the fleet (served: d3-flash, d3-mini, triage). "
                      "Fix or remove it."]  # fmt: skip
    fleet["l4-a"]["plan"] = plan(catalog_vars, [{"model": "d3-flash"}, {"model": "d3-edge", "name": "other"}], "l4-a")
    errors = router_backends(fleet, "router", {"d3-edge": 9100})["errors"]
    assert errors and "model d3-edge is served under several names (other, triage)" in errors[0]


def test_loopback_instances_are_refused_unless_the_router_is_that_host(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    fleet["l4-a"]["plan"] = plan(catalog_vars, [{"model": "d3-flash"}], "l4-a", listen_address="127.0.0.1")
    errors = router_backends(fleet, "router")["errors"]
    assert len(errors) == 1
    assert errors[0].startswith("host l4-a instance 'd3-flash' listens on 127.0.0.1 only (d3_listen_address), "
                                "so the router on router cannot reach it")  # fmt: skip
    assert "d3_units_api_key" in errors[0] and "0.0.0.0" in errors[0]
    # the router host's own instance port 8000 is the fleet endpoint's default port: refused, and free with another
    assert router_backends(fleet, "l4-a")["errors"] == [
        "d3_router_port 8000 is also the port of instance d3-flash on the router host l4-a. Choose another."]
    out = router_backends(fleet, "l4-a", options={"endpoint_port": 8080})
    assert out["errors"] == []
    assert out["models"][0]["servers"][0]["address"] == "127.0.0.1"
    fleet["l4-a"]["plan"] = plan(catalog_vars, [{"model": "d3-flash"}], "l4-a", listen_address="::1")
    assert "listens on ::1 only" in router_backends(fleet, "router")["errors"][0]


def test_a_host_the_run_did_not_plan_is_refused(fleet: dict[str, Any]) -> None:
    fleet["l4-c"] = {"plan": None, "backend_address": None, "ansible_host": "10.0.0.13"}
    errors = router_backends(fleet, "router")["errors"]
    assert errors == ["host l4-c (l4-nodes) has no d3_host_plan: this run did not plan it, so the router cannot know its "
                      "instances. Run site.yml without a --limit that leaves l4-nodes hosts out (e.g. -l 'l4-nodes:d3-routers'), "
                      "and fix the host if its plan failed."]  # fmt: skip


def test_an_empty_fleet_is_refused() -> None:
    errors = router_backends({}, "router")["errors"]
    assert len(errors) == 1 and "nothing to route" in errors[0]
    assert router_backends({"l4-a": {"plan": {"instances": []}}}, "router")["errors"] == errors


def test_the_address_the_router_connects_to(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    fleet["l4-a"]["backend_address"] = "l4-a.internal.example"
    del fleet["l4-b"]["ansible_host"]
    out = router_backends(fleet, "router")
    assert out["errors"] == []
    assert {s["host"]: s["address"] for s in out["models"][0]["servers"]} == {"l4-a": "l4-a.internal.example", "l4-b": "l4-b"}
    # an instance bound to one address is reached there (vLLM listens there only)
    fleet["l4-a"] = {"plan": plan(catalog_vars, [{"model": "d3-flash"}], "l4-a", listen_address="192.0.2.7"),
                     "backend_address": None, "ansible_host": "10.0.0.11", "api_key": True}  # fmt: skip
    assert router_backends(fleet, "router")["models"][0]["servers"][0]["address"] == "192.0.2.7"
    # ansible_host on loopback (an ssh port forward, the lab) is not the host as the router sees it
    fleet["l4-a"] = {"plan": fleet["l4-b"]["plan"], "backend_address": None, "ansible_host": "127.0.0.1", "api_key": True}
    errors = router_backends(fleet, "router")["errors"]
    assert errors and all("Set d3_router_backend_address on l4-a" in e for e in errors), errors


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [
        ("backend_address", "10.0.0.1\nbind *:1", "d3_router_backend_address = '10.0.0.1\\nbind *:1' is not one line of text"),
        ("backend_address", "10.0.0.1 check", "d3_router_backend_address = '10.0.0.1 check' is not an IP address or a DNS host name"),
        ("ansible_host", "host name", "ansible_host = 'host name', is not an IP address or a DNS host name"),
    ],
)
def test_addresses_that_must_not_reach_the_config_are_refused(fleet: dict[str, Any], field: str, value: str, says: str) -> None:
    fleet["l4-a"][field] = value
    errors = router_backends(fleet, "router")["errors"]
    assert errors and says in errors[0], errors


def test_plan_values_that_must_not_reach_the_config_are_refused(fleet: dict[str, Any]) -> None:
    bad = copy.deepcopy(fleet)
    bad["l4-a"]["plan"]["instances"][0]["served_model_name"] = "d3-flash\n    server x 1.2.3.4:1"
    bad["l4-b"]["plan"]["instances"][0]["port"] = 70000
    errors = router_backends(bad, "router")["errors"]
    assert len(errors) == 2, errors
    assert "host l4-a instance 'd3-flash': the plan's served_model_name 'd3-flash\\n    server x 1.2.3.4:1'" in errors[0]
    assert "host l4-b instance 'd3-flash': the plan's port 70000" in errors[1]
    for listen in ("0.0.0.0:80", "*", "::\n"):
        assert "d3_router_listen_address" in router_backends(fleet, "router", listen_address=listen)["errors"][0]
    assert router_backends(fleet, "router", listen_address="::")["errors"] == []
    assert "is not a mapping of model or served name to port" in router_backends(fleet, "router", ["d3"])["errors"][0]


def test_one_served_name_for_two_models_is_refused(fleet: dict[str, Any], catalog_vars: dict[str, Any]) -> None:
    fleet["l4-b"]["plan"] = plan(catalog_vars, [{"model": "d3-nano", "name": "d3-flash"}], "l4-b")
    errors = router_backends(fleet, "router")["errors"]
    assert errors == ["served name d3-flash is used by different models (d3-flash, d3-nano) on different hosts: clients would "
                      "get either. Give the instances distinct `name:`."]  # fmt: skip


def test_server_names_that_collide_after_sanitizing_are_refused(fleet: dict[str, Any]) -> None:
    fleet["l4 a"] = copy.deepcopy(fleet["l4-a"])
    fleet["l4_a"] = copy.deepcopy(fleet["l4-a"])
    errors = router_backends(fleet, "router")["errors"]
    assert any("router server name 'l4_a-d3-flash' is also that of host l4 a instance 'd3-flash'" in e for e in errors), errors


def test_the_health_check_path_is_open_without_the_key() -> None:
    """The router's health check carries no key: its path must be one vLLM leaves open (the contract)."""
    contract = json.loads((ROOT / "tests/contracts/vllm/unauthorized.json").read_text())
    template = (ROOT / "roles/d3_router/templates/haproxy.cfg.j2").read_text()
    assert "option httpchk GET /health\n" in template
    assert "/health" in contract["open_paths"] and not any(p.startswith("/health") for p in contract["guarded_paths"])
    assert json.loads((ROOT / "tests/contracts/vllm/health.json").read_text())["needs_api_key"] is False


def test_a_port_offset_is_added_to_every_server_port_of_that_host(fleet: dict[str, Any]) -> None:
    """A NAT between router and host (the lab publishes each host's instance ports 10100 higher on 10.0.2.2)."""
    fleet["l4-a"].update(backend_address="10.0.2.2", backend_port_offset=10100)
    out = router_backends(fleet, "router")
    assert out["errors"] == []
    ports = {h: {i["name"]: i["port"] for i in fleet[h]["plan"]["instances"]} for h in fleet}
    flash = {s["host"]: (s["address"], s["port"]) for s in out["models"][0]["servers"]}
    assert flash == {"l4-a": ("10.0.2.2", ports["l4-a"]["d3-flash"] + 10100), "l4-b": ("10.0.0.12", ports["l4-b"]["d3-flash"])}


@pytest.mark.parametrize("offset", ["100", 1.5, True, 70000, 60000])
def test_an_offset_that_is_not_a_whole_number_or_leaves_the_port_range_is_refused(fleet: dict[str, Any], offset: Any) -> None:
    fleet["l4-a"].update(backend_address="10.0.2.2", backend_port_offset=offset)
    errors = router_backends(fleet, "router")["errors"]
    assert errors and all("d3_router_backend_port_offset" in e for e in errors), errors
