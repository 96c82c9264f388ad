"""Fault drills on the shared converged lab fleet (issue 12), each printing its figure and checking that nothing is
lost: the deployment record, the weights and the images on the host are intact, and every instance that served
before the fault serves after it (or after the documented action). Drill 8 (controller killed mid-rollout) and
drill 9 (broken image at the canary) live in test_rollout.py, which moves the fleet's tag.

  5 a revision that does not exist      refused at staging, nothing restarted
  6 disk too small                      refused before any change, with the sizes needed and free
  3 mirror down while staging           the rollout stops before any restart, names the mirror
  4 registry down while staging         the same for the image registry
  1 container crash                     systemd restarts it; status.yml shows the restart count
  7 a GPU lost                          status.yml names the instances and the GPU; site.yml refuses, changes nothing
  2 host reboot                         every instance serves again with no Ansible run

The lab is a STAND-IN (lab/README.md). "Down" for the mirror and the registry is per lab host: the host's
/etc/hosts points the service's name at a closed port (connection refused, as from a stopped service), so the
shared lab services keep serving the other hosts; the drill restores the name in a finally block. The GPU loss uses
the driver stand-in's labelled `lab-nvidia-setup --hide-gpu` (lab/nvidia/README.md).

Figures: printed as `DRILL <n> | <name> | <figure> | <lab seconds>`; with D3_DRILLS_OUT=<file> also appended there as
JSON lines (lab/drills.sh prints them as one table)."""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import labkit
import pytest
from drillkit import all_answer, assert_intact, decision, figure, nothing_lost, ports, run_seconds
from labkit import IMAGE, on_host, run_playbook, running, unit_state

pytestmark = pytest.mark.lab

HF_REVISIONS = labkit.LAB_STATE / "hf-revisions.json"
CLOSED = "127.0.0.9"  # nothing listens there inside a lab host: connection refused


@contextlib.contextmanager
def unreachable(host: str, name: str) -> Iterator[None]:
    """The lab service `name` (lab-hf, lab-registry) refuses connections from this lab host only (STAND-IN for the
    service being down): /etc/hosts points the name at a closed address; restored afterwards whatever happens."""
    original = on_host(host, "cat /etc/hosts")
    assert re.search(rf"^\S+\s+{name}\b", original, re.M), f"{host}: /etc/hosts has no {name} (make lab)"
    edited = re.sub(rf"^\S+(\s+{name}\b)", rf"{CLOSED}\1", original, flags=re.M)
    on_host(host, f"printf '%s' '{edited}' > /etc/hosts")  # in place: /etc/hosts is a bind mount
    try:
        yield
    finally:
        on_host(host, f"printf '%s' '{original}' > /etc/hosts")
    assert on_host(host, "cat /etc/hosts") == original


def revisions() -> dict[str, str]:
    assert HF_REVISIONS.is_file(), f"{HF_REVISIONS} is missing: run `make lab`"
    return {repo.split("/", 1)[1]: sha for repo, sha in json.loads(HF_REVISIONS.read_text()).items()}


@pytest.fixture
def host(converged: list[str]) -> str:
    """The drills' host: the last lab host (one small instance, d3-lite, on a Quadlet host)."""
    return converged[-1]


def refused_staging(host: str, started: float, **extravars: Any) -> tuple[labkit.Run, str]:
    before_units = unit_state(host)
    run = run_playbook("playbooks/rollout.yml", limit=host, extravars=extravars)
    assert run.status == "failed", run.stdout[-2000:]
    text = run.failure_text(host)
    assert "The rollout stops before any restart" in text, text
    # nothing of the restart play ran: no marker, no unit task (but the read-only input checks of staging's head),
    # nothing restarted
    checks = {"Refuse unit inputs that could inject into a unit file", "Refuse an API key that cannot be a podman secret's data"}
    ran = [d["task"] for d in run.results(host) if d.get("role") in ("d3_units", "d3_smoke") and d["task"] not in checks]
    assert not ran, ran
    assert unit_state(host) == before_units
    assert on_host(host, "test -e /var/lib/d3/rollout-in-progress && echo present || echo absent").strip() == "absent"
    return run, text


def test_drill_5_revision_that_does_not_exist(host: str) -> None:
    started = time.monotonic()
    before = nothing_lost(host)
    bogus = "0123456789abcdef0123456789abcdef01234567"
    run, text = refused_staging(host, started, d3_model_revisions={**revisions(), "d3-lite": bogus})
    assert "staging failed at weights" in text and bogus in text, text
    assert_intact(host, before)
    figure(5, "revision that does not exist", f"refused at staging after {run_seconds(run):.0f} s, 0 restarts", started)


