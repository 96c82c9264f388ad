#!/usr/bin/python
"""Ansible module: HAProxy's runtime API (the stats socket) for the d3_router role, without socat."""

from __future__ import annotations

DOCUMENTATION = r"""
module: haproxy_runtime
version_added: 0.4.0
short_description: Read HAProxy's show stat, set servers to drain or ready, and wait until they are drained or up
description:
  - Talks to HAProxy's runtime API on its UNIX stats socket (the C(stats socket ... level admin) line of the global
    section) from Python, one command per connection in HAProxy's non-interactive mode (the command line is sent, HAProxy
    answers and closes the connection).
  - Always reads C(show stat) (the CSV of section "9.1. CSV format" - a header line C(# pxname,svname,...), then one line
    per proxy and server -) and returns, for every row, its backend, server, current sessions (C(scur)) and C(status).
  - With O(state), sends C(set server <backend>/<server> state <state>) for each of O(servers) that is not known to be in
    that state already (C(show stat) shows V(DRAIN) for a drained server that is up, V(UP) or V(NOLB) for a ready one;
    a V(DOWN) server may be either, so the command is sent to it). HAProxy answers an empty line when the command is
    taken; any other answer (V(No such server.), V(Permission denied)) fails the module, naming the router, the socket
    and the server. Check mode sends nothing and reports what would change.
  - A server given back (V(ready)) goes through maintenance first, C(set server ... state maint) then C(state ready),
    since HAProxy applies a server's C(slowstart) only when it was seen failed or leaves maintenance (doc/configuration.txt
    "slowstart"; src/server.c), so a server back from DRAIN would take its whole share of new requests at once; from
    MAINT its share grows over the C(slowstart) period (tests/contracts/haproxy/loopback-2.6.12-3.0.11.json). A V(DOWN)
    server is given back with C(state ready) only - leaving maintenance sets its check health to C(rise) (src/server.c),
    so it would be V(UP 1/2), taking new requests, until its first check failed; it stays V(DOWN), and ramps up over
    C(slowstart) when its checks pass (tests/contracts/haproxy/giveback-down.json).
  - After it changed a server's state, it writes C(show servers state) (doc/management.txt) to O(state_file), the file
    HAProxy's C(server-state-file) names, through a temporary file written to the disk and a rename, so that a start
    after an unclean stop (C(kill -9), a crash, a power loss) or a reload that bypasses the service's own save applies
    the states as they are now, never an older drain. When the state cannot be read, the last file gets this change
    (each changed server's administrative state as C(set server) leaves it) and keeps every other server's state, never
    removed (C(state_patched), and a warning); when there is no last file either, nothing is written and a warning
    says so. The change itself stands.
  - Its C(set server) commands and that save are made under the lock O(state_file)C(.lock) that the d3_router role's
    reload holds from its own save until the new worker runs (module_utils/d3_server_state.py), so a change is never
    sent in between, where the old worker alone would get it and the new one would start from the file without it.
    It fails, sending nothing, when the lock is not had within 45 s. Without O(state_file) or its directory, no lock.
  - Each command goes as C(show info;<command>), which names the worker that ran it; with O(master_socket), one that a
    worker C(show proc) does not list as current took (an old one still accepting for a moment after a reload) is sent
    again, for 5 s at most.
  - While it waits, it checks on every read that the servers are still in O(state) (V(DRAIN), V(MAINT) or V(DOWN) for
    a drain; not V(DRAIN) or plain V(MAINT) for V(ready)). A server out of it under another worker than the one it was
    set on lost it in a reload that bypassed the lock (C(kill -USR2), the master CLI's C(reload)), so it is set again and
    named in C(reapplied). Under the same worker someone else changed it, so the module fails, naming it, and does not
    fight them.
  - With O(wait), polls C(show stat) every O(poll) seconds until the O(servers) have no current session left (sum of
    C(scur) 0, for V(drain)) or are all V(UP) (for V(ready)), and fails after O(timeout) seconds naming the servers
    that are not there yet. Check mode does not wait.
  - With O(master_socket) (HAProxy's master CLI, C(-S); Debian's haproxy.service has C(/run/haproxy-master.sock)), a
    wait for V(drain) counts each server's sessions on every worker the master lists in C(show proc) - the current ones
    and the old ones still finishing their requests after a reload (C(@!<pid> show stat), management.txt "9.4. Master
    CLI") - not only on the worker the stats socket reaches; after a reload that one is new and shows 0 sessions while
    the old worker still serves the drained server's requests in flight. A worker that left between C(show proc) and
    its C(show stat) counts nothing; a C(show proc) that fails (a reload re-executing the master) is a read that did
    not happen, asked again at the next poll.
  - Every name that reaches the socket is checked first, as a whole string (backend and server names, of letters,
    digits, C(.) C(_) C(:) C(-), at most 127 characters, and the socket path, a plain absolute path), before any command is sent.
  - The protocol is HAProxy's management guide, doc/management.txt in the HAProxy sources, section "9.3. Unix Socket
    commands" (non-interactive mode; C(set server <backend>/<server> state [ ready | drain | maint ])) and "9.1. CSV
    format" (C(show stat)); the parsing is module_utils/d3_haproxy.py, shared with the d3_router_api filters, and is
    tested against a C(show stat) captured from Debian's HAProxy 3.0 (tests/contracts/haproxy/show-stat.csv).
options:
  socket:
    description:
      - The stats socket (a plain absolute path, checked as given; the d3_router role's C(d3_router_stats_socket)).
    type: str
    required: true
  master_socket:
    description:
      - HAProxy's master CLI socket (a plain absolute path; the d3_router role's C(d3_router_master_socket)). When set,
        a wait for V(drain) counts the sessions on every worker, old ones included. Empty - the stats socket's worker
        only.
    type: str
    default: ""
  router:
    description: The router's name in messages (the inventory host); the socket path when empty.
    type: str
    default: ""
  servers:
    description:
      - The servers to set, wait for and report, each C({backend, server}) (the C(d3fleet.fleet.d3_router_backends)
        filter's C(servers)). Without O(state), only reported (C(servers), C(missing)).
    type: list
    elements: dict
    default: []
  state:
    description: The administrative state to set O(servers) to; none to only read.
    type: str
    choices: [drain, ready]
  wait:
    description: After setting O(state), wait until the servers are drained (no session) or up.
    type: bool
    default: false
  timeout:
    description: How long to wait, in whole seconds (1-86400).
    type: int
    default: 60
  poll:
    description: Seconds between two reads of C(show stat) while waiting (0.05-60).
    type: float
    default: 1.0
  connect_timeout:
    description: Seconds to wait for one connection's answer before failing (0.1-300).
    type: float
    default: 10.0
  state_file:
    description:
      - Where to write C(show servers state) after a change (a plain absolute path); the d3_router role's
        C(server-state-file) (its C(_d3_router_state_file), kept equal to this default by a unit test). Empty - not
        written.
    type: str
    default: /var/lib/haproxy/server-state
author: d3-fleet
"""

