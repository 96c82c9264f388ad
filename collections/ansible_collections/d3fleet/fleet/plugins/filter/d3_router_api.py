"""HAProxy runtime API helpers for draining (Ansible filter plugins ``d3_router_command``, ``d3_router_stat``).

Pure functions used by the d3_router role's drain.yml / ready.yml (delegated from playbooks/rollout.yml). The runtime
API and ``show stat``'s CSV are HAProxy's management interface (doc/management.txt, "9.3. Unix Socket commands" and
"9.1. CSV format": fields ``pxname``, ``svname``, ``scur`` (current sessions), ``status``).
"""

from __future__ import annotations

import csv
import re
from typing import Any

NAME = re.compile(r"\A[A-Za-z0-9_.:-]{1,127}\Z")
STATES = ("ready", "drain", "maint")


def router_command(server: dict[str, Any], state: str) -> str:
    """``set server <backend>/<server> state <state>`` for one {backend, server}; names are checked (whole string,
    HAProxy's name characters), so nothing else can reach the runtime API."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
    backend, name = server.get("backend"), server.get("server")
    for what, value in (("backend", backend), ("server", name)):
        if not isinstance(value, str) or not NAME.match(value):
            raise ValueError(f"{what} name {value!r} is not an HAProxy name (letters, digits, . _ : -)")
    return f"set server {backend}/{name} state {state}"


def router_stat(text: str, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of ``show stat`` for the given {backend, server}s, in their order: {backend, server, scur, status}. A
    server HAProxy does not list gets status ``MISSING`` (a wait for UP, or for no session, then never passes)."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not the output of `show stat`: {text[:200]!r}")
    reader = csv.DictReader([lines[0][2:], *lines[1:]])
    rows = {(row.get("pxname"), row.get("svname")): row for row in reader}
    out = []
    for server in servers:
        row = rows.get((server.get("backend"), server.get("server")))
        if row is None:
            out.append({"backend": server.get("backend"), "server": server.get("server"), "scur": 0, "status": "MISSING"})
        else:
            scur = int(row.get("scur") or 0)
            out.append({"backend": row["pxname"], "server": row["svname"], "scur": scur, "status": row.get("status", "")})
    return out


def router_status(text: str, router: str = "") -> list[str]:
    """One line per backend of ``show stat``: the model (backend ``be_<served name>``) and its servers grouped by what
    the router does with them: up (sent requests), draining, down (failing health checks, or going down), in
    maintenance."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not the output of `show stat`: {text[:200]!r}")
    groups: dict[str, dict[str, list[str]]] = {}
    for row in csv.DictReader([lines[0][2:], *lines[1:]]):
        backend, server, status = row.get("pxname") or "", row.get("svname") or "", row.get("status") or ""
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


class FilterModule:
    """Ansible filters: d3_router_command, d3_router_stat, d3_router_status."""

    def filters(self) -> dict[str, Any]:
        return {"d3_router_command": router_command, "d3_router_stat": router_stat, "d3_router_status": router_status}
