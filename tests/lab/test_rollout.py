"""Fleet rollouts on a lab of at least 3 hosts, driven by ansible-runner, through the lab's router. d3-lite has three
replicas: d3-lab-host3's and two on d3-lab-host2 (instances d3-lite and d3-lite-2, one served name: as `spread:
false` places them; lab/vars/lab.yml), one backend with three servers. Every rollout here uses a copy of the
lab inventory where they answer in 1 s (the simulator's D3_SIM_REQUEST_MS, a STAND-IN for long decisions;
lab/README.md):
- the controller killed while the canary's first wave is drained (drill 8, the rollout that makes the replicas
  slow): its d3-lite drained, its d3-lite-2 still UP (one at a time); HAProxy killed with SIGKILL and started again
  by systemd brings the drain back from its state file; status.yml names the drained server as left by
  an interrupted rollout (and, asked about nightly-next, every host's drift: the next test's "before"); with the
  other replicas put in MAINT by an operator, the next run gives the drained one back and is refused before any
  change (the drain would leave d3-lite without an UP server), the operator's MAINTs stay; once they are lifted,
  the next run, on the whole fleet, completes with nothing lost although the router holding the virtual address is
  killed in its middle (while 32 keep-alive clients use the address: the other router takes it within seconds,
  printed for docs/router.md; no request sent a second after the move fails) and started again: no server drained,
  no drain record, no lease left on either router;
- a rollout of the whole fleet to the simulator's second tag while 32 closed-loop keep-alive clients send 1 s
  decisions to d3-lite through the router, with a router reload by hand (`systemctl reload haproxy`: the d3_router
  role's drop-in saves the server state first) while a replica is drained: no request fails, each d3-lite server had
  requests in flight when it was drained (the drain's own show stat, scur) and they drain one at a time (host2's pair
  in two waves), the drained one stays drained across the reload, every instance moves to the new digest with
  nothing downloaded inside the restart window, each restarted instance is down for its (simulated) cold start and
  at most 15 s more, the rollout says which batch of how many it is at and what it drained, restarted and gave back,
  and ends with one summary table (a single-replica model's client-visible window beside its unit's) and a pin
  command; status shows none after;
- a rollout of the replicas to the broken tag under load (drill 9): it stops at the canary, which is drained again,
  rolled back, serving and given back to the router; the other replica's host is never drained nor restarted; no
  request fails.

The lab is a STAND-IN (lab/README.md); its simulator's cold starts are the field report's, shortened 30x."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import labkit
import pytest
import routerkit
from drillkit import figure
from labkit import IMAGE, ROOT, Run, on_host, registry_digest, run_playbook, running
from routerkit import MODEL, PAIR_HOST, REPLICAS, ROUTER, WARMUP_S, load_tool, server_states, set_state

pytestmark = pytest.mark.lab

MARKER = "/var/lib/d3/rollout-in-progress"  # the d3_state role's d3_state_rollout_marker default
DRAINS = "/var/lib/d3/router-drains"  # the d3_state role's d3_state_drains_dir default (on the router)
# the simulator's slow answers (STAND-IN): each d3-lite decision takes 1 s; no batching slowdown on top
SLOW = {"D3_SIM_REQUEST_MS": "1000", "D3_SIM_BATCH_SLOWDOWN": "0"}
CLIENTS = 32
# the failover run's clients: each at most 4 decisions a second (d3-lite answers fast there: unpaced, 32 clients sent
# about 400 a second and slowed the rollout beside them threefold); a quarter second is the figures' resolution
FAILOVER_PACE_S = 0.25
# after the rollout's silences expired, how long the webhook still listens: the lab's group_interval (1 s) and an
# evaluation (5 s) more
OBSERVE_S = 6
SLOW_S = 10  # how long the first drained replica's requests stay in flight across the router reload (frozen)
# the debug line may be folded by the YAML callback: whitespace (newlines included) between the words
DOWNTIME = re.compile(r"([\w.-]+): down ([0-9.]+) s \(unit stop to ready;\s+([^;]+?);\s+smoke passed\)")


def downtimes_of(stdout: str) -> dict[str, tuple[float, str]]:
    return {unit: (float(s), " ".join(reason.split())) for unit, s, reason in DOWNTIME.findall(stdout)}


def downtimes_by_host(run: Run) -> dict[tuple[str, str], tuple[float, str]]:
    """(host, unit) -> (downtime, reason) from the rollout's downtime lines (runner events: a model may run on several
    hosts under one unit name, e.g. the lab's two d3-lite replicas)."""
    out: dict[tuple[str, str], tuple[float, str]] = {}
    for event in run.events:
        data = event.get("event_data", {})
        if event.get("event") == "runner_on_ok" and str(data.get("task", "")).startswith("Print each restarted instance's downtime"):
            for item in (data.get("res") or {}).get("results", []):
                out.update({(data["host"], unit): value for unit, value in downtimes_of(str(item.get("msg", ""))).items()})
    return out


def status(tmp_path: Path, tag: str, inventory: Path, report: dict[str, Any] | None = None) -> list[dict]:
    """status.yml's rows against TAG (d3_status_output); ``report`` gets the run."""
    out = tmp_path / f"status-{tag}.json"
    run = run_playbook("playbooks/status.yml", extravars={"d3_image_name": f"{IMAGE}:{tag}", "d3_status_output": str(out)},
                       inventory=inventory)  # fmt: skip
    assert run.status == "successful", run.failure_text()
    if report is not None:
        report["run"] = run
    return json.loads(out.read_text())


def cold_start_s(host: str, unit: str) -> float:
    """The cold start the running simulator instance spent (its log line: '(simulator) cold start 4.98 s for ...')."""
    found = re.findall(r"\(simulator\) cold start ([0-9.]+) s", on_host(host, f"podman logs {unit} 2>&1"))
    assert found, f"{host}: {unit} logged no cold start"
    return float(found[-1])