EXAMPLES = r"""
- name: Drain this host's servers in every router and wait until they serve no request
  d3fleet.fleet.haproxy_runtime:
    socket: /run/haproxy/admin.sock
    router: "{{ item }}"
    servers:
      - {backend: be_d3-lite, server: l4-a-d3-lite}
    state: drain
    wait: true
    timeout: 180
  delegate_to: "{{ item }}"
  loop: "{{ groups['d3-routers'] }}"

- name: Read the router's servers (show stat)
  d3fleet.fleet.haproxy_runtime:
    socket: /run/haproxy/admin.sock
  register: runtime
"""

RETURN = r"""
stat:
  description: Every row of C(show stat) as it was last read, C({backend, server, scur, status}), in HAProxy's order.
  type: list
  elements: dict
  returned: success
servers:
  description: The rows of O(servers), in their order, as last read; a server HAProxy does not list has status V(MISSING).
  type: list
  elements: dict
  returned: success
before:
  description:
    - The rows of O(servers), in their order, as read just before their state was set (the first C(show stat) of the
      run); with O(state=drain), C(scur) is what each server had in flight when it was drained.
  type: list
  elements: dict
  returned: success
missing:
  description: The O(servers) HAProxy does not list, C({backend, server}).
  type: list
  elements: dict
  returned: success
changed_servers:
  description: The servers whose state was set (or would be, in check mode), as C(backend/server).
  type: list
  elements: str
  returned: success
state_saved:
  description:
    - After a change, O(state_file) when the servers' state was written there (read from HAProxy, or the last file
      patched, O(state_patched)); empty when nothing changed, O(state_file) is empty, or nothing could be written.
  type: str
  returned: success
state_patched:
  description:
    - True when C(show servers state) could not be read after a change and the last O(state_file) got the change
      instead.
  type: bool
  returned: success
state:
  description: O(state) (null when only reading).
  type: str
  returned: always
workers_seen:
  description:
    - With O(master_socket) and a wait for V(drain), every worker pid that held sessions of O(servers) during the wait,
      with the most sessions seen on it (C({pid - sessions})); two pids mean a reload came during the wait.
  type: dict
  returned: success
reapplied:
  description:
    - The servers (C(backend/server)) found out of O(state) during the wait and set again, each once per time it was
      found so.
  type: list
  elements: str
  returned: success
waited_s:
  description: Seconds spent waiting (0 without O(wait)).
  type: float
  returned: success
router:
  description: O(router), or the socket path when it is empty.
  type: str
  returned: always
socket:
  description: O(socket).
  type: str
  returned: always
error:
  description: On failure, the bare cause (for example the socket error), without the router and socket.
  type: str
  returned: failure
"""

