"""Fleet rollouts on a lab of at least 3 hosts, driven by ansible-runner, through the lab's router:
- a rollout of the whole fleet to the simulator's second tag, while a load generator (tools/rollout_under_load.py)
  sends decisions to d3-lite (two replicas) through the router at a steady rate: every instance moves to the new
  digest with nothing downloaded inside the restart window, each restarted instance is down for at most its
  (simulated) cold start + 5 s, the rollout marker is present on a host only while its batch runs, status shows
  drift before and none after, no request fails, and each replica is drained, restarted and taken back before the
  other is drained;
- a rollout of the two replicas to the broken tag under load (drill 9): it stops at the canary, which is rolled back,
  serving and given back to the router; the other replica is never drained nor restarted; no request fails;
- the controller killed in the middle of a rollout back to the first tag (drill 8), after which a second run
  completes with nothing lost.

The lab is a STAND-IN (lab/README.md); its simulator's cold starts are the field report's, shortened 30x."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import labkit
import pytest
import routerkit
from drillkit import figure
from labkit import IMAGE, ROOT, Run, on_host, registry_digest, run_playbook, running
from routerkit import MODEL, RATE, REPLICAS, WARMUP_S, load_tool, machine_url, server_states

pytestmark = pytest.mark.lab

MARKER = "/var/lib/d3/rollout-in-progress"  # the d3_state role's d3_state_rollout_marker default
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


def status(tmp_path: Path, tag: str) -> list[dict]:
    out = tmp_path / f"status-{tag}.json"
    run = run_playbook("playbooks/status.yml", extravars={"d3_image_name": f"{IMAGE}:{tag}", "d3_status_output": str(out)})
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


def under_load(routed: dict[str, Any], limit: str | None, extravars: dict[str, Any]) -> tuple[Run, dict[str, Any]]:
    """rollout.yml (ansible-runner) while the load generator sends d3-lite decisions through the router; the run and
    what clients saw (tools/rollout_under_load.py's figures, printed)."""
    with load_tool.load_during(machine_url(routed[MODEL]["port"]), MODEL, RATE, WARMUP_S, api_key=None) as window:
        run = run_playbook("playbooks/rollout.yml", limit=limit, extravars=extravars)
    figures = load_tool.figures_of(window, RATE, run.status, run.rc, run.events)
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


def test_rollout_to_next_tag_under_load_fails_no_request(fleet: list[str], routed: dict[str, Any], tmp_path: Path) -> None:
    old, new = registry_digest("nightly"), registry_digest("nightly-next")
    assert old != new

    before = status(tmp_path, "nightly-next")
    assert before and all(any("image" in d for d in row["drift"]) for row in before)

    run, figures = under_load(routed, None, {"d3_image_name": f"{IMAGE}:nightly-next"})
    assert run.status == "successful", run.failure_text()

    # what clients of the router saw: nothing failed, and the two replicas moved one after the other (each drained,
    # restarted and taken back before the other was drained), so d3-lite always had a server
    assert figures["before"]["requests"] >= RATE * 5 and figures["during"]["requests"] >= RATE * 10, figures
    assert figures["before"]["failed"] == 0 and figures["during"]["failed"] == 0, figures["failed_requests"]
    rows = {row["host"]: row for row in figures["timeline"]}
    assert set(REPLICAS) <= set(rows), figures["timeline"]
    first, second = (rows[h] for h in REPLICAS)
    assert first["drained_s"] < first["back_s"] <= second["drained_s"] < second["back_s"], figures["timeline"]

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

    # the marker exists on a host from before its units are touched until after its record is written
    for host in fleet:
        (mark,) = task_events(run, "Mark the host as being rolled out", host)
        (unmark,) = task_events(run, "Remove the rollout marker", host)
        units = [i for i in unit_events(run) if run.events[i]["event_data"].get("host") == host]
        records = task_events(run, "Record it, keeping the deployment it replaces as previous", host)
        assert mark < min(units) and records and max(records) < unmark, host

    # nothing is downloaded inside the restart window: pulls and weight downloads all happen in the stage play,
    # before the first unit is touched, and the restart batches run neither role
    first_unit = min(unit_events(run))
    staging = role_events(run, "d3_image") + role_events(run, "d3_weights")
    assert staging and max(staging) < first_unit
    plays = [e["event_data"]["play"] for e in run.events if e.get("event") == "playbook_on_play_start"]
    assert plays[0].startswith("Stage")
    batch_roles = {e["event_data"].get("role") for e in run.events[first_unit:] if e.get("event") in ("runner_on_ok", "runner_on_failed")}
    assert not batch_roles & {"d3_image", "d3_weights"}

    after = status(tmp_path, "nightly-next")
    assert all(row["drift"] == [] and row["health"] == "ready" for row in after), after
    assert {row["digest"] for row in after} == {new}


def test_a_broken_tag_stops_at_the_canary_which_rolls_back_through_the_router_and_no_request_fails(routed: dict[str, Any]) -> None:
    """Drill 9 under load: an image that never becomes healthy, rolled to the two d3-lite replicas behind the router
    (serial 1). The rollout stops at the canary, which goes back to its previous digest by itself, passes its smoke
    and is given back to the router; the other replica is never drained nor restarted; no client request fails."""
    started = time.monotonic()
    canary, other = REPLICAS
    before = {h: running(h) for h in REPLICAS}
    good = {image for image, _ in before[canary].values()}
    assert len(good) == 1 and f"{IMAGE}@{registry_digest('nightly-broken')}" not in good
    run, figures = under_load(routed, ":".join(REPLICAS),
                              {"d3_image_name": f"{IMAGE}:nightly-broken", "d3_rollout_serial": 1, "d3_smoke_timeout_s": 12})  # fmt: skip
    assert run.status == "failed", run.stdout[-3000:]
    assert [f["host"] for f in run.failures() if "The rollout stops" in json.dumps(f.get("res", {}))] == [canary]
    text = run.failure_text(canary)
    assert f"host {canary}: the new deployment failed" in text
    # the readiness timeout names its variable and what each instance showed, not a raw uri error
    assert "not serving within d3_smoke_timeout_s (12 s)" in text, text
    assert run.stats.get("rescued", {}).get(canary) == 1

    # what clients saw: nothing failed; only the canary was drained, and it was given back after its rollback
    assert figures["during"]["failed"] == 0, figures["failed_requests"]
    rows = {row["host"]: row for row in figures["timeline"]}
    assert list(rows) == [canary], figures["timeline"]  # the other replica was never drained
    assert rows[canary]["back_s"] is not None, "the rolled-back canary was not given back to the router"
    assert set(server_states(routed[MODEL]["backend"]).values()) == {"UP"}

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
    figure(9, "broken image at the canary", f"stopped at the canary {canary}, back on its previous digest, serving and "
           f"given back to the router; the other replica untouched; 0 failed requests", started)  # fmt: skip


def _unit_files_with(host: str, digest: str) -> list[str]:
    out = on_host(host, f"grep -l '{digest}' /etc/containers/systemd/*.container /etc/systemd/system/*.service 2>/dev/null || true")
    return out.split()


def test_drill_controller_killed_mid_rollout(fleet: list[str]) -> None:
    """Drill 8: roll the canary back to the first tag and SIGKILL ansible-playbook (and its workers) as soon as its
    first unit file names the new digest - units half switched, nothing restarted or recorded, the marker left. The
    next rollout.yml run must complete: every instance on the new digest, record and units agree, nothing stopped.
    (One host: the other hosts would only repeat the canary's batch; they must stay untouched.)"""
    canary, others = fleet[0], fleet[1:]
    target = registry_digest("nightly")
    untouched = {h: running(h) for h in others}
    serving_before = {canary: sorted(running(canary))}
    images_before = {canary: set(on_host(canary, "podman images -q --no-trunc").split())}
    weights_before = {canary: on_host(canary, "ls /var/lib/d3/huggingface/hub/*/snapshots")}
    # the digest pinned: the drill must not depend on what the tag resolves to while it runs
    pinned = {"d3_image_name": f"{IMAGE}:nightly", "d3_image_digest": target}
    argv = [labkit.venv_tool("ansible-playbook"), "playbooks/rollout.yml", "-i", str(labkit.LAB_INVENTORY), "-l", canary,
            "-e", json.dumps(pinned)]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.Popen(argv, cwd=ROOT, env=labkit.ANSIBLE_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        labkit.wait_until(f"{canary}: a unit file naming {target[:19]}", lambda: _unit_files_with(canary, target), timeout=240,
                          poll=0.05)  # fmt: skip
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    killed_at = time.monotonic() - started
    assert on_host(canary, f"test -e {MARKER} && echo present || echo absent").strip() == "present"
    recorded = json.loads(on_host(canary, "cat /var/lib/d3/deployed.json"))
    assert target not in recorded["image_ref"], "the killed run must not have recorded the canary yet"

    resumed = run_playbook("playbooks/rollout.yml", limit=canary, extravars=pinned)
    assert resumed.status == "successful", resumed.failure_text()
    reasons = {unit: reason for unit, (_, reason) in downtimes_of(resumed.stdout).items()}
    for host in others:
        assert running(host) == untouched[host], host
    for host in [canary]:
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
    # the canary's units written by the killed run were restarted although they did not change again
    assert any("newer than the" in r for r in reasons.values()), reasons
    figure(8, "controller killed mid-rollout", f"killed {killed_at:.0f} s in (canary units half switched); the next run completed, "
           f"{len(reasons)} instances restarted, record = units, marker gone", started)  # fmt: skip
