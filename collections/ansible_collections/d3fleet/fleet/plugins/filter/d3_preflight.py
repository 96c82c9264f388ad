"""The d3_preflight role's checks that need a decision.

- ``d3_driver_problems`` (tasks/gpus.yml): is the host's NVIDIA driver new enough for the vLLM image. vLLM's nightly
  image is built on CUDA 13 (tests/contracts/versions.yml: driver), which needs driver R580+; R535-R579 data-center
  drivers run it only in CUDA forward-compatibility mode (d3_cuda_compat).
- ``d3_fleet_problems`` (tasks/fleet.yml): the checks across groups, before any change on any host: every router can
  authenticate to every backend its readiness check asks, and every monitor can reach every exporter through the
  firewall (d3_firewall's nftables set, HAProxy's /metrics ACL). Each refusal names the host, the variable and the
  group where it should be set.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any

try:  # under Ansible: the collection's own modules
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_inputs import shown
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_metrics import _host_address as scrape_address
    from ansible_collections.d3fleet.fleet.plugins.filter.d3_metrics import monitors_problem
except ImportError:  # the unit tests import the filters as top-level modules
    from d3_inputs import shown  # type: ignore[no-redef]
    from d3_metrics import _host_address as scrape_address  # type: ignore[no-redef]
    from d3_metrics import monitors_problem  # type: ignore[no-redef]

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def driver_branch(version: Any) -> int:
    """'580.95.05' -> 580; 0 when the version does not start with a number (refused as too old)."""
    head = str(version).split(".")[0].strip()
    return int(head) if head.isdigit() else 0


def driver_problems(version: Any, host: str, options: Mapping[str, Any]) -> list[str]:
    """The refusal of a driver too old for the image's CUDA, empty when it passes: the driver's branch is at least
    ``min_branch``, or ``cuda_compat`` is set and it is at least ``compat_min_branch``."""
    branch = driver_branch(version)
    minimum, compat_minimum = int(options["min_branch"]), int(options["compat_min_branch"])
    compat = bool(options["cuda_compat"])
    if branch >= minimum or (compat and branch >= compat_minimum):
        return []
    if compat:
        fix = (f"d3_cuda_compat is set, but forward compatibility needs at least R{compat_minimum} "
               "(d3_preflight_driver_compat_min_branch). Fix: upgrade the driver.")  # fmt: skip
    else:
        fix = (f"Fix: upgrade the driver to branch {minimum} or newer, or, on an R{compat_minimum}+ data-center "
               "driver, set d3_cuda_compat: true (adds VLLM_ENABLE_CUDA_COMPATIBILITY=1 to every instance).")  # fmt: skip
    return [
        f"host {host}: NVIDIA driver {version} is older than R{minimum}, which the vLLM image's CUDA 13 needs "
        f"(d3_preflight_driver_min_branch); vLLM would crash-loop at start. {fix}"
    ]


def _members(fleet: Mapping[str, Any], group: str) -> dict[str, dict[str, Any]]:
    members = fleet.get(group)
    if not isinstance(members, Mapping):
        return {}
    return {str(h): dict(v) if isinstance(v, Mapping) else {} for h, v in members.items()}


def _ip(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(str(value))
    except ValueError:
        return None


def _networks(values: Any) -> list[Network]:
    """The IP networks of a list of addresses or networks; a bad entry is left out (the role's own check refuses it)."""
    found = []
    for value in values if isinstance(values, list) else []:
        try:
            found.append(ipaddress.ip_network(str(value), strict=False))
        except ValueError:
            continue
    return found


def _key(value: Any) -> str:
    return value if isinstance(value, str) else ""


def key_problems(fleet: Mapping[str, Any]) -> list[str]:
    """Routers whose readiness check (``d3_router_check_api_key``) would get 401 from a backend host whose instances
    require ``d3_units_api_key``. Never shows a key."""
    backends = _members(fleet, "l4-nodes")
    keyed = {h: _key(spec.get("api_key")) for h, spec in backends.items() if _key(spec.get("api_key"))}
    if len(set(keyed.values())) > 1:
        return [f"hosts {', '.join(sorted(keyed))} of l4-nodes use different API keys (d3_units_api_key), and a "
                "router sends one key to every backend (d3_router_check_api_key): its readiness check would get 401 "
                "from some of them. Fix: set one d3_units_api_key for the fleet, in group_vars/all (the hosts of "
                "l4-nodes and d3-routers both read it)."]  # fmt: skip
    problems = []
    for router, spec in sorted(_members(fleet, "d3-routers").items()):
        sent = _key(spec.get("check_api_key"))
        refused = sorted(h for h, key in keyed.items() if key != sent)
        if not refused:
            continue
        why = (f"d3_router_check_api_key is empty on {router} (it defaults to d3_units_api_key on the router host, "
               "not set there)" if not sent else f"d3_router_check_api_key on {router} is not their key")  # fmt: skip
        problems.append(
            f"router {router} cannot authenticate to {', '.join(refused)}: their instances require the API key "
            f"(d3_units_api_key) and {why}; HAProxy would be configured, then every readiness check would get 401 "
            f"until d3_router_ready_timeout_s. Fix: set d3_units_api_key in group_vars/all (or group_vars/d3-routers), "
            f"from the same vault variable, not only in group_vars/l4-nodes."
        )
    return problems


def _blocked(allowed: list[Network], target: str, monitors: dict[str, dict[str, Any]], host: str) -> list[str]:
    """The monitors that cannot reach ``host`` at ``target`` (where d3_metrics_scrape points them). Loopback is always
    let in: a monitor scrapes its own host over loopback, and a loopback target is reached from the same machine. A
    monitor whose address (its ansible_host, else its name) is an IP must be in ``allowed``; one whose address is a
    name or loopback (how the host sees it is unknown) is blocked only when ``allowed`` is empty."""
    dest = _ip(target)
    if dest is not None and dest.is_loopback:
        return []
    blocked = []
    for monitor, spec in sorted(monitors.items()):
        if monitor == host:
            continue
        source = spec.get("ansible_host") if spec.get("ansible_host") not in (None, "") else monitor
        ip = _ip(source)
        if ip is None or ip.is_loopback:
            if not allowed:
                blocked.append(f"{monitor} ({shown(str(source))})")
        elif not any(ip in net for net in allowed):
            blocked.append(f"{monitor} ({shown(str(source))})")
    return blocked


def monitor_problems(fleet: Mapping[str, Any]) -> list[str]:
    """Exporters a monitor of ``d3-monitors`` cannot scrape: node exporter (and the instances' /metrics) behind
    d3_firewall on a host with ``d3_firewall_enabled``, where only loopback and ``d3_firewall_monitors`` get in; HAProxy's
    /metrics on a router, where only loopback and ``d3_router_metrics_allowed`` get in."""
    monitors = _members(fleet, "d3-monitors")
    if not monitors:
        return []
    l4, routers = _members(fleet, "l4-nodes"), _members(fleet, "d3-routers")
    problems = []
    for host in sorted(set(l4) | set(routers)):
        spec = l4[host] if host in l4 else routers[host]
        if spec.get("firewall") is not True:
            continue
        groups = [g for g, members in (("l4-nodes", l4), ("d3-routers", routers)) if host in members]
        blocked = _blocked(_networks(spec.get("firewall_monitors")), scrape_address(spec, host, ""), monitors, host)
        if blocked:
            what = "node exporter and the instances' /metrics" if host in l4 else "node exporter"
            problems.append(
                f"host {host}: the firewall is on (d3_firewall_enabled) and lets only loopback and d3_firewall_monitors "
                f"= {shown(spec.get('firewall_monitors'))} reach {what}: the monitor {', '.join(blocked)} of d3-monitors "
                f"would be refused, and its alerts would never see data. Fix: list the monitors' addresses, as {host} "
                f"sees them, in d3_firewall_monitors in group_vars/{' or group_vars/'.join(groups)} (or group_vars/all)."
            )
    for router, spec in sorted(routers.items()):
        blocked = _blocked(_networks(spec.get("metrics_allowed")), scrape_address(spec, router, ""), monitors, router)
        if blocked:
            problems.append(
                f"router {router}: HAProxy's /metrics (d3_router_metrics_port) answers loopback and "
                f"d3_router_metrics_allowed = {shown(spec.get('metrics_allowed'))} only: the monitor {', '.join(blocked)} "
                "of d3-monitors would get 403. Fix: list the monitors' addresses, as the router sees them, in "
                "d3_router_metrics_allowed in group_vars/d3-routers (or group_vars/all)."
            )
    return problems


def fleet_problems(_input: Any) -> list[str]:
    """Every refusal across groups (``key_problems``, more than one monitor (d3_metrics.monitors_problem), then
    ``monitor_problems``); empty when the fleet passes.
    ``_input``: ``{l4-nodes: {host: {api_key, backend_address, ansible_host, firewall, firewall_monitors}},
    d3-routers: {host: {check_api_key, ansible_host, firewall, firewall_monitors, metrics_allowed}},
    d3-monitors: {host: {ansible_host}}}``."""
    fleet = _input if isinstance(_input, Mapping) else {}
    several = monitors_problem(_members(fleet, "d3-monitors"))
    return key_problems(fleet) + ([several] if several else []) + monitor_problems(fleet)


class FilterModule:
    """Ansible filters: d3_driver_problems, d3_fleet_problems."""

    def filters(self) -> dict[str, Any]:
        return {"d3_driver_problems": driver_problems, "d3_fleet_problems": fleet_problems}