import contextlib
import re
import time
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_haproxy import (
    in_state,
    parse_proc,
    parse_stat,
    ready_steps,
    select,
    set_command,
    worker_pids,
)

# one command on a socket (half-closed after the line, as socat does), the file written to the disk and the lock
# that orders changes with the reload: the save-state helper's, one place
from ansible_collections.d3fleet.fleet.plugins.module_utils.d3_server_state import (
    LOCK_WAIT_S,
    ask,
    ask_as,
    is_state,
    lock_path,
    locked,
    patch,
    read,
    worker_pid,
    write,
)

# the d3_input_problems filter's 'path' rule (plugins/filter/d3_inputs.py): /dir/name, no .. or . components
PLAIN_PATH = re.compile(r"\A(/[A-Za-z0-9_.@+-]+)+\Z")
ARGUMENT_SPEC: dict[str, Any] = {
    "socket": {"type": "str", "required": True},
    "master_socket": {"type": "str", "default": ""},
    "router": {"type": "str", "default": ""},
    "servers": {"type": "list", "elements": "dict", "default": []},
    "state": {"type": "str", "choices": ["drain", "ready"]},
    "wait": {"type": "bool", "default": False},
    "timeout": {"type": "int", "default": 60},
    "poll": {"type": "float", "default": 1.0},
    "connect_timeout": {"type": "float", "default": 10.0},
    "state_file": {"type": "str", "default": "/var/lib/haproxy/server-state"},
}


# the master CLI's answer for a pid it does not know (tests/contracts/haproxy/master-cli.yml: unknown_pid_answer_3_0)
UNKNOWN_PID = "Can't find the target"


class Refusal(Exception):
    """A failure of the module: its message names the router, the socket and the server; ``error`` is the bare cause
    (returned as ``error``, for the d3_router_api_problems filter)."""

    def __init__(self, msg: str, error: str = "") -> None:
        super().__init__(msg)
        self.error = error or msg


