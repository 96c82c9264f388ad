"""A `set server` racing a reload, on Debian's HAProxy 2.6 and 3.0: as the reload ran before (save, check, SIGUSR2:
three commands, no lock) and through the helper's --reload with the module's lock. Writes the results as
tests/contracts/haproxy/reload-race.json's "captures". Usage: python3 reload_race.py HELPER (HELPER: the path of
plugins/module_utils/d3_server_state.py; stubs: stub.py on 31001 and 31002)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
import time

from common import BINS, D, ask, pid, start, stop

spec = importlib.util.spec_from_file_location("d3_server_state", sys.argv[1])
helper = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helper)
SOCK, STATE, CFG, PIDFILE, MASTER = D / "race.sock", D / "race-state", D / "race.cfg", D / "race.pid", D / "race-master.sock"
CHECK_S = 0.3  # the package's `haproxy -c` of the role's configuration took 0.1-0.4 s on the lab's routers
TRIES = 40
CONFIG = f"""global
    stats socket {SOCK} mode 600 level admin expose-fd listeners
    server-state-file {STATE}
defaults
    mode http
    load-server-state-from-file global
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:31081
    default_backend be_a
backend be_a
    default-server check inter 500 fall 2 rise 2 init-addr libc,none slowstart 10s
    server s1 127.0.0.1:31001 maxconn 4
    server s2 127.0.0.1:31002 maxconn 4
"""


def status(server: str) -> str:
    rows = [line.split(",") for line in ask(SOCK, "show stat").splitlines() if line.startswith(f"be_a,{server},")]
    return rows[0][17]


def worker() -> int:
    return int(next(line for line in ask(SOCK, "show info").splitlines() if line.startswith("Pid:")).split()[1])


def old_reload() -> None:
    """The drop-in as it was: the save, the package's check (its time), SIGUSR2."""
    helper.save(str(SOCK), str(STATE), str(CFG), 5)
    time.sleep(CHECK_S)
    os.kill(pid(PIDFILE), signal.SIGUSR2)


def new_reload() -> None:
    check = [sys.executable, "-c", f"import time; time.sleep({CHECK_S})"]
    helper.reload(str(SOCK), str(STATE), str(CFG), pid(PIDFILE), check, 5)


def module_set(command: str, locked: bool) -> None:
    """The module's set and save (haproxy_runtime.apply), with or without the lock."""
    if locked:
        with helper.locked(str(STATE)):
            ask(SOCK, command)
            helper.write(str(STATE), ask(SOCK, "show servers state"))
    else:
        ask(SOCK, command)
        helper.write(str(STATE), ask(SOCK, "show servers state"))


def attempt(how: str, delay: float, command: str, want: str) -> dict[str, object]:
    before = worker()
    reload = threading.Thread(target=old_reload if how == "before" else new_reload)
    reload.start()
    time.sleep(delay)  # the set comes this long after the reload began (its save)
    module_set(command, how != "before")
    reload.join()
    deadline = time.monotonic() + 5
    while worker() == before and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    return {"delay_s": delay, "after": status("s1"), "kept": status("s1").split()[0] == want}


def scenario(binary: str, how: str) -> dict[str, object]:
    for path in (STATE, SOCK, MASTER):
        if path.exists():
            path.unlink()
    CFG.write_text(CONFIG)
    start(binary, CFG, PIDFILE, MASTER)
    time.sleep(1.5)  # the stubs' checks pass: s1 and s2 UP
    out: dict[str, object] = {"drain": [], "ready": []}
    for n in range(TRIES):
        delay = CHECK_S + 0.0015 * n  # around the signal: the window is the new worker's start (about 30 ms)
        # a drain sent while a reload runs must hold in the new worker; then a give-back the same way
        out["drain"].append(attempt(how, delay, "set server be_a/s1 state drain", "DRAIN"))
        out["ready"].append(attempt(how, delay, "set server be_a/s1 state ready", "UP"))
    stop(PIDFILE)
    for kind in ("drain", "ready"):
        out[f"{kind}_lost"] = sum(1 for r in out[kind] if not r["kept"])
    return out


def main() -> None:
    out = {version: {how: scenario(binary, how) for how in ("before", "helper --reload and the module's lock")}
           for version, binary in BINS.items()}  # fmt: skip
    (D / "race-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps({v: {h: {k: r[k] for k in ("drain_lost", "ready_lost")} for h, r in runs.items()}
                      for v, runs in out.items()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
