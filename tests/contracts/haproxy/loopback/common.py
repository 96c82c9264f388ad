"""What the loopback scripts share: Debian's HAProxy binaries unpacked under /tmp (not installed), the runtime API in
non-interactive mode, HAProxy started in master-worker mode. Not a test: run by hand (README.md here), the results
written down in tests/contracts/haproxy/*.json."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

D = Path(os.environ.get("RFIX_DIR", "/tmp/rfix-exp"))
# `dpkg -x` of haproxy_2.6.12-1+deb12u4 (with liblua5.3-0, libopentracing-c-wrapper0, libopentracing1 of bookworm)
# and of haproxy_3.0.11-1+deb13u4 (with trixie's libc6, libssl3t64, liblua5.4-0, libjemalloc2, libpcre2-8-0,
# libcrypt1, libstdc++6, libgcc-s1, libopentracing-c-wrapper0t64, libopentracing1), each run through a wrapper
# (LD_LIBRARY_PATH; for 3.0 trixie's ld.so with --library-path and --argv0 "$0", so the master's re-exec on a reload
# goes through the wrapper again)
BINS = {"2.6.12-1+deb12u4": "/tmp/rfix-haproxy-2.6/haproxy", "3.0.11-1+deb13u4": "/tmp/rfix-haproxy-3.0/haproxy"}


def ask(path: Path | str, command: str) -> str:
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(5)
        conn.connect(str(path))
        conn.sendall(command.encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
    return out.decode()


def start(binary: str, config: Path, pidfile: Path, master: Path | None = None) -> None:
    args = [binary, "-W", *(["-S", str(master)] if master else []), "-f", str(config), "-p", str(pidfile), "-D"]
    subprocess.run(args, check=True, stderr=subprocess.DEVNULL)
    time.sleep(1.5)


def pid(pidfile: Path) -> int:
    return int(pidfile.read_text())


def stop(pidfile: Path) -> None:
    os.kill(pid(pidfile), signal.SIGTERM)
    time.sleep(0.8)