class Unread(Exception):
    """A read of the wait that did not happen this time (asked again at the next poll)."""


def plain(path: str) -> bool:
    return bool(PLAIN_PATH.match(path)) and "/../" not in path + "/" and "/./" not in path + "/"


def check_inputs(p: dict[str, Any], where: str) -> None:
    """Refuse, before anything is sent, a socket path, a server name or a wait that could not be meant."""
    for what, path in (("stats socket", p["socket"]), ("master socket", p.get("master_socket") or ""),
                       ("state file", p.get("state_file") or "")):
        if (path or what == "stats socket") and not plain(path):
            raise Refusal(f"{where}: the {what} {path!r} is not a plain absolute path (/dir/name: letters, digits, "
                          ". _ - @ +; no .. or spaces).")  # fmt: skip
    for server in p["servers"]:
        try:
            set_command(server, p["state"] or "ready")
        except ValueError as exc:
            raise Refusal(f"{where}: server {server!r}: {exc}; nothing was sent to the router.") from None
    if not 1 <= p["timeout"] <= 86400:
        raise Refusal(f"{where}: timeout = {p['timeout']} is not 1-86400 whole seconds.")
    if not 0.05 <= p["poll"] <= 60:
        raise Refusal(f"{where}: poll = {p['poll']} is not 0.05-60 seconds.")
    if not 0.1 <= p["connect_timeout"] <= 300:
        raise Refusal(f"{where}: connect_timeout = {p['connect_timeout']} is not 0.1-300 seconds.")


def read_stat(p: dict[str, Any], where: str) -> list[dict[str, Any]]:
    try:
        text = ask(p["socket"], "show stat", p["connect_timeout"])
    except OSError as exc:
        raise Refusal(f"{where}: HAProxy's runtime API does not answer `show stat`: {exc}.", str(exc)) from None
    try:
        return parse_stat(text)
    except ValueError:
        shown = " ".join(text.split())[:200]
        raise Refusal(f"{where}: the answer to `show stat` is not HAProxy's CSV: {shown!r}.", f"not show stat: {shown!r}") from None


PLACE_WAIT_S = 5.0  # a change an old worker took is sent again until a current worker takes it, this long at most
PLACE_POLL_S = 0.02


class Saved:
    """What the module did with the state file after a change: ``path`` written (or ""), ``patched`` when ``show
    servers state`` could not be read and the last file got the change instead, ``pid`` the worker the change reached."""

    def __init__(self, path: str = "", patched: bool = False, pid: int | None = None) -> None:
        self.path, self.patched, self.pid = path, patched, pid


def current_workers(p: dict[str, Any]) -> set[int] | None:
    """The pids ``show proc`` lists as current workers (not the old ones still finishing), None without a master
    socket or when it does not answer (a reload by hand re-executing the master)."""
    if not p.get("master_socket"):
        return None
    try:
        procs = parse_proc(ask(p["master_socket"], "show proc", p["connect_timeout"]))
    except (OSError, ValueError):
        return None
    return {x["pid"] for x in procs if x["type"] == "worker" and x["section"] == "workers"}


def send(p: dict[str, Any], where: str, command: str, current: set[int] | None, clock: Any, sleep: Any) -> tuple[int | None, str]:
    """One command on the stats socket, sent again while a worker that is not current took it (``show info;`` before
    it names the worker: d3_server_state.ask_as); its worker's pid and its answer."""
    deadline = clock() + PLACE_WAIT_S
    while True:
        try:
            pid, answer = ask_as(p["socket"], command, p["connect_timeout"])
        except OSError as exc:
            raise Refusal(f"{where}: `{command}` failed: {exc}.", str(exc)) from None
        if current is None or pid in current:
            return pid, answer
        # asked again: a reload that bypassed the lock may have made the worker that took it the current one
        current = current_workers(p) or current
        if pid in current:
            return pid, answer
        if clock() >= deadline:
            raise Refusal(f"{where}: `{command}` reached worker {pid} only, not a current one ({', '.join(map(str, sorted(current)))}, "
                          f"show proc), for {PLACE_WAIT_S:.0f} s.")  # fmt: skip
        sleep(PLACE_POLL_S)


