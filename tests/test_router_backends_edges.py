"""Edges of d3_router_backends on hand-made plans (only the keys the router reads): the exact boundaries of ports and
offsets, the messages an operator reads for each refusal, and that one refused host, instance, port key or model
never hides the ones after it (the router still routes what is valid and reports every problem in one run)."""

from __future__ import annotations

import ipaddress
from typing import Any

from d3_router import router_backends


def inst(name: str, port: int, served: str | None = None, model: str | None = None, bind: Any = "0.0.0.0") -> dict[str, Any]:
    return {"name": name, "served_model_name": served or name, "model": model or name, "port": port, "bind_address": bind}


def node(*instances: Any, **spec: Any) -> dict[str, Any]:
    spec.setdefault("ansible_host", "10.0.0.11")
    spec.setdefault("api_key", True)
    return {"plan": {"instances": list(instances)}, **spec}


def served(out: dict[str, Any]) -> dict[str, list[tuple[str, str, int]]]:
    """served name -> [(server, address, port)] of the router's models."""
    return {m["served_name"]: [(s["name"], s["address"], s["port"]) for s in m["servers"]] for m in out["models"]}


def test_input_that_is_not_a_mapping_is_refused_with_empty_models_and_servers() -> None:
    out = router_backends(["l4-a"], "router")
    assert out == {"models": [], "servers": {}, "endpoint": {}, "metrics": {}, "health": {}, "client_ports": [],
                   "errors": ["fleet hosts: expected a mapping of host to plan, got ['l4-a']"]}


def test_host_names_that_are_not_one_line_of_text_are_refused_and_the_other_hosts_still_route() -> None:
    fleet = {1: node(inst("a", 8001)), "": node(inst("a", 8001)), "l4\nb": node(inst("a", 8001)), "l4-a": node(inst("a", 8001))}
    out = router_backends(fleet, "router")
    assert out["errors"] == [f"l4-nodes host {shown}: a host name must be one line of text. Fix the inventory."
                             for shown in ("''", "1", "'l4\\nb'")]  # fmt: skip
    assert list(out["servers"]) == ["l4-a"]
    assert served(out) == {"a": [("l4-a-a", "10.0.0.11", 8001)]}


def test_a_host_without_a_mapping_or_plan_does_not_stop_the_hosts_after_it() -> None:
    out = router_backends({"l4-a": None, "l4-b": node(inst("a", 8001), ansible_host="10.0.0.12")}, "router")
    assert len(out["errors"]) == 1 and out["errors"][0].startswith("host l4-a (l4-nodes) has no d3_host_plan")
    assert served(out) == {"a": [("l4-b-a", "10.0.0.12", 8001)]}


def test_an_empty_backend_address_means_unset_and_ipv6_addresses_are_accepted() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001), backend_address="")}, "router")
    assert out["errors"] == [] and served(out)["a"][0][1] == "10.0.0.11"
    out = router_backends({"l4-a": node(inst("a", 8001), backend_address="2001:db8::5")}, "router")
    assert out["errors"] == [] and served(out)["a"][0][1] == "2001:db8::5"


def test_a_bad_backend_address_does_not_stop_the_hosts_after_it() -> None:
    fleet = {"l4-a": node(inst("a", 8001), backend_address="10.0.0.1 backup"), "l4-b": node(inst("a", 8002))}
    out = router_backends(fleet, "router")
    assert out["errors"] == ["host l4-a: d3_router_backend_address = '10.0.0.1 backup' is not an IP address or a DNS host name. "
                             "Fix the inventory."]  # fmt: skip
    assert served(out) == {"a": [("l4-b-a", "10.0.0.11", 8002)]}


def test_an_empty_ansible_host_falls_back_to_the_inventory_name() -> None:
    out = router_backends({"l4-a.example": node(inst("a", 8001), ansible_host="")}, "router")
    assert out["errors"] == [] and served(out)["a"][0][1] == "l4-a.example"


def test_an_inventory_name_that_is_no_dns_name_is_refused_for_every_instance_naming_where_it_came_from() -> None:
    out = router_backends({"l4_a": node(inst("a", 8001), inst("b", 8002), ansible_host=None)}, "router")
    assert out["errors"] == [f"host l4_a instance '{i}': the router's address for it, the inventory name = 'l4_a', is not an IP "
                             "address or a DNS host name. Set d3_router_backend_address on that host." for i in "ab"]  # fmt: skip
    assert out["models"] == []


