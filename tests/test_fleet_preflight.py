"""Unit tests for d3_fleet_problems (d3_preflight.py): the checks across groups that roles/d3_preflight/tasks/fleet.yml
runs in site.yml's read-only head and in plan.yml, before any change on any host (issue 35): every router can
authenticate to every backend its readiness check asks, and every monitor can reach every exporter through the
firewall. The playbook tier runs them through plan.yml (tests/test_plan_playbook.py)."""

from __future__ import annotations

from typing import Any

import pytest
from d3_preflight import FilterModule, driver_problems, fleet_problems, key_problems, monitor_problems

KEY = "s3cret-key-0123"


def fleet(**groups: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {name.replace("_", "-"): members for name, members in groups.items()}


def keyed(key: str = KEY, **extra: Any) -> dict[str, Any]:
    return {"api_key": key, **extra}


# --- the API key reaches the routers ------------------------------------------------------------------------------


def test_the_key_only_in_group_vars_l4_nodes_refuses_each_router_naming_d3_routers() -> None:
    """The example's old layout: the key in group_vars/l4-nodes, nothing on the routers."""
    problems = fleet_problems(fleet(l4_nodes={"l4-b": keyed(), "l4-a": keyed()},
                                    d3_routers={"router-2": {"check_api_key": ""}, "router-1": {}}))  # fmt: skip
    expected = (
        "router {r} cannot authenticate to l4-a, l4-b: their instances require the API key (d3_units_api_key) and "
        "d3_router_check_api_key is empty on {r} (it defaults to d3_units_api_key on the router host, not set there); "
        "HAProxy would be configured, then every readiness check would get 401 until d3_router_ready_timeout_s. Fix: "
        "set d3_units_api_key in group_vars/all (or group_vars/d3-routers), from the same vault variable, not only in "
        "group_vars/l4-nodes."
    )
    assert problems == [expected.format(r="router-1"), expected.format(r="router-2")]
    assert not any(KEY in p for p in problems)


def test_a_router_with_another_key_is_refused_without_showing_either() -> None:
    problems = key_problems(fleet(l4_nodes={"a": keyed(), "b": {"api_key": ""}},
                                  d3_routers={"r": {"check_api_key": "other-key-9"}}))  # fmt: skip
    assert len(problems) == 1
    assert problems[0].startswith("router r cannot authenticate to a: their instances require the API key")
    assert "d3_router_check_api_key on r is not their key;" in problems[0]
    assert KEY not in problems[0] and "other-key-9" not in problems[0]


@pytest.mark.parametrize(
    ("case", "l4", "routers"),
    [
        ("the same key everywhere", {"a": keyed(), "b": keyed()}, {"r": {"check_api_key": KEY}}),
        ("no key anywhere", {"a": {"api_key": ""}, "b": {}}, {"r": {"check_api_key": ""}}),
        ("a key on the router only", {"a": {}}, {"r": {"check_api_key": KEY}}),
        ("no routers", {"a": keyed()}, {}),
        ("a key that is not text counts as none", {"a": {"api_key": None}, "b": {"api_key": 5}}, {"r": {}}),
    ],
)
def test_routers_that_can_authenticate_pass(case: str, l4: dict[str, Any], routers: dict[str, Any]) -> None:
    assert fleet_problems(fleet(l4_nodes=l4, d3_routers=routers)) == [], case


def test_hosts_with_different_keys_are_refused_once_whatever_the_routers_send() -> None:
    problems = fleet_problems(fleet(l4_nodes={"b": keyed("k2"), "a": keyed("k1"), "c": {}},
                                    d3_routers={"r": {"check_api_key": "k1"}}))  # fmt: skip
    assert problems == [
        "hosts a, b of l4-nodes use different API keys (d3_units_api_key), and a router sends one key to every backend "
        "(d3_router_check_api_key): its readiness check would get 401 from some of them. Fix: set one d3_units_api_key "
        "for the fleet, in group_vars/all (the hosts of l4-nodes and d3-routers both read it)."
    ]
    assert not any(k in problems[0] for k in ("k1", "k2"))


# --- the monitor reaches every exporter ---------------------------------------------------------------------------

MON = {"mon-1": {"ansible_host": "10.0.0.5"}}


def firewalled(monitors: Any, **extra: Any) -> dict[str, Any]:
    return {"firewall": True, "firewall_monitors": monitors, "ansible_host": "10.0.0.11", **extra}


def test_the_firewall_on_without_the_monitor_is_refused_naming_host_variable_and_group() -> None:
    problems = fleet_problems(fleet(l4_nodes={"l4-a": firewalled([])}, d3_monitors=MON))
    assert problems == [
        "host l4-a: the firewall is on (d3_firewall_enabled) and lets only loopback and d3_firewall_monitors = [] reach "
        "node exporter and the instances' /metrics: the monitor mon-1 ('10.0.0.5') of d3-monitors would be refused, "
        "and its alerts would never see data. Fix: list the monitors' addresses, as l4-a sees them, in "
        "d3_firewall_monitors in group_vars/l4-nodes (or group_vars/all)."
    ]


def test_a_firewalled_router_names_its_group_and_node_exporter_only() -> None:
    problems = monitor_problems(fleet(d3_routers={"r": firewalled(["10.9.0.0/16"], metrics_allowed=["10.0.0.0/24"])},
                                      d3_monitors=MON))  # fmt: skip
    assert problems == [
        "host r: the firewall is on (d3_firewall_enabled) and lets only loopback and d3_firewall_monitors = "
        "['10.9.0.0/16'] reach node exporter: the monitor mon-1 ('10.0.0.5') of d3-monitors would be refused, and its "
        "alerts would never see data. Fix: list the monitors' addresses, as r sees them, in d3_firewall_monitors in "
        "group_vars/d3-routers (or group_vars/all)."
    ]


def test_a_host_in_both_groups_names_both() -> None:
    spec = firewalled(["10.1.0.0/16"], metrics_allowed=["10.0.0.5"])
    problems = monitor_problems(fleet(l4_nodes={"h": spec}, d3_routers={"h": spec}, d3_monitors=MON))
    assert len(problems) == 1
    assert "reach node exporter and the instances' /metrics:" in problems[0]
    assert "in d3_firewall_monitors in group_vars/l4-nodes or group_vars/d3-routers (or group_vars/all)." in problems[0]


def test_haproxys_metrics_acl_without_the_monitor_is_refused() -> None:
    problems = monitor_problems(fleet(d3_routers={"router-1": {"ansible_host": "10.0.0.10"}}, d3_monitors=MON))
    assert problems == [
        "router router-1: HAProxy's /metrics (d3_router_metrics_port) answers loopback and d3_router_metrics_allowed = "
        "None only: the monitor mon-1 ('10.0.0.5') of d3-monitors would get 403. Fix: list the monitors' addresses, as "
        "the router sees them, in d3_router_metrics_allowed in group_vars/d3-routers (or group_vars/all)."
    ]


@pytest.mark.parametrize(
    ("case", "allowed", "monitors", "blocked"),
    [
        ("the monitor's address", ["10.0.0.5"], MON, []),
        ("its network", ["192.0.2.0/24", "10.0.0.0/24"], MON, []),
        ("a network given with host bits", ["10.0.0.9/24"], MON, []),
        ("another network", ["10.0.1.0/24"], MON, ["mon-1 ('10.0.0.5')"]),
        ("a bad entry is no network", ["not-an-ip", "10.0.0.5/40"], MON, ["mon-1 ('10.0.0.5')"]),
        ("not a list", "10.0.0.5", MON, ["mon-1 ('10.0.0.5')"]),
        ("IPv6", ["2001:db8::/64"], {"m": {"ansible_host": "2001:db8::7"}}, []),
        ("IPv6 elsewhere", ["2001:db8:1::/64", "10.0.0.0/8"], {"m": {"ansible_host": "2001:db8::7"}}, ["m ('2001:db8::7')"]),
        ("a DNS name: any entry may be it", ["10.0.1.0/24"], {"mon.example": {"ansible_host": "mon.example"}}, []),
        ("a DNS name and no entry", [], {"mon.example": {"ansible_host": "mon.example"}}, ["mon.example ('mon.example')"]),
        ("no ansible_host: the name", [], {"mon-2": {}}, ["mon-2 ('mon-2')"]),
        ("an IP name, no ansible_host", ["10.0.1.0/24"], {"10.0.0.6": {"ansible_host": ""}}, ["10.0.0.6 ('10.0.0.6')"]),
        ("a loopback ansible_host (a tunnel): any entry", ["10.0.1.0/24"], {"m": {"ansible_host": "127.0.0.1"}}, []),
        ("a loopback ansible_host and no entry", [], {"m": {"ansible_host": "127.0.0.1"}}, ["m ('127.0.0.1')"]),
        ("two monitors, one let in", ["10.0.0.5"], {**MON, "mon-0": {"ansible_host": "10.0.0.4"}}, ["mon-0 ('10.0.0.4')"]),
    ],
)
def test_which_monitors_the_firewall_lets_in(case: str, allowed: Any, monitors: dict[str, Any], blocked: list[str]) -> None:
    problems = monitor_problems(fleet(l4_nodes={"h": firewalled(allowed)}, d3_monitors=monitors))
    if not blocked:
        assert problems == [], case
    else:
        assert len(problems) == 1, case
        assert f"the monitor {', '.join(blocked)} of d3-monitors would be refused" in problems[0], (case, problems)


@pytest.mark.parametrize(
    ("case", "l4", "routers", "monitors"),
    [
        ("no monitors", {"h": firewalled([])}, {"r": {"ansible_host": "10.0.0.10"}}, {}),
        ("the firewall off", {"h": {**firewalled([]), "firewall": False}}, {}, MON),
        ("the firewall not a boolean", {"h": {**firewalled([]), "firewall": "yes"}}, {}, MON),
        ("the monitor is the host (it scrapes itself over loopback)", {"mon-1": firewalled([])}, {}, MON),
        ("the monitor reaches the host over loopback", {"h": firewalled([], ansible_host="127.0.0.1")}, {}, MON),
        ("a router the monitor reaches over loopback", {}, {"r": {"ansible_host": "127.0.0.1"}}, MON),
        ("a router on the monitor's host", {}, {"mon-1": {"ansible_host": "10.0.0.5"}}, MON),
        ("the router lets the monitor in", {}, {"r": {"ansible_host": "10.0.0.10", "metrics_allowed": ["10.0.0.0/28"]}}, MON),
    ],
)
def test_monitors_that_reach_every_exporter_pass(case: str, l4: Any, routers: Any, monitors: Any) -> None:
    assert fleet_problems(fleet(l4_nodes=l4, d3_routers=routers, d3_monitors=monitors)) == [], case


def test_the_monitor_is_checked_where_it_scrapes_the_host_the_backend_address() -> None:
    """A host behind a NAT on loopback (the lab: d3_router_backend_address) is a network target, not loopback."""
    nat = firewalled([], ansible_host="127.0.0.1", backend_address="10.0.2.2")
    assert len(monitor_problems(fleet(l4_nodes={"h": nat}, d3_monitors=MON))) == 1
    direct = firewalled([], ansible_host="10.0.2.2", backend_address="127.0.0.1")
    assert monitor_problems(fleet(l4_nodes={"h": direct}, d3_monitors=MON)) == []


def test_keys_then_monitors_in_one_list() -> None:
    problems = fleet_problems(fleet(l4_nodes={"h": firewalled([], api_key=KEY)}, d3_routers={"r": {"ansible_host": "127.0.0.1"}},
                                    d3_monitors=MON))  # fmt: skip
    assert [p.split(":")[0] for p in problems] == ["router r cannot authenticate to h", "host h"]


@pytest.mark.parametrize("value", [None, [], "x", {"l4-nodes": "x", "d3-routers": ["r"], "d3-monitors": None},
                                   {"l4-nodes": {"h": None}, "d3-routers": {"r": "x"}, "d3-monitors": {"m": 3}}])  # fmt: skip
def test_malformed_input_refuses_nothing_it_cannot_read(value: Any) -> None:
    """The inventory's own checks refuse bad values; this one only reads what is there (no exception)."""
    problems = fleet_problems(value)
    assert all("router r:" in p for p in problems), problems


def test_the_filter_is_registered() -> None:
    assert FilterModule().filters() == {"d3_driver_problems": driver_problems, "d3_fleet_problems": fleet_problems}


def test_every_entry_is_read_past_the_ones_that_pass() -> None:
    """A good router, a host with the firewall off, a bad network entry, the monitor's own host: each is passed over
    and the next one still checked."""
    problems = fleet_problems(fleet(
        l4_nodes={"a": {"firewall": False}, "b": firewalled(["bad", "10.9.0.0/16"], api_key=KEY)},
        d3_routers={"r1": {"check_api_key": KEY, "ansible_host": "127.0.0.1"},
                    "r2": {"check_api_key": "", "ansible_host": "10.0.0.10", "metrics_allowed": ["10.8.0.0/16", "10.9.0.0/16"]}},
        d3_monitors={"b": {"ansible_host": "10.0.0.11"}, "mon-1": {"ansible_host": "10.0.0.5"},
                     "mon-2": {"ansible_host": "10.0.0.6"}}))  # fmt: skip
    assert [p.split(" (")[0].split(":")[0] for p in problems] == ["router r2 cannot authenticate to b", "d3-monitors lists 3 hosts",
                                                                  "host b", "router r2"]  # fmt: skip
    assert "the monitor mon-1 ('10.0.0.5'), mon-2 ('10.0.0.6') of d3-monitors would be refused" in problems[2]
    assert "d3_firewall_monitors = ['bad', '10.9.0.0/16'] reach" in problems[2]
    assert ("d3_router_metrics_allowed = ['10.8.0.0/16', '10.9.0.0/16'] only: the monitor b ('10.0.0.11'), "
            "mon-1 ('10.0.0.5'), mon-2 ('10.0.0.6') of d3-monitors would get 403") in problems[3]  # fmt: skip


@pytest.mark.parametrize("monitors", [{}, {"mon-1": {}}, {"mon-1": {}, "mon-2": {}}])
def test_more_than_one_monitor_is_refused(monitors: dict[str, Any]) -> None:
    """Each monitor runs its own Alertmanager, not clustered: two monitors page every alert twice (the SRE review of
    2026-12-05, one D3RouterDown and two notifications on Alertmanager 0.25)."""
    problems = fleet_problems(fleet(l4_nodes={"a": {"firewall": False}}, d3_monitors=monitors))
    if len(monitors) <= 1:
        assert problems == []
    else:
        assert problems == ["d3-monitors lists 2 hosts (mon-1, mon-2): each would run its own Alertmanager, not clustered "
                            "with the others, and every alert would page once per monitor. Fix: keep one host in d3-monitors "
                            "(its Watchdog, d3_metrics_watchdog_webhook, tells you when it stops); docs/metrics.md."]  # fmt: skip


def test_a_host_without_an_address_is_reached_at_its_name() -> None:
    """No ansible_host: the monitor scrapes the inventory name, here a loopback address (nothing to check)."""
    spec = {"firewall": True, "firewall_monitors": []}
    assert monitor_problems(fleet(l4_nodes={"127.0.0.1": spec}, d3_routers={"127.0.0.2": {}}, d3_monitors=MON)) == []
    assert len(monitor_problems(fleet(l4_nodes={"h": spec}, d3_routers={"r": {}}, d3_monitors=MON))) == 2
