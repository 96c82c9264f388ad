"""Helpers for the lab tests of the router (test_router.py) and of the rollouts through it (test_rollout.py): the
lab router host, the model with three replicas (d3-lite on d3-lab-host3, and twice on d3-lab-host2 as `spread:
false` places two replicas on one host: instances d3-lite and d3-lite-2, one served name; lab/vars/lab.yml),
the router's models as the converge published them, and HAProxy's server states.

The lab is a STAND-IN (lab/README.md): the routers reach the hosts through this machine's loopback (published ports)."""

from __future__ import annotations

import http.client
import json
import shutil
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import labkit
import yaml
from labkit import ROOT, Run, on_host

sys.path.insert(0, str(ROOT / "tools"))
import rollout_under_load as load_tool

ROUTER = "d3-lab-router1"
_LAB = yaml.safe_load((ROOT / "lab/roles/lab_hosts/defaults/main.yml").read_text())
# every lab router (d3-lab-router1: Debian 13, HAProxy 3.0; d3-lab-router2: Debian 12, HAProxy 2.6)
ROUTERS = [f"{_LAB['lab_hosts_router_prefix']}{n}" for n in range(1, _LAB["lab_hosts_router_count"] + 1)]
MODEL = "d3-lite"
REPLICAS = ["d3-lab-host2", "d3-lab-host3"]  # the hosts of d3-lite's replicas
PAIR_HOST = "d3-lab-host2"  # the host with two of them (instances d3-lite and d3-lite-2)
RATE = 10.0
WARMUP_S = 3.0  # the open-loop load's seconds before the rollout starts (9 decisions at 3/s: its "before" figures)
# the role default (the lab router sets no other)
SOCKET = yaml.safe_load((ROOT / "roles/d3_router/defaults/main.yml").read_text())["d3_router_stats_socket"]

# the d3_router role's saved server state, read by HAProxy's new worker after a reload (server-state-file); None when
# the role keeps none
STATE_FILE = yaml.safe_load((ROOT / "roles/d3_router/vars/main.yml").read_text() or "{}").get("_d3_router_state_file") \
    if (ROOT / "roles/d3_router/vars/main.yml").is_file() else None
# the one fleet endpoint (routes by the body's model), when the router role has one
ENDPOINT_PORT = yaml.safe_load((ROOT / "roles/d3_router/defaults/main.yml").read_text()).get("d3_router_port")

__all__ = ["ENDPOINT_PORT", "MODEL", "PAIR_HOST", "RATE", "REPLICAS", "ROUTER", "ROUTERS", "WARMUP_S", "KeepAliveClients",
           "StatSampler", "ask", "hold_vip", "load_tool", "machine_url", "reload_by_hand", "restart_router", "routed",
           "router_url", "server_states", "set_state", "stop_waiting", "vip", "vip_holder", "wait_for_record",
           "wait_for_state"]


def router_models(run: Run) -> list[dict[str, Any]]:
    """The router's models (fact d3_router_models) as the converge published them."""
    return run.published_fact(ROUTER, "d3_router_models", "the d3_router role", "d3-routers")


def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    """served name -> the router's model (frontend port, backend, servers), checked to hold d3-lite's replicas."""
    assert set(REPLICAS) <= set(host_names), f"the router tests need {REPLICAS}: make lab LAB_HOSTS=3"
    models = {m["served_name"]: m for m in router_models(converge_run)}
    assert MODEL in models, sorted(models)
    return models


def machine_url(port: int) -> str:
    """The router's frontend port as this machine reaches it (the lab publishes the router's ports on loopback)."""
    out = labkit.podman("port", ROUTER, f"{port}/tcp").stdout.strip()
    assert out, f"{ROUTER} does not publish port {port}: re-create the lab (make lab-down && make lab)"
    return "http://" + out.splitlines()[0].replace("0.0.0.0", "127.0.0.1")


def ask(url: str, model: str) -> dict[str, Any]:
    body = json.dumps({"model": model, "state": {"ticket": "x"}, "questions": {"q": {"type": "noul", "instructions": "ok?"}}})
    request = urllib.request.Request(f"{url}/v1/systemone", data=body.encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())


def server_states(backend: str, router: str = ROUTER) -> dict[str, str]:
    text = on_host(router, f"echo 'show stat' | socat stdio {SOCKET}")
    rows = [line.split(",") for line in text.splitlines() if line and not line.startswith("#")]
    return {r[1]: r[17] for r in rows if r[0] == backend and r[1] not in ("FRONTEND", "BACKEND")}