def save_state(p: dict[str, Any], where: str, changes: dict[tuple[str, str], str], current: set[int] | None, clock: Any,
               sleep: Any) -> Saved:  # fmt: skip
    """``show servers state`` (a version 1 dump, from a current worker) written to ``state_file`` (d3_server_state.write:
    a temporary file, fsync, a rename). When it cannot be read, the last file gets ``changes`` instead
    (d3_server_state.patch): it is never removed, since it holds every other server's state too (a restart would
    bring every drain back ready: the review of 2026-12-05)."""
    target = p["state_file"]
    with contextlib.suppress(OSError, ValueError, Refusal):
        pid, text = send(p, where, "show servers state", current, clock, sleep)
        if not is_state(text):
            raise ValueError(text[:100])
        write(target, text)
        return Saved(target, False, pid)
    last = read(target)
    if last is not None and is_state(last):
        with contextlib.suppress(OSError):
            write(target, patch(last, changes))
            return Saved(target, True)
    return Saved()


def apply(p: dict[str, Any], where: str, todo: list[tuple[dict[str, Any], str]], state: str, clock: Any = time.monotonic,
          sleep: Any = time.sleep) -> Saved:  # fmt: skip
    """Set each (server, its show stat status) of ``todo`` to ``state`` and save, under the reload's lock, each command
    taken by a current worker (``show proc``, with a master socket); what was saved, and the worker's pid."""
    with contextlib.ExitStack() as stack:
        if p["state_file"]:
            try:
                held = stack.enter_context(locked(p["state_file"], clock=clock, sleep=sleep))
            except FileNotFoundError:
                held = True  # no directory for the state file: no reload saves there either, nothing to order with
            except OSError as exc:
                raise Refusal(f"{where}: the lock {lock_path(p['state_file'])} cannot be opened: {exc}; nothing was "
                              "set.", str(exc)) from None  # fmt: skip
            if not held:
                raise Refusal(f"{where}: the lock {lock_path(p['state_file'])} is still held after {LOCK_WAIT_S:.0f} s "
                              "(a reload of HAProxy that does not end: systemctl status haproxy); nothing was set.")  # fmt: skip
        current = current_workers(p)
        pid = None
        for server, status in todo:
            # ready through maint (slowstart applies to a server leaving maintenance, not to one leaving DRAIN), except
            # for a DOWN server: leaving maint would make it UP until its first check (d3_haproxy.ready_steps)
            for step in ready_steps(status) if state == "ready" else (state,):
                command = set_command(server, step)
                pid, answer = send(p, where, command, current, clock, sleep)
                if answer.strip():
                    raise Refusal(f"{where}: `{command}` was refused: {' '.join(answer.split())[:200]}")
        if not (todo and p["state_file"]):
            return Saved(pid=pid)
        saved = save_state(p, where, {(s["backend"], s["server"]): state for s, _ in todo}, current, clock, sleep)
        saved.pid = pid
        return saved


