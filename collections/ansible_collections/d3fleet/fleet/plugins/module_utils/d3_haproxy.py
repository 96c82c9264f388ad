"""HAProxy's runtime API, the parts the d3_router role uses: the ``set server`` command and the ``show stat`` CSV.

Shared by the filters of plugins/filter/d3_router_api.py (on the controller) and the module haproxy_runtime (on the
router). Standard library only. The protocol is HAProxy's management guide (doc/management.txt): "9.3. Unix Socket
commands" (non-interactive mode: one line, the answer, then HAProxy closes the connection; ``set server
<backend>/<server> state [ ready | drain | maint ]``) and "9.1. CSV format" (``show stat``: a header line ``# pxname,
svname,...``, then one line per proxy and server; fields ``pxname``, ``svname``, ``scur`` (current sessions),
``status`` (UP, DOWN, NOLB, DRAIN, MAINT, MAINT(via)..., with ``N/M`` while a check is changing it)); and "9.4.
Master CLI" (the master process's socket, ``-S``, Debian's ``/run/haproxy-master.sock``: ``show proc`` lists the
master, the current workers and the old ones still finishing their requests after a reload; ``@!<pid> <command>``
sends a command to one of them: tests/contracts/haproxy/master-cli.yml).
"""

from __future__ import annotations

import csv
import re
from typing import Any

NAME = re.compile(r"\A[A-Za-z0-9_.:-]{1,127}\Z")
STATES = ("ready", "drain", "maint")


def set_command(server: dict[str, Any], state: str) -> str:
    """``set server <backend>/<server> state <state>`` for one {backend, server}; the names are checked as whole
    strings (HAProxy's name characters), so nothing else can reach the runtime API."""
    if state not in STATES:
        raise ValueError(f"state must be one of {', '.join(STATES)}, not {state!r}")
    backend, name = server.get("backend"), server.get("server")
    for what, value in (("backend", backend), ("server", name)):
        if not isinstance(value, str) or not NAME.match(value):
            raise ValueError(f"{what} name {value!r} is not an HAProxy name (letters, digits, . _ : -)")
    return f"set server {backend}/{name} state {state}"


def parse_stat(text: str) -> list[dict[str, Any]]:
    """Every row of ``show stat``, in HAProxy's order: {backend (pxname), server (svname), scur (int), status}."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# "):
        raise ValueError(f"not the output of `show stat`: {text[:200]!r}")
    return [
        {"backend": row.get("pxname") or "", "server": row.get("svname") or "", "scur": int(row.get("scur") or 0),
         "status": row.get("status") or ""}
        for row in csv.DictReader([lines[0][2:], *lines[1:]])
    ]  # fmt: skip


def select(rows: list[dict[str, Any]], servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the given {backend, server}s, in their order. A server HAProxy does not list gets status
    ``MISSING`` and scur 0 (a wait for UP, or for no session, then never passes)."""
    by_name = {(row["backend"], row["server"]): row for row in rows}
    out = []
    for server in servers:
        key = (server.get("backend"), server.get("server"))
        out.append(dict(by_name.get(key) or {"backend": key[0], "server": key[1], "scur": 0, "status": "MISSING"}))
    return out


def in_state(status: str, state: str) -> bool:
    """Whether a server whose ``show stat`` status is ``status`` is known to be in the administrative ``state``
    already. ``show stat`` shows DRAIN only for a server that is up, and MAINT for maintenance; a DOWN server may or
    may not be drained, so it is never taken as already ``drain`` or ``ready`` (the command is sent: it is idempotent)."""
    word = status.split(" ")[0]
    if state == "drain":
        return word == "DRAIN"
    if state == "maint":
        return word.startswith("MAINT")
    return word in ("UP", "NOLB")


def ready_steps(status: str) -> tuple[str, ...]:
    """The ``set server ... state`` steps that give back a server whose ``show stat`` status is ``status``.

    Through maintenance (``maint``, then ``ready``) so that ``slowstart`` applies: configuration.txt "It only applies
    when a server has been previously seen as failed", and src/server.c (v2.6.0, v3.0.0) starts the ramp when a server
    leaves maintenance, setting its check health to ``rise`` ("start OK but check immediately"): it is UP at once,
    before its first check. For a server that is DOWN (its checks fail: the instance is not serving) that made it
    ``UP 1/2``, eligible for new requests, until that check failed (tests/contracts/haproxy/giveback-down.json); so a
    DOWN server is given back from DRAIN directly: it stays DOWN, and when its checks pass it comes up through the
    same ramp (a server coming back from failed checks starts STARTING with its warmup, src/server.c
    ``srv_set_running``)."""
    return ("ready",) if status.split(" ")[0] == "DOWN" else ("maint", "ready")


def parse_proc(text: str) -> list[dict[str, Any]]:
    """The processes of the master CLI's ``show proc``: {pid, type, section} per line, section ``master`` before the
    first ``# <section>`` comment (``workers``, ``old workers``, ``programs``). Fails on text that has no master line."""
    out = []
    section = "master"
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#<") or line.startswith("# <"):
            continue
        if line.startswith("#"):
            section = line.lstrip("#").strip()
            continue
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit():
            out.append({"pid": int(fields[0]), "type": fields[1], "section": section})
    if not any(p["type"] == "master" for p in out):
        raise ValueError(f"not the output of `show proc`: {text[:200]!r}")
    return out


def worker_pids(text: str) -> list[int]:
    """The pids of every worker ``show proc`` lists, the current ones and the old ones still finishing their
    requests (not the master, not external programs)."""
    return [p["pid"] for p in parse_proc(text) if p["type"] == "worker" and p["section"] in ("workers", "old workers")]
