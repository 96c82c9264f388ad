"""Fleet rollouts on a lab of at least 3 hosts, driven by ansible-runner, through the lab's router. Every rollout here
uses a copy of the lab inventory where the two d3-lite replicas answer in 1 s (the simulator's D3_SIM_REQUEST_MS,
a STAND-IN for long decisions; lab/README.md):
- the controller killed while the first replica is drained (drill 8, the rollout that makes the replicas slow):
  status.yml names the drained server as left by an interrupted rollout; with the other replica put in MAINT by an
  operator, the next run gives the drained one back and is refused before any change (the drain would leave d3-lite
  without an UP server), the operator's MAINT stays; once it is lifted, the next run completes with nothing lost;
- a rollout of the whole fleet to the simulator's second tag while 32 closed-loop keep-alive clients send 1 s
  decisions to d3-lite through the router, with a router reload (the d3_router role's way: server state saved,
  then reloaded) while a replica is drained: no request fails, each replica had requests in flight when it was
  drained (show stat scur, read just before the drain) and stays drained across the reload, every instance moves
  to the new digest with nothing downloaded inside the restart window, each restarted instance is down for at most
  its (simulated) cold start + 5 s, the rollout says which batch of how many it is at and what it drained,
  restarted and gave back, and ends with one summary table (a single-replica model's client-visible window beside
  its unit's) and a pin command; status shows drift before and none after;
- a rollout of the two replicas to the broken tag under load (drill 9): it stops at the canary, which is drained
  again, rolled back, serving and given back to the router; the other replica is never drained nor restarted; no
  request fails.

The lab is a STAND-IN (lab/README.md); its simulator's cold starts are the field report's, shortened 30x."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import labkit
import pytest
import routerkit
from drillkit import figure
from labkit import IMAGE, ROOT, Run, on_host, registry_digest, run_playbook, running
from routerkit import MODEL, REPLICAS, ROUTER, WARMUP_S, load_tool, server_states, set_state

pytestmark = pytest.mark.lab

MARKER = "/var/lib/d3/rollout-in-progress"  # the d3_state role's d3_state_rollout_marker default
DRAINS = "/var/lib/d3/router-drains"  # the d3_state role's d3_state_drains_dir default (on the router)
# the simulator's slow answers (STAND-IN): each d3-lite decision takes 1 s; no batching slowdown on top
SLOW = {"D3_SIM_REQUEST_MS": "1000", "D3_SIM_BATCH_SLOWDOWN": "0"}
CLIENTS = 32
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


def status(tmp_path: Path, tag: str, inventory: Path) -> list[dict]:
    out = tmp_path / f"status-{tag}.json"
    run = run_playbook("playbooks/status.yml", extravars={"d3_image_name": f"{IMAGE}:{tag}", "d3_status_output": str(out)},
                       inventory=inventory)  # fmt: skip
    assert run.status == "successful", run.failure_text()
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


def servers_of(routed: dict[str, Any]) -> dict[str, str]:
    """host -> the router server of its d3-lite replica."""
    return {s["host"]: s["name"] for s in routed[MODEL]["servers"]}


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


def _unit_files_with(host: str, text: str) -> list[str]:
    out = on_host(host, f"grep -l '{text}' /etc/containers/systemd/*.container /etc/systemd/system/*.service 2>/dev/null || true")
    return out.split()


def _drain_records() -> str:
    return on_host(ROUTER, f"cat {DRAINS}/*.json 2>/dev/null || true")


def facts_of(run: Run, task: str, fact: str) -> dict[str, Any]:
    """host -> the fact a set_fact task set (its last ok event)."""
    return {e["event_data"]["host"]: e["event_data"]["res"]["ansible_facts"][fact]
            for e in run.events if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task
            and fact in ((e["event_data"].get("res") or {}).get("ansible_facts") or {})}  # fmt: skip


def messages(run: Run, task: str) -> list[tuple[str, Any]]:
    """(host, msg) of every ok event of a debug task, in order."""
    return [(e["event_data"]["host"], e["event_data"]["res"].get("msg")) for e in run.events
            if e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task]  # fmt: skip


PLAN_TASK = "Work out which servers this rollout drains in each router (an operator's MAINT or DRAIN stays as it is)"


def test_drill_controller_killed_mid_rollout(fleet: list[str], routed: dict[str, Any], slow: Path) -> None:
    """Drill 8 on the two d3-lite replicas (the rollout that gives them the slow answers): SIGKILL ansible-playbook (and
    its workers) as soon as the canary's first unit file changed - its d3-lite drained in the router, units half
    switched, nothing restarted or recorded, the marker and the drain record left. status.yml names the drained
    server. With the other replica in MAINT (an operator's), the next run gives the drained one back and is refused
    before any change: the drain would leave d3-lite without an UP server; the MAINT stays. Once the operator lifts
    it, the next run completes: every instance on the pinned digest, record and units agree, nothing stopped."""
    canary, other = REPLICAS
    backend, names = routed[MODEL]["backend"], servers_of(routed)
    target = registry_digest("nightly")
    untouched = {h: running(h) for h in fleet if h not in REPLICAS}
    serving_before = {h: sorted(running(h)) for h in REPLICAS}
    images_before = {h: set(on_host(h, "podman images -q --no-trunc").split()) for h in REPLICAS}
    weights_before = {h: on_host(h, "ls /var/lib/d3/huggingface/hub/*/snapshots") for h in REPLICAS}
    limit = ":".join(REPLICAS)
    # the digest pinned: the drill must not depend on what the tag resolves to while it runs
    pinned = {"d3_image_name": f"{IMAGE}:nightly", "d3_image_digest": target}
    argv = [labkit.venv_tool("ansible-playbook"), "playbooks/rollout.yml", "-i", str(slow), "-l", limit,
            "-e", json.dumps(pinned)]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=labkit.ANSIBLE_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        labkit.wait_until(f"{canary}: a unit file with the slow answers", lambda: _unit_files_with(canary, "D3_SIM_REQUEST_MS"),
                          timeout=240, poll=0.05)  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = time.monotonic() - started
    assert on_host(canary, f"test -e {MARKER} && echo present || echo absent").strip() == "present"
    assert server_states(backend)[names[canary]] == "DRAIN"
    assert f'"server": "{names[canary]}"' in _drain_records()

    # status.yml (the routers' play only) names the server left drained
    report = run_playbook("playbooks/status.yml", limit="d3-routers", inventory=slow)
    assert report.status == "successful", report.failure_text()
    left = [m for _, m in messages(report, "Print the drains left by an interrupted rollout")]
    assert any(f"{backend}/{names[canary]} (host {canary}, instance {MODEL}) left by an interrupted rollout" in line
               for line in left[0]), left  # fmt: skip

    # the other replica in maintenance (an operator's): the next run gives the canary back, then refuses its drain
    set_state(backend, names[other], "maint")
    try:
        refused = run_playbook("playbooks/rollout.yml", limit=limit, extravars=pinned, inventory=slow)
        assert refused.status == "failed", refused.stdout[-3000:]
        text = refused.failure_text(canary)
        assert (f"router {ROUTER}: draining {names[canary]} would leave model {MODEL} (backend {backend}) with 0 UP "
                f"server(s), fewer than d3_rollout_min_up = 1; its other servers: {names[other]} (MAINT)") in text, text
        assert not unit_events(refused), "the refused run touched a unit"
        states = server_states(backend)
        assert states[names[canary]] == "UP" and states[names[other]] == "MAINT", states  # given back; the MAINT stays
        assert _drain_records().strip() == ""
    finally:
        set_state(backend, names[other], "ready")
    labkit.wait_until(f"{names[other]} UP", lambda: server_states(backend)[names[other]] == "UP", timeout=30, poll=0.5)

    resumed = run_playbook("playbooks/rollout.yml", limit=limit, extravars=pinned, inventory=slow)
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
    assert set(server_states(backend).values()) == {"UP"} and _drain_records().strip() == ""
    figure(8, "controller killed mid-rollout", f"killed {killed_at:.0f} s in ({canary} drained, units half switched); status "
           f"named the drain; refused with {other} in MAINT (kept), {canary} given back; the next run completed, "
           f"{len(reasons)} instances restarted, record = units, marker and drain records gone", started)  # fmt: skip


def test_rollout_to_next_tag_under_load_fails_no_request(fleet: list[str], routed: dict[str, Any], slow: Path, tmp_path: Path) -> None:
    old, new = registry_digest("nightly"), registry_digest("nightly-next")
    assert old != new
    backend, names = routed[MODEL]["backend"], servers_of(routed)

    before = status(tmp_path, "nightly-next", slow)
    assert before and all(any("image" in d for d in row["drift"]) for row in before)

    # a router reload (the d3_router role's way) as soon as a replica is drained: the drain must survive it
    reloads: list[dict[str, Any]] = []

    def reload_while_drained(stop: threading.Event) -> None:
        while not stop.is_set():
            states = server_states(backend)
            drained = [s for s in names.values() if states.get(s) == "DRAIN"]
            if drained and routerkit.STATE_FILE:
                how = routerkit.reload_like_the_role()
                reloads.append({"server": drained[0], "how": how, "after": server_states(backend).get(drained[0])})
                return
            stop.wait(0.2)

    urls = routerkit.endpoint_urls(routed, [MODEL])
    stop = threading.Event()
    watcher = threading.Thread(target=reload_while_drained, args=(stop,), daemon=True)
    with routerkit.KeepAliveClients(urls, CLIENTS) as clients:
        watcher.start()
        run = run_playbook("playbooks/rollout.yml", extravars={"d3_image_name": f"{IMAGE}:nightly-next"}, inventory=slow)
        stop.set()
        watcher.join(timeout=30)
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

    # each replica had requests in flight when it was drained (show stat scur, read just before the drain), and the
    # two moved one after the other: each drained, restarted and given back before the other was drained
    plans = facts_of(run, PLAN_TASK, "_d3_rollout_drains")
    for host in REPLICAS:
        (entry,) = [d for p in plans[host] for d in p["drain"] if d["server"] == names[host]]
        assert entry["scur"] >= 1, plans[host]
    order = {e["event_data"]["host"]: i for i, e in enumerate(run.events) if e.get("event") == "runner_on_ok"
             and e["event_data"].get("task", "").startswith("Drain this host's instances in every router")}  # fmt: skip
    back = {e["event_data"]["host"]: i for i, e in enumerate(run.events) if e.get("event") == "runner_on_ok"
            and e["event_data"].get("task", "").startswith("Give back this host's drained instances")}  # fmt: skip
    first, second = REPLICAS
    assert order[first] < back[first] < order[second] < back[second]

    # where it is: which batch of how many, and each host drained / restarted / given back
    assert [m for _, m in messages(run, "Say which batch this is")] == [
        f"batch {i} of {len(fleet)}: hosts {host}" for i, host in enumerate(fleet, start=1)]  # fmt: skip
    said = {m.split(": ", 1)[0] + ": " + m.split(": ", 1)[1].split(" (")[0] for task in
            ("Say what was drained", "Say what was restarted", "Say what was given back") for _, m in messages(run, task)}  # fmt: skip
    for i, host in enumerate(fleet, start=1):
        assert {f"batch {i} of {len(fleet)}, {host}: {p}" for p in ("drained", "restarted", "given back")} <= said, said

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
            assert 0 < down <= cold + 5, (host, unit, down, cold)

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
    assert all(r[6].startswith("0 s (1 other replica(s) served") for r in rows if r[2] == MODEL), summary
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


def test_a_broken_tag_stops_at_the_canary_which_rolls_back_through_the_router_and_no_request_fails(
        routed: dict[str, Any], slow: Path) -> None:  # fmt: skip
    """Drill 9 under load: an image that never becomes healthy, rolled to the two d3-lite replicas behind the router
    (serial 1). The rollout stops at the canary, which is drained again, goes back to its previous digest by itself,
    passes its smoke and is given back to the router; the other replica is never drained nor restarted; no client
    request fails."""
    started = time.monotonic()
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
    for name in running(canary):
        port = json.loads(on_host(canary, "cat /var/lib/d3/deployed.json"))["instances"][name]["port"]
        answer = on_host(
            canary,
            f"curl -sf http://127.0.0.1:{port}/v1/systemone -H 'Content-Type: application/json' -d "
            f'\'{{"model": "{name}", "state": "x", "questions": {{"q": {{"type": "noul", "instructions": "ok?"}}}}}}\'',
        )
        assert json.loads(answer)["object"] == "structured_decision"
    assert running(other) == before[other]
    figure(9, "broken image at the canary", f"stopped at the canary {canary}, drained again, back on its previous digest, "
           f"serving and given back to the router; the other replica untouched; 0 failed requests", started)  # fmt: skip
