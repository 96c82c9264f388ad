#!/usr/bin/python3
"""HAProxy's server-state file, made to agree with the configuration it is loaded with (the d3_router role installs
this file as /usr/local/libexec/d3-fleet/d3-haproxy-save-state; standard library only, Python 3.9+).

The file is ``show servers state`` (doc/management.txt 9.3): a first line with the format version, 1, a ``# be_id
be_name ...`` line naming the fields, then one line per server of 20 to 25 fields separated by spaces, the same in
2.6 and 3.0 (include/haproxy/server-t.h ``SRV_STATE_FILE_FIELD_NAMES``, src/proxy.c ``dump_servers_state``; the
contract tests/contracts/haproxy/server-state.yml). A new worker (``load-server-state-from-file global``) finds each
configured server's line by backend and server name and applies its states **and its port**: src/server_state.c
``srv_state_srv_update`` ends with ``if (port_st) srv->svc_port = port_svc;`` (v2.6.0 and v3.0.0), whatever the
configuration says. The address is not applied (it becomes ``lastaddr``, used only by ``init-addr last``, which the
role does not set). So a reload after the plan moved an instance to another port kept sending to the old one.

Before HAProxy reads the file (haproxy.service's reload, restart and start; the role's drop-in) each line is compared
with the server of the same backend and name in the configuration:

- same port (and the same address where the configuration gives an IP address): kept as it is, drain and maintenance
  included;
- moved, neither drained nor in maintenance: dropped; the server starts as the configuration describes it, as HAProxy
  starts a server the file does not name;
- moved while drained (``set server ... state drain``) or in maintenance (``state maint``): kept with the new port,
  its operational state STOPPED and its check health 0 (the old port's UP says nothing about the new one), so the
  drain or the maintenance stays and the server is DOWN until its checks pass at the new port;
- a server the configuration no longer has, and every line HAProxy would not read (a wrong field count): dropped.

Usage (never fails: a reload goes ahead either way):
    d3-haproxy-save-state SOCKET FILE [CONFIG]   save ``show servers state`` to FILE, made to agree with CONFIG
    d3-haproxy-save-state --reconcile FILE CONFIG   make FILE agree with CONFIG (before a start)
When the state cannot be read (HAProxy gone), FILE stays and is made to agree with CONFIG.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import sys
import tempfile

VERSION = "1"
# include/haproxy/server-t.h SRV_STATE_FILE_FIELD_NAMES, the same at v2.6.0 and v3.0.0
FIELDS = ("be_id", "be_name", "srv_id", "srv_name", "srv_addr", "srv_op_state", "srv_admin_state", "srv_uweight",
          "srv_iweight", "srv_time_since_last_change", "srv_check_status", "srv_check_result", "srv_check_health",
          "srv_check_state", "srv_agent_state", "bk_f_forced_id", "srv_f_forced_id", "srv_fqdn", "srv_port", "srvrecord",
          "srv_use_ssl", "srv_check_port", "srv_check_addr", "srv_agent_addr", "srv_agent_port")  # fmt: skip
MIN_FIELDS, MAX_FIELDS = 20, 25  # SRV_STATE_FILE_MIN_FIELDS_VERSION_1, SRV_STATE_FILE_MAX_FIELDS_VERSION_1
BE_NAME, SRV_NAME, SRV_ADDR, OP_STATE, ADMIN_STATE = 1, 3, 4, 5, 6
CHECK_HEALTH, SRV_PORT = 12, 18
FMAINT, FDRAIN = 0x01, 0x08  # SRV_ADMF_FMAINT, SRV_ADMF_FDRAIN: `set server ... state maint|drain`
STOPPED = "0"  # SRV_ST_STOPPED
SECTIONS = {"global", "defaults", "frontend", "backend", "listen", "peers", "resolvers", "userlist", "program",
            "http-errors", "ring", "cache", "mailers", "crt-store", "traces", "log-forward"}  # fmt: skip


def config_servers(text: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(backend, server): (address, port)} of every ``server NAME ADDRESS:PORT`` line in a ``backend`` or ``listen``
    section of a configuration (the role's: one file, no ``default-server`` port, no port ranges)."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    proxy = None
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] in SECTIONS and not line[:1].isspace():
            proxy = words[1] if words[0] in ("backend", "listen") and len(words) > 1 else None
        elif proxy and words[0] == "server" and len(words) > 2:
            address, _, port = words[2].rpartition(":")
            out[(proxy, words[1])] = (address.strip("[]"), port)
    return out


def ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address ``address`` spells (any spelling of it), or None for a host name or ``-``."""
    try:
        return ipaddress.ip_address(address)
    except ValueError:
        return None