def every_worker(p: dict[str, Any], where: str, servers: list[dict[str, Any]]) -> dict[int, dict[tuple[str, str], int] | None]:
    """Each worker's sessions of ``servers`` through the master CLI: {pid: {(backend, server): scur}}, for every worker
    ``show proc`` lists (current and old). A worker the master no longer knows when asked (it left between ``show
    proc`` and its ``show stat``: nothing in flight there) is not in it; one whose ``show stat`` could not be asked
    (a reload closes every master CLI connection, management.txt 9.4) is None: not known to be empty."""
    master = p["master_socket"]
    try:
        pids = worker_pids(ask(master, "show proc", p["connect_timeout"]))
    except OSError as exc:
        # a reload re-executes the master: its CLI refuses or resets connections for 26-53 ms (the review of
        # 2026-12-05): not read this time, asked again at the next poll; the timeout names the variable
        raise Unread(f"HAProxy's master CLI {master} (it does not answer `show proc`: {exc}; if it never does, set "
                     "d3_router_master_socket to the -S socket of haproxy.service)") from None  # fmt: skip
    except ValueError as exc:
        raise Unread(f"HAProxy's master CLI {master} (it did not answer `show proc` as HAProxy does: {exc})") from None
    out: dict[int, dict[tuple[str, str], int] | None] = {}
    for pid in pids:
        try:
            answer = ask(master, f"@!{pid} show stat", p["connect_timeout"])
        except OSError:
            out[pid] = None  # the connection failed (a reload): unknown, not empty; asked again at the next poll
            continue
        if answer.startswith(UNKNOWN_PID):
            continue  # the master does not know it any more: it left, nothing in flight there
        try:
            rows = parse_stat(answer)
        except ValueError:
            out[pid] = None  # no answer (closed by a reload) or another one: unknown, not empty
            continue
        out[pid] = {(r["backend"], r["server"]): r["scur"] for r in select(rows, servers)}
    return out


def pending(rows: list[dict[str, Any]], state: str) -> list[str]:
    """The servers a wait for ``state`` still waits for: with sessions (drain), or not UP (ready)."""
    if state == "drain":
        return [f"{r['backend']}/{r['server']} ({r['scur']} sessions)" for r in rows if r["scur"] > 0]
    return [f"{r['backend']}/{r['server']} ({r['status']})" for r in rows if r["status"] != "UP"]


def left_state(status: str, state: str) -> bool:
    """Whether a server whose ``show stat`` status is ``status`` is known to have left ``state`` since it was set:
    ready (UP, NOLB) when drained, drained or in maintenance when ready. DOWN says nothing (d3_haproxy.in_state)."""
    word = status.split(" ")[0]
    # MAINT (resolution), MAINT (via ...): maintenance HAProxy set (a name that does not resolve, a tracked server), not
    # the administrative state a give-back sets; waited for as not UP (the review of 2026-12-05: set again 17 times)
    return word in ("UP", "NOLB") if state == "drain" else word == "DRAIN" or status == "MAINT"


