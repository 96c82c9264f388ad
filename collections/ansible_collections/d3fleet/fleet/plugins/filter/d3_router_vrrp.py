"""The router pair's virtual address (keepalived, VRRP): ``d3_router_vrrp_addresses`` and ``d3_router_vrrp``.

Pure functions on the controller; the d3_router role's keepalived tasks call them (roles/d3_router/tasks/keepalived*.yml)
and render templates/keepalived.conf.j2 from the plan ``d3_router_vrrp`` returns. The keywords, and what the plan
decides, come from keepalived's manual page keepalived.conf(5) (acassen/keepalived, doc/man/man5/keepalived.conf.5.in;
the contract with its quotes: tests/contracts/keepalived/keepalived-conf.yml):

- every router starts ``state BACKUP`` with ``nopreempt`` ("NOTE: For this to work, the initial state must not be
  MASTER"): a router that comes back never takes the address from the one holding it (a second move for clients);
- distinct priorities ("All systems should have different priorities in order to make behaviour deterministic. If you
  want to stop a higher priority instance taking over as master when it starts, configure no_preempt rather than using
  equal priorities"): 150 minus the router's place among the sorted router names;
- adverts by ``unicast_peer`` to the other routers' addresses (no multicast needed on the routers' network), with
  ``authentication { auth_type PASS }`` ("avoid using if possible, except when using unicast, where it can be
  helpful"; "Only the first eight (8) characters are used": a longer password is refused rather than cut; AH is "not
  recommended" and not offered).

IPv4 only (VRRPv2, keepalived's default ``vrrp_version``); an IPv6 virtual address is refused, naming the variable.
"""

from __future__ import annotations

import ipaddress
import json
import re
from typing import Any

PASSWORD = re.compile(r"\A[A-Za-z0-9._+=-]{1,8}\Z")
INTERFACE = re.compile(r"\A[A-Za-z0-9_.-]{1,15}\Z")
TOP_PRIORITY = 150
MAX_ROUTERS = 100


def vrrp_addresses(text: Any) -> list[dict[str, Any]]:
    """The IPv4 addresses of a router, from ``ip -json -4 address show`` (iproute2's JSON: one object per interface,
    ``ifname`` and ``addr_info`` [{family, local, prefixlen}]): [{interface, address, prefix}], in the order shown.
    Secondary addresses are kept (a router already holding the virtual address lists it too)."""
    data = json.loads(text) if isinstance(text, str) else text
    out = []
    for link in data or []:
        for info in link.get("addr_info") or []:
            if info.get("family") == "inet" and info.get("local"):
                out.append({"interface": str(link.get("ifname") or ""), "address": str(info["local"]),
                            "prefix": int(info.get("prefixlen", 32))})  # fmt: skip
    return out


