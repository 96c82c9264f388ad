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

One lock, FILE + ``.lock`` (``lock_path``), orders every save and every change of a server's state. A reload saves
the state, checks the configuration and signals the master; the new worker reads the file while it starts, before it
binds (haproxy.c: ``apply_server_state()`` before ``protocol_bind_all()``, v2.6.0 and v3.0.0). A ``set server`` in
that window reached the old worker only and was lost (a drain came back ready, a ``ready`` came back DRAIN: the
HAProxy maintainer's review, Debian's 2.6.12 and 3.0.11 on loopback; tests/contracts/haproxy/reload-race.json). So
``--reload`` holds the lock from its save until the stats socket is answered by a worker that was not there before the
signal (``show info``'s ``Pid``: a worker answers only once it runs, after it read the file), and the module
haproxy_runtime holds it around its ``set server`` and its own save: a change lands either before the reload's save
(the file has it) or after the new worker runs (the new worker gets it).

Usage:
    d3-haproxy-save-state SOCKET FILE [CONFIG]   save ``show servers state`` to FILE, made to agree with CONFIG
    d3-haproxy-save-state --reconcile FILE CONFIG   make FILE agree with CONFIG (before a start)
    d3-haproxy-save-state --reload SOCKET FILE CONFIG MAINPID -- CHECK...   under the lock: save, run CHECK (the
        package's ``haproxy -c`` line), then SIGUSR2 to the master MAINPID and wait for the new worker (haproxy.service's
        reload; exits with CHECK's status when the configuration is refused, as the package's reload does, else 0)
The saves never fail: when the state cannot be read (HAProxy gone), FILE stays and is made to agree with CONFIG; when
the lock is not had within LOCK_WAIT_S the save or the reload goes ahead without it and says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

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
# a reload holds the lock about 0.1-2 s (save, haproxy -c, a new worker's start: docs/router.md); one whose new worker
# never answers (its start failed: the master keeps the old one) gives it up after NEW_WORKER_WAIT_S, and a change
# waiting for it waits longer than that and the check's time together (the review of 2026-12-05: both were 30 s, so a
# change that came with a failed reload was refused)
NEW_WORKER_WAIT_S = 20.0
LOCK_WAIT_S = 45.0
POLL_S = 0.01
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
    """Through a temporary file of its own in the same directory, written to the disk (``fsync``), then a rename and the
    directory written to the disk: after a power loss the file is the old one or the new one, never empty (an empty
    file would start every server ready, and the rollout's drain records would give its drains back)."""
    directory = os.path.dirname(path) or "."
    handle, temporary = tempfile.mkstemp(prefix=os.path.basename(path) + ".", dir=directory)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    finally:
        with contextlib.suppress(OSError):
            os.remove(temporary)


def lock_path(state_file: str) -> str:
    """The lock that orders the saves of ``state_file`` and the changes of the servers' states (module docstring)."""
    return state_file + ".lock"


@contextlib.contextmanager
def locked(state_file: str, wait: float = LOCK_WAIT_S, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> Iterator[bool]:  # fmt: skip
    """Hold ``lock_path(state_file)`` (``flock``, exclusive; the file root's only, 0600) for the ``with`` block; yields
    True when held, False when another holder kept it ``wait`` seconds (the caller decides). Released when the block
    ends, or when the process dies (a killed holder never leaves it taken). OSError when the lock cannot be opened."""
    fd = os.open(lock_path(state_file), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = clock() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held = True
                break
            except BlockingIOError:
                if clock() >= deadline:
                    held = False
                    break
                sleep(POLL_S)
        yield held
    finally:
        os.close(fd)


@contextlib.contextmanager
def held_or_not(path: str, doing: str, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep) -> Iterator[list[str]]:  # fmt: skip
    """The helper's lock: a save or a reload never waits longer than LOCK_WAIT_S for it, and never fails for want of
    it; yields the note to print when it goes ahead without it."""
    with contextlib.ExitStack() as stack:
        try:
            held = stack.enter_context(locked(path, clock=clock, sleep=sleep))
            notes = [] if held else [f"{lock_path(path)}: still held after {LOCK_WAIT_S:.0f} s, {doing} without it"]
        except OSError as exc:
            notes = [f"{lock_path(path)}: {exc.strerror or exc}, {doing} without the lock"]
        yield notes


def info_pid(text: str) -> int | None:
    """The ``Pid:`` of a ``show info`` answer (management.txt 9.3), None without one."""
    for line in text.splitlines():
        if line.startswith("Pid:") and line.split()[1:2] and line.split()[1].isdigit():
            return int(line.split()[1])
    return None


def worker_pid(sock: str, timeout: float) -> int | None:
    """The pid of the worker that answers the stats socket (``show info``'s ``Pid:``), None when none answers."""
    with contextlib.suppress(OSError):
        return info_pid(ask(sock, "show info", timeout))
    return None


def ask_as(sock: str, command: str, timeout: float) -> tuple[int | None, str]:
    """``show info;COMMAND`` in one connection (management.txt 9.3: commands separated by ``;`` run in turn on the
    same worker): the pid of the worker that ran COMMAND, and COMMAND's answer. After a reload the old worker may
    still take a connection on the stats socket for a while (242 ms after the new one answered, under load: the
    review of 2026-12-05), so a change is known to have reached the current worker only by its pid."""
    text = ask(sock, f"show info;{command}", timeout)
    info, found, rest = text.partition("\n\n")
    return info_pid(info), rest if found else text


def patch(state: str, changes: dict[tuple[str, str], str]) -> str:
    """A state file's text with the administrative state of each changed (backend, server) as HAProxy's ``set server
    ... state`` leaves it (src/server.c v2.6.0, v3.0.0: ``drain`` sets FDRAIN and clears FMAINT, ``ready`` clears
    both, ``maint`` sets FMAINT and clears FDRAIN): for when ``show servers state`` cannot be read after a change, so the
    last file keeps every other server's state and gets this change (the file is never removed)."""
    set_flags = {"drain": (FDRAIN, FMAINT), "ready": (0, FDRAIN | FMAINT), "maint": (FMAINT, FDRAIN)}
    lines = state.splitlines()
    for n, line in enumerate(lines[2:], start=2):
        fields = line.split()
        wanted = changes.get((fields[BE_NAME], fields[SRV_NAME])) if len(fields) > SRV_NAME else None
        if wanted and len(fields) > ADMIN_STATE and fields[ADMIN_STATE].isdigit():
            add, clear = set_flags[wanted]
            fields[ADMIN_STATE] = str((int(fields[ADMIN_STATE]) | add) & ~clear)
            lines[n] = " ".join(fields)
    return "\n".join(lines) + "\n"


def save(sock: str, path: str, config: str, timeout: float) -> list[str]:
    """Save ``show servers state`` (or, HAProxy gone, the last file) to ``path``, made to agree with ``config``; the
    lines to print."""
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


def reload(sock: str, path: str, config: str, mainpid: int, check: list[str], timeout: float = 10.0,
           clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> tuple[int, list[str]]:  # fmt: skip
    """haproxy.service's reload under the lock (module docstring): (exit status, lines to print)."""
    with held_or_not(path, "reloading", clock, sleep) as notes:
        notes += save(sock, path, config, timeout)
        try:
            status = subprocess.run(check, check=False).returncode  # the package's check: its messages to the journal
            if status == 0:
                before = worker_pid(sock, timeout)
                os.kill(mainpid, signal.SIGUSR2)
        except OSError as exc:
            return 1, [*notes, f"reload: {exc}"]
        if status:
            return status, [*notes, f"{' '.join(check)}: exit status {status}, no reload"]
        deadline = clock() + NEW_WORKER_WAIT_S
        while (now := worker_pid(sock, timeout)) is None or now == before:
            if clock() >= deadline:
                return 0, [*notes, f"{sock}: no new worker answered {NEW_WORKER_WAIT_S:.0f} s after the reload "
                           f"(still {now or 'none'}): look at journalctl -u haproxy"]  # fmt: skip
            sleep(POLL_S)
    return 0, notes


USAGE = ("usage: d3-haproxy-save-state SOCKET FILE [CONFIG] | --reconcile FILE CONFIG"
         " | --reload SOCKET FILE CONFIG MAINPID -- CHECK...")  # fmt: skip


def run(argv: list[str], timeout: float = 10.0) -> tuple[int, list[str]]:
    """What the command line asks (module docstring); returns the exit status and the lines to print."""
    if len(argv) > 7 and argv[1] == "--reload" and argv[6] == "--" and argv[5].isdigit():
        return reload(argv[2], argv[3], argv[4], int(argv[5]), argv[7:], timeout)
    if len(argv) == 4 and argv[1] == "--reconcile":
        sock, path, config = "", argv[2], argv[3]
    elif len(argv) in (3, 4) and not argv[1].startswith("-"):
        sock, path, config = argv[1], argv[2], argv[3] if len(argv) == 4 else ""
    else:
        return 2, [USAGE]
    with held_or_not(path, "saving") as notes:
        return 0, notes + save(sock, path, config, timeout)


def main() -> int:
    status, lines = run(sys.argv)
    for line in lines:
        print(line, file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