def run(p: dict[str, Any], check_mode: bool, clock: Any = time.monotonic, sleep: Any = time.sleep) -> dict[str, Any]:
    """The module's work; raises Refusal with the message to fail with."""
    router = p["router"] or p["socket"]
    where = f"router {router} (HAProxy runtime API {p['socket']})"
    check_inputs(p, where)
    state = p["state"]
    rows = read_stat(p, where)
    wanted = before = select(rows, p["servers"])
    missing = [{"backend": r["backend"], "server": r["server"]} for r in wanted if r["status"] == "MISSING"]
    if state and missing:
        names = ", ".join(f"{m['backend']}/{m['server']}" for m in missing)
        raise Refusal(f"{where} does not know the servers {names}: nothing was set. Configure the routers first: "
                      "ansible-playbook site.yml -l d3-routers --tags router")  # fmt: skip
    status = {(row["backend"], row["server"]): row["status"] for row in wanted}
    todo = [server for server, row in zip(p["servers"], wanted, strict=True) if state and not in_state(row["status"], state)]
    saved = Saved()
    if not check_mode and todo:
        saved = apply(p, where, [(s, status[(s["backend"], s["server"])]) for s in todo], state, clock, sleep)
    patched = saved.patched
    waited = 0.0
    seen: dict[int, int] = {}
    reapplied: list[str] = []
    if state and p["wait"] and not check_mode:
        start = clock()
        # the worker the state was set on (or found in): a server out of it under another worker lost it in a reload
        # that bypassed the lock (`kill -USR2`, the master CLI's `reload`); under the same one, someone changed it
        set_on = saved.pid if saved.pid is not None else worker_pid(p["socket"], p["connect_timeout"])
        seen_lost = False
        while True:
            rows = read_stat(p, where)
            wanted = select(rows, p["servers"])
            lost = [(s, r["status"]) for s, r in zip(p["servers"], wanted, strict=True) if left_state(r["status"], state)]
            held: list[str] = []
            if lost:
                now = current_workers(p) or {worker_pid(p["socket"], p["connect_timeout"])}
                names = ", ".join(f"{s['backend']}/{s['server']} ({status})" for s, status in lost)
                # once is not proof: this show stat may have come from the old worker of a reload (it still takes
                # connections for up to about 250 ms), or show info from it; twice in a row, it is someone else's
                if set_on is not None and set_on in now and not seen_lost:
                    seen_lost = True
                    held = [f"{s['backend']}/{s['server']} ({status}: read again)" for s, status in lost]
                    lost = []
                elif set_on is not None and set_on in now:
                    raise Refusal(f"{where}: {names} left {state} during the wait with no reload since it was set (worker "
                                  f"{set_on}): someone else changed it, so it is not set again. Find who (an operator, "
                                  "another run) and run again.")  # fmt: skip
            if lost:
                seen_lost = False
                again = apply(p, where, lost, state, clock, sleep)
                saved = again if again.path else saved
                patched = patched or again.patched
                set_on = again.pid if again.pid is not None else worker_pid(p["socket"], p["connect_timeout"])
                reapplied += [f"{s['backend']}/{s['server']}" for s, _ in lost]
                rows = read_stat(p, where)
                wanted = select(rows, p["servers"])
            elif not held:
                seen_lost = False
            unread: list[str] = list(held)
            if state == "drain" and p.get("master_socket"):
                try:
                    by_worker = every_worker(p, where, p["servers"])
                except Unread as exc:
                    by_worker = {}
                    unread.append(str(exc))
                known = {pid: sessions for pid, sessions in by_worker.items() if sessions is not None}
                unread += [f"worker {pid} (its show stat could not be read)" for pid, s in by_worker.items() if s is None]
                for pid, sessions in known.items():
                    if sum(sessions.values()):
                        seen[pid] = max(seen.get(pid, 0), sum(sessions.values()))
                for row in wanted:
                    row["scur"] = sum(w.get((row["backend"], row["server"]), 0) for w in known.values())
            left = pending(wanted, state) + unread
            waited = round(clock() - start, 1)
            if not left:
                break
            if waited >= p["timeout"]:
                what = "still serve requests" if state == "drain" else "are not UP"
                raise Refusal(f"{where}: the servers {', '.join(left)} {what} after {p['timeout']} s (timeout).")
            sleep(p["poll"])
    return {
        "changed": bool(todo),
        "stat": rows,
        "servers": wanted,
        "before": before,
        "missing": missing,
        "changed_servers": [f"{s['backend']}/{s['server']}" for s in todo],
        "waited_s": waited,
        "reapplied": reapplied,
        "workers_seen": seen,
        "state_saved": saved.path,
        "state_patched": patched,
    }


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    p = module.params
    ident = {"state": p["state"], "router": p["router"] or p["socket"], "socket": p["socket"]}
    try:
        result = run(p, module.check_mode)
    except Refusal as exc:
        module.fail_json(msg=str(exc), error=exc.error, **ident)
    if result["changed_servers"] and p["state_file"] and not module.check_mode:
        if result["state_patched"]:
            module.warn(f"{ident['router']}: `show servers state` could not be read after the change; {p['state_file']} "
                        "got the change over its last saved states instead (every other server as last saved).")  # fmt: skip
        elif not result["state_saved"]:
            module.warn(f"{ident['router']}: `show servers state` could not be read after the change and there is no "
                        f"last {p['state_file']} to patch: a start applies the configuration's states until the next "
                        "change or reload.")  # fmt: skip
    module.exit_json(**result, **ident)


if __name__ == "__main__":
    main()
