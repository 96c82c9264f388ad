"""HAProxy runtime API filters: ``d3_router_command``, ``d3_router_stat``, ``d3_router_status``, ``d3_router_api_problems``.

Pure functions on the controller; the parsing is module_utils/d3_haproxy.py, shared with the haproxy_runtime module
that talks to the routers (the d3_router role's servers.yml, drainable.yml, verify.yml, status.yml). The runtime API
and ``show stat``'s CSV are HAProxy's management interface (doc/management.txt, "9.3. Unix Socket commands" and "9.1.
CSV format": fields ``pxname``, ``svname``, ``scur`` (current sessions), ``status``).
"""

from __future__ import annotations

from typing import Any

from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_haproxy import parse_stat, select, set_command


def router_command(server: dict[str, Any], state: str) -> str:
    """``set server <backend>/<server> state <state>`` for one {backend, server}; names are checked (whole string,
    HAProxy's name characters), so nothing else can reach the runtime API."""
    return set_command(server, state)


def router_stat(text: str, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``show stat`` for the given {backend, server}s, in their order: {backend, server, scur, status}. A
    server HAProxy does not list gets status ``MISSING`` (a wait for UP, or for no session, then never passes)."""
    return select(parse_stat(text), servers)


def router_status(stat: str | list[dict[str, Any]], router: str = "") -> list[str]:
    """One line per backend of ``show stat`` (its text, or the rows the haproxy_runtime module returns as ``stat``):
    the model (backend ``be_<served name>``) and its servers grouped by what the router does with them: up (sent
    requests), draining, down (failing health checks, or going down), in maintenance."""
    groups: dict[str, dict[str, list[str]]] = {}
    for row in parse_stat(stat) if isinstance(stat, str) else stat:
        backend, server, status = row["backend"], row["server"], row["status"]
        if server in ("FRONTEND", "BACKEND") or not backend.startswith("be_"):
            continue
        word = status.split()[0] if status else ""
        kind = {"UP": "up", "DRAIN": "draining", "MAINT": "maint", "NOLB": "draining"}.get(word, "down")
        if status.startswith("UP ") and "/" in status:  # going down: failed checks, not yet down
            kind = "down"
        groups.setdefault(backend[3:], {"up": [], "draining": [], "down": [], "maint": []})[kind].append(server)
    prefix = f"{router}: " if router else ""
    return [
        prefix + f"{model}: {len(g['up'])} up, {len(g['draining'])} draining, {len(g['down'])} down, {len(g['maint'])} in maintenance"
        + "".join(f"; {kind}: {', '.join(names)}" for kind, names in g.items() if names and kind != "up")
        for model, g in sorted(groups.items())
    ]


def router_api_problems(results: list[dict[str, Any]]) -> list[str]:
    """What stops a rollout (or a converge) at the routers, from the haproxy_runtime module's results (one per
    router, a loop's ``results`` or a single result in a list): a router whose runtime API did not answer ``show
    stat`` (the result has no ``stat``: the module failed, or the router was unreachable), named with its socket and
    the error (the module's ``error``, else ``msg``); a router that does not know some of the servers asked for
    (``missing``), named with those servers."""
    out = []
    for result in results:
        router = result.get("router") or result.get("item") or "router"
        if "stat" not in result:
            error = " ".join(str(result.get("error") or result.get("msg") or "no answer").split())
            error = error if len(error) <= 160 else error[:157] + "..."
            out.append(f"{router}: no HAProxy runtime API at {result.get('socket') or '?'} ({error}).")
            continue
        names = list(dict.fromkeys(server["server"] for server in result.get("missing") or []))
        if names:
            out.append(f"{router} does not know the servers {', '.join(names)}.")
    return out


class FilterModule:
    """Ansible filters: d3_router_command, d3_router_stat, d3_router_status, d3_router_api_problems."""

    def filters(self) -> dict[str, Any]:
        return {"d3_router_command": router_command, "d3_router_stat": router_stat, "d3_router_status": router_status,
                "d3_router_api_problems": router_api_problems}  # fmt: skip