def test_drill_6_disk_too_small(host: str) -> None:
    """The weights cache's disk is replaced by a 16 MiB one (a tmpfs mounted over it on the host only; running
    containers keep their own mount), so the weights look missing and there is no room for them."""
    started = time.monotonic()
    before = nothing_lost(host)
    cache = "/var/lib/d3/huggingface"
    on_host(host, f"mount -t tmpfs -o size=16m d3-drill-small-disk {cache}")
    try:
        _, text = refused_staging(host, started)
    finally:
        on_host(host, f"umount {cache}")
    match = re.search(r"has ([0-9.]+) GiB free, the weights to download need ([0-9.]+) GiB.*?and a ([0-9]+) GiB margin", text)
    assert match, text
    assert "staging failed at preflight" in text, text
    assert_intact(host, before)
    free, need, margin = match.groups()
    text = f"16 MiB cache disk refused before any change: {free} GiB free < {need} GiB of weights + {margin} GiB margin"
    figure(6, "disk too small", text, started)


def test_drill_3_mirror_down_while_staging(host: str) -> None:
    """A model added to the host while the Hugging Face mirror is down: staging cannot download it."""
    started = time.monotonic()
    before = nothing_lost(host)
    cached = on_host(host, "ls /var/lib/d3/huggingface/hub")
    new = next(m for m in ("d3-edge", "d3-nano", "d3-mini") if f"models--vllm-sr--{m}" not in cached)
    models = [*labkit.host_vars(host)["d3_models"], {"model": new}]
    with unreachable(host, "lab-hf"):
        run, text = refused_staging(host, started, d3_models=models)
    assert "staging failed at weights (downloading from the Hugging Face endpoint http://lab-hf:8090" in text, text
    assert_intact(host, before)
    figure(3, "mirror down while staging", f"stopped before any restart after {run_seconds(run):.0f} s, names http://lab-hf:8090", started)


def test_drill_4_registry_down_while_staging(host: str) -> None:
    started = time.monotonic()
    before = nothing_lost(host)
    with unreachable(host, "lab-registry"):
        run, text = refused_staging(host, started, d3_image_name=f"{IMAGE}:nightly-next")
    assert f"staging failed at image (the image {IMAGE}:nightly-next from lab-registry:5000 or docker.io)" in text, text
    assert_intact(host, before)
    figure(4, "registry down while staging", f"stopped before any restart after {run_seconds(run):.0f} s, names lab-registry:5000", started)


def status_rows(limit: str, **extravars: Any) -> tuple[labkit.Run, list[dict[str, Any]]]:
    out = Path(f"/tmp/d3-drill-status-{limit}.json")
    out.unlink(missing_ok=True)
    run = run_playbook("playbooks/status.yml", limit=limit, extravars={"d3_status_output": str(out), **extravars})
    return run, json.loads(out.read_text()) if out.is_file() else []


def test_drill_1_container_crash(host: str) -> None:
    started = time.monotonic()
    before = nothing_lost(host)
    name, port = next(iter(ports(host).items()))
    assert decision(host, port, name)
    restarts_before = int(on_host(host, f"systemctl show -p NRestarts --value {name}.service"))
    pid = on_host(host, f"podman inspect -f '{{{{.State.Pid}}}}' {name}").strip()
    killed = time.monotonic()
    on_host(host, f"kill -9 {pid}")
    labkit.wait_until(f"{host}: {name} down after the kill", lambda: decision(host, port, name) is None, timeout=10, poll=0.05)
    labkit.wait_until(f"{host}: {name} answers again", lambda: decision(host, port, name), timeout=120, poll=0.2)
    back = time.monotonic() - killed
    run, rows = status_rows(host)
    assert run.status == "successful", run.failure_text()
    (row,) = [r for r in rows if r["instance"] == name]
    assert row["restarts"] == restarts_before + 1 and row["health"] == "ready" and row["drift"] == [], row
    assert_intact(host, before)  # a new container of the same image
    pause = labkit.restart_sec(host, name)
    text = f"kill to next answered decision {back:.1f} s (systemd RestartSec={pause:g}); status shows restarts={row['restarts']}"
    figure(1, "container crash", text, started)