def is_state(text: str) -> bool:
    """A version 1 state file: its version line, then the field names (a dump cut short by a dying HAProxy is not)."""
    lines = text.splitlines()
    return len(lines) >= 2 and lines[0].strip() == VERSION and lines[1].split() == ["#", *FIELDS]


def reconcile(state: str, servers: dict[tuple[str, str], tuple[str, str]]) -> tuple[str, list[str]]:
    """A state file's text (``is_state``) made to agree with ``servers`` (``config_servers``), and a line for each
    server changed (``be/srv: 10.0.0.1:9001 -> 10.0.0.1:9002, dropped ...`` or ``..., kept drained, ...``)."""
    lines = state.splitlines()
    out, changes = lines[:2], []
    for line in lines[2:]:
        fields = line.split()
        if not MIN_FIELDS <= len(fields) <= MAX_FIELDS:
            continue
        name = f"{fields[BE_NAME]}/{fields[SRV_NAME]}"
        configured = servers.get((fields[BE_NAME], fields[SRV_NAME]))
        if configured is None:
            changes.append(f"{name}: not in the configuration, dropped")
            continue
        address, port = configured
        # a host name in the configuration: the saved address is what libc gave for it, not comparable
        if fields[SRV_PORT] == port and (ip(address) is None or ip(fields[SRV_ADDR]) == ip(address)):
            out.append(line)
            continue
        moved = f"{name}: {fields[SRV_ADDR]}:{fields[SRV_PORT]} -> {address}:{port}"
        admin = int(fields[ADMIN_STATE]) if fields[ADMIN_STATE].isdigit() else 0
        if not admin & (FMAINT | FDRAIN):
            changes.append(f"{moved}, dropped (starts as configured)")
            continue
        fields[SRV_PORT], fields[OP_STATE], fields[CHECK_HEALTH] = port, STOPPED, "0"
        out.append(" ".join(fields))
        changes.append(f"{moved}, kept {'in maintenance' if admin & FMAINT else 'drained'}, DOWN until its checks pass")
    return "\n".join(out) + "\n", changes


def ask(path: str, command: str, timeout: float) -> str:
    """One runtime API or master CLI command: the line sent, the sending side closed (as `socat` does at the end of its
    input), read until HAProxy closes the connection. The master CLI keeps a connection open after answering until the
    client's side closes (the HAProxy maintainer's review, 2.6.12 and 3.0.11): without the half-close every master CLI
    command waited the whole timeout and failed. The module haproxy_runtime asks through this one too."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


def write(path: str, text: str) -> None:
    """Through a temporary file of its own in the same directory and a rename (the module's save may run at once)."""
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path) or ".")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def run(argv: list[str], timeout: float = 10.0) -> list[str]:
    """What the command line asks (module docstring); returns the lines to print."""
    if len(argv) == 4 and argv[1] == "--reconcile":
        sock, path, config = "", argv[2], argv[3]
    elif len(argv) in (3, 4) and not argv[1].startswith("-"):
        sock, path, config = argv[1], argv[2], argv[3] if len(argv) == 4 else ""
    else:
        return ["usage: d3-haproxy-save-state SOCKET FILE [CONFIG] | --reconcile FILE CONFIG"]
    state = None
    if sock:
        with contextlib.suppress(OSError):
            state = ask(sock, "show servers state", timeout)
    if state is None or not is_state(state):  # HAProxy gone: the last file stays, made to agree with CONFIG
        state = read(path)
        if state is None or not is_state(state):
            return [f"{path}: no server state to save"]
    notes = []
    configured = read(config) if config else None
    if configured is not None:
        state, changes = reconcile(state, config_servers(configured))
        notes = [f"{path}: {change}" for change in changes]
    elif config:
        notes = [f"{config}: not readable, the state saved as HAProxy gave it"]
    with contextlib.suppress(OSError):
        if state != read(path):
            write(path, state)
    return notes


def main() -> int:
    for line in run(sys.argv):
        print(line, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