def test_the_port_offset_range_is_inclusive_at_both_ends() -> None:
    # the widest offsets still reach a port: 65535 - 65534 = 1 and 1 + 65534 = 65535
    fleet = {"l4-a": node(inst("a", 65535), backend_port_offset=-65534), "l4-b": node(inst("b", 1), backend_port_offset=65534)}
    out = router_backends(fleet, "router")
    assert out["errors"] == []
    assert served(out) == {"a": [("l4-a-a", "10.0.0.11", 1)], "b": [("l4-b-b", "10.0.0.11", 65535)]}
    assert router_backends({"l4-a": node(inst("a", 8001), backend_port_offset="")}, "router")["models"][0]["servers"][0]["port"] == 8001


def test_offsets_outside_the_range_are_refused_and_the_hosts_after_still_route() -> None:
    for offset in (-65535, 65535):
        out = router_backends({"l4-a": node(inst("a", 8001), backend_port_offset=offset), "l4-b": node(inst("b", 8002))}, "router")
        assert out["errors"] == [f"host l4-a: d3_router_backend_port_offset = {offset} is not a whole number of ports "
                                 "(-65534..65534). Fix the inventory."]  # fmt: skip
        assert list(served(out)) == ["b"]


def test_an_offset_that_takes_one_instance_out_of_the_port_range_refuses_that_instance_only() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001), inst("b", 65000), backend_port_offset=1000)}, "router")
    assert out["errors"] == ["host l4-a instance 'b': its port 65000 + d3_router_backend_port_offset 1000 = 66000 is not a TCP "
                             "port (1-65535). Fix the inventory."]  # fmt: skip
    out = router_backends({"l4-a": node(inst("a", 100), inst("b", 9000), backend_port_offset=-1000)}, "router")
    assert out["errors"] == ["host l4-a instance 'a': its port 100 + d3_router_backend_port_offset -1000 = -900 is not a TCP "
                             "port (1-65535). Fix the inventory."]  # fmt: skip
    assert served(out) == {"b": [("l4-a-b", "10.0.0.11", 8000)]}


def test_an_instance_that_is_not_a_mapping_does_not_hide_the_next() -> None:
    out = router_backends({"l4-a": node("junk", inst("a", 8001))}, "router")
    assert out["errors"] == ["host l4-a: d3_host_plan has an instance that is not a mapping: 'junk'"]
    assert list(served(out)) == ["a"]


def test_every_bad_plan_value_of_an_instance_is_named_in_one_message() -> None:
    bad = {"name": "a b", "served_model_name": "ok", "model": "m x", "port": 0, "bind_address": "0.0.0.0"}
    out = router_backends({"l4-a": node(bad, inst("a", 8001))}, "router")
    assert out["errors"] == ["host l4-a instance 'a b': the plan's name 'a b', model 'm x', port 0 cannot go into the router's "
                             "configuration (names: letters, digits, . _ -; port 1-65535). Fix d3_models / d3_fleet_models."]  # fmt: skip
    assert list(served(out)) == ["a"]


def test_instance_ports_of_hosts_other_than_the_router_may_be_router_ports() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001))}, "router", {"a": 8001})
    assert out["errors"] == [] and out["models"][0]["port"] == 8001


def test_a_bind_address_that_is_not_text_or_not_one_line_is_refused() -> None:
    for bind, shown in ((ipaddress.ip_address("192.0.2.7"), "IPv4Address('192.0.2.7')"), ("fe80::1%\n", "'fe80::1%\\n'")):
        out = router_backends({"l4-a": node(inst("a", 8001, bind=bind), inst("b", 8002))}, "router")
        assert out["errors"] == [f"host l4-a instance 'a': the plan's bind_address {shown} is not an IP address. "
                                 "Fix d3_listen_address."]  # fmt: skip
        assert list(served(out)) == ["b"]


def test_a_loopback_backend_address_is_refused_for_every_instance_naming_the_variable() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001), inst("b", 8002), backend_address="127.0.0.1")}, "router")
    assert out["errors"] == [f"host l4-a instance '{i}': the router would connect to 127.0.0.1 (d3_router_backend_address), which "
                             "is not that host as seen from the router router. Set d3_router_backend_address on l4-a to an "
                             "address the router reaches it at." for i in "ab"]  # fmt: skip
    errors = router_backends({"l4-a": node(inst("a", 8001), ansible_host="::")})["errors"]
    assert errors == ["host l4-a instance 'a': the router would connect to :: (ansible_host), which is not that host as seen from "
                      "the router. Set d3_router_backend_address on l4-a to an address the router reaches it at."]  # fmt: skip


