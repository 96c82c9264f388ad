"""A reload (and a stop, then a start) with ports moved while servers are drained and in maintenance, on Debian's
HAProxy 2.6 and 3.0: the state saved unchanged (as before), then through the d3_router helper. Writes the results as
tests/contracts/haproxy/server-state.json's "captures". Usage: python3 server_state.py HELPER (stubs: stub.py on
31001-31006)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

from common import BINS, D, ask, pid, start, stop

HELPER = sys.argv[1]
SOCK, STATE, CFG, PIDFILE, MASTER = D / "admin.sock", D / "server-state", D / "h.cfg", D / "h.pid", D / "master.sock"
BEFORE, AFTER = [31001, 31002, 31003, 31004], [31001, 31005, 31006, 31004]
PLAIN, FIXED, START = ("reload, plain save (before the fix)", "reload, the helper with the configuration",
                       "stop, configuration changed, start (ExecStartPre --reconcile)")  # fmt: skip


def config(ports: list[int]) -> str:
    servers = "".join(f"    server s{i} 127.0.0.1:{p} maxconn 4\n" for i, p in enumerate(ports, 1))
    return f"""global
    stats socket {SOCK} mode 660 level admin expose-fd listeners
    server-state-file {STATE}
defaults
    mode http
    load-server-state-from-file global
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:31080
    default_backend be_a
backend be_a
    balance roundrobin
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 500 fall 2 rise 2 init-addr libc,none slowstart 10s
{servers}"""


def stat() -> dict[str, str]:
    rows = [line.split(",") for line in ask(SOCK, "show stat").splitlines() if line.startswith("be_a,s")]
    return {r[1]: f"{r[17]} {r[73]}" for r in rows}  # status, addr


def reached(n: int = 8) -> dict[str, int]:
    out: dict[str, int] = {}
    for _ in range(n):
        try:
            with urllib.request.urlopen("http://127.0.0.1:31080/", timeout=3) as answer:
                body = answer.read().decode().split()[1]  # the stub answers "port N"
        except OSError as exc:
            body = f"error {type(exc).__name__}"
        out[body] = out.get(body, 0) + 1
    return out


def helper(*args: str) -> list[str]:
    return subprocess.run([sys.executable, HELPER, *args], capture_output=True, text=True, check=False).stderr.splitlines()


def scenario(binary: str, how: str) -> dict[str, object]:
    for path in (STATE, SOCK, MASTER):
        if path.exists():
            path.unlink()
    CFG.write_text(config(BEFORE))
    start(binary, CFG, PIDFILE, MASTER)
    for command in ("set server be_a/s1 state drain", "set server be_a/s3 state drain", "set server be_a/s4 state maint"):
        ask(SOCK, command)
    rec: dict[str, object] = {"before": stat()}
    CFG.write_text(config(AFTER))
    notes: list[str] = []
    if how == PLAIN:  # as the shell helper before: HAProxy's answer unchanged
        STATE.write_text(ask(SOCK, "show servers state"))
        os.kill(pid(PIDFILE), signal.SIGUSR2)
    elif how == FIXED:  # haproxy.service's ExecReload: the helper, then SIGUSR2 to the master
        notes = helper(str(SOCK), str(STATE), str(CFG))
        os.kill(pid(PIDFILE), signal.SIGUSR2)
    else:  # ExecStop's save, then a start: ExecStartPre's --reconcile
        notes = helper(str(SOCK), str(STATE), str(CFG))
        os.kill(pid(PIDFILE), signal.SIGTERM)
        time.sleep(1)
        notes += helper("--reconcile", str(STATE), str(CFG))
        start(binary, CFG, PIDFILE, MASTER)
    time.sleep(0.3)
    rec["helper"] = [note.split(": ", 1)[1] for note in notes]
    rec["state_file"] = STATE.read_text().splitlines()[2:]
    rec["just_after"] = stat()
    time.sleep(2.5)
    rec["after_checks"] = stat()
    rec["requests_reached_port"] = reached()
    rec["workers"] = sum(1 for line in ask(MASTER, "show proc").splitlines() if " worker " in f" {line} ")
    stop(PIDFILE)
    return rec


def main() -> None:
    out = {version: {how: scenario(binary, how) for how in (PLAIN, FIXED, START)} for version, binary in BINS.items()}
    (D / "state-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
