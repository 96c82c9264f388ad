#!/usr/bin/env python3
"""LAB (STAND-IN hosts): measure a router failover under load. N keep-alive clients send decisions to the routers'
virtual address (keepalived, d3_router_vip); the router host that holds the address is killed (`podman kill`: the
host dies, nothing shuts down in order); the script prints when the other router held the address, when clients got
answers again, and what failed (the requests in flight on the dead router may; every later one must not). Then the
killed host is started again, its VRRP link re-made (lab/roles/lab_hosts/files/lab_vrrp_link.sh) and it rejoins as
BACKUP (nopreempt: the address stays where it is).

Usage (on the lab, under the lab lock): .venv/bin/python lab/router_failover.py [--clients 32] [--model d3-lite]
Exit status 0 when no request sent after the address moved failed."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests/lab"))
sys.path.insert(0, str(ROOT / "tests"))
import routerkit  # noqa: E402

VIP = routerkit.vip()
ROUTERS = routerkit.ROUTERS
holder = routerkit.vip_holder


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--model", default=routerkit.MODEL)
    parser.add_argument("--after", type=float, default=15.0, help="seconds of load after the address moved")
    args = parser.parse_args()
    dead = holder()
    assert dead, f"no lab router holds {VIP}: make lab && site.yml first"
    other = next(r for r in ROUTERS if r != dead)
    url = f"http://{VIP}:{routerkit.ENDPOINT_PORT}"
    with routerkit.KeepAliveClients({args.model: url}, args.clients, timeout=30) as clients:
        time.sleep(3)
        killed = time.monotonic()
        subprocess.run(["podman", "kill", dead], check=True, capture_output=True)
        moved = None
        while time.monotonic() - killed < 60:
            if holder() == other:
                moved = time.monotonic() - killed
                break
            time.sleep(0.1)
        time.sleep(args.after)
    results = list(clients.results)
    after_kill = [r for r in results if r[2] >= killed]
    ok_after = sorted(r[2] + r[3] for r in after_kill if r[4] == 200)
    first_answer = round(ok_after[0] - killed, 2) if ok_after else None
    moved_at = killed + (moved or 0)
    failed = [r for r in results if r[4] != 200]
    late = [r for r in failed if moved is None or r[2] >= moved_at + 1.0]  # sent a second after the move, still failed
    print(f"router failover, {args.clients} keep-alive clients on {url} ({args.model}), {time.strftime('%Y-%m-%d')}:")
    print(f"  killed {dead} (podman kill); {other} held {VIP} after {moved if moved is None else round(moved, 2)} s; "
          f"first answer after the kill {first_answer} s")  # fmt: skip
    print(f"  {len(results)} requests, {len(failed)} failed (in flight on {dead} or sent before the move), "
          f"{len(late)} failed among those sent 1 s or more after the move")  # fmt: skip
    for r in failed[:5]:
        print(f"    client {r[0]} sent at +{r[2] - killed:.2f} s: {r[4]}")
    # the killed host back: started, its VRRP link re-made; keepalived rejoins as BACKUP (nopreempt)
    routerkit.restart_router(dead)
    print(f"  {dead} back: haproxy and keepalived active; {holder()} holds {VIP}")
    return 0 if moved is not None and not late else 1


if __name__ == "__main__":
    sys.exit(main())
