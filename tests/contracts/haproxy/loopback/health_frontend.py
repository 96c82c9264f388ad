"""The fleet endpoint's maxconn held by idle keep-alive clients, on Debian's HAProxy 2.6 and 3.0: keepalived's check
(roles/d3_router/files/d3-router-check) against the endpoint's /health and against the health frontend. Writes
tests/contracts/haproxy/health-frontend.json's "captures". Usage: python3 health_frontend.py CHECK (a stub: stub.py
on 31001)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

from common import BINS, D, start, stop

CHECK = sys.argv[1]
FLEET_MAXCONN, HEALTH_MAXCONN, SPARE = 4, 16, 64
CFG, PIDFILE = D / "health.cfg", D / "health.pid"
CONFIG = f"""global
    stats socket {D}/admin2.sock mode 660 level admin expose-fd listeners
    maxconn {FLEET_MAXCONN + HEALTH_MAXCONN + SPARE}
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    timeout http-request 10s
    timeout http-keep-alive 30s
frontend fe_fleet
    bind 127.0.0.1:31180 proto h1
    maxconn {FLEET_MAXCONN}
    http-request return status 200 if {{ path /health }} {{ nbsrv(be_a) ge 1 }}
    http-request return status 503 if {{ path /health }}
    default_backend be_a
frontend fe_health
    bind 127.0.0.1:31186 proto h1
    maxconn {HEALTH_MAXCONN}
    no log
    http-request return status 200 if {{ path /health }} {{ nbsrv(be_a) ge 1 }}
    http-request return status 503 if {{ path /health }}
    http-request deny deny_status 404
frontend fe_metrics
    bind 127.0.0.1:31185 proto h1
    maxconn {SPARE}
    http-request deny deny_status 404
backend be_a
    option httpchk GET /health
    default-server check inter 500 fall 2 rise 2
    server s1 127.0.0.1:31001 maxconn 4
"""
ENDPOINT, HEALTH = "http://127.0.0.1:31180/health", "http://127.0.0.1:31186/health"


def keepalive_client(port: int) -> tuple[socket.socket, str]:
    """One request answered, then the connection kept open and idle (keep-alive)."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    return conn, conn.recv(4096).split(b"\r\n", 1)[0].decode()


def check(url: str) -> dict[str, float]:
    """As keepalived runs it: d3-router-check URL 2."""
    began = time.monotonic()
    code = subprocess.run([sys.executable, CHECK, url, "2"], check=False).returncode
    return {"exit": code, "seconds": round(time.monotonic() - began, 1)}


def main() -> None:
    out = {}
    for version, binary in BINS.items():
        CFG.write_text(CONFIG)
        start(binary, CFG, PIDFILE)
        rec: dict[str, object] = {"idle": {"endpoint": check(ENDPOINT), "health_frontend": check(HEALTH)}}
        held = [keepalive_client(31180) for _ in range(FLEET_MAXCONN)]
        rec["held_keepalive_connections"] = [answer for _, answer in held]
        rec["endpoint_full"] = {"endpoint": check(ENDPOINT), "health_frontend": check(HEALTH)}
        # the exporter's port held past its own maxconn too: the health frontend still answers
        extra = [socket.create_connection(("127.0.0.1", 31185), timeout=5) for _ in range(SPARE + 8)]
        time.sleep(0.3)
        rec["endpoint_and_exporter_full"] = {"health_frontend": check(HEALTH)}
        for conn in [c for c, _ in held] + extra:
            conn.close()
        time.sleep(0.5)
        rec["released"] = {"endpoint": check(ENDPOINT)}
        stop(PIDFILE)
        out[version] = rec
    (D / "health-results.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
