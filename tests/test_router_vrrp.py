"""The router pair's virtual address: the filters d3_router_vrrp_addresses and d3_router_vrrp (every refusal before any
change, the plan), and roles/d3_router/templates/keepalived.conf.j2 rendered from a plan against keepalived's manual
page (tests/contracts/keepalived/keepalived-conf.yml)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "collections/ansible_collections/d3fleet/fleet/plugins/filter"))
from d3_router_vrrp import FilterModule, vrrp, vrrp_addresses  # noqa: E402

ROLE = ROOT / "roles/d3_router"
CONTRACT = yaml.safe_load((ROOT / "tests/contracts/keepalived/keepalived-conf.yml").read_text())

# `ip -json -4 address show` as iproute2 prints it (a lab router: loopback, slirp4netns' tap0, the VRRP link)
IP_JSON = json.dumps([
    {"ifindex": 1, "ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
    {"ifindex": 2, "ifname": "tap0", "addr_info": [{"family": "inet", "local": "10.0.2.100", "prefixlen": 24}]},
    {"ifindex": 7, "ifname": "vrrp0", "addr_info": [{"family": "inet", "local": "10.79.0.11", "prefixlen": 24},
                                                     {"family": "inet", "local": "10.79.0.10", "prefixlen": 24}]},
    {"ifindex": 8, "ifname": "v6only", "addr_info": [{"family": "inet6", "local": "fd00::1", "prefixlen": 64}]},
])  # fmt: skip


def router(address: str, interface: str = "vrrp0", prefix: int = 24, **over: Any) -> dict[str, Any]:
    return {"vip": "10.79.0.10", "router_id": 51, "password": "s3cret", "listen": "0.0.0.0",
            "addresses": [{"interface": "lo", "address": "127.0.0.1", "prefix": 8},
                          {"interface": interface, "address": address, "prefix": prefix}], **over}  # fmt: skip


def pair(**over: Any) -> dict[str, Any]:
    return {"r1": router("10.79.0.11"), "r2": router("10.79.0.12"), **over}


def test_addresses_from_iproute2_json_ipv4_only_in_order() -> None:
    assert vrrp_addresses(IP_JSON) == [
        {"interface": "lo", "address": "127.0.0.1", "prefix": 8},
        {"interface": "tap0", "address": "10.0.2.100", "prefix": 24},
        {"interface": "vrrp0", "address": "10.79.0.11", "prefix": 24},
        {"interface": "vrrp0", "address": "10.79.0.10", "prefix": 24},
    ]
    assert vrrp_addresses(json.loads(IP_JSON))[0]["interface"] == "lo"
    assert vrrp_addresses("[]") == [] and vrrp_addresses([{"ifname": "x"}]) == []
    assert vrrp_addresses([{"ifname": "x", "addr_info": [{"family": "inet", "local": "1.2.3.4"}]}]) == [
        {"interface": "x", "address": "1.2.3.4", "prefix": 32}]
    assert vrrp_addresses([{"addr_info": [{"family": "inet", "local": "1.2.3.4", "prefixlen": 8}]}])[0]["interface"] == ""


def test_the_plan_of_each_router_of_a_pair() -> None:
    one, two = vrrp(pair(), "r1"), vrrp(pair(), "r2")
    assert one == {"errors": [], "vip": "10.79.0.10", "interface": "vrrp0", "address": "10.79.0.11", "prefix": 24,
                   "peers": ["10.79.0.12"], "priority": 150}  # fmt: skip
    assert two["peers"] == ["10.79.0.11"] and two["priority"] == 149 and two["address"] == "10.79.0.12"
    three = vrrp(pair(r3=router("10.79.0.13")), "r3")
    assert three["peers"] == ["10.79.0.11", "10.79.0.12"] and three["priority"] == 148
    # the router that already holds the address lists it as a secondary: its own address is still the other one
    holder = pair(r1={**router("10.79.0.11"), "addresses": vrrp_addresses(IP_JSON)})
    assert vrrp(holder, "r1")["address"] == "10.79.0.11" and vrrp(holder, "r2")["peers"] == ["10.79.0.11"]
    assert FilterModule().filters() == {"d3_router_vrrp_addresses": vrrp_addresses, "d3_router_vrrp": vrrp}


def only_error(routers: dict[str, Any], me: str = "r1") -> str:
    plan = vrrp(routers, me)
    assert len(plan["errors"]) == 1, plan["errors"]
    assert plan["vip"] == "" and plan["peers"] == [] and plan["priority"] == 0
    return plan["errors"][0]


def test_refuses_one_router_or_none() -> None:
    assert "has 1 router (r1)" in only_error({"r1": router("10.79.0.11")})
    assert "needs two or more routers" in only_error({"r1": router("10.79.0.11")})
    assert "has 0 router (none)" in only_error({})


def test_refuses_more_than_a_hundred_routers() -> None:
    many = {f"r{i:03d}": router(f"10.79.1.{i + 1}", prefix=16) for i in range(101)}
    assert "101 routers: at most 100" in only_error(many)
    assert vrrp(dict(list(many.items())[:100]), "r000")["errors"] == []


def test_refuses_a_router_the_run_does_not_reach() -> None:
    message = only_error(pair(r2=None))
    assert message.startswith("r2: not in this run") and "-l d3-routers" in message


@pytest.mark.parametrize(("key", "variable", "value"), [
    ("vip", "d3_router_vip", "10.79.0.20"), ("router_id", "d3_router_vrrp_router_id", 52),
    ("password", "d3_router_vrrp_password", "other"), ("listen", "d3_router_listen_address", "127.0.0.1"),
])  # fmt: skip
def test_refuses_routers_that_disagree_naming_the_variable_never_the_password(key: str, variable: str, value: Any) -> None:
    message = only_error(pair(r2=router("10.79.0.12", **{key: value})))
    assert message.startswith(f"{variable} differs between the routers (r1 and r2)")
    assert "other" not in message and "s3cret" not in message


def test_refuses_a_vip_not_in_a_routers_subnet_naming_its_subnets() -> None:
    message = only_error(pair(r2=router("10.80.0.12")))
    assert message == ("r2: d3_router_vip = 10.79.0.10 is in none of its subnets (127.0.0.1/8 (lo), 10.80.0.12/24 (vrrp0)):"
                       " the virtual address must be in the subnet the routers share.")  # fmt: skip
    assert "(none)" in only_error(pair(r2={**router("10.79.0.12"), "addresses": []}))
    assert "in none of its subnets" in only_error(pair(r2={**router("10.79.0.12"), "addresses": None}))
    # the address itself, or a /32, is no subnet to share
    assert "in none" in only_error(pair(r2={**router("x"), "addresses": [{"interface": "e", "address": "10.79.0.10", "prefix": 24}]}))
    assert "in none" in only_error(pair(r2=router("10.79.0.10", prefix=32)))
    assert "in none" in only_error(pair(r2={**router("x"), "addresses": [{"interface": "e", "address": "bad", "prefix": 24}]}))
    assert "in none" in only_error(pair(r2={**router("x"), "addresses": [{"interface": "e", "address": "fd00::1", "prefix": 64}]}))


def test_refuses_routers_in_different_subnets() -> None:
    message = only_error(pair(r2=router("10.79.0.12", prefix=16)))
    assert message.startswith("the routers hold d3_router_vip = 10.79.0.10 in different subnets (10.79.0.0/16, 10.79.0.0/24)")


def test_refuses_an_interface_keepalived_cannot_take() -> None:
    assert "interface 'a b' is not an interface name" in only_error(pair(r2=router("10.79.0.12", interface="a b")))
    assert "interface 'a234567890123456'" in only_error(pair(r2=router("10.79.0.12", interface="a234567890123456")))
    assert vrrp(pair(r2=router("10.79.0.12", interface="a23456789012345")), "r2")["errors"] == []


@pytest.mark.parametrize(("over", "expected"), [
    ({"vip": "not-an-ip"}, "d3_router_vip = 'not-an-ip' is not an IPv4 address"),
    ({"vip": ""}, "d3_router_vip = '' is not an IPv4 address"),
    ({"vip": "fd00::10"}, "d3_router_vip = 'fd00::10' is IPv6"),
    ({"router_id": 0}, "d3_router_vrrp_router_id = 0 is not a whole number 1-255"),
    ({"router_id": 256}, "d3_router_vrrp_router_id = 256"),
    ({"router_id": True}, "d3_router_vrrp_router_id = True"),
    ({"router_id": "x"}, "d3_router_vrrp_router_id = 'x'"),
    ({"router_id": -1}, "d3_router_vrrp_router_id = -1"),
    ({"password": ""}, "d3_router_vrrp_password is not 1-8 characters"),
    ({"password": "123456789"}, "uses only the first eight"),
    ({"password": "a b"}, "d3_router_vrrp_password is not"),
    ({"password": "ab\n"}, "d3_router_vrrp_password is not"),
    ({"password": None}, "d3_router_vrrp_password is not"),
    ({"listen": "127.0.0.1"}, "d3_router_listen_address = '127.0.0.1': with d3_router_vip, HAProxy must listen on every"),
])  # fmt: skip
def test_refuses_a_bad_setting_naming_it(over: dict[str, Any], expected: str) -> None:
    routers = {name: {**r, **over} for name, r in pair().items()}
    message = only_error(routers)
    assert message.startswith("r1: ") and expected in message


def test_accepts_the_edges_of_each_setting() -> None:
    for over in ({"router_id": 1}, {"router_id": 255}, {"router_id": "7"}, {"password": "a"}, {"password": "12345678"},
                 {"password": "A.z_+=-9"}):  # fmt: skip
        routers = {name: {**r, **over} for name, r in pair().items()}
        assert vrrp(routers, "r1")["errors"] == [], over
    assert vrrp({n: {k: v for k, v in r.items() if k != "listen"} for n, r in pair().items()}, "r1")["errors"] == []


def test_a_host_that_is_no_router() -> None:
    assert vrrp(pair(), "other")["errors"] == ["other is not a router of d3-routers."]


def render(plan: dict[str, Any], **over: Any) -> str:
    role_vars = yaml.safe_load((ROLE / "vars/main.yml").read_text())
    values = {**yaml.safe_load((ROLE / "defaults/main.yml").read_text()), "ansible_managed": "Ansible managed",
              "inventory_hostname": "d3 router/1", "_d3_router_vrrp": plan, "d3_router_vrrp_password": "s3cret",
              "_d3_router_check_script": "/usr/local/libexec/d3-fleet/d3-router-check",
              "_d3_router_health_url": jinja2.Template(role_vars["_d3_router_health_url"]).render(d3_router_health_port=8406),
              **over}  # fmt: skip
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, value)
    return env.from_string((ROLE / "templates/keepalived.conf.j2").read_text()).render(**values)


def sections(text: str) -> dict[str, list[str]]:
    """keyword lines per top-level section (the first word of each line inside it)."""
    out: dict[str, list[str]] = {}
    current = None
    depth = 0
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if depth == 0 and line.endswith("{"):
            current = line.split()[0]
            out[current] = []
        elif current:
            out[current].append(line)
        depth += line.count("{") - line.count("}")
    return out


def test_the_configuration_uses_the_manuals_keywords_and_the_plan() -> None:
    text = render(vrrp(pair(r3=router("10.79.0.13")), "r2"))
    found = sections(text)
    for section, keywords in CONTRACT["keywords"].items():
        words = [line.split()[0] for line in found[section]]
        for keyword in keywords:
            assert keyword in words, (section, keyword)
    instance = found["vrrp_instance"]
    contract = CONTRACT["contract"]
    assert f"state {contract['initial_state']}" in instance and "nopreempt" in instance  # nopreempt needs BACKUP
    assert f"auth_type {contract['auth_type']}" in instance and "auth_pass s3cret" in instance
    assert "priority 149" in instance and "interface vrrp0" in instance and "unicast_src_ip 10.79.0.12" in instance
    assert "virtual_router_id 51" in instance and "advert_int 1" in instance
    peers = instance[instance.index("unicast_peer {") + 1:instance.index("}")]
    assert peers == ["10.79.0.11", "10.79.0.13"]
    assert "10.79.0.10/24 dev vrrp0" in instance and "d3_router_check" in instance
    # weight 0 (FAULT on the check's failures): the manual's default
    assert not any("weight" in line for lines in found.values() for line in lines)
    script = found["vrrp_script"]
    # the health frontend (loopback, a maxconn of its own), not the fleet endpoint its clients can fill
    assert script[0] == 'script "/usr/local/libexec/d3-fleet/d3-router-check http://127.0.0.1:8406/health 2"'
    assert "router_id d3_router_1" in found["global_defs"]
    assert "script_user nobody nogroup" in found["global_defs"] and "enable_script_security" in found["global_defs"]
    assert text.count("{") == text.count("}")


def test_the_role_defaults_have_no_pair() -> None:
    defaults = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    assert defaults["d3_router_vip"] == "" and defaults["d3_router_vrrp_password"] == ""
    assert 1 <= defaults["d3_router_vrrp_router_id"] <= 255
    assert len(CONTRACT["contract"]) == 5 and CONTRACT["contract"]["auth_pass_max_chars"] == 8


def test_every_refusal_in_full() -> None:
    """The whole sentence of each refusal (what the operator reads)."""
    assert vrrp({"r1": router("10.79.0.11")}, "r1")["errors"] == [
        "d3_router_vip is set but d3-routers has 1 router (r1): a virtual address needs two or more routers to move "
        "between. Add a router, or leave d3_router_vip empty."]  # fmt: skip
    assert vrrp({"r1": None, "r2": None, "r3": router("x")}, "r3")["errors"] == [
        "r1, r2: not in this run (each router's address is the others' unicast peer): run the routers together "
        "(-l d3-routers, or without --limit)."]  # fmt: skip
    assert vrrp({"r1": router("10.79.0.11"), "r2": router("10.79.0.12", vip="10.79.0.9"),
                 "r3": router("10.79.0.13", vip="10.79.0.9")}, "r1")["errors"] == [
        "d3_router_vip differs between the routers (r1 and r2, r3): every router of d3-routers must have the same (set "
        "it for the group, not per host)."]  # fmt: skip
    bad = {name: {**r, "vip": "x", "router_id": 0, "password": "", "listen": "::"} for name, r in pair().items()}
    assert vrrp(bad, "r1")["errors"] == [
        "r1: d3_router_vip = 'x' is not an IPv4 address (the routers' virtual address, e.g. 192.0.2.10; empty for none).",
        "r1: d3_router_vrrp_router_id = 0 is not a whole number 1-255 (keepalived's virtual_router_id, unique on the "
        "routers' network).",
        "r1: d3_router_vrrp_password is not 1-8 characters of letters, digits, . _ + = - (keepalived's auth_pass uses "
        "only the first eight; put it in Ansible Vault).",
        "r1: d3_router_listen_address = '::': with d3_router_vip, HAProxy must listen on every IPv4 address (0.0.0.0) to "
        "take the virtual address's connections on whichever router holds it (and its own check over loopback)."]  # fmt: skip
    assert vrrp({n: {**r, "vip": "fd00::10"} for n, r in pair().items()}, "r1")["errors"] == [
        "r1: d3_router_vip = 'fd00::10' is IPv6: the router pair takes an IPv4 virtual address (VRRPv2)."]
    assert vrrp(pair(r2=router("10.79.0.12", prefix=16)), "r1")["errors"] == [
        "the routers hold d3_router_vip = 10.79.0.10 in different subnets (10.79.0.0/16, 10.79.0.0/24): they must share "
        "one."]  # fmt: skip
    # each router's own problem is named, not only the first's
    two = vrrp({"r1": router("10.80.0.11"), "r2": router("10.81.0.12"), "r3": router("10.79.0.13")}, "r3")["errors"]
    assert [e.split(":")[0] for e in two] == ["r1", "r2"]
    two = vrrp({"r1": router("10.79.0.11", interface="a b"), "r2": router("10.79.0.12", interface="c d")}, "r1")["errors"]
    assert [e.split(":")[0] for e in two] == ["r1", "r2"]
    plan = vrrp({"r1": router("10.79.0.11")}, "r1")
    assert (plan["interface"], plan["address"], plan["prefix"]) == ("", "", 0)


def test_a_bad_address_before_the_good_one_is_skipped() -> None:
    skipped = {**router("x"), "addresses": [{"interface": "e", "address": "bad", "prefix": 24},
                                            {"interface": "vrrp0", "address": "10.79.0.12", "prefix": 24}]}  # fmt: skip
    assert vrrp(pair(r2=skipped), "r2")["address"] == "10.79.0.12"
    assert vrrp(pair(r2=router("10.79.0.12", router_id="51")), "r1")["errors"][0].startswith("d3_router_vrrp_router_id differs")