def set_state(backend: str, server: str, state: str, router: str = ROUTER) -> None:
    """What an operator does on a router: `set server <backend>/<server> state <state>` (HAProxy's runtime API)."""
    answer = on_host(router, f"echo 'set server {backend}/{server} state {state}' | socat stdio {SOCKET}")
    assert not answer.strip(), answer


_WAITERS: list[subprocess.Popen[str]] = []


def wait_for_state(backend: str, state: str, timeout: float, router: str = ROUTER) -> str | None:
    """Wait on the router itself until a server of ``backend`` shows ``state`` in show stat (polled there every 0.1 s:
    one podman exec, not one per poll); that server's name, or None at the deadline or after stop_waiting()."""
    script = (f"until out=$(echo 'show stat' | socat stdio {SOCKET} | awk -F, '$1 == \"{backend}\" && $18 == \"{state}\" "
              "{ print $2; exit }') && [ -n \"$out\" ]; do sleep 0.1; done; echo \"$out\"")  # fmt: skip
    proc = subprocess.Popen(["podman", "exec", router, "timeout", str(int(timeout)), "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    _WAITERS.append(proc)
    out, _ = proc.communicate()
    return out.strip() or None if proc.returncode == 0 else None


def wait_for_record(backend: str, server: str, timeout: float, router: str = ROUTER) -> bool:
    """Wait on the router itself until a rollout's drain record for ``backend``/``server`` exists (the d3_state role
    writes it just before the drain; polled there every 0.05 s: one podman exec). False at the deadline or after
    stop_waiting()."""
    drains = yaml.safe_load((ROOT / "roles/d3_state/defaults/main.yml").read_text())["d3_state_drains_dir"]
    script = f"until [ -e {drains}/{backend}--{server}.json ]; do sleep 0.05; done"
    proc = subprocess.Popen(["podman", "exec", router, "timeout", str(int(timeout)), "sh", "-c", script],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    _WAITERS.append(proc)  # type: ignore[arg-type]
    return proc.wait() == 0


def stop_waiting() -> None:
    """End the waits of wait_for_state still running (their podman exec, started here)."""
    for proc in _WAITERS:
        if proc.poll() is None:
            proc.terminate()
    _WAITERS.clear()


class StatSampler:
    """``show stat`` of one backend sampled on the router every 0.25 s while it runs (one podman exec, the loop on the
    router): per sample (monotonic seconds on the router, server, stot (sessions ever), status). ``ramps()`` gives
    each server given back (from DRAIN, MAINT or DOWN to UP) its share of the backend's new sessions in each second
    after, the figure slowstart shapes."""

    def __init__(self, backend: str, timeout: float = 900) -> None:
        self.backend = backend
        script = (f"while :; do t=$(cut -d' ' -f1 /proc/uptime); echo 'show stat' | socat stdio {SOCKET} | "
                  f"awk -F, -v t=$t '$1 == \"{backend}\" && $2 != \"BACKEND\" {{ print t \",\" $2 \",\" $8 \",\" $18 }}'; "
                  "sleep 0.25; done")  # fmt: skip
        # the loop's name on the router ($0 of its shell): ended there by __exit__ (ending the podman exec here does
        # not end it: it went on sampling, 4 processes a second, to its timeout, through the tests after it)
        self.tag = f"d3-stat-sampler-{uuid.uuid4().hex[:12]}"
        self.proc = subprocess.Popen(["podman", "exec", ROUTER, "timeout", str(int(timeout)), "sh", "-c", script, self.tag],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
        self.samples: list[tuple[float, str, int, str]] = []
        self.reader = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            when, server, stot, status = line.strip().split(",", 3)
            self.samples.append((float(when), server, int(stot or 0), status))

    def __enter__(self) -> StatSampler:
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        # [r]: the pattern does not match the command line of the shell that runs pkill
        labkit.on_host(ROUTER, f"pkill -f -- '{self.tag[:-1]}[{self.tag[-1]}]' || true", check=False)
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.reader.join(timeout=30)

    def ramps(self, seconds: int = 12) -> list[dict[str, Any]]:
        """Per give-back: the server, and its share (per cent) of the backend's new sessions in each second after
        it showed UP again (None for a second with no new session)."""
        by_time: dict[float, dict[str, tuple[int, str]]] = {}
        for when, server, stot, status in self.samples:
            by_time.setdefault(when, {})[server] = (stot, status)
        times = sorted(by_time)
        out = []
        for server in sorted({s for _, s, _, _ in self.samples}):
            out_of_service = False
            for i, when in enumerate(times):
                status = by_time[when].get(server, (0, "?"))[1]
                if status.split(" ")[0] in ("DRAIN", "MAINT", "DOWN"):
                    out_of_service = True
                elif out_of_service and status.startswith("UP"):
                    out_of_service = False
                    shares = []
                    for second in range(seconds):
                        window = [t for t in times[i:] if when + second <= t <= when + second + 1]
                        if len(window) < 2:
                            shares.append(None)
                            continue
                        first, last = by_time[window[0]], by_time[window[-1]]
                        new = {s: last[s][0] - first[s][0] for s in last if s in first}
                        total = sum(new.values())
                        shares.append(round(100 * new.get(server, 0) / total) if total else None)
                    out.append({"server": server, "shares": shares})
        return out


def reload_by_hand() -> str:
    """Reload HAProxy as an operator does, `systemctl reload haproxy`, nothing saved first: the d3_router role's
    drop-in for haproxy.service (roles/d3_router/templates/d3-server-state.conf.j2) saves `show servers state` where
    the new worker reads it (server-state-file) before the reload itself. Returns what was done."""
    on_host(ROUTER, "systemctl reload haproxy")
    return "systemctl reload haproxy (by hand: the unit's drop-in saves the server state)"


def vip() -> str | None:
    """The routers' virtual address (d3_router_vip of the lab inventory's d3-routers: keepalived holds it on one of the
    lab's two routers, on their VRRP bridge, which this machine reaches), None without one."""
    group = labkit.lab_inventory()["all"]["children"].get(labkit.ROUTER_GROUP) or {}
    return (group.get("vars") or {}).get("d3_router_vip") or None


def router_url(router: str, port: int) -> str:
    """A lab router's port as this machine reaches it: the router's own address on the VRRP bridge (HAProxy listens
    on every address of a router of a pair), else the port the lab publishes on loopback (``machine_url``)."""
    if vip():
        number = ROUTERS.index(router) + 1
        return f"http://{_LAB['lab_hosts_vrrp_base']}.{10 + number}:{port}"
    assert router == ROUTER, f"{router}: the lab publishes only {ROUTER}'s ports"
    return machine_url(port)


def vip_holder() -> str | None:
    """The lab router whose VRRP link (vrrp0) holds the virtual address now (keepalived adds it there), None when none
    does or the lab has no virtual address."""
    address = vip()
    for router in ROUTERS if address else []:
        out = subprocess.run(["podman", "exec", router, "ip", "-4", "-o", "address", "show", "dev", "vrrp0"],
                             capture_output=True, text=True, check=False).stdout  # fmt: skip
        if f" {address}/" in out:
            return router
    return None


def hold_vip(router: str) -> None:
    """Move the virtual address to ``router`` when another lab router holds it: restart keepalived there (it gives the
    address up; with nopreempt it comes back as BACKUP), then wait until ``router`` holds it. Nothing without a pair."""
    holder = vip_holder()
    if holder is None or holder == router:
        return
    on_host(holder, "systemctl restart keepalived")
    labkit.wait_until(f"{router} holds {vip()}", lambda: vip_holder() == router, timeout=30, poll=0.2)


def restart_router(router: str, timeout: float = 120.0) -> None:
    """Start a lab router host that was killed (``podman kill``: its network namespace went with it), re-make its VRRP
    link (the lab_hosts role's lab_vrrp_link.sh, as `make lab` made it) and wait until HAProxy and keepalived run."""
    labkit.podman("start", router)
    number = ROUTERS.index(router) + 1
    base, bridge = _LAB["lab_hosts_vrrp_base"], _LAB["lab_hosts_vrrp_bridge"]
    subprocess.run(["sh", str(ROOT / "lab/roles/lab_hosts/files/lab_vrrp_link.sh"), bridge, f"{base}.1/24", router,
                    f"{base}.{10 + number}/24", f"d3lab-vr{number}"], check=True, capture_output=True)  # fmt: skip

    def running() -> bool:
        out = subprocess.run(["podman", "exec", router, "systemctl", "is-active", "haproxy", "keepalived"],
                             capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
        return out == ["active", "active"]

    labkit.wait_until(f"{router}: haproxy and keepalived active", running, timeout=timeout, poll=0.5)


def endpoint_urls(models: dict[str, Any], names: list[str]) -> dict[str, str]:
    """served name -> the URL a client sends its decisions to: the fleet endpoint (it routes by the body's model) on
    the routers' virtual address when the lab has one (whichever router holds it), else on the first router's
    published port; without a fleet endpoint, the model's own frontend port."""
    if ENDPOINT_PORT and vip():
        return {name: f"http://{vip()}:{ENDPOINT_PORT}" for name in names}
    if ENDPOINT_PORT:
        return {name: machine_url(int(ENDPOINT_PORT)) for name in names}
    return {name: machine_url(models[name]["port"]) for name in names}


class KeepAliveClients:
    """N closed-loop clients, each on its own keep-alive connection (http.client): each sends the next decision as soon
    as the last is answered, so N requests are always in flight. Every result is kept: (client, model, sent at
    (monotonic), seconds, HTTP status or the error). ``pace``: each client sends at most one request per ``pace``
    seconds (against fast answers, 32 unpaced clients sent about 400 a second and slowed every Ansible task of the
    rollout beside them about threefold on this 2-core machine: drill 8's failover run, 2026-12-05)."""

    def __init__(self, urls: dict[str, str], clients: int = 32, timeout: float = 120.0, pace: float = 0.0) -> None:
        self.urls, self.clients, self.timeout, self.pace = urls, clients, timeout, pace
        self.models = sorted(urls)
        self.results: list[tuple[int, str, float, float, Any]] = []
        self.connections = 0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(clients)]

    def _client(self, number: int) -> None:
        model = self.models[number % len(self.models)]
        url = urlsplit(self.urls[model])
        body = json.dumps({"model": model, "state": {"ticket": f"client {number}"},
                           "questions": {"q": {"type": "noul", "instructions": "ok?"}}}).encode()  # fmt: skip
        conn: http.client.HTTPConnection | None = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection(url.hostname, url.port, timeout=self.timeout)
                with self.lock:
                    self.connections += 1
            sent = time.monotonic()
            try:
                conn.request("POST", "/v1/systemone", body=body, headers={"Content-Type": "application/json"})
                answer = conn.getresponse()
                answer.read()
                status: Any = answer.status
                if answer.will_close:
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                status = f"{type(exc).__name__}: {exc}"
                conn.close()
                conn = None
            with self.lock:
                self.results.append((number, model, sent, time.monotonic() - sent, status))
            if self.pace:
                self.stop.wait(max(0.0, sent + self.pace - time.monotonic()))  # ends at once when the clients stop
        if conn is not None:
            conn.close()

    def __enter__(self) -> KeepAliveClients:
        for thread in self.threads:
            thread.start()
        # every client connected and answered once before the caller goes on
        labkit.wait_until(f"{self.clients} clients answered once", lambda: len({r[0] for r in self.results}) >= self.clients,
                          timeout=120, poll=0.2)  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=self.timeout + 10)

    def figures(self) -> dict[str, Any]:
        with self.lock:
            results = list(self.results)
        ok = [seconds for _, _, _, seconds, status in results if status == 200]
        return {"requests": len(results), "failed": [r for r in results if r[4] != 200], "connections": self.connections,
                "clients": self.clients, "min_s": round(min(ok), 2) if ok else None,
                "median_s": round(statistics.median(ok), 2) if ok else None, "max_s": round(max(ok), 2) if ok else None}  # fmt: skip


def slow_inventory(tmp: Path, env: dict[str, str]) -> Path:
    """A copy of the lab inventory where the d3-lite replicas (REPLICAS) carry ``env`` (the simulator's slow-answer
    STAND-IN setting, lab/README.md): every rollout of the module uses it, so the replicas stay slow."""
    copy = tmp / "inventory"
    shutil.copytree(labkit.LAB_INVENTORY, copy)
    for host in REPLICAS:
        path = copy / "host_vars" / f"{host}.yml"
        data = yaml.safe_load(path.read_text())
        data["d3_models"] = [{**m, "env": {**(m.get("env") or {}), **env}} if m.get("model") == MODEL else m
                             for m in data["d3_models"]]  # fmt: skip
        path.write_text(yaml.safe_dump(data, sort_keys=False))
    return copy