@pytest.fixture
def fleet(converged: list[str]) -> list[str]:
    """The session's converged fleet (on the nightly tag); this module runs last (conftest) as it moves the tag."""
    assert len(converged) >= 3, "rollout tests need a lab of 3 hosts: make lab LAB_HOSTS=3"
    return converged


@pytest.fixture(scope="module")
def routed(converge_run: Run, host_names: list[str]) -> dict[str, Any]:
    return routerkit.routed(converge_run, host_names)


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The lab inventory with slow d3-lite replicas (SLOW): the inventory of every rollout in this module."""
    return routerkit.slow_inventory(tmp_path_factory.mktemp("slow"), SLOW)


def servers_of(routed: dict[str, Any]) -> dict[str, list[str]]:
    """host -> the router servers of its d3-lite replicas, in instance order (PAIR_HOST: d3-lite, d3-lite-2)."""
    out: dict[str, list[str]] = {}
    for s in sorted(routed[MODEL]["servers"], key=lambda s: (s["host"], s["instance"])):
        out.setdefault(s["host"], []).append(s["name"])
    return out


# the open-loop load of the broken-tag drill: one slow replica (8 slots, 1.5 s a decision on nightly-next) must
# carry it alone while the other is drained, so below its 5 decisions/s
SLOW_RATE = 3.0


def under_load(routed: dict[str, Any], limit: str | None, extravars: dict[str, Any], inventory: Path) -> tuple[Run, dict[str, Any]]:
    """rollout.yml (ansible-runner) while the load generator sends d3-lite decisions through the router (SLOW_RATE a
    second, each from its own thread); the run and what clients saw (tools/rollout_under_load.py's figures, printed)."""
    url = routerkit.endpoint_urls(routed, [MODEL])[MODEL]
    with load_tool.load_during(url, MODEL, SLOW_RATE, WARMUP_S, api_key=None) as window:
        run = run_playbook("playbooks/rollout.yml", limit=limit, extravars=extravars, inventory=inventory)
    figures = load_tool.figures_of(window, SLOW_RATE, run.status, run.rc, run.events)
    print(f"\nrollout to {extravars['d3_image_name']} under load:\n" + load_tool.report(figures))
    return run, figures


def role_events(run: Run, role: str) -> list[int]:
    return [i for i, e in enumerate(run.events) if e.get("event_data", {}).get("role") == role and e.get("event") == "runner_on_ok"]


def task_events(run: Run, task: str, host: str) -> list[int]:
    return [
        i for i, e in enumerate(run.events)
        if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task and e["event_data"].get("host") == host
    ]  # fmt: skip


# d3_units' read-only input checks run in the staging play's head (d3_preflight inputs), before any restart
UNIT_INPUT_CHECKS = {"Refuse unit inputs that could inject into a unit file",
                     "Refuse an API key that cannot be a podman secret's data"}  # fmt: skip


def unit_events(run: Run) -> list[int]:
    """Indices of the d3_units role's events, its read-only input checks left out."""
    return [i for i in role_events(run, "d3_units") if run.events[i]["event_data"].get("task") not in UNIT_INPUT_CHECKS]


def _drain_records(router: str = ROUTER) -> str:
    return on_host(router, f"cat {DRAINS}/*.json 2>/dev/null || true")


def facts_of(run: Run, task: str, fact: str) -> dict[str, Any]:
    """host -> the fact a set_fact task set (its last ok event)."""
    return {e["event_data"]["host"]: e["event_data"]["res"]["ansible_facts"][fact]
            for e in run.events if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task
            and fact in ((e["event_data"].get("res") or {}).get("ansible_facts") or {})}  # fmt: skip


def messages(run: Run, task: str) -> list[tuple[str, Any]]:
    """(host, msg) of every ok event of a debug task, in order."""
    return [(e["event_data"]["host"], e["event_data"]["res"].get("msg")) for e in run.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task]  # fmt: skip


DRAIN_TASK = "Drain this host's instances in every router and wait (no new request; the current ones finish)"
GIVE_TASK = "Give back this host's drained instances in every router and wait until each is UP"
# before each wave (tasks/rollout_routers_live.yml)
WAVE_READ_TASK = "Read every router's servers (show stat; a router that does not answer is left out)"
STOP_TASK = "Stop the instances that restart beside another on their GPU, before any of them starts"


def drains_of(run: Run, task: str = DRAIN_TASK, router: str = ROUTER) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """(event index, host, servers) of every drain (or give-back) the run made in ``router``, in order; for a drain,
    each server's `before`: its show stat row as read just before its drain was set (scur: its requests in flight)."""
    out = []
    for i, e in enumerate(run.events):
        data = e.get("event_data", {})
        if e.get("event") == "runner_on_ok" and data.get("task") == task:
            for item in (data.get("res") or {}).get("results", []):
                if (item.get("item") or {}).get("router") == router:
                    out.append((i, data["host"], item.get("before") or item.get("servers") or []))
    return out


def drain_results(run: Run) -> list[dict[str, Any]]:
    """The drain task's per-router results (the module's return with its loop item {router, drain})."""
    return [item for e in run.events if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == DRAIN_TASK
            for item in e["event_data"]["res"].get("results", [])]  # fmt: skip


def run_id(run: Run) -> str:
    """The rollout's identity (its lease and drain records carry it), from its lease task."""
    for e in run.events:
        if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == "Keep the lease":
            return e["event_data"]["res"]["ansible_facts"]["d3_state_lease"]["owner"]
    raise AssertionError("the rollout took no lease")


LEASE = "/var/lib/d3/rollout-lease.json"  # the d3_state role's d3_state_lease_file default (on each router)


def rollout_through_a_router_failover(routed: dict[str, Any], extravars: dict[str, Any], inventory: Path) -> tuple[Run, dict[str, Any]]:
    """rollout.yml on the whole fleet while 32 keep-alive clients (4 a second each) send d3-lite decisions to the virtual
    address; the router holding it is killed (`podman kill`: the host dies, nothing shuts down in order) as soon as the
    rollout's drain of PAIR_HOST's d3-lite is set there, and started again (routerkit.restart_router). The run and the
    failover's figures (printed: docs/router.md): when the other router held the address, the requests, those failed
    and those failed among the ones sent 1 s or more after the move (``late``: must be none)."""
    address = routerkit.vip()
    assert address, "the lab has no router pair (d3_router_vip): make lab"
    dead = routerkit.vip_holder()
    assert dead, f"no lab router holds {address}"
    (other,) = [r for r in routerkit.ROUTERS if r != dead]
    backend, server = routed[MODEL]["backend"], servers_of(routed)[PAIR_HOST][0]
    events: dict[str, float] = {}
    outcome: dict[str, Run] = {}
    thread = threading.Thread(target=lambda: outcome.update(run=run_playbook("playbooks/rollout.yml", extravars=extravars,
                                                                             inventory=inventory)), daemon=True)  # fmt: skip
    url = f"http://{address}:{routerkit.ENDPOINT_PORT}"
    with routerkit.KeepAliveClients({MODEL: url}, CLIENTS, timeout=30, pace=FAILOVER_PACE_S) as clients:
        thread.start()
        try:
            assert routerkit.wait_for_record(backend, server, timeout=600, router=dead), f"{server} never drained on {dead}"
            assert routerkit.wait_for_state(backend, "DRAIN", timeout=30, router=dead), f"no drain on {dead}"
            events["killed"] = time.monotonic()
            labkit.podman("kill", dead, check=True)
            labkit.wait_until(f"{other} holds {address}", lambda: routerkit.vip_holder() == other, timeout=30, poll=0.1)
            events["moved"] = time.monotonic()
            routerkit.restart_router(dead)
            events["back"] = time.monotonic()
        finally:
            routerkit.stop_waiting()
            thread.join(timeout=900)
    assert "run" in outcome, "the rollout did not end within 900 s"
    results = list(clients.results)
    failed = [r for r in results if r[4] != 200]
    late = [r for r in failed if r[2] >= events["moved"] + 1.0]
    answered = sorted(r[2] + r[3] for r in results if r[4] == 200 and r[2] + r[3] > events["killed"])
    figures = {"dead": dead, "other": other, "moved_s": round(events["moved"] - events["killed"], 2),
               "first_answer_s": round(answered[0] - events["killed"], 2) if answered else None,
               "back_s": round(events["back"] - events["killed"], 1), "requests": len(results), "failed": len(failed),
               "late": late[:5]}  # fmt: skip
    left_out = [m for _, m in messages(outcome["run"], "Say which routers are left out")]
    print(f"\nrouter failover in a whole-fleet rollout ({time.strftime('%Y-%m-%d')}, {CLIENTS} keep-alive clients, "
          f"at most {1 / FAILOVER_PACE_S:g} a second each, on {url}): "
          f"{dead} killed while draining {server}; {other} held {address} after {figures['moved_s']} s; first answer "
          f"after the kill {figures['first_answer_s']} s; {dead} back (haproxy, keepalived active) {figures['back_s']} s "
          f"after the kill; {len(results)} requests, {len(failed)} failed, {len(late)} of them sent 1 s or more after "
          f"the move; the rollout said: {left_out or 'nothing (every step found both routers answering)'}")  # fmt: skip
    return outcome["run"], figures


def test_drill_controller_killed_mid_rollout(fleet: list[str], routed: dict[str, Any], slow: Path, tmp_path: Path) -> None:
    """Drill 8 on d3-lite's replicas (the rollout that gives them the slow answers): SIGKILL ansible-playbook (and its
    workers) as soon as the canary's first unit file changed - the canary's first wave drained in the router (its
    d3-lite, not its second replica d3-lite-2: one at a time), units half switched, nothing restarted or recorded,
    the marker and the drain record left. status.yml names the drained server (and, asked about nightly-next, shows
    every host's drift: the whole-fleet rollout's "before"). With the other replicas in MAINT (an operator's), the
    next run gives the drained one back and is refused before any change: the drain would leave d3-lite without an UP
    server; the MAINTs stay. Once the operator lifts them, the next run completes: every instance on the pinned
    digest, record and units agree, nothing stopped."""
    canary, other = REPLICAS
    assert canary == PAIR_HOST
    backend, names = routed[MODEL]["backend"], servers_of(routed)
    first, second = names[canary]  # the canary's d3-lite and d3-lite-2
    target = registry_digest("nightly")
    untouched = {h: running(h) for h in fleet if h not in REPLICAS}
    serving_before = {h: sorted(running(h)) for h in REPLICAS}
    images_before = {h: set(on_host(h, "podman images -q --no-trunc").split()) for h in REPLICAS}
    weights_before = {h: on_host(h, "ls /var/lib/d3/huggingface/hub/*/snapshots") for h in REPLICAS}
    # the digest pinned: the drill must not depend on what the tag resolves to while it runs
    pinned = {"d3_image_name": f"{IMAGE}:nightly", "d3_image_digest": target}
    # the canary alone: the kill comes in its first wave, before the other host would be reached anyway
    argv = [labkit.venv_tool("ansible-playbook"), "playbooks/rollout.yml", "-i", str(slow), "-l", canary,
            "-e", json.dumps(pinned)]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=labkit.ANSIBLE_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        # one wait on the host itself (grep every 0.05 s there, not a podman exec from here each time)
        waited = subprocess.run(["podman", "exec", canary, "timeout", "240", "sh", "-c",
                                 "until grep -qs D3_SIM_REQUEST_MS /etc/containers/systemd/*.container "
                                 "/etc/systemd/system/*.service; do sleep 0.05; done"], check=False, timeout=300)  # fmt: skip
        assert waited.returncode == 0, f"{canary}: no unit file with the slow answers within 240 s"
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = time.monotonic() - started
    assert on_host(canary, f"test -e {MARKER} && echo present || echo absent").strip() == "present"
    states = server_states(backend)
    # the first wave drained the canary's d3-lite only: its second replica on the same host kept serving
    assert states[first] == "DRAIN" and states[second] == "UP", states
    assert f'"server": "{first}"' in _drain_records() and f'"server": "{second}"' not in _drain_records()

    # HAProxy killed (SIGKILL to the master and its workers: nothing saved on the way down) and started again by
    # systemd (Restart=always, the package's unit): the drain comes back from the server-state file the module wrote
    # after it, owned by the killed rollout's record: status.yml reports it below and the next run gives it back
    pids = on_host(ROUTER, "pidof haproxy").split()
    on_host(ROUTER, "pkill -KILL -x haproxy")

    def restarted() -> bool:
        now = on_host(ROUTER, "pidof haproxy || true").split()
        answer = on_host(ROUTER, f"echo 'show stat' | socat stdio {routerkit.SOCKET}", check=False)
        return bool(now) and not set(now) & set(pids) and f"\n{backend}," in answer

    labkit.wait_until(f"{ROUTER}: HAProxy started again after kill -9", restarted, timeout=60, poll=0.5)
    states = server_states(backend)
    assert states[first] == "DRAIN" and states[second] == "UP", states

    # status.yml names the server left drained; asked about nightly-next, every host drifts (the next test's rollout)
    report: dict[str, Any] = {}
    rows = status(tmp_path, "nightly-next", slow, report)
    left = [m for _, m in messages(report["run"], "Print the drains left by an interrupted rollout")]
    assert any(f"{backend}/{first} (host {canary}, instance {MODEL}) left by an interrupted rollout" in line
               for line in left[0]), left  # fmt: skip
    assert rows and all(any("image" in d for d in row["drift"]) for row in rows), rows
    BEFORE_NEXT["status"] = rows

    # the other replicas in maintenance (an operator's): the next run gives the canary's back, then refuses its drain
    held = [second, *names[other]]
    for server in held:
        set_state(backend, server, "maint")
    try:
        refused = run_playbook("playbooks/rollout.yml", limit=canary, extravars=pinned, inventory=slow)
        assert refused.status == "failed", refused.stdout[-3000:]
        text = " ".join(refused.failure_text(canary).split())
        assert (f"router {ROUTER}: draining {first} would leave model {MODEL} (backend {backend}) with 0 UP "
                f"server(s), fewer than d3_rollout_min_up = 1; its other servers: ") in text, text
        assert all(f"{server} (MAINT)" in text for server in held), text
        assert not unit_events(refused), "the refused run touched a unit"
        states = server_states(backend)
        assert states[first] == "UP" and all(states[s] == "MAINT" for s in held), states  # given back; MAINTs stay
        assert _drain_records().strip() == ""
    finally:
        for server in held:
            set_state(backend, server, "ready")
    labkit.wait_until("d3-lite's servers UP", lambda: set(server_states(backend).values()) == {"UP"}, timeout=30, poll=0.5)

    # the next run: the whole fleet (the canary of this run is d3-lab-host1, which has nothing to change), 32
    # keep-alive clients on the routers' virtual address, and the router that holds it killed as soon as the run
    # drains PAIR_HOST's d3-lite there, then started again: the rollout goes on without it and finishes
    # (serial [2, 1]: d3-lab-host1 beside d3-lab-host2, then d3-lab-host3, as the rollout under load does)
    resumed, failover = rollout_through_a_router_failover(routed, {**pinned, "d3_rollout_serial": [2, 1]}, slow)
    assert resumed.status == "successful", resumed.failure_text()
    reasons = {key: reason for key, (_, reason) in downtimes_by_host(resumed).items()}
    for host in untouched:
        assert running(host) == untouched[host], host
    for host in REPLICAS:
        record = json.loads(on_host(host, "cat /var/lib/d3/deployed.json"))
        containers = labkit.d3_containers(host)
        assert sorted(running(host)) == serving_before[host], host  # no instance left stopped
        assert record["image_ref"] == f"{IMAGE}@{target}", host
        for name, info in containers.items():
            # what runs is what is recorded
            assert info["ImageName"] == record["image_ref"], (host, name, resumed.stdout[-4000:])
            assert info["Config"]["Labels"]["io.d3-fleet.revision"] == record["instances"][name]["revision"], (host, name)
            assert on_host(host, f"systemctl is-active {name}.service").strip() == "active"
        assert on_host(host, f"test -e {MARKER} && echo present || echo absent").strip() == "absent", host
        assert images_before[host] <= set(on_host(host, "podman images -q --no-trunc").split()), host  # images kept
        assert on_host(host, "ls /var/lib/d3/huggingface/hub/*/snapshots") == weights_before[host], host  # weights kept
    # the canary's unit written by the killed run was restarted although it did not change again
    assert any("newer than the" in r for (host, _), r in reasons.items() if host == canary), reasons
    # no server drained, no drain record and no lease on either router (the one killed brought its drain back from its
    # state file: given back by the wave or at the rollout's end); no request sent a second after the move failed
    for router in routerkit.ROUTERS:
        assert set(server_states(backend, router).values()) == {"UP"}, (router, server_states(backend, router))
        assert _drain_records(router).strip() == "", router
        assert on_host(router, f"test -e {LEASE} && echo present || echo absent").strip() == "absent", router
    assert failover["moved_s"] < 10 and not failover["late"], failover
    figure(8, "controller killed mid-rollout", f"killed {killed_at:.0f} s in ({first} drained, {second} serving, units "
           f"half switched); status named the drain; refused with {', '.join(held)} in MAINT (kept), {first} given back; "
           f"the next run (the whole fleet, the router holding the address killed in it) completed, {len(reasons)} "
           f"instances restarted, record = units, marker, drain records and leases gone", started)  # fmt: skip
    figure("pair", "router failover in a whole-fleet rollout",
           f"{failover['dead']} killed while draining; {failover['other']} held the address after {failover['moved_s']} s; "
           f"first answer after the kill {failover['first_answer_s']} s; {failover['dead']} back {failover['back_s']} s "
           f"after the kill; {failover['requests']} requests by {CLIENTS} keep-alive clients, {failover['failed']} failed, "
           f"{len(failover['late'])} of them sent 1 s or more after the move", started)  # fmt: skip


def alertmanager(method: str = "GET", path: str = "/api/v2/silences") -> Any:
    """The lab monitor's Alertmanager API v2 (it listens on the monitor's loopback; the monitor is ROUTER)."""
    script = ("import sys, urllib.request; r = urllib.request.urlopen(urllib.request.Request(sys.argv[1], method=sys.argv[2])); "
              "print(r.read().decode() or 'null')")  # fmt: skip
    return json.loads(on_host(ROUTER, f"python3 -c {script!r} 'http://127.0.0.1:9093{path}' {method}"))


def rollout_silences(since: str, errors: bool = True) -> list[dict[str, Any]]:
    """The silences a planned restart posted (d3_metrics silence.yml) that started at ``since`` (UTC) or later;
    ``errors`` False: without the router error ratio's, which ends the ratio's window (5 min) after the others."""
    return [x for x in alertmanager() if x["createdBy"] == "d3-fleet" and "planned restart of" in x["comment"]
            and x["startsAt"][:19] >= since and (errors or x["matchers"][0]["value"] != "D3RouterErrors")]  # fmt: skip


def ended(run: Run) -> datetime:
    """When a run ended (its last runner event, UTC)."""
    return datetime.fromisoformat(max(e["created"] for e in run.events if "created" in e))


def settle_s() -> int:
    """The lab monitor's settle time: twice its scrape and evaluation intervals (the d3_metrics role's, 20 s in the lab)."""
    return 2 * sum(labkit.monitor_intervals())


def the_silences_end_a_settle_time_after(since: str, run_end: datetime) -> list[dict[str, Any]]:
    """A run's silences, checked to end a settle time (settle_s()) after the run (``run_end``, UTC: ended()), shortened
    from the hour they were posted with; the error ratio's, left to its later end, within its window (5 min) of the
    others'."""
    ours = rollout_silences(since)
    assert ours, "the run posted no silence"
    others = [x for x in ours if x["matchers"][0]["value"] != "D3RouterErrors"]
    assert others, ours
    ends = [datetime.fromisoformat(x["endsAt"].replace("Z", "+00:00")) for x in others]
    # ended by this run's end (the end play's or the rescue's last steps after it: well under half a minute), at most a
    # settle time (and a few seconds of its own calls) after the run
    assert all(-30 <= (end - run_end).total_seconds() <= settle_s() + 5 for end in ends), (run_end, others)
    errors = [x for x in ours if x["matchers"][0]["value"] == "D3RouterErrors"]
    later = [(datetime.fromisoformat(x["endsAt"].replace("Z", "+00:00")) - max(ends)).total_seconds() for x in errors]
    assert later and all(290 <= s <= 310 for s in later), later
    return ours


def wait_for_the_silences_to_end(since: str, run_end: datetime) -> list[dict[str, Any]]:
    """the_silences_end_a_settle_time_after, and then until Alertmanager has expired them (all but the error ratio's)."""
    ours = the_silences_end_a_settle_time_after(since, run_end)
    labkit.wait_until("the run's silences expired", lambda: {x["status"]["state"] for x in rollout_silences(since, errors=False)}
                      == {"expired"}, timeout=120, poll=1)  # fmt: skip
    return ours


# what the drill's status run saw (asked about nightly-next): the whole-fleet rollout's drift before it
BEFORE_NEXT: dict[str, Any] = {}


def test_rollout_to_next_tag_under_load_fails_no_request(fleet: list[str], routed: dict[str, Any], slow: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    old, new = registry_digest("nightly"), registry_digest("nightly-next")
    assert old != new
    backend, names = routed[MODEL]["backend"], servers_of(routed)
    # the clients reach ROUTER (the virtual address on it), where the stats are sampled and the reload is made
    routerkit.hold_vip(ROUTER)

    # status before: every host drifts from nightly-next (seen by the drill's status run, which asks about it; alone,
    # this test asks itself)
    before = BEFORE_NEXT.get("status") or status(tmp_path, "nightly-next", slow)
    assert before and all(any("image" in d for d in row["drift"]) for row in before)

    # a router reload by hand (`systemctl reload haproxy`, nothing saved first: the role's drop-in for haproxy.service
    # saves the server state) as soon as a replica is drained: the drain must survive it. The first drained replica
    # (PAIR_HOST's d3-lite, batch 1's first wave) is frozen (SIGSTOP to its process on its host) as soon as its drain
    # record is written, just before the drain: the requests in flight on it stay in flight across the reload for
    # SLOW_S, on the old HAProxy worker only; the drain wait (master CLI: every worker) must wait for them, so the
    # instance is not restarted under them. Meanwhile a second rollout (another operator's --limit) and site.yml
    # --tags router run: the second is refused naming this one, site.yml gives none of this rollout's drains back.
    reloads: list[dict[str, Any]] = []
    servers = [s for host in names.values() for s in host]
    frozen: dict[str, Any] = {}
    beside: dict[str, Run] = {}
    pid = on_host(PAIR_HOST, f"podman inspect --format '{{{{.State.Pid}}}}' {MODEL}").strip()

    def beside_the_rollout(name: str, playbook: str, **kwargs: Any) -> threading.Thread:
        thread = threading.Thread(target=lambda: beside.update({name: run_playbook(playbook, inventory=slow, **kwargs)}),
                                  daemon=True)  # fmt: skip
        thread.start()
        return thread

    def reload_while_drained() -> None:
        record = routerkit.wait_for_record(backend, names[PAIR_HOST][0], timeout=600)
        if record:
            on_host(PAIR_HOST, f"kill -STOP {pid}")
            frozen["at"] = time.monotonic()
        try:
            # one wait on the router itself (show stat every 0.1 s there, not a podman exec from here each time)
            drained = routerkit.wait_for_state(backend, "DRAIN", timeout=600)
            if drained and routerkit.STATE_FILE:
                others = [beside_the_rollout("second", "playbooks/rollout.yml", limit=fleet[-1],
                                             extravars={"d3_image_name": f"{IMAGE}:nightly-next"}),
                          beside_the_rollout("site", "site.yml", cmdline="--tags router")]  # fmt: skip
                how = routerkit.reload_by_hand()
                reloads.append({"server": drained, "how": how, "after": server_states(backend).get(drained)})
                if frozen:
                    time.sleep(max(0.0, frozen["at"] + SLOW_S - time.monotonic()))
                    thaw()
                for thread in others:
                    thread.join(timeout=600)
        finally:
            thaw()  # whatever happened: a failure here must not leave the instance stopped for the next test

    def thaw() -> None:
        if frozen and "for_s" not in frozen:
            on_host(PAIR_HOST, f"kill -CONT {pid}")
            frozen["for_s"] = round(time.monotonic() - frozen["at"], 1)

    urls = routerkit.endpoint_urls(routed, [MODEL])
    watcher = threading.Thread(target=reload_while_drained, daemon=True)
    # the monitor's webhook (the lab's receiver, a STAND-IN pager) listens through the rollout: it must get nothing
    hook, since = tmp_path / "webhook.jsonl", time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    hook.touch()
    receiver = subprocess.Popen([sys.executable, str(labkit.ROOT / "lab/webhook/receiver.py"), "--port", "19099", "--out", str(hook)])
    # the fleet in two batches: d3-lab-host1 (no d3-lite) restarts beside d3-lab-host2, whose d3-lite replicas go one
    # at a time; then d3-lab-host3 (batches of the default serial: tests/test_rollout_batches.py)
    serial = [2, 1]
    try:
        # d3-lite's show stat sampled on the router throughout: each given-back replica's share of new requests
        with routerkit.StatSampler(backend) as sampler, routerkit.KeepAliveClients(urls, CLIENTS) as clients:
            watcher.start()
            run = run_playbook("playbooks/rollout.yml", extravars={"d3_image_name": f"{IMAGE}:nightly-next", "d3_rollout_serial": serial},
                               inventory=slow)  # fmt: skip
            routerkit.stop_waiting()
            watcher.join(timeout=30)
    except BaseException:
        receiver.terminate()
        raise
    seen = clients.figures()
    print(f"\nrollout to nightly-next, {CLIENTS} keep-alive clients through {sorted(set(urls.values()))}: {seen['requests']} "
          f"requests on {seen['connections']} connections, {len(seen['failed'])} failed, {seen['min_s']} / {seen['median_s']} / "
          f"{seen['max_s']} s (min / median / max); reload: {reloads}")  # fmt: skip
    assert run.status == "successful", run.failure_text()

    # what clients of the router saw: nothing failed; every request took the stand-in's 1 s at least
    assert seen["failed"] == [], seen["failed"][:10]
    assert seen["requests"] >= CLIENTS * 3 and seen["min_s"] >= 1.0, seen
    # the reload came while a replica was drained, and it stayed drained across it (the role's server-state-file)
    assert routerkit.STATE_FILE, "the d3_router role keeps no server state across a reload (roles/d3_router/vars/main.yml)"
    assert len(reloads) == 1 and reloads[0]["after"] == "DRAIN", reloads

    # a given-back replica ramps up (slowstart 10 s: the give-back goes through MAINT, docs/router.md "A returning
    # server ramps up"): its share of new requests in its first two seconds back is below its share 8-12 s later,
    # averaged over the give-backs (with 32 clients on three replicas a full share is about a third)
    ramps = sampler.ramps()
    print("given back, share of new requests per second after (%):", ramps)
    figure("ramp", f"slowstart on {ROUTER}: a given-back d3-lite replica's share of new requests, % per second after",
           "; ".join(f"{r.get('server', '?')}: {r['shares'][:12]}" for r in ramps), started)

    def mean(values: list[Any]) -> float | None:
        known = [v for v in values if v is not None]
        return sum(known) / len(known) if known else None

    assert len(ramps) >= len(servers), ramps
    # the give-backs seen long enough on both sides (the last may end with the run)
    pairs = [(mean(r["shares"][:2]), mean(r["shares"][8:12])) for r in ramps]
    pairs = [(early, late) for early, late in pairs if early is not None and late is not None]
    assert len(pairs) >= 2, ramps
    early, late = mean([e for e, _ in pairs]), mean([la for _, la in pairs])
    assert early is not None and late is not None and early < late, (early, late, ramps)

    # the frozen replica's requests stayed in flight across the reload, on the old worker only: the drain wait saw
    # them there (on the worker from before the reload) and waited until they were answered before the restart
    assert frozen.get("for_s", 0) >= SLOW_S, frozen
    (first_drain,) = [item for item in drain_results(run) if item["item"]["router"] == ROUTER and names[PAIR_HOST][0]
                      in [d["server"] for d in item["item"]["drain"]]]  # fmt: skip
    # the sessions it waited for were on a worker that has left since (the one before the reload: HAProxy ends an old
    # worker once its last connection closes), not on the worker that runs now
    held = set(first_drain["workers_seen"])
    assert held and not held & set(on_host(ROUTER, "pidof haproxy").split()), (first_drain["workers_seen"], reloads)
    assert first_drain["waited_s"] >= SLOW_S - 3, first_drain["waited_s"]
    assert seen["max_s"] >= SLOW_S - 2, seen  # the frozen requests were answered (200), late

    # one rollout at a time: the second was refused before any change, naming this one; site.yml gave back nothing
    second, site = beside["second"], beside["site"]
    assert second.status == "failed", second.stdout[-3000:]
    refusal = " ".join(second.failure_text().split())
    assert "holds the routers: one rollout at a time, so this one changes nothing" in refusal, refusal
    assert f"d3_rollout_take_over={run_id(run)}" in refusal and not unit_events(second), refusal
    assert site.status == "successful", site.failure_text()
    assert not [m for _, m in messages(site, "Give back the servers an interrupted rollout left drained")], site.stdout[-3000:]
    kept = " ".join(" ".join(m) for _, m in messages(site, "Say which drains stay with the rollout that holds the routers"))
    assert f"rollout {run_id(run)} (" in kept and "holds the routers: its drains stay" in kept, site.stdout[-3000:]

    # each replica had requests in flight when it was drained (show stat scur, read by the drain itself just before it
    # set the drain), and they moved one at a time: each drained, restarted and given back before the next was drained,
    # the two on PAIR_HOST too (two waves: one backend's two servers never drained together)
    drains = [(i, host, row) for i, host, rows in drains_of(run) for row in rows if row["backend"] == backend]
    gives = [(i, host, row) for i, host, rows in drains_of(run, GIVE_TASK) for row in rows if row["backend"] == backend]
    assert sorted(row["server"] for _, _, row in drains) == sorted(servers), drains  # each drained once
    for _, host, row in drains:
        assert row["scur"] >= 1, (host, row)  # in flight when it was drained (show stat)
    back = {row["server"]: i for i, _, row in gives}
    timeline = sorted([(i, "drain", row["server"]) for i, _, row in drains] + [(i, "back", s) for s, i in back.items()])
    assert [what for _, what, _ in timeline] == ["drain", "back"] * len(servers), timeline
    assert [s for _, _, s in timeline] == [s for _, _, row in drains for s in (row["server"],) * 2], timeline
    # when PAIR_HOST's second server was drained, show stat had its first back UP (the wave's own read, before it)
    pair_first, pair_second = names[PAIR_HOST]
    reads = [e["event_data"]["res"]["results"] for e in run.events if e.get("event") == "runner_on_ok"
             and e["event_data"].get("task") == WAVE_READ_TASK and e["event_data"]["host"] == PAIR_HOST]  # fmt: skip
    assert reads, "PAIR_HOST's second wave read no show stat"
    seen_up = {row["server"]: row["status"] for item in reads[-1] for row in item["stat"] if row["backend"] == backend}
    assert seen_up[pair_first] == "UP" and seen_up[pair_second] == "UP", seen_up
    assert [row["server"] for _, host, row in drains if host == PAIR_HOST] == [pair_first, pair_second], drains

    # where it is: which batch of how many, and each host drained / restarted / given back
    batches = [fleet[:2], fleet[2:]]
    assert [m for _, m in messages(run, "Say which batch this is")] == [
        f"batch {i} of 2: hosts {', '.join(hosts)}" for i, hosts in enumerate(batches, start=1)]  # fmt: skip
    said = {m.split(": ", 1)[0] + ": " + m.split(": ", 1)[1].split(" (")[0] for task in
            ("Say what was drained", "Say what was restarted", "Say what was given back") for _, m in messages(run, task)}  # fmt: skip
    for i, hosts in enumerate(batches, start=1):
        for host in hosts:
            assert {f"batch {i} of 2, {host}: {p}" for p in ("drained", "restarted", "given back")} <= said, said

    for host in fleet:
        images = {image for image, _ in running(host).values()}
        assert images == {f"{IMAGE}@{new}"}, (host, images)
        assert on_host(host, f"test -e {MARKER} && echo present || echo absent").strip() == "absent", host

    # every restarted instance reports its downtime, at most its simulated cold start + 5 s
    downtimes = downtimes_by_host(run)
    assert len(downtimes) == sum(len(running(h)) for h in fleet), (sorted(downtimes), run.stdout[-3000:])
    print()
    for host in fleet:
        for unit in running(host):
            cold = cold_start_s(host, unit)
            down, reason = downtimes[(host, unit)]
            print(f"{host} {unit}: down {down:.1f} s, cold start {cold:.1f} s ({reason})")
            assert reason == "unit changed"
            # the window holds the cold start; its bound leaves room for systemd, the smoke poll and this 2-core
            # machine's other jobs (at + 5 s an unloaded d3-mini failed once with 6.2 s down for a 0.9 s cold start)
            assert cold <= down <= cold + 15, (host, unit, down, cold)

    # PAIR_HOST's first wave restarts d3-nano and d3-lite, which share a GPU (d3-lite starts after d3-nano): both were
    # stopped before either started (the later first), so neither profiled the GPU's memory while the other still held
    # it; the second wave's d3-lite-2 restarted alone (d3_units_actions' stops; every instance passed its smoke above)
    stops = [[r["item"] for r in e["event_data"]["res"]["results"]] for e in run.events if e.get("event") == "runner_on_ok"
             and e["event_data"].get("task") == STOP_TASK and e["event_data"]["host"] == PAIR_HOST]  # fmt: skip
    assert [s for s in stops if s] == [["d3-lite", "d3-nano"]], stops

    # one summary table: a single-replica model's window as clients could see it (drain to back in the router) beside
    # its unit's (stop to ready); the replicated model lost nothing; the pin command names the new digest
    (summary,) = [m for _, m in messages(run, "Print the summary (host, instance, digests, downtime as the unit and as "
                                              "clients saw it) and how to pin the digest")]  # fmt: skip
    print("\n".join(summary))
    single = {m["served_name"] for m in routed.values() if len(m["servers"]) == 1}
    rows = [re.match(r"(\S+)\s+(\S+)\s+(sha256:\w+)\s+(sha256:\w+)\s+([0-9.]+) s\s+(.*)$", line) for line in summary[1:]]
    rows = [r for r in rows if r]
    assert len(rows) == len(downtimes), summary
    singles = [r for r in rows if r[2] in single]
    assert singles, summary
    for r in singles:
        unit_s, clients_s = float(r[5]), float(r[6].split(" s ")[0])
        assert r[6].endswith("s (one replica: drain to back in the router)"), r[0]
        assert r[3] == old[:19] and r[4] == new[:19] and 0 < unit_s <= clients_s, r[0]
    lite = [r for r in rows if r[2] in (MODEL, f"{MODEL}-2")]
    assert len(lite) == len(servers) and all(r[6].startswith(f"0 s ({len(servers) - 1} other replica(s) served") for r in lite), summary
    assert f"-e d3_image_digest={new}" in summary[-2] and "site.yml" in summary[-2], summary

    # nothing is downloaded inside the restart window: pulls and weight downloads all happen in the stage play,
    # before the first unit is touched, and the restart batches run neither role
    first_unit = min(unit_events(run))
    staging = role_events(run, "d3_image") + role_events(run, "d3_weights")
    assert staging and max(staging) < first_unit
    plays = [e["event_data"]["play"] for e in run.events if e.get("event") == "playbook_on_play_start"]
    assert plays[0].startswith("Stage")
    batch_roles = {e["event_data"].get("role") for e in run.events[first_unit:] if e.get("event") in ("runner_on_ok", "runner_on_failed")}
    assert not batch_roles & {"d3_image", "d3_weights"}

    after = status(tmp_path, "nightly-next", slow)
    assert all(row["drift"] == [] and row["health"] == "ready" for row in after), after
    assert {row["digest"] for row in after} == {new}

    # planned work did not page (issue 32): the rollout posted its silences (comment its own) and at its end made them
    # end a settle time later (twice the lab monitor's 5 s scrape and evaluation intervals: 20 s), not at once (an
    # alert still firing when its silence goes is notified at once: the second lab run of 2026-12-05 paged two
    # D3ModelReplicasMissing so). The webhook listens until they have expired by themselves and then for OBSERVE_S
    # more (the lab's group_interval is 1 s: a page held back by them would have come): it got no alert that started
    # since the rollout began, the Watchdog aside
    ours = wait_for_the_silences_to_end(since, ended(run))
    ending = min(x["endsAt"] for x in ours)
    time.sleep(OBSERVE_S)  # a window in which nothing must arrive: no event to poll for
    receiver.terminate()
    receiver.wait(timeout=10)
    records = [json.loads(line) for line in hook.read_text().splitlines()]
    (ROOT / "build").mkdir(exist_ok=True)
    shutil.copy(hook, ROOT / "build/rollout-webhook.jsonl")  # kept for a failure's reader (pytest's tmp_path is not)
    pages = [(a["labels"], a["startsAt"], a["status"]) for rec in records if rec["path"] == "/alerts" and rec["body"]
             for a in rec["body"]["alerts"] if a["startsAt"][:19] >= since]  # fmt: skip
    assert pages == [], pages
    print(f"webhook during the rollout and {OBSERVE_S} s after its silences ended ({ending}; the error ratio's 5 min later): "
          f"nothing; {len(ours)} silences posted and ended ({ours[0]['comment']})")  # fmt: skip


def test_a_broken_tag_stops_at_the_canary_which_rolls_back_through_the_router_and_no_request_fails(
        routed: dict[str, Any], slow: Path) -> None:  # fmt: skip
    """Drill 9 under load: an image that never becomes healthy, rolled to the two d3-lite replicas behind the router
    (serial 1). The rollout stops at the canary, which is drained again, goes back to its previous digest by itself,
    passes its smoke and is given back to the router; the other replica is never drained nor restarted; no client
    request fails."""
    started, since = time.monotonic(), time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    canary, other = REPLICAS
    before = {h: running(h) for h in REPLICAS}
    good = {image for image, _ in before[canary].values()}
    assert len(good) == 1 and f"{IMAGE}@{registry_digest('nightly-broken')}" not in good
    run, figures = under_load(routed, ":".join(REPLICAS),
                              {"d3_image_name": f"{IMAGE}:nightly-broken", "d3_rollout_serial": 1, "d3_smoke_timeout_s": 12},
                              slow)  # fmt: skip
    assert run.status == "failed", run.stdout[-3000:]
    assert [f["host"] for f in run.failures() if "The rollout stops" in json.dumps(f.get("res", {}))] == [canary]
    text = run.failure_text(canary)
    assert f"host {canary}: the new deployment failed" in text
    # the readiness timeout names its variable and what each instance showed, not a raw uri error
    assert "not serving within d3_smoke_timeout_s (12 s)" in text, text
    assert run.stats.get("rescued", {}).get(canary) == 1
    assert task_events(run, "Drain this host's instances again in every router before rolling back", canary)

    # what clients saw: nothing failed; only the canary was drained, and it was given back after its rollback
    assert figures["during"]["failed"] == 0, figures["failed_requests"]
    rows = {row["host"]: row for row in figures["timeline"]}
    assert list(rows) == [canary], figures["timeline"]  # the other replica was never drained
    assert rows[canary]["back_s"] is not None, "the rolled-back canary was not given back to the router"
    assert set(server_states(routed[MODEL]["backend"]).values()) == {"UP"}
    assert _drain_records().strip() == ""

    # the canary is back on the previous digest, answers decisions and carries no rollout marker; the other replica
    # was not restarted
    assert {image for image, _ in running(canary).values()} == good
    assert on_host(canary, f"test -e {MARKER} && echo present || echo absent").strip() == "absent"
    served = {s["instance"]: name for name, m in routed.items() for s in m["servers"] if s["host"] == canary}
    for name in running(canary):
        port = json.loads(on_host(canary, "cat /var/lib/d3/deployed.json"))["instances"][name]["port"]
        answer = on_host(
            canary,
            f"curl -sf http://127.0.0.1:{port}/v1/systemone -H 'Content-Type: application/json' -d "
            f'\'{{"model": "{served[name]}", "state": "x", "questions": {{"q": {{"type": "noul", "instructions": "ok?"}}}}}}\'',
        )
        assert json.loads(answer)["object"] == "structured_decision"
    assert running(other) == before[other]

    # a rollout that stops on a failure skips its end play (docs/rollouts.md), but its rescue, once the canary is back
    # and given back, ends the rollout's silences a settle time later as the end play would (not an hour later: a
    # fault the rollback left pages; the SRE review of 2026-12-05): they end within the settle time (20 s in the lab)
    # of the run's end, well before the hour they were posted with (d3_metrics_silence_minutes). Alertmanager
    # expiring them by themselves is the rollout under load's (above): not waited for again here
    the_silences_end_a_settle_time_after(since, ended(run))
    figure(9, "broken image at the canary", f"stopped at the canary {canary}, drained again, back on its previous digest, "
           f"serving and given back to the router; the other replica untouched; 0 failed requests", started)  # fmt: skip