def test_drill_7_gpu_lost(converged: list[str]) -> None:
    """The first lab host loses GPU 1 (the driver stand-in hides it and kills what runs on it, as a GPU that falls
    off the bus does): the 27B instance on GPUs 0-1 goes down and cannot start; status.yml names it and the GPU;
    site.yml refuses with the plan error and changes nothing. The GPU back, systemd restarts the instance by itself."""
    started = time.monotonic()
    host = converged[0]
    victim = next(n for n, i in json.loads(on_host(host, "cat /var/lib/d3/deployed.json"))["instances"].items() if 1 in i["gpus"])
    before = nothing_lost(host)
    setup = "/usr/lib/lab-nvidia/lab-nvidia-setup"
    assert "--hide-gpu" in on_host(host, f"{setup} --help 2>&1 || true"), (
        f"{host}: the driver stand-in has no --hide-gpu: rebuild the lab (make lab-down && make lab)"
    )
    on_host(host, f"{setup} --hide-gpu 1")
    try:
        assert "GPU 1:" not in on_host(host, "nvidia-smi -L")
        labkit.wait_until(f"{host}: {victim} down", lambda: victim not in running(host), timeout=30, poll=0.2)
        units = unit_state(host)
        run, rows = status_rows(host)
        assert run.status == "failed", "status.yml must exit non-zero when the plan fails"
        (row,) = [r for r in rows if r["instance"] == victim]
        assert "GPU 1 missing (nvidia-smi lists 0, 2, 3)" in row["drift"], row
        assert any("GPU index [1] out of range" in d for d in row["drift"]), row
        refused = run_playbook("site.yml", limit=host)
        assert refused.status == "failed"
        assert "GPU index [1] out of range: the host has 3 GPU(s) (0, 2, 3)" in refused.failure_text(host), refused.failure_text(host)
        assert not [r for r in refused.roles_run(host) if r in ("nvidia_toolkit", "podman", "d3_image", "d3_weights", "d3_units")]
        assert {k: v for k, v in unit_state(host).items() if not k.startswith("ctr:")} == {
            k: v for k, v in units.items() if not k.startswith("ctr:")
        }
    finally:
        on_host(host, f"{setup} --hide-gpu none")
    labkit.wait_until(f"{host}: {victim} serving again", lambda: all_answer(host), timeout=120, poll=0.5)
    back = time.monotonic() - started
    assert_intact(host, before)
    text = f"status names {victim} and GPU 1; site.yml refused, nothing changed; {victim} serving {back:.0f} s after the loss (GPU back)"
    figure(7, "GPU lost", text, started)


def test_drill_2_host_reboot(converged: list[str]) -> None:
    """A Debian 12 host (classic units) and a Debian 13 host (Quadlet) stopped and started together: /run and
    /var/run/cdi start empty (tmpfs), the CDI spec is written at boot by the toolkit's refresh service, which every
    instance's unit orders after, and every instance serves again with no Ansible run (classic units are enabled;
    Quadlet's generated units are wanted by their [Install] section)."""
    started = time.monotonic()
    # one host of each suite, the one with the fewest instances (the fewest cold starts to wait for)
    by_suite = labkit.host_per_suite(converged)
    suites = {host: suite for suite, host in by_suite.items()}
    hosts = sorted(suites)
    before = {h: nothing_lost(h) for h in hosts}
    for host in hosts:
        on_host(host, "touch /run/d3-drill-before-reboot /var/run/cdi/d3-drill-before-reboot")
    for host in hosts:
        assert labkit.podman("stop", "-t", "30", host, timeout=120).returncode == 0
    for host in hosts:
        assert labkit.podman("start", host, timeout=120).returncode == 0
    booted = time.monotonic()
    back = {}
    for host in hosts:
        labkit.wait_until(f"{host}: every instance answers after the reboot", lambda h=host: _answers(h), timeout=240, poll=0.5)
        back[host] = time.monotonic() - booted
    for host in hosts:
        assert on_host(host, "ls /run/d3-drill-before-reboot /var/run/cdi/d3-drill-before-reboot 2>/dev/null || true").strip() == ""
        assert on_host(host, "systemctl is-active nvidia-cdi-refresh.service").strip() == "active", host
        assert "nvidia.com/gpu" in on_host(host, "cat /var/run/cdi/nvidia.yaml")
        units = " ".join(f"{n}.service" for n in running(host))
        assert on_host(host, f"systemctl show -p After --value {units}").count("nvidia-cdi-refresh.service") == len(running(host)), host
        assert_intact(host, before[host])
    text = "; ".join(f"{suites[h]} ({len(before[h]['serving'])} instances) all answering {back[h]:.1f} s after boot" for h in hosts)
    figure(2, "host reboot", f"{text} (no Ansible run)", started)


def _answers(host: str) -> bool:
    try:
        return all_answer(host)
    except AssertionError:  # the host's container is still starting (podman exec refused)
        return False
