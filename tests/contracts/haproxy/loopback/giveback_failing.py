"""A drained server whose checks fail, given back through MAINT or straight, on Debian's HAProxy 2.6 and 3.0 (by hand:
README.md). Usage: python3 giveback_failing.py maint,ready | ready (starts its own stub on 31011). Each line printed
is one version's capture for ../giveback-failing.json."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from common import BINS, D, ask

SOCK, CFG, PIDFILE = D / "df.sock", D / "df.cfg", D / "df.pid"
CONFIG = f"""global
    stats socket {SOCK} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
frontend fe
    bind 127.0.0.1:31091
    default_backend be_a
backend be_a
    default-server check inter 1000 fall 3 rise 2 init-addr libc,none slowstart 10s
    server s1 127.0.0.1:31011 maxconn 4
"""


def status() -> str:
    return next(line.split(",")[17] for line in ask(SOCK, "show stat").splitlines() if line.startswith("be_a,s1,"))


def changes(seconds: float, until: str) -> list[tuple[float, str]]:
    """[seconds, status] whenever the status changes, every 10 ms, until ``until`` starts the status or time is up."""
    seen: list[tuple[float, str]] = []
    start = time.monotonic()
    while time.monotonic() - start < seconds:
        now = status()
        if not seen or seen[-1][1] != now:
            seen.append((round(time.monotonic() - start, 3), now))
        if now.startswith(until):
            break
        time.sleep(0.01)
    return seen


def main() -> None:
    steps = sys.argv[1].split(",")
    CFG.write_text(CONFIG)
    for version, binary in BINS.items():
        stub = subprocess.Popen([sys.executable, "stub.py", "31011"])
        subprocess.run([binary, "-W", "-f", str(CFG), "-p", str(PIDFILE), "-D"], check=True, stderr=subprocess.DEVNULL)
        time.sleep(2.5)  # its checks pass: UP
        ask(SOCK, "set server be_a/s1 state drain")
        stub.terminate()
        stub.wait()
        failing = changes(1.6, "DRAIN ")  # DRAIN, then DRAIN 2/3 at its first failed check
        for step in steps:
            ask(SOCK, f"set server be_a/s1 state {step}")
        print(version, failing, steps, changes(3.5, "DOWN"))
        os.kill(int(PIDFILE.read_text()), signal.SIGTERM)
        time.sleep(0.8)


if __name__ == "__main__":
    main()