def _subnet(vip: ipaddress.IPv4Address, addresses: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The router's own address whose subnet holds the virtual address (not the virtual address itself)."""
    for entry in addresses:
        try:
            net = ipaddress.ip_interface(f"{entry['address']}/{entry['prefix']}")
        except (ValueError, KeyError):
            continue
        if net.version == 4 and net.ip != vip and vip in net.network:
            return entry
    return None


def _vip_problems(name: str, settings: dict[str, Any]) -> tuple[ipaddress.IPv4Address | None, list[str]]:
    problems = []
    raw = settings.get("vip")
    vip = None
    try:
        vip = ipaddress.ip_address(str(raw))
    except ValueError:
        problems.append(f"{name}: d3_router_vip = {raw!r} is not an IPv4 address (the routers' virtual address, e.g. "
                        "192.0.2.10; empty for none).")  # fmt: skip
    if vip is not None and vip.version != 4:
        problems.append(f"{name}: d3_router_vip = {raw!r} is IPv6: the router pair takes an IPv4 virtual address "
                        "(VRRPv2).")  # fmt: skip
    router_id = settings.get("router_id")
    if isinstance(router_id, bool) or not str(router_id).isdigit() or not 1 <= int(router_id) <= 255:
        problems.append(f"{name}: d3_router_vrrp_router_id = {router_id!r} is not a whole number 1-255 (keepalived's "
                        "virtual_router_id, unique on the routers' network).")  # fmt: skip
    password = settings.get("password")
    if not isinstance(password, str) or not PASSWORD.match(password):
        problems.append(f"{name}: d3_router_vrrp_password is not 1-8 characters of letters, digits, . _ + = - "
                        "(keepalived's auth_pass uses only the first eight; put it in Ansible Vault).")  # fmt: skip
    listen = settings.get("listen", "0.0.0.0")
    if listen != "0.0.0.0":
        problems.append(f"{name}: d3_router_listen_address = {listen!r}: with d3_router_vip, HAProxy must listen on every "
                        "IPv4 address (0.0.0.0) to take the virtual address's connections on whichever router holds it "
                        "(and its own check over loopback).")  # fmt: skip
    return vip, problems


def vrrp(routers: dict[str, dict[str, Any]], me: str) -> dict[str, Any]:
    """The keepalived plan for router ``me``, and every reason the pair cannot have its virtual address.

    ``routers``: every router of the group, {name: {vip, router_id, password, listen, addresses}} (``addresses`` from
    vrrp_addresses on that router), None for a router this run does not reach (left out by --limit).
    Returns {errors, vip, interface, address, prefix, peers, priority}: ``errors`` non-empty refuses the run before any
    change (fewer than two routers, a setting that differs between routers, a virtual address outside a router's
    subnets or equal to its own address, a router the run cannot read)."""
    names = sorted(routers)
    errors: list[str] = []
    plan: dict[str, Any] = {"errors": errors, "vip": "", "interface": "", "address": "", "prefix": 0, "peers": [],
                            "priority": 0}  # fmt: skip
    if len(names) < 2:
        errors.append(f"d3_router_vip is set but d3-routers has {len(names)} router ({', '.join(names) or 'none'}): a "
                      "virtual address needs two or more routers to move between. Add a router, or leave d3_router_vip "
                      "empty.")  # fmt: skip
        return plan
    if len(names) > MAX_ROUTERS:
        errors.append(f"d3-routers has {len(names)} routers: at most {MAX_ROUTERS} share one virtual address here.")
        return plan
    absent = [n for n in names if not isinstance(routers[n], dict)]
    if absent:
        errors.append(f"{', '.join(absent)}: not in this run (each router's address is the others' unicast peer): run "
                      "the routers together (-l d3-routers, or without --limit).")  # fmt: skip
        return plan
    first = routers[names[0]]
    for key, variable in (("vip", "d3_router_vip"), ("router_id", "d3_router_vrrp_router_id"),
                          ("password", "d3_router_vrrp_password"), ("listen", "d3_router_listen_address")):  # fmt: skip
        differ = [n for n in names if routers[n].get(key) != first.get(key)]
        if differ:
            errors.append(f"{variable} differs between the routers ({names[0]} and {', '.join(differ)}): every router "
                          "of d3-routers must have the same (set it for the group, not per host).")  # fmt: skip
    if errors:
        return plan
    vip, problems = _vip_problems(names[0], first)
    errors.extend(problems)
    if errors:
        return plan
    own: dict[str, dict[str, Any]] = {}
    for name in names:
        addresses = routers[name].get("addresses") or []
        entry = _subnet(vip, addresses)
        if entry is None:
            shown = ", ".join(f"{a['address']}/{a['prefix']} ({a['interface']})" for a in addresses) or "none"
            errors.append(f"{name}: d3_router_vip = {vip} is in none of its subnets ({shown}): the virtual address "
                          "must be in the subnet the routers share.")  # fmt: skip
            continue
        if not INTERFACE.match(str(entry["interface"])):
            errors.append(f"{name}: interface {entry['interface']!r} is not an interface name keepalived can take.")
            continue
        own[name] = entry
    networks = {str(ipaddress.ip_interface(f"{e['address']}/{e['prefix']}").network) for e in own.values()}
    if len(networks) > 1:
        errors.append(f"the routers hold d3_router_vip = {vip} in different subnets ({', '.join(sorted(networks))}): "
                      "they must share one.")  # fmt: skip
    if errors or me not in own:
        if not errors:
            errors.append(f"{me} is not a router of d3-routers.")
        return plan
    mine = own[me]
    plan.update(vip=str(vip), interface=str(mine["interface"]), address=str(mine["address"]), prefix=int(mine["prefix"]),
                peers=[own[n]["address"] for n in names if n != me], priority=TOP_PRIORITY - names.index(me))  # fmt: skip
    return plan


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"d3_router_vrrp_addresses": vrrp_addresses, "d3_router_vrrp": vrrp}