def test_without_a_router_host_a_loopback_instance_is_refused_for_another_host() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001, bind="127.0.0.1"), inst("b", 8002))})
    assert len(out["errors"]) == 1
    assert out["errors"][0].startswith("host l4-a instance 'a' listens on 127.0.0.1 only (d3_listen_address), so the router on "
                                       "another host cannot reach it: set d3_listen_address")  # fmt: skip
    assert list(served(out)) == ["b"]


def test_server_names_that_collide_refuse_that_instance_only() -> None:
    out = router_backends({"l4 a": node(inst("x", 8001)), "l4_a": node(inst("x", 8001), inst("y", 8002))}, "router")
    assert out["errors"] == ["host l4_a instance 'x': its router server name 'l4_a-x' is also that of host l4 a instance 'x'. "
                             "Rename the instance (`name:`) or the host."]  # fmt: skip
    assert out["servers"]["l4_a"] == {"y": {"backend": "be_y", "server": "l4_a-y", "frontend": "fe_y"}}


def test_inventory_values_are_shown_in_their_refusals() -> None:
    fleet = {"l4-a": node(inst("a", 8001), inst("b", 8002))}
    out = router_backends(fleet, "router", ["d3"], "*")
    assert out["errors"] == [
        "d3_router_ports = ['d3'] is not a mapping of model or served name to port. Fix the inventory.",
        "d3_router_listen_address = '*' is not an IP address (0.0.0.0: every IPv4 address, :: every IPv6 address). Fix the inventory.",
    ]
    # a refused mapping gives no model a port of its own; every model stays on the fleet endpoint
    assert [m["port"] for m in out["models"]] == [None, None]


def test_router_ports_at_both_ends_of_the_range_are_accepted() -> None:
    out = router_backends({"l4-a": node(inst("a", 8001), inst("b", 8002))}, "router", {"a": 1, "b": 65535})
    assert out["errors"] == [] and [m["port"] for m in out["models"]] == [1, 65535]


def test_port_keys_of_any_type_are_checked_one_by_one() -> None:
    fleet = {"l4-a": node(inst("a", 8001), inst("b", 8002))}
    out = router_backends(fleet, "router", {1: 9000, "a": "9100", "b": 9500})
    assert out["errors"] == ["d3_router_ports[1] names no model served in the fleet (served: a, b). Fix or remove it.",
                             "d3_router_ports['a'] = '9100' is not a TCP port (1-65535). Fix the inventory."]  # fmt: skip
    assert {m["served_name"]: m["port"] for m in out["models"]} == {"a": None, "b": 9500}


def test_a_port_key_when_nothing_is_served_says_none_is_served() -> None:
    errors = router_backends({"l4-a": node(inst("a", 8001, bind="127.0.0.1"))}, "router", {"a": 9000})["errors"]
    assert errors[1:] == ["d3_router_ports['a'] names no model served in the fleet (served: none). Fix or remove it."]


def test_a_model_served_under_several_names_asks_for_the_served_name_as_key() -> None:
    fleet = {"l4-a": node(inst("a", 8001, model="m"), inst("b", 8002, model="m"))}
    errors = router_backends(fleet, "router", {"m": 9100})["errors"]
    assert errors == ["d3_router_ports['m']: model m is served under several names (a, b); key the port by served name instead."]


def test_one_refused_model_does_not_hide_the_models_after_it() -> None:
    fleet = {"l4-a": node(inst("a", 8001), inst("b", 8002), inst("c", 8003))}
    # the port of another model
    out = router_backends(fleet, "router", {"a": 9000, "b": 9000, "c": 9002})
    assert len(out["errors"]) == 1 and out["errors"][0].startswith("model b: its router port 9000")
    assert {m["served_name"]: m["port"] for m in out["models"]} == {"a": 9000, "c": 9002}
    # the port of an instance on the router host
    out = router_backends(fleet, "l4-a", {"a": 8001, "b": 9001})
    assert out["errors"] == ["model a: its router port 8001 (d3_router_ports['a']) is also the port of instance a on the router "
                             "host l4-a. Choose another in d3_router_ports."]  # fmt: skip
    assert {m["served_name"]: m["port"] for m in out["models"]} == {"b": 9001, "c": None}
    # one served name for two models
    fleet["l4-b"] = node(inst("a", 8001, model="other"))
    out = router_backends(fleet, "router")
    assert len(out["errors"]) == 1 and out["errors"][0].startswith("served name a is used by different models (a, other)")
    assert [m["served_name"] for m in out["models"]] == ["b", "c"]


def test_an_empty_fleet_says_how_to_get_a_frontend() -> None:
    assert router_backends({}, "router")["errors"] == [
        "no instance is planned on any host of l4-nodes: the router has nothing to route (HAProxy does not start without a "
        "frontend). Plan models (d3_models, d3_fleet_models) first."
    ]
