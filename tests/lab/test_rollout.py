"""Fleet rollouts on a lab of at least 3 hosts, driven by ansible-runner: a rollout to the simulator's second
tag moves every instance to the new digest with nothing downloaded inside the restart window; status shows drift
before and none after; a rollout to the broken tag stops at the canary, which is back on the old digest and
serving, while no other host's instance restarts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from labkit import IMAGE, Run, on_host, registry_digest, run_playbook, running

pytestmark = pytest.mark.lab


def status(tmp_path: Path, tag: str) -> list[dict]:
    out = tmp_path / f"status-{tag}.json"
    run = run_playbook("playbooks/status.yml", extravars={"d3_image_name": f"{IMAGE}:{tag}", "d3_status_output": str(out)})
    assert run.status == "successful", run.failure_text()
    return json.loads(out.read_text())


@pytest.fixture
def fleet(converged: list[str]) -> list[str]:
    """The session's converged fleet (on the nightly tag); this module runs last (conftest) as it moves the tag."""
    assert len(converged) >= 3, "rollout tests need a lab of 3 hosts: make lab LAB_HOSTS=3"
    return converged


def role_events(run: Run, role: str) -> list[int]:
    return [i for i, e in enumerate(run.events) if e.get("event_data", {}).get("role") == role and e.get("event") == "runner_on_ok"]


def test_rollout_to_next_tag(fleet: list[str], tmp_path: Path) -> None:
    old, new = registry_digest("nightly"), registry_digest("nightly-next")
    assert old != new

    before = status(tmp_path, "nightly-next")
    assert before and all(any("image" in d for d in row["drift"]) for row in before)

    run = run_playbook("playbooks/rollout.yml", extravars={"d3_image_name": f"{IMAGE}:nightly-next"})
    assert run.status == "successful", run.failure_text()

    for host in fleet:
        images = {image for image, _ in running(host).values()}
        assert images == {f"{IMAGE}@{new}"}, (host, images)

    # every restarted instance reports its downtime
    downtimes = re.findall(r"(\S+): down ([0-9.]+) s \(unit stop to smoke pass\)", run.stdout)
    assert len(downtimes) == sum(len(running(h)) for h in fleet)
    assert all(float(s) < 120 for _, s in downtimes)

    # nothing is downloaded inside the restart window: pulls and weight downloads all happen in the stage play,
    # before the first unit is touched, and the restart batches run neither role
    first_unit = min(role_events(run, "d3_units"))
    staging = role_events(run, "d3_image") + role_events(run, "d3_weights")
    assert staging and max(staging) < first_unit
    plays = [e["event_data"]["play"] for e in run.events if e.get("event") == "playbook_on_play_start"]
    assert plays[0].startswith("Stage")
    batch_roles = {e["event_data"].get("role") for e in run.events[first_unit:] if e.get("event") in ("runner_on_ok", "runner_on_failed")}
    assert not batch_roles & {"d3_image", "d3_weights"}

    after = status(tmp_path, "nightly-next")
    assert all(row["drift"] == [] and row["health"] == "ready" for row in after), after
    assert {row["digest"] for row in after} == {new}


def test_broken_tag_stops_at_the_canary_and_rolls_it_back(fleet: list[str]) -> None:
    canary, others = fleet[0], fleet[1:]
    good = {image for image, _ in running(canary).values()}
    assert len(good) == 1 and f"{IMAGE}@{registry_digest('nightly-broken')}" not in good
    untouched = {h: running(h) for h in others}

    run = run_playbook(
        "playbooks/rollout.yml",
        extravars={"d3_image_name": f"{IMAGE}:nightly-broken", "d3_smoke_timeout_s": 20, "d3_smoke_poll_s": 2},
    )
    assert run.status == "failed"
    assert [f["host"] for f in run.failures() if "The rollout stops" in json.dumps(f.get("res", {}))] == [canary]
    assert f"host {canary}: the new deployment failed" in run.failure_text(canary)
    assert run.stats.get("rescued", {}).get(canary) == 1

    # the canary is back on the previous digest and answers decisions
    assert {image for image, _ in running(canary).values()} == good
    for name in running(canary):
        port = json.loads(on_host(canary, "cat /var/lib/d3/deployed.json"))["instances"][name]["port"]
        answer = on_host(
            canary,
            f"curl -sf http://127.0.0.1:{port}/v1/systemone -H 'Content-Type: application/json' -d "
            f'\'{{"model": "{name}", "state": "x", "questions": {{"q": {{"type": "noul", "instructions": "ok?"}}}}}}\'',
        )
        assert json.loads(answer)["object"] == "structured_decision"

    # no other host's instance was restarted
    for host in others:
        assert running(host) == untouched[host], host
