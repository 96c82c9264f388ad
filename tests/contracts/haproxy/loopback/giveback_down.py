"""A drained server given back while its instance is down, on Debian's HAProxy 2.6 and 3.0: its `show stat` status
every 50 ms for 3 s after the give-back, through MAINT (`state maint`, `state ready`) and straight from DRAIN
(`state ready`); then the instance started and the status and slowstart throttle sampled until it is UP and past.
Writes tests/contracts/haproxy/giveback-down.json's "captures". Usage: python3 giveback_down.py (stub.py on 31001; the
script starts and stops its own stub on 31009)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from common import BINS, D, ask, start, stop

SOCK, CFG, PIDFILE = D / "gb.sock", D / "gb.cfg", D / "gb.pid"
CONFIG = f"""global
    stats socket {SOCK} mode 660 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
    retries 2
    option redispatch 1
frontend fe
    bind 127.0.0.1:31380
    default_backend be_a
backend be_a
    balance leastconn
    option httpchk GET /health
    http-check expect status 200
    default-server check inter 1000 fall 2 rise 2 init-addr libc,none slowstart 10s
    server up1 127.0.0.1:31001 maxconn 4
    server back 127.0.0.1:31009 maxconn 4
"""
STUB = Path(__file__).with_name("stub.py")


def row() -> dict[str, str]:
    for line in ask(SOCK, "show stat").splitlines():
        fields = line.split(",")
        if fields[:2] == ["be_a", "back"]:
            return {"status": fields[17], "throttle": fields[29]}  # status, throttle (slowstart %)
    return {}


def sample(seconds: float, every: float = 0.05) -> list[list[object]]:
    """[seconds since the start, status, throttle] each time either changes."""
    out: list[list[object]] = []
    began = time.monotonic()
    while (now := time.monotonic() - began) < seconds:
        got = row()
        if not out or out[-1][1:] != [got["status"], got["throttle"]]:
            out.append([round(now, 2), got["status"], got["throttle"]])
        time.sleep(every)
    return out


def main() -> None:
    out = {}
    for version, binary in BINS.items():
        out[version] = {}
        for how, steps in (("through MAINT (the module before)", ["maint", "ready"]), ("straight from DRAIN", ["ready"])):
            CFG.write_text(CONFIG)
            start(binary, CFG, PIDFILE)
            stub = subprocess.Popen([sys.executable, str(STUB), "31009"], stderr=subprocess.DEVNULL)
            time.sleep(3)  # both UP
            ask(SOCK, "set server be_a/back state drain")
            stub.terminate()
            stub.wait()
            time.sleep(3)  # its checks fail: drained and down
            rec: dict[str, object] = {"drained_and_down": row()["status"]}
            for step in steps:
                ask(SOCK, f"set server be_a/back state {step}")
            rec["after_give_back"] = sample(3.0)
            stub = subprocess.Popen([sys.executable, str(STUB), "31009"], stderr=subprocess.DEVNULL)
            rec["instance_started"] = sample(14.0, 0.1)
            stub.terminate()
            stub.wait()
            stop(PIDFILE)
            out[version][how] = rec
    (D / "giveback-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
